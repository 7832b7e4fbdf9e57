"""Charts remembered beside the instances, so that ``send ID`` can find the chart again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .. import Chart

__all__ = ["ChartRegistry", "SQLiteChartRegistry", "charts_from_rows"]


class ChartRegistry:
    """Every chart revision ``start`` (or ``migrate``) was given, kept in the store itself.

    Revisions are keyed by (name, identity): a host built from the registry runs each
    stored position on the revision it was written for, and starts new instances on the
    revision remembered last (the "drain on the old chart" migration).
    """

    def remember(self, chart: Chart, path: str, source: bytes) -> None:
        """Record ``chart`` (a new revision, or the latest again)."""
        raise NotImplementedError

    def load_all(self) -> list[Chart]:
        """Every remembered revision, oldest first (so the latest is registered last)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the registry's connection, if it has one."""


def charts_from_rows(rows: list[tuple[str, str | None, bytes]]) -> list[Chart]:
    """Compile ``(name, path, source)`` rows; ``src`` attributes resolve beside ``path``."""
    out = []
    for name, path, source in rows:
        base = str(Path(path).parent) if path else None
        out.append(Chart.from_scxml(source, name=name, base_path=base))
    return out


class SQLiteChartRegistry(ChartRegistry):
    """The registry as a table in the SQLite database that holds the instances."""

    def __init__(self, db_path: str) -> None:
        self.db = sqlite3.connect(db_path, timeout=30, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS cli_chart_revisions (name TEXT NOT NULL, identity TEXT NOT NULL, "
                        "path TEXT, source BLOB NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (name, identity))")

    def remember(self, chart: Chart, path: str, source: bytes) -> None:
        """Record ``chart``; it becomes the latest revision of its name."""
        seq = self.db.execute("SELECT coalesce(max(seq), 0) + 1 FROM cli_chart_revisions").fetchone()[0]
        self.db.execute("INSERT INTO cli_chart_revisions VALUES (?, ?, ?, ?, ?) ON CONFLICT (name, identity) "
                        "DO UPDATE SET path = excluded.path, seq = excluded.seq",
                        (chart.name, chart.identity, path, source, seq))

    def load_all(self) -> list[Chart]:
        """Every remembered revision, oldest first."""
        return charts_from_rows(list(self.db.execute(
            "SELECT name, path, source FROM cli_chart_revisions ORDER BY seq")))

    def close(self) -> None:
        """Close the registry's connection."""
        self.db.close()
