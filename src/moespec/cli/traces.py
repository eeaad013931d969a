"""moespec traces (being written)."""

from moespec.cli.app import app  # noqa: F401
