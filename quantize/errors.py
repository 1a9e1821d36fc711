"""Errors that carry the file, tensor or pattern at fault, and the exit code the CLI uses.

The library raises these; only the CLI prints them and turns them into exit codes.
"""

from __future__ import annotations

__all__ = ["QuantizeError", "InputError", "ConversionError", "OutputExistsError", "OutputBusyError"]


class QuantizeError(Exception):
    """Base class: one line of text that says what is wrong and, where it can, what to do."""

    exit_code = 1


class InputError(QuantizeError):
    """Bad usage or unusable input: a recipe, a source checkpoint, an argument (exit code 2)."""

    exit_code = 2


class OutputExistsError(InputError):
    """The output directory exists and `--overwrite` was not given."""


class ConversionError(QuantizeError):
    """The work itself failed (exit code 1): a write, a check."""

    exit_code = 1


class OutputBusyError(InputError):
    """Another conversion is writing the same output directory."""
