"""Errors that carry the file, tensor or pattern at fault, and the exit code the CLI uses.

The library raises these; only the CLI prints them and turns them into exit codes.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["QuantizeError", "InputError", "ConversionError", "OutputExistsError", "OutputBusyError"]


class QuantizeError(Exception):
    """Base class: one line of text that says what is wrong and, where it can, what to do."""

    exit_code = 1


class InputError(QuantizeError):
    """Bad usage or unusable input: a recipe, a source checkpoint, an argument (exit code 2).

    `parameters`: the arguments of the Python call the message names, each written in it as its name in
    backticks; the CLI writes the option a user typed in its place (`with_options`).

    >>> e = InputError("`workers` must be at least 1, got 0", parameters=("workers",))
    >>> e.with_options({"workers": "--workers"})
    '--workers must be at least 1, got 0'
    """

    exit_code = 2

    def __init__(self, message: str, *, parameters: tuple[str, ...] = ()):
        super().__init__(message)
        self.parameters = parameters

    def with_options(self, options: Mapping[str, str]) -> str:
        """The message, each of `parameters` that `options` maps (name -> option) written as that option."""
        text = str(self)
        for name in self.parameters:
            if name in options:
                text = text.replace(f"`{name}`", options[name])
        return text


class OutputExistsError(InputError):
    """The output directory exists and `--overwrite` was not given."""


class ConversionError(QuantizeError):
    """The work itself failed (exit code 1): a write, a check."""

    exit_code = 1


class OutputBusyError(InputError):
    """Another conversion is writing the same output directory."""
