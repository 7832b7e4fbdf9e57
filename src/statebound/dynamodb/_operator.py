"""DynamoStore's operator reads and batch jobs: what ``statebound`` runs, never the hot path.

Kept apart from ``store.py`` (commits, claims and the sweep) because none of it is on the
path of an event or a fire. Each function is bound as a :class:`DynamoStore` method; the
costs below are per call, "RCU" meaning read capacity units (4 KB each, halved for an
eventually consistent read).

==========================  ==========================================================
``due_timers``              1 ``Query`` of the due index per shard (``gsi_due`` up to
                            ``due_before_ms``), reading only the rows due by then,
                            stopping at ``limit`` rows per shard
``list_positions``          a paginated ``Scan`` of the table, keeping position items
                            (of one chart, if asked): reading every instance costs the
                            whole table's read units once. There is no index by chart.
``history``                 1 ``Query`` of the instance's ``H#`` items (consistent)
history, on ``commit``      1 more ``Put`` per record in the commit's
                            ``TransactWriteItems``; a commit that was a single conditional
                            ``PutItem`` becomes a 2-item transaction (transactions bill
                            2 write units per KB per item: an event with no timer changes
                            goes from about 1 WCU to about 4)
history, on delete          by a host with history on: 1 ``Query`` of the ``H#`` items +
                            1 ``BatchWriteItem`` per 25, after the commit, best effort
                            (TTL removes any left over, and what other hosts leave)
``purge_done``              a ``Scan`` of the table (the whole table over a full pass:
                            done rows are in no index), plus 1 conditional
                            ``DeleteItem`` per row deleted. Prefer ``done_ttl_s``, which
                            costs no requests at all.
==========================  ==========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..exceptions import ConflictError
from ..host.store import (CLAIMED, DELETED, DONE, PENDING, HistoryRecord, PositionRecord, check_ints, check_text, TimerRow, pack_history,
                          unpack_history)
from . import _codec as codec
from ._codec import B, N, S

if TYPE_CHECKING:
    from .store import DynamoStore

log = logging.getLogger(__name__)

__all__ = ["due_timers", "list_positions", "purge_done", "history", "history_item", "purge_history",
           "HISTORY_PREFIX"]

#: Sort key prefix of history items: ``H#<version, 20 digits>`` in the instance's partition.
HISTORY_PREFIX = "H#"

row_done = "#state = :done"


def purge_done(self: DynamoStore, due_before_ms: int, limit: int = 10_000) -> int:
    """Delete up to ``limit`` completed timer rows that were due before ``due_before_ms``.

    Done rows leave both indexes, so finding them takes a ``Scan`` (see the module table
    for its cost). The scan resumes, on the next call to the same store object, where this
    one stopped, so a caller looping until fewer than ``limit`` come back reads the table
    once. Each delete is conditional on the row still being done: an instance deleted and
    re-created under the same id may have reused the key for a pending row meanwhile.
    Returns how many rows were deleted.
    """
    check_ints(due_before_ms=due_before_ms, limit=limit)
    if limit <= 0:
        return 0
    found: list[tuple[str, int]] = []
    kwargs: dict[str, Any] = dict(
        ProjectionExpression="#pk, #ordinal",
        FilterExpression="begins_with(#sk, :timers) AND #state = :done AND #due < :cutoff",
        ExpressionAttributeNames={"#pk": "pk", "#sk": "sk", "#ordinal": "ordinal", "#state": "state",
                                  "#due": "due_at_ms"},
        ExpressionAttributeValues={":timers": S(codec.TIMER_PREFIX), ":done": S(DONE), ":cutoff": N(due_before_ms)})
    resume = self._purge_resume
    if resume is not None:
        kwargs["ExclusiveStartKey"] = resume
    while True:
        page = self._call("scan", TableName=self.table_name, **kwargs)
        for item in page.get("Items", []):
            found.append((item["pk"]["S"], int(item["ordinal"]["N"])))
        resume = page.get("LastEvaluatedKey")
        if len(found) >= limit:
            if len(found) > limit:  # resume just after the last row this call takes
                found = found[:limit]
                resume = self._timer_key(found[-1])
            break
        if not resume:
            break
        kwargs["ExclusiveStartKey"] = resume
    self._purge_resume = resume
    deleted = 0
    for key in found:
        try:
            self._call("delete_item", TableName=self.table_name, Key=self._timer_key(key),
                       ConditionExpression=row_done, ExpressionAttributeNames={"#state": "state"},
                       ExpressionAttributeValues={":done": S(DONE)})
            deleted += 1
        except ConflictError:
            pass  # no longer a done row: not ours to delete
    return deleted


def _ready_order(row: TimerRow) -> tuple[int, str, int]:
    return (row.ready_at_ms, row.instance_id, row.ordinal)


def due_timers(self: DynamoStore, due_before_ms: int, limit: int = 1_000) -> Sequence[TimerRow]:
    """Up to ``limit`` pending rows of any instance ready by ``due_before_ms``, earliest first.

    Reads the due index only, never the table: one ``Query`` per shard, each reading the
    rows due by then and no others. Every shard is read, whatever :attr:`owned_shards`
    says: this is an operator's view of the table, not a sweep. The index is eventually
    consistent, so a row fired a moment ago may still be listed.
    """
    check_ints(due_before_ms=due_before_ms, limit=limit)
    if limit <= 0:
        return []
    out: list[TimerRow] = []
    for shard in range(self.shards):
        out.extend(_query_due(self, shard, limit, due_before_ms))
    return sorted(out, key=_ready_order)[:limit]


def _visible(self: DynamoStore, item: dict[str, Any]) -> TimerRow | None:
    """An index item as a row, with this store's soft claim shown; ``None`` for a row this
    store has just completed (the index lags the table)."""
    row = self._sweep.overlay(codec.listed_row(item))
    if row.state == PENDING and self._sweep.hidden(row.key, None):   # not soft-claimed, so: completed here
        return None
    return row if row.state in (PENDING, CLAIMED) else None


def _query_due(self: DynamoStore, shard: int, want: int, due_before_ms: int) -> list[TimerRow]:
    out: list[TimerRow] = []
    for item in self._pages("query", IndexName=codec.DUE_INDEX,
                            KeyConditionExpression="#gsi_pk = :p AND #gsi_due <= :t",
                            ExpressionAttributeNames={"#gsi_pk": "gsi_pk", "#gsi_due": "gsi_due"},
                            ExpressionAttributeValues={":p": S(codec.due_partition(shard)),
                                                       ":t": N(due_before_ms)},
                            Limit=min(want + 8, 1_000)):
        row = _visible(self, item)
        if row is not None:
            out.append(row)
            if len(out) >= want:
                break
    return out


def list_positions(self: DynamoStore, chart: str | None = None, *, after: str | None = None,
                   limit: int = 1_000) -> Sequence[PositionRecord]:
    """Up to ``limit`` position items, in scan order, after instance ``after``.

    A ``Scan`` with a filter (see the module table for the cost): scan order is the
    partitions' hash order, and resuming after ``(after, "P")`` continues right behind
    that instance's position item, so passing the last id returned pages through the
    table exactly once. Eventually consistent, as a batch job's listing may be.
    """
    check_text("chart", chart)
    check_text("after", after)
    check_ints(limit=limit)
    if limit <= 0:
        return []
    # a deleted instance's tombstone (ADR 0028) is no instance
    names = {"#sk": "sk", "#status": "status"}
    values = {":position": S(codec.POSITION_SK), ":deleted": S(DELETED)}
    expr = "#sk = :position AND #status <> :deleted"
    if chart is not None:
        names["#chart"] = "chart"
        values[":chart"] = S(chart)
        expr += " AND #chart = :chart"
    kwargs: dict[str, Any] = dict(FilterExpression=expr, ExpressionAttributeNames=names,
                                  ExpressionAttributeValues=values)
    if after is not None:
        kwargs["ExclusiveStartKey"] = self._key(after, codec.POSITION_SK)
    out: list[PositionRecord] = []
    for item in self._pages("scan", **kwargs):
        out.append(codec.record_from_item(item))
        if len(out) >= limit:
            break
    return out


def _history_sk(version: int) -> str:
    return f"{HISTORY_PREFIX}{version:0{codec.ORDINAL_WIDTH}d}"


def history_item(self: DynamoStore, h: HistoryRecord) -> dict[str, Any]:
    """The item of one history record. A record over the item limit keeps everything but
    the event and start data (marked ``call["truncated"]``): history must never be the
    reason an event is refused, and replay reports such a record instead of guessing."""
    from .store import MAX_ITEM_BYTES
    item = _history_attrs(h)
    if codec.item_size(item) > MAX_ITEM_BYTES:
        # what a caller or an event brought is what grows without bound: its data, and the
        # caller_context, which every step of the call carries again (a send to self, too)
        steps = tuple(_slim_step(s) for s in h.steps)
        item = _history_attrs(replace(h, steps=steps, start=None, caller_context=None,
                                      call={**h.call, "caller_context": None, "truncated": True}))
    if codec.item_size(item) > MAX_ITEM_BYTES:
        # still too large (thousands of steps): what the call was, and that it was truncated
        call: dict[str, Any] = {k: h.call[k] for k in ("op", "instance", "timer") if k in h.call}
        item = _history_attrs(replace(h, steps=(), start=None, caller_context=None,
                                      call={**call, "truncated": True}))
    return item


def _slim_step(step: dict[str, Any]) -> dict[str, Any]:
    out = {**step, "event": {**step["event"], "data": None}} if "event" in step else dict(step)
    if "context" in out:
        out["context"] = None
    return out


def _history_attrs(h: HistoryRecord) -> dict[str, Any]:
    item = {"pk": S(h.instance_id), "sk": S(_history_sk(h.version)), "record": B(pack_history(h)),
            "at_ms": N(h.at_ms)}
    if h.expires_at_ms is not None:
        item["expires_at"] = N(h.expires_at_ms // 1000)     # the table's TTL attribute, in seconds
    return item


def history(self: DynamoStore, instance_id: str, *, after_version: int = 0,
            limit: int = 1_000) -> Sequence[HistoryRecord]:
    """The instance's history records after ``after_version``, oldest first: one ``Query``
    of its ``H#`` items (strongly consistent), paginated."""
    check_ints(after_version=after_version, limit=limit)
    codec.check_id(instance_id)
    if limit <= 0:
        return []
    out: list[HistoryRecord] = []
    for item in self._pages("query", ConsistentRead=True,
                            KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                            ExpressionAttributeNames={"#pk": "pk", "#sk": "sk"},
                            ExpressionAttributeValues={":pk": S(instance_id), ":lo": S(_history_sk(after_version + 1)),
                                                       ":hi": S(_history_sk(10 ** codec.ORDINAL_WIDTH - 1))},
                            Limit=min(limit, 1_000)):
        out.append(unpack_history(bytes(item["record"]["B"])))
        if len(out) >= limit:
            break
    return out


def purge_history(self: DynamoStore, instance_id: str, up_to_version: int | None = None) -> None:
    """Delete a deleted instance's history items, after its commit, best effort: those up to
    ``up_to_version`` (the tombstone's), or all. A new instance started over the tombstone in
    between writes records past that version (ADR 0028): they are its own, and stay."""
    if up_to_version is None:
        cond, values = "begins_with(#sk, :h)", {":pk": S(instance_id), ":h": S(HISTORY_PREFIX)}
    else:
        cond = "#sk BETWEEN :h AND :last"
        values = {":pk": S(instance_id), ":h": S(HISTORY_PREFIX), ":last": S(_history_sk(up_to_version))}
    keys = [item["sk"]["S"] for item in self._pages(
        "query", ConsistentRead=True,   # the records the deleted instance's last commits wrote too
        KeyConditionExpression=f"#pk = :pk AND {cond}", ProjectionExpression="#sk",
        ExpressionAttributeNames={"#pk": "pk", "#sk": "sk"}, ExpressionAttributeValues=values)]
    self._batch_delete_quietly([self._key(instance_id, sk) for sk in keys], f"history records of {instance_id!r}")
