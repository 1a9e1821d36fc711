"""The `quantize` command line: the only place that parses arguments, prints, or picks exit codes.

One module per command; the group below lists them all. `_console` holds the consoles and the progress
display, `_options` the options several commands share, `_render` the tables and JSON summaries.
"""

from __future__ import annotations

import signal
import sys
import traceback

import click
from rich.markup import escape

from ..errors import InputError, QuantizeError
from ._console import err, state
from .convert import convert_cmd
from .example import example_cmd
from .inspect import inspect_cmd
from .plan import plan_cmd
from .recipes import recipes_cmd
from .sensitivity import sensitivity_cmd
from .upload import upload_cmd
from .verify import verify_cmd

__all__ = ["cli", "main"]


@click.group(
    commands=[
        convert_cmd,
        example_cmd,
        inspect_cmd,
        plan_cmd,
        recipes_cmd,
        sensitivity_cmd,
        upload_cmd,
        verify_cmd,
    ],
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="dit-quantize")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Offline quantization of video diffusion transformers into pre-quantized safetensors checkpoints."""
    state["debug"] = debug
    state["command"] = ctx.invoked_subcommand


# --- entry point -------------------------------------------------------------------------------


class Interrupted(BaseException):
    """SIGINT or SIGTERM: unwinds like KeyboardInterrupt (every cleanup runs), exits 128 + the signal number.

    Not a KeyboardInterrupt, which click would turn into an anonymous Abort."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    _ignore_stop_signals()  # the first signal stops the run; more must not cut short the cleanup it starts
    raise Interrupted(signum)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, DESIGN.md's exit codes, tracebacks only with --debug."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        _run(argv)
    except Interrupted as e:  # one that came in while an error was being reported
        sys.exit(128 + e.signum)


def _run(argv: list[str] | None) -> None:
    try:
        code = cli.main(args=argv, prog_name="quantize", standalone_mode=False)
    except QuantizeError as e:
        _fail(e, _message(e), e.exit_code)
    except click.ClickException as e:  # bad usage: missing argument, bad option value
        _fail(
            e,
            f"{e.format_message()} (see quantize --help)",
            2 if isinstance(e, click.UsageError) else e.exit_code,
        )
    except (Interrupted, KeyboardInterrupt, click.Abort) as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        _fail(
            e,
            f"interrupted by {signal.Signals(signum).name}: stopped; nothing partial was left behind",
            128 + signum,
        )
    except Exception as e:  # a bug, or an environment problem we did not foresee
        _fail(e, f"{type(e).__name__}: {e} (run with --debug for the traceback)", 1)
    _exit(code if isinstance(code, int) else 0)


def _message(e: QuantizeError) -> str:
    """The error's text, each Python parameter it names written as the option of the command that was run."""
    if not isinstance(e, InputError):
        return str(e)
    command = cli.commands.get(state["command"] or "")
    params = command.params if command is not None else []
    return e.with_options({p.name: max(p.opts, key=len) for p in params if isinstance(p, click.Option)})


def _exit(code: int) -> None:
    _ignore_stop_signals()  # the work is over: a late signal must not change the exit code
    sys.exit(code)


def _ignore_stop_signals() -> None:
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _fail(e: BaseException, message: str, code: int) -> None:
    _ignore_stop_signals()
    from ..read.hub import scrub

    if state["debug"]:
        err.print(scrub("".join(traceback.format_exception(e))), markup=False, highlight=False)
    one_line = " ".join(message.split())  # a library's message may span lines (YAML's, the OS's)
    err.print(f"[red]error:[/] {escape(scrub(one_line))}", soft_wrap=True)
    _exit(code)
