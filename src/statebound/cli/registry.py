"""Charts remembered beside the instances, so that ``send ID`` can find the chart again."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import Chart
from ..exceptions import ChartError
from ..host.sqlite import _map_sqlite_errors

__all__ = ["ChartRegistry", "SQLiteChartRegistry", "DynamoChartRegistry", "charts_from_rows"]

log = logging.getLogger("statebound")


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
        try:
            out.append(Chart.from_scxml(source, name=name, base_path=base, trust=trust or "trusted"))
        except ChartError as exc:
            # A revision this version no longer compiles (a rule tightened since it was
            # started: ids starting with '_sb_', say) failed every command on the store, for
            # every instance. Skipped, only its own instances fail (their chart is unknown).
            log.warning("chart %r (%s), remembered in the store, no longer compiles and is skipped; its "
                        "instances cannot run until it is started again in a form that compiles: %s",
                        name, path or "no path", exc)
    return out


class SQLiteChartRegistry(ChartRegistry):
    """The registry as a table in the SQLite database that holds the instances.

    Every driver error comes out as the store's would (``StoreUnavailable``: locked past
    ``timeout_s``, not a database, an I/O error), never as an ``sqlite3`` one. Many processes
    may open one new file at once: the table is created whole, and a file from before charts
    had a trust level gets the column added once, under the write lock.
    """

    def __init__(self, db_path: str, timeout_s: float = 30.0) -> None:
        with _map_sqlite_errors():
            self.db = sqlite3.connect(db_path, timeout=timeout_s, isolation_level=None)
        try:
            with _map_sqlite_errors():
                self.db.execute("CREATE TABLE IF NOT EXISTS cli_chart_revisions (name TEXT NOT NULL, "
                                "identity TEXT NOT NULL, path TEXT, source BLOB NOT NULL, seq INTEGER NOT NULL, "
                                "trust TEXT, PRIMARY KEY (name, identity))")
                if not self._has_trust():
                    # Every process that opens the old file at once sees the column missing:
                    # only the first to take the write lock may add it.
                    with self._transaction():
                        if not self._has_trust():
                            self.db.execute("ALTER TABLE cli_chart_revisions ADD COLUMN trust TEXT")
                if self._has_table("cli_charts"):
                    self._adopt_first_registry()
        except BaseException:
            self.db.close()
            raise

    def _has_table(self, name: str) -> bool:
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                               (name,)).fetchone() is not None

    def _adopt_first_registry(self) -> None:
        """Bring in the charts of the CLI's first registry (one revision per name, table
        ``cli_charts``), which no version since read: a store it made lost its charts on
        upgrade, and every instance failed with "not registered". Once, under the lock."""
        with self._transaction():
            if not self._has_table("cli_charts"):
                return   # another process adopted it meanwhile
            for n, (name, identity, path, source) in enumerate(
                    self.db.execute("SELECT name, identity, path, source FROM cli_charts ORDER BY name").fetchall()):
                # before every later revision: the first registry's charts are the oldest
                self.db.execute("INSERT INTO cli_chart_revisions (name, identity, path, source, seq, trust) "
                                "VALUES (?, ?, ?, ?, ?, NULL) ON CONFLICT (name, identity) DO NOTHING",
                                (name, identity, path, source, n - 1_000_000))
            self.db.execute("DROP TABLE cli_charts")

    def _has_trust(self) -> bool:
        return "trust" in {row[1] for row in self.db.execute("PRAGMA table_info(cli_chart_revisions)")}

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def remember(self, chart: Chart, path: str, source: bytes) -> None:
        """Record ``chart``; it becomes the latest revision of its name."""
        # One transaction: two processes remembering at once must not both read the same
        # max(seq), or both revisions would get one number and the latest be either.
        with _map_sqlite_errors(), self._transaction():
            seq = self.db.execute("SELECT coalesce(max(seq), 0) + 1 FROM cli_chart_revisions").fetchone()[0]
            self.db.execute("INSERT INTO cli_chart_revisions (name, identity, path, source, seq, trust) "
                            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name, identity) "
                            "DO UPDATE SET path = excluded.path, seq = excluded.seq",
                            (chart.name, chart.identity, path, source, seq, chart.trust))

    def load_all(self) -> list[Chart]:
        """Every remembered revision, oldest first."""
        with _map_sqlite_errors():
            rows = list(self.db.execute("SELECT name, path, source, trust FROM cli_chart_revisions ORDER BY seq"))
        return charts_from_rows(rows)

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
