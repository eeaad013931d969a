"""The typer application that every command module adds itself to, and its error boundary."""

import os
import shutil
import sys
import warnings

import typer
from rich.console import Console
from typer.core import TyperGroup

# Outside a terminal (a pipe, a log) rich would wrap every table at 80 columns; a table wider than
# that keeps its rows whole up to this width, and a narrower one keeps its own.
PIPED_WIDTH = 240


def cli_console() -> Console:
    """The console every command prints through: the terminal's width in a terminal, COLUMNS when
    set, else PIPED_WIDTH, so that tables keep their shape when piped or logged."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return Console()
    return Console(width=max(PIPED_WIDTH, shutil.get_terminal_size((PIPED_WIDTH, 24)).columns))


# A user's mistake: moespec raises these with the offending value and the fix (docs/robustness.md).
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    typer.secho(f"warning: {message}", err=True, fg="yellow", bold=True)


class _ErrorBoundary(TyperGroup):
    """Runs a command: a user's mistake prints as `error: <message>` and exits 2, a warning as
    `warning: <message>`; with --debug, Python's own traceback and warning format. Usage errors keep
    typer's format; any other exception is a bug and keeps its traceback."""

    def invoke(self, ctx: typer.Context):
        debug = ctx.params.get("debug", False)
        with warnings.catch_warnings():
            if not debug:
                warnings.showwarning = _show_warning
            try:
                return super().invoke(ctx)
            except USER_ERRORS as e:
                if debug:
                    raise
                typer.echo(f"error: {e}", err=True)
                raise typer.Exit(2) from None


app = typer.Typer(
    name="moespec",
    cls=_ErrorBoundary,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="show the full traceback of an error, not only its message"),
) -> None:
    """Lossless speculative decoding that knows when it pays, above all on MoE models."""
