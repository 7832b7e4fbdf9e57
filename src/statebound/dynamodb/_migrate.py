"""Bring a table written by statebound 0.1 to this version's index layout, in place.

0.1 keyed the due index by time bucket and shard (``gsi_pk = "<bucket>#<shard>"``) and
kept a sweep cursor item per shard (``sweep#<shard>`` / ``C``) to know which buckets to
read; every dead row sat under one ``dead_pk = "dead"``. This version keys the due index by
shard alone (``due#<shard>``) and spreads dead rows the same way (``dead#<shard>``), so:

1. every pending row still under a 0.1 due partition gets its ``gsi_pk`` rewritten (one
   conditional ``UpdateItem`` each; a row fired or changed meanwhile is left alone);
2. every dead row under ``"dead"`` moves to its shard's dead partition;
3. the cursor items are deleted, and so are 0.1's per-shard lease and membership items
   (the lease board replaced them);
4. last, the **layout marker** (``statebound#layout`` / ``V``, ``layout = 2``) is written:
   the table holds no 0.1-keyed row.

Finding the 0.1 rows costs one ``Scan`` of the due index, in proportion to the pending
rows, once. Positions, timer rows and keys are otherwise unchanged. Idempotent: run it
again after a writer still on 0.1 wrote rows (``DynamoStore.migrate()``).

**Telling a 0.1 table.** Only 0.1's *sweepers* wrote cursors; a table that only 0.1
writers touched (``statebound start``, an API) has 0.1-keyed rows and no cursor. So a
sweeper (:meth:`Sweep.check_legacy`, once per store object) reads the cursors and the
marker in one ``BatchGetItem``, and migrates when it finds a cursor, or when it finds no
marker and :func:`legacy_rows_left` finds a 0.1 row. A table without the marker and
without 0.1 rows (made from ``table_spec`` by infrastructure code, or before the marker
existed) just gets the marker, so the look at its rows happens once per table, not per
process. ``create_table`` writes the marker on a table it creates, which has no row yet.
The marker is written last, after the work it vouches for: a migration or a look cut
short leaves no marker, and the next sweep does it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..exceptions import ConflictError
from . import _codec as codec
from ._codec import N, S

if TYPE_CHECKING:
    from .store import DynamoStore

__all__ = ["MigrationReport", "migrate", "legacy_rows_left", "layout_key", "layout_item", "mark_layout"]

# Named clauses.
partition_unchanged = "#gsi_pk = :old"
dead_partition_unchanged = "#dead_pk = :old"


def layout_key() -> dict[str, Any]:
    """The key of the layout marker item."""
    return {"pk": S(codec.LAYOUT_PK), "sk": S(codec.LAYOUT_SK)}


def layout_item() -> dict[str, Any]:
    """The layout marker item: this table holds no 0.1-keyed row."""
    return {**layout_key(), "layout": N(codec.LAYOUT)}


def mark_layout(store: DynamoStore) -> None:
    """Write the layout marker (an unconditional put: every writer writes the same item)."""
    store._call("put_item", TableName=store.table_name, Item=layout_item())


def legacy_rows_left(store: DynamoStore) -> bool:
    """Whether any row of ``store``'s table is still indexed the 0.1 way.

    A dead row under 0.1's single ``"dead"`` partition is found by one ``Query`` (one item
    at most). A pending row may sit under any ``"<bucket>#<shard>"``, a key no ``Query``
    can name, so the due index is scanned, filtered to keys not of the ``"due#"`` form,
    and the scan stops at the first one: a 0.1 table answers within a page or so, a table
    without 0.1 rows costs one read of its pending rows. The caller does this once per
    table, then writes the marker (see the module doc).
    """
    page = store._call("query", TableName=store.table_name, IndexName=codec.DEAD_INDEX, Limit=1,
                       KeyConditionExpression="#dead_pk = :old", ProjectionExpression="#pk",
                       ExpressionAttributeNames={"#dead_pk": "dead_pk", "#pk": "pk"},
                       ExpressionAttributeValues={":old": S(codec.LEGACY_DEAD_PARTITION)})
    if page.get("Items"):
        return True
    for _ in store._pages("scan", IndexName=codec.DUE_INDEX, ProjectionExpression="#gsi_pk",
                          FilterExpression="NOT begins_with(#gsi_pk, :new)",
                          ExpressionAttributeNames={"#gsi_pk": "gsi_pk"},
                          ExpressionAttributeValues={":new": S(codec.DUE_PREFIX)}):
        return True
    return False


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What :func:`migrate` moved."""

    due_rows: int = 0
    dead_rows: int = 0
    cursors: int = 0


def migrate(store: DynamoStore) -> MigrationReport:
    """Rewrite the 0.1 index attributes of ``store``'s table (see the module doc)."""
    due_rows = 0
    for item in store._pages("scan", IndexName=codec.DUE_INDEX,
                             ProjectionExpression="#pk, #sk, #ordinal, #gsi_pk",
                             ExpressionAttributeNames={"#pk": "pk", "#sk": "sk", "#ordinal": "ordinal",
                                                       "#gsi_pk": "gsi_pk"}):
        old = item["gsi_pk"]["S"]
        if not codec.is_legacy_due_partition(old):
            continue
        key = (item["pk"]["S"], int(item["ordinal"]["N"]))
        new = codec.due_partition(store.shard_of(key))
        try:
            store._call("update_item", TableName=store.table_name,
                        Key={"pk": item["pk"], "sk": item["sk"]}, UpdateExpression="SET #gsi_pk = :new",
                        ConditionExpression=partition_unchanged,
                        ExpressionAttributeNames={"#gsi_pk": "gsi_pk"},
                        ExpressionAttributeValues={":new": S(new), ":old": S(old)})
            due_rows += 1
        except ConflictError:
            pass  # fired, cancelled or rewritten since the scan read it

    dead_rows = 0
    for item in store._pages("query", IndexName=codec.DEAD_INDEX,
                             KeyConditionExpression="#dead_pk = :old",
                             ProjectionExpression="#pk, #sk, #ordinal",
                             ExpressionAttributeNames={"#dead_pk": "dead_pk", "#pk": "pk", "#sk": "sk",
                                                       "#ordinal": "ordinal"},
                             ExpressionAttributeValues={":old": S(codec.LEGACY_DEAD_PARTITION)}):
        key = (item["pk"]["S"], int(item["ordinal"]["N"]))
        try:
            store._call("update_item", TableName=store.table_name,
                        Key={"pk": item["pk"], "sk": item["sk"]}, UpdateExpression="SET #dead_pk = :new",
                        ConditionExpression=dead_partition_unchanged,
                        ExpressionAttributeNames={"#dead_pk": "dead_pk"},
                        ExpressionAttributeValues={":new": S(codec.dead_partition(store.shard_of(key))),
                                                   ":old": S(codec.LEGACY_DEAD_PARTITION)})
            dead_rows += 1
        except ConflictError:
            pass  # retried or purged meanwhile

    cursors = 0
    leftovers = [store._key(f"{codec.LEGACY_LEASE_PREFIX}{shard}", codec.LEGACY_LEASE_SK)
                 for shard in range(store.shards)]
    # the membership partition may hold an instance's items too: pin sk to the members
    leftovers += [{"pk": item["pk"], "sk": item["sk"]} for item in store._pages(
        "query", ConsistentRead=True, KeyConditionExpression="#pk = :members AND begins_with(#sk, :member)",
        ProjectionExpression="#pk, #sk", ExpressionAttributeNames={"#pk": "pk", "#sk": "sk"},
        ExpressionAttributeValues={":members": S(codec.LEGACY_MEMBERS_PK), ":member": S(codec.LEGACY_MEMBER_PREFIX)})]
    for leftover in leftovers:
        store._call("delete_item", TableName=store.table_name, Key=leftover)
    # the cursors last: while one is left, the next sweep migrates again
    for shard in range(store.shards):
        response = store._call("delete_item", TableName=store.table_name,
                               Key=store._key(f"{codec.LEGACY_CURSOR_PREFIX}{shard}", codec.LEGACY_CURSOR_SK),
                               ReturnValues="ALL_OLD")
        cursors += "Attributes" in response
    # the marker after everything: while it is missing, the next sweep looks again
    mark_layout(store)
    return MigrationReport(due_rows, dead_rows, cursors)
