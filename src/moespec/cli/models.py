"""moespec presets: list the built-in synthetic models and the trained presets shipped with moespec."""

from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.models import synthetic, trained


@app.command()
def presets() -> None:
    """List the presets usable as `synthetic:NAME` or `trained:NAME` wherever a model is named."""
    table = Table("spec", "architecture", "description")
    for name in synthetic.preset_names():
        p = synthetic.PRESETS[name]
        table.add_row(f"synthetic:{name}", p.config_class.__name__.replace("Config", ""), p.description)
    for name in trained.names():
        m = trained.manifest(name)
        if "held_out_bits_per_byte" in m:
            bpb = m["held_out_bits_per_byte"]
            score = f"held-out {bpb['code']:.2f} bits/byte on code, {bpb['prose']:.2f} on prose"
        else:
            agree = m["held_out_teacher_agreement"]
            score = f"held-out top-1 agreement with SmolLM2 {agree['code']:.2f} on code, {agree['prose']:.2f} on prose"
        table.add_row(trained.PREFIX + name, m["recipe"]["arch"].replace("Config", ""),
                      f"{m['recipe']['description']}; {score}")
    cli_console().print(table)
