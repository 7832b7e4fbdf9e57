"""Bring a table written by statebound 0.1 to this version's index layout, in place.

0.1 keyed the due index by time bucket and shard (``gsi_pk = "<bucket>#<shard>"``) and
kept a sweep cursor item per shard (``sweep#<shard>`` / ``C``) to know which buckets to
read; every dead row sat under one ``dead_pk = "dead"``. This version keys the due index by
shard alone (``due#<shard>``) and spreads dead rows the same way (``dead#<shard>``), so:

1. every pending row still under a 0.1 due partition gets its ``gsi_pk`` rewritten (one
   conditional ``UpdateItem`` each; a row fired or changed meanwhile is left alone);
2. every dead row under ``"dead"`` moves to its shard's dead partition;
3. the cursor items are deleted, which is also how a sweeper tells the work is done
   (:meth:`Sweep.check_legacy` looks for them once per store object), and so are 0.1's
   per-shard lease and membership items (the lease board replaced them).

Finding the 0.1 rows costs one ``Scan`` of the due index, in proportion to the pending
rows, once. Positions, timer rows and keys are otherwise unchanged. Idempotent: run it
again after a writer still on 0.1 wrote rows (``DynamoStore.migrate()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..exceptions import ConflictError
from . import _codec as codec
from ._codec import S

if TYPE_CHECKING:
    from .store import DynamoStore

__all__ = ["MigrationReport", "migrate"]

# Named clauses.
partition_unchanged = "#gsi_pk = :old"
dead_partition_unchanged = "#dead_pk = :old"


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
    return MigrationReport(due_rows, dead_rows, cursors)
