"""The one matplotlib setup of the report: the Agg backend (no screen needed) and saving a figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path: str | Path) -> Path:
    """Lay out `fig`, write it as PNG to `path` (folders made as needed), close it, return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
