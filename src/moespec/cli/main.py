"""Entry point: import every command module (each registers itself on `app`), then run."""

import sys

try:
    from moespec.cli import batch, chain, characterize, export, gate, generate, measure, models, settings, theory, traces, train  # noqa: F401,E501  (registration)
    from moespec.cli.app import app
except KeyboardInterrupt:  # Ctrl-C while the commands load: nothing ran yet, so no traceback
    sys.stderr.write("interrupted while moespec was starting; nothing was run: run the command again to resume\n")
    raise SystemExit(130) from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
