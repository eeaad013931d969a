"""The typer application that every command module adds itself to."""

import typer

app = typer.Typer(
    name="moespec",
    help="Lossless speculative decoding that knows when it pays, above all on MoE models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
