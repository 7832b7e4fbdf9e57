"""Charts remembered beside the instances, so that ``send ID`` can find the chart again."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from .. import Chart

__all__ = ["ChartRegistry", "SQLiteChartRegistry", "DynamoChartRegistry", "charts_from_rows"]


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


def charts_from_rows(rows: list[tuple[str, str | None, bytes, str | None]]) -> list[Chart]:
    """Compile ``(name, path, source, trust)`` rows; ``src`` attributes resolve beside ``path``.

    A chart is compiled again under the trust it was started with: the trust level is part
    of its identity, so a blob written under one level never loads under the other.
    """
    out = []
    for name, path, source, trust in rows:
        base = str(Path(path).parent) if path else None
        out.append(Chart.from_scxml(source, name=name, base_path=base, trust=trust or "trusted"))
    return out


class SQLiteChartRegistry(ChartRegistry):
    """The registry as a table in the SQLite database that holds the instances."""

    def __init__(self, db_path: str) -> None:
        self.db = sqlite3.connect(db_path, timeout=30, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS cli_chart_revisions (name TEXT NOT NULL, identity TEXT NOT NULL, "
                        "path TEXT, source BLOB NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (name, identity))")
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(cli_chart_revisions)")}
        if "trust" not in columns:  # a registry written before charts had a trust level
            self.db.execute("ALTER TABLE cli_chart_revisions ADD COLUMN trust TEXT")

    def remember(self, chart: Chart, path: str, source: bytes) -> None:
        """Record ``chart``; it becomes the latest revision of its name."""
        seq = self.db.execute("SELECT coalesce(max(seq), 0) + 1 FROM cli_chart_revisions").fetchone()[0]
        self.db.execute("INSERT INTO cli_chart_revisions (name, identity, path, source, seq, trust) "
                        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name, identity) "
                        "DO UPDATE SET path = excluded.path, seq = excluded.seq",
                        (chart.name, chart.identity, path, source, seq, chart.trust))

    def load_all(self) -> list[Chart]:
        """Every remembered revision, oldest first."""
        return charts_from_rows(list(self.db.execute(
            "SELECT name, path, source, trust FROM cli_chart_revisions ORDER BY seq")))

    def close(self) -> None:
        """Close the registry's connection."""
        self.db.close()


class DynamoChartRegistry(ChartRegistry):
    """The registry as items in the statebound table: one partition, ``pk = "cli#charts"``,
    one item per revision with ``sk = "R#<name>\\x1f<identity>"``.

    The sort key never starts with ``P`` or ``T#``, so an instance that happens to be named
    ``cli#charts`` keeps its own items apart. Loading every revision is one ``Query``.
    """

    PK = "cli#charts"

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.table_name = table_name

    def _call(self, op: str, **kwargs: Any) -> Any:
        from ..dynamodb._errors import call
        return call(getattr(self.client, op), TableName=self.table_name, **kwargs)

    def remember(self, chart: Chart, path: str, source: bytes) -> None:
        """Record ``chart``; it becomes the latest revision of its name (by wall-clock order)."""
        from ..dynamodb._codec import B, N, S, item_size
        from ..dynamodb.store import MAX_ITEM_BYTES
        from ..exceptions import ItemTooLarge
        item = {"pk": S(self.PK), "sk": S(f"R#{chart.name}\x1f{chart.identity}"), "name": S(chart.name),
                "path": S(path), "source": B(source), "seq": N(time.time_ns()), "trust": S(chart.trust)}
        size = item_size(item)
        if size > MAX_ITEM_BYTES:
            raise ItemTooLarge(f"chart {chart.name!r} is {size:,} bytes; a DynamoDB item holds at most 400 KB",
                               size, MAX_ITEM_BYTES)
        self._call("put_item", Item=item)

    def load_all(self) -> list[Chart]:
        """Every remembered revision, oldest first."""
        from ..dynamodb._codec import S
        rows = []
        kwargs: dict[str, Any] = dict(
            ConsistentRead=True, KeyConditionExpression="#pk = :pk AND begins_with(#sk, :r)",
            ExpressionAttributeNames={"#pk": "pk", "#sk": "sk"},
            ExpressionAttributeValues={":pk": S(self.PK), ":r": S("R#")})
        while True:
            page = self._call("query", **kwargs)
            for item in page.get("Items", []):
                rows.append((int(item["seq"]["N"]), item["name"]["S"], item["path"]["S"], bytes(item["source"]["B"]),
                             item.get("trust", {}).get("S")))
            if not page.get("LastEvaluatedKey"):
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        rows.sort(key=lambda r: r[0])
        return charts_from_rows([(name, path, source, trust) for _, name, path, source, trust in rows])
