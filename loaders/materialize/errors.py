"""`CheckpointMismatchError`, what every stage of a load raises where the checkpoint does not fit the model (its
own module so that the skeleton, the names and the match raise the one class without importing each other)."""

from __future__ import annotations

from quantize.errors import InputError


class CheckpointMismatchError(InputError):
    """The checkpoint does not fit the model: a key, shape or dtype names where."""
