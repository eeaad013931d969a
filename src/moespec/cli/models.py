"""moespec presets: list the built-in synthetic models."""

from rich.console import Console
from rich.table import Table

from moespec.cli.app import app
from moespec.models import synthetic


@app.command()
def presets() -> None:
    """List the synthetic presets usable as `synthetic:NAME` wherever a model is named."""
    table = Table("spec", "architecture", "description")
    for name in synthetic.preset_names():
        p = synthetic.PRESETS[name]
        table.add_row(f"synthetic:{name}", p.config_class.__name__.replace("Config", ""), p.description)
    Console().print(table)
