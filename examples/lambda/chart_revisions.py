"""The chart revisions a deployment ships: ``charts/<name>/<revision>.scxml``.

``charts/order/v1.scxml`` and ``charts/order/v2.scxml`` are two revisions of chart
``order``. Every revision shipped is registered with the host, in natural order (``v2``
before ``v10``), so the last one is the one new instances start on, while each stored
position keeps running on the revision whose identity its blob carries until it finishes:
the "drain on the old chart" upgrade of ``docs/persistence.md``. A plain
``charts/<name>.scxml`` is a chart with a single, unlabelled revision.

Remove a revision's file only once ``revisions.py`` counts no running instance on it (see
the README, "Upgrade a chart"). Kept apart from ``app.py`` so that operator tools can load
the same list without the functions' logging set-up.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import statebound as sb

__all__ = ["chart_files", "load_charts"]


def _natural(path: Path) -> list[Any]:
    """Sort key that orders ``v2`` before ``v10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem)]


def chart_files(charts_dir: str | os.PathLike[str] | None = None) -> list[tuple[str, str | None, Path]]:
    """``(name, revision, path)`` of every chart revision shipped, oldest revision first."""
    root = Path(charts_dir or os.environ.get("CHARTS_DIR") or Path(__file__).with_name("charts"))
    found: list[tuple[str, str | None, Path]] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            found += [(entry.name, f.stem, f) for f in sorted(entry.glob("*.scxml"), key=_natural)]
        elif entry.suffix == ".scxml":
            found.append((entry.stem, None, entry))
    return found


def load_charts(charts_dir: str | os.PathLike[str] | None = None) -> list[sb.Chart]:
    """Compile every revision of every chart; for each name, the latest revision comes last."""
    return [sb.Chart.from_file(path, name=name, version=revision)
            for name, revision, path in chart_files(charts_dir)]
