"""Entry point: import every command module (each registers itself on `app`), then run."""

from moespec.cli import batch, chain, characterize, export, gate, generate, measure, models, settings, theory, traces, train  # noqa: F401  (registration)
from moespec.cli.app import app


def main() -> None:
    app()


if __name__ == "__main__":
    main()
