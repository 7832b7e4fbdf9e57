"""The source tree of an earlier commit, for the sections that measure "today" against "before"."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def export_src(rev: str, into: Path) -> Path:
    """``git archive REV src`` unpacked under ``into``; returns the ``src`` directory."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into / "src"
