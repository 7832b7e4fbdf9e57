"""DynamoStore specifics on in-process moto (``mock_aws``): table creation, item layout,
index membership, limits, call counts, sweep cursors, error mapping and idempotent retries.

The backend-agnostic behaviour is in ``store_contract.py`` (``test_dynamo_contract.py``);
races between processes are in ``test_dynamo_server.py`` (serialised moto server).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from statebound.dynamodb import DEAD_INDEX, DUE_INDEX, DynamoStore
from statebound.dynamodb import _codec as codec
from statebound.exceptions import (ConflictError, ItemTooLarge, SerializationError, StoreError,
                                   StoreUnavailable)
from statebound.host.store import (DEAD, DONE, INVOKE, PENDING, SEND, WAITING, Commit, KeyRecord,
                                   PositionWrite, TimerCompletion, TimerRef)
from store_contract import create, delete, timer, update

from .helpers import index_keys, make_store, table_items, written_items

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
T0 = 1_800_000_000_000  # a wall-clock-like epoch ms, far from bucket 0


def due_members(client, table):
    """Timer keys in the due index."""
    return {(pk, int(sk[2:])) for pk, sk in index_keys(client, table, DUE_INDEX)}


def dead_members(client, table):
    """Timer keys in the dead index."""
    return {(pk, int(sk[2:])) for pk, sk in index_keys(client, table, DEAD_INDEX)}


# --------------------------------------------------------------------------- packaging


def test_import_statebound_does_not_import_boto3():
    """``import statebound`` must work without touching boto3/botocore (checked in a fresh
    interpreter, since this test process has long imported both)."""
    code = ("import sys, statebound, statebound.host; "
            "bad = [m for m in ('boto3', 'botocore') if m in sys.modules]; "
            "assert not bad, bad")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --------------------------------------------------------------------------- table


def test_create_table_is_idempotent_with_both_sparse_indexes(mock_client):
    """In-process moto: creating twice is fine; the table is on-demand with two GSIs and TTL."""
    DynamoStore.create_table("t", mock_client)
    DynamoStore.create_table("t", mock_client)  # existing table: accepted
    table = mock_client.describe_table(TableName="t")["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert [k["AttributeName"] for k in table["KeySchema"]] == ["pk", "sk"]
    indexes = {g["IndexName"]: [k["AttributeName"] for k in g["KeySchema"]]
               for g in table["GlobalSecondaryIndexes"]}
    assert indexes == {DUE_INDEX: ["gsi_pk", "gsi_due"], DEAD_INDEX: ["dead_pk", "dead_sk"]}
    ttl = mock_client.describe_time_to_live(TableName="t")["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires_at")


def test_create_table_refuses_a_foreign_table(mock_client):
    """In-process moto: an existing table without our indexes is an error, not silently used."""
    mock_client.create_table(TableName="other", BillingMode="PAY_PER_REQUEST",
                             KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                             AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}])
    with pytest.raises(StoreError, match="index"):
        DynamoStore.create_table("other", mock_client)


def test_missing_table_is_store_unavailable(mock_client):
    """In-process moto: calls on a table that does not exist raise StoreUnavailable."""
    store = make_store(mock_client, "no-such-table")
    with pytest.raises(StoreUnavailable, match="create_table"):
        store.load("a")


# --------------------------------------------------------------------------- layout


def test_item_layout(mock_client, table, dstore):
    """In-process moto: position and timer items carry the documented attributes."""
    create(dstore, "a", timers=(TimerRef(1, "s1", "pay"),), parent="p",
           timers_put=[timer("a", 1, T0 + 5, name="pay", caller_context={"c": 1})])
    items = {(i["pk"]["S"], i["sk"]["S"]): i for i in table_items(mock_client, table)}
    pos = items[("a", "P")]
    assert {"chart", "version", "blob", "status", "timers", "parent", "commit_token"} <= set(pos)
    assert pos["timers"]["L"][0]["M"]["send_id"] == {"S": "s1"}
    row = items[("a", codec.timer_sk(1))]
    assert codec.timer_sk(1) == "T#00000000000000000001"
    assert set(row["event"]) == {"B"} and set(row["dedup"]) == {"B"}
    assert set(row["caller_context"]) == {"B"}
    shard = dstore.shard_of(("a", 1))
    assert row["gsi_pk"] == {"S": f"due#{shard}"}
    assert row["gsi_due"] == {"N": str(T0 + 5)}
    assert "dead_pk" not in row


def test_outbox_row_and_idempotency_key_layout(mock_client, table, dstore):
    """In-process moto: an outbox row carries ``kind`` (a timer carries none), and the
    retained idempotency keys are one binary attribute of the position item."""
    dstore.commit(Commit(writes=(PositionWrite("a", "chart", None, b"b", "running",
                                               idempotency=(KeyRecord("req-1", b"\x01" * 16),)),),
                         timers_put=(timer("a", 1, T0, kind=SEND), timer("a", 2, T0))))
    items = {(i["pk"]["S"], i["sk"]["S"]): i for i in table_items(mock_client, table)}
    assert set(items[("a", "P")]["idem"]) == {"B"}
    assert items[("a", codec.timer_sk(1))]["kind"] == {"S": SEND}
    assert "kind" not in items[("a", codec.timer_sk(2))]
    assert dstore.load("a").idempotency == (KeyRecord("req-1", b"\x01" * 16),)


def test_waiting_and_dead_completions_move_between_indexes(mock_client, table, dstore, calls):
    """In-process moto: a completion alone is one UpdateItem (no transaction); ``waiting``
    leaves the due index for none, ``dead`` moves to the dead index with the attempt counted."""
    create(dstore, "a", timers_put=[timer("a", 1, T0, kind=INVOKE), timer("a", 2, T0, kind=SEND)])
    calls.take()
    dstore.commit(Commit(complete=TimerCompletion(("a", 1), None, node_id="n1", state=WAITING)))
    dstore.commit(Commit(complete=TimerCompletion(("a", 2), None, state=DEAD, error="gave up")))
    assert calls.take() == ["UpdateItem", "UpdateItem"]
    assert due_members(mock_client, table) == set()
    assert dead_members(mock_client, table) == {("a", 2)}
    dead = dstore.get_timer(("a", 2))
    assert (dead.state, dead.attempts, dead.last_error) == (DEAD, 1, "gave up")
    assert dstore.get_timer(("a", 1)).state == WAITING
    dstore.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
    assert dstore.get_timer(("a", 1)).outcome == "fired"
    with pytest.raises(ConflictError):
        dstore.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))


def test_unserializable_event_data_is_refused_before_writing(mock_client, table, dstore, calls):
    """In-process moto: event data msgpack cannot encode is a SerializationError, no write."""
    with pytest.raises(SerializationError):
        create(dstore, "a", timers_put=[timer("a", 1, 10, event={"name": "x", "data": object()})])
    assert "TransactWriteItems" not in calls.take()
    assert written_items(mock_client, table) == []


# --------------------------------------------------------------------------- index membership


def test_due_index_holds_pending_rows_only(mock_client, table, dstore):
    """In-process moto: fired and cancelled rows leave the due index; dead rows move to their
    shard's dead partition; a retried row comes back; a released row moves to its backoff time."""
    create(dstore, "a", timers_put=[timer("a", i, T0 + i) for i in range(1, 6)])
    assert due_members(mock_client, table) == {("a", i) for i in range(1, 6)}

    dstore.commit(Commit(writes=(update("a", 1),), complete=TimerCompletion(("a", 1), "fired")))
    dstore.commit(Commit(writes=(update("a", 2),), timers_delete=(("a", 2),)))
    dstore.claim_due(T0 + 10, 10, "n1", MINUTE)
    dstore.release(("a", 3), "n1", error="boom", next_attempt_at_ms=T0 + 10, dead=True)
    dstore.release(("a", 4), "n1", error="later", next_attempt_at_ms=T0 + 5 * MINUTE, dead=False)
    assert due_members(mock_client, table) == {("a", 4), ("a", 5)}
    assert dead_members(mock_client, table) == {("a", 3)}
    moved = mock_client.get_item(TableName=table, Key={"pk": {"S": "a"},
                                                       "sk": {"S": codec.timer_sk(4)}})["Item"]
    assert moved["gsi_pk"] == {"S": f"due#{dstore.shard_of(('a', 4))}"}
    assert moved["gsi_due"] == {"N": str(T0 + 5 * MINUTE)}
    dead = mock_client.get_item(TableName=table, Key={"pk": {"S": "a"},
                                                      "sk": {"S": codec.timer_sk(3)}})["Item"]
    assert dead["dead_pk"] == {"S": f"dead#{dstore.shard_of(('a', 3))}"}  # dead rows spread too
    done = mock_client.get_item(TableName=table, Key={"pk": {"S": "a"},
                                                      "sk": {"S": codec.timer_sk(1)}})["Item"]
    assert done["state"] == {"S": DONE} and "gsi_pk" not in done and "dead_pk" not in done

    assert dstore.retry_timer(("a", 3), T0 + 20)
    assert due_members(mock_client, table) == {("a", 3), ("a", 4), ("a", 5)}
    assert dead_members(mock_client, table) == set()


def test_done_rows_get_a_ttl_when_asked(mock_client, table):
    """In-process moto: with done_ttl_s, completion sets expires_at (moto never expires it)."""
    store = make_store(mock_client, table, done_ttl_s=3600)
    create(store, "a", timers_put=[timer("a", 1, 10)])
    store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
    item = mock_client.get_item(TableName=table, Key={"pk": {"S": "a"},
                                                      "sk": {"S": codec.timer_sk(1)}})["Item"]
    assert int(item["expires_at"]["N"]) > 1_000_000_000


# --------------------------------------------------------------------------- limits


def test_oversized_blob_is_refused_with_nothing_written(mock_client, table, dstore, calls):
    """In-process moto: a 500 KB position is ItemTooLarge before any write is sent, whether it
    would go as a PutItem or inside a transaction."""
    big = b"x" * 500_000
    with pytest.raises(ItemTooLarge) as err:
        create(dstore, "a", blob=big)
    assert err.value.size > err.value.limit == 400_000
    with pytest.raises(ItemTooLarge):
        create(dstore, "a", blob=big, timers_put=[timer("a", 1, 10)])
    assert calls.take() == []
    assert written_items(mock_client, table) == []


def test_item_just_under_the_limit_is_accepted(mock_client, table, dstore):
    """In-process moto: the estimate is conservative but not absurd: 390 KB goes through."""
    create(dstore, "a", blob=b"x" * 390_000)
    assert len(dstore.load("a").blob) == 390_000


def test_oversized_timer_row_is_refused_with_nothing_written(mock_client, table, dstore):
    """In-process moto: a timer whose event data is over the limit refuses the whole commit."""
    row = timer("a", 1, 10, event={"name": "x", "data": "y" * 450_000})
    with pytest.raises(ItemTooLarge):
        create(dstore, "a", timers_put=[row])
    assert written_items(mock_client, table) == []


def test_more_than_100_actions_is_refused_with_nothing_written(mock_client, table, dstore, calls):
    """In-process moto: a position plus 100 timer rows is 101 actions: refused up front."""
    rows = [timer("a", i, 10 + i) for i in range(100)]
    with pytest.raises(ItemTooLarge, match="100") as err:
        create(dstore, "a", timers_put=rows)
    assert (err.value.size, err.value.limit) == (101, 100)
    assert calls.take() == []
    assert written_items(mock_client, table) == []
    create(dstore, "a", timers_put=rows[:99])  # exactly 100 actions is fine
    assert len(dstore.pending_timers("a")) == 99


def test_delete_with_many_done_rows_purges_them_beyond_one_transaction(mock_client, table, dstore,
                                                                       calls):
    """In-process moto: done rows of a deleted instance that do not fit in the transaction
    are deleted right after it; nothing of the instance remains."""
    create(dstore, "a")
    for start in range(0, 110, 55):  # done rows, as completions would have left them
        dstore.commit(Commit(timers_put=tuple(timer("a", i, 10, state=DONE, outcome="fired")
                                              for i in range(start, start + 55))))
    dstore.commit(Commit(timers_put=tuple(timer("a", i, 10) for i in range(110, 120))))
    create(dstore, "b", timers_put=[timer("b", 1, 10)])
    calls.take()
    dstore.commit(Commit(writes=(delete("a", 1),)))
    # 1 position + 10 live + 89 done rows in the transaction, the other 21 done rows after,
    # then the Query for its history records (none here)
    assert calls.take() == ["Query", "TransactWriteItems", "BatchWriteItem", "Query"]
    assert dstore.load("a") is None
    assert {i["pk"]["S"] for i in written_items(mock_client, table)} == {"b"}


def test_delete_with_too_many_live_rows_is_refused(mock_client, table, dstore):
    """In-process moto: live rows must go in the delete's transaction; over 100 is refused."""
    create(dstore, "a")
    for start in range(0, 120, 60):
        dstore.commit(Commit(timers_put=tuple(timer("a", i, 10) for i in range(start, start + 60))))
    with pytest.raises(ItemTooLarge):
        dstore.commit(Commit(writes=(delete("a", 1),)))
    assert dstore.load("a").version == 1
    assert len(dstore.pending_timers("a")) == 120


def test_two_writes_of_one_instance_in_a_commit_is_refused(dstore):
    """In-process moto: DynamoDB cannot touch one item twice in a transaction; say so."""
    create(dstore, "a")
    with pytest.raises(StoreError, match="twice"):
        dstore.commit(Commit(writes=(update("a", 1), update("a", 1))))


# --------------------------------------------------------------------------- call counts


def test_call_counts(mock_client, table, dstore, calls):
    """In-process moto, counted with botocore ``before-call`` hooks: load is one GetItem, a
    commit without timers one PutItem, a commit with timers (or a fire) one
    TransactWriteItems, and a sweep of a table with recent cursors a few Queries, no write."""
    create(dstore, "a")
    assert calls.take() == ["PutItem"]
    assert dstore.load("a").version == 1
    assert calls.take() == ["GetItem"]
    dstore.commit(Commit(writes=(update("a", 1),)))
    assert calls.take() == ["PutItem"]
    dstore.commit(Commit(writes=(update("a", 2, timers=(TimerRef(1, "s1"),)),),
                         timers_put=(timer("a", 1, T0),)))
    assert calls.take() == ["TransactWriteItems"]
    # an external event: one GetItem and one write
    rec = dstore.load("a")
    dstore.commit(Commit(writes=(update("a", rec.version, timers=()),), timers_delete=(("a", 1),)))
    assert calls.take() == ["GetItem", "TransactWriteItems"]

    dstore.commit(Commit(timers_put=(timer("a", 2, T0),)))
    calls.take()
    [row] = dstore.claim_due(T0, 10, "n1", MINUTE)  # first sweep: a 0.1-table check, then every shard
    assert calls.take() == ["BatchGetItem"] + ["Query"] * dstore.shards
    dstore.commit(Commit(writes=(update("a", 4),), complete=TimerCompletion(row.key, "fired")))
    assert calls.take() == ["TransactWriteItems"]
    assert dstore.claim_due(T0 + 1, 10, "n1", MINUTE) == []
    assert calls.take() == []   # every shard's hint says nothing is due: no request at all


# --------------------------------------------------------------------------- sweep hints


def test_cold_start_finds_rows_due_long_ago_with_one_query_per_shard(mock_client, table, calls):
    """In-process moto: a sweeper starting days after rows fell due finds them with one
    Query per shard, no Scan and no look-back window to fall out of."""
    writer = make_store(mock_client, table)
    put_rows = [timer("a", 1, T0 - 3 * DAY), timer("b", 1, T0 - 2 * DAY), timer("c", 1, T0)]
    writer.commit(Commit(timers_put=tuple(put_rows)))
    sweeper = make_store(mock_client, table)
    calls.take()
    assert [r.key for r in sweeper.claim_due(T0, 10, "n1", MINUTE)] == [("a", 1), ("b", 1), ("c", 1)]
    assert calls.take() == ["BatchGetItem"] + ["Query"] * sweeper.shards


def test_rows_of_this_store_lower_the_hint_rows_of_others_wait_for_the_fallback(mock_client, table):
    """In-process moto: a row written through the sweeping store object is seen when due; a
    row another process wrote is found by the fallback read (or by a wake-up, elsewhere)."""
    sweeper = make_store(mock_client, table, shards=1)
    assert sweeper.claim_due(T0, 10, "n1", MINUTE) == []          # read: shard empty
    sweeper.commit(Commit(timers_put=(timer("mine", 1, T0 + 5_000),)))
    make_store(mock_client, table, shards=1).commit(Commit(timers_put=(timer("theirs", 1, T0 + 5_000),)))
    assert sweeper.next_due() == T0 + 5_000
    got = sweeper.claim_due(T0 + 5_000, 10, "n1", MINUTE)     # due by the hint: the shard is read
    assert sorted(r.key for r in got) == [("mine", 1), ("theirs", 1)]
    for row in got:
        sweeper.commit(Commit(complete=TimerCompletion(row.key, "fired", node_id="n1")))

    make_store(mock_client, table, shards=1).commit(Commit(timers_put=(timer("late", 1, T0 + 6_000),)))
    assert sweeper.claim_due(T0 + 30_000, 10, "n1", MINUTE) == []  # unknown here until the fallback
    assert [r.key for r in sweeper.claim_due(T0 + 65_000, 10, "n1", MINUTE)] == [("late", 1)]


def test_cancelling_the_earliest_row_makes_next_due_look_again(mock_client, table, calls):
    """In-process moto: next_due stays exact when the row a hint came from is cancelled."""
    store = make_store(mock_client, table, shards=1)
    store.commit(Commit(timers_put=(timer("a", 1, T0 + 1_000), timer("a", 2, T0 + 9_000))))
    store.claim_due(T0, 10, "n1", MINUTE)
    assert store.next_due() == T0 + 1_000
    store.commit(Commit(timers_delete=(("a", 1),)))
    calls.take()
    assert store.next_due() == T0 + 9_000
    assert calls.take() == ["Query"]
    assert store.next_due() == T0 + 9_000
    assert calls.take() == []


class LaggingIndex:
    """Wraps a client: due-index Queries do not see rows written less than ``lag`` calls ago,
    the way a GSI trails its table."""

    def __init__(self, client, lag):
        self._client, self._lag, self._written = client, lag, {}
        self._tick = 0

    def __getattr__(self, name):
        return getattr(self._client, name)

    def transact_write_items(self, **kw):
        self._tick += 1
        for action in kw["TransactItems"]:
            item = action.get("Put", {}).get("Item")
            if item and "gsi_pk" in item:
                self._written[(item["pk"]["S"], item["sk"]["S"])] = self._tick
        return self._client.transact_write_items(**kw)

    def query(self, **kw):
        self._tick += 1
        page = self._client.query(**kw)
        if kw.get("IndexName") == DUE_INDEX:
            page = {**page, "Items": [i for i in page["Items"]
                                      if self._tick - self._written.get((i["pk"]["S"], i["sk"]["S"]), -99) > self._lag]}
        return page


def test_a_row_the_lagging_index_hides_is_read_again_when_due(mock_client, table):
    """A wrapper makes the due index trail the table: the first read after this store's
    write misses the row, yet the row keeps its shard due and the next sweep finds it,
    well before the fallback."""
    store = make_store(LaggingIndex(mock_client, lag=1), table, shards=1)
    store.claim_due(T0, 10, "n1", MINUTE)
    store.commit(Commit(timers_put=(timer("a", 1, T0),)))
    assert store.claim_due(T0, 10, "n1", MINUTE) == []            # the index lags
    assert [r.key for r in store.claim_due(T0 + 1_000, 10, "n1", MINUTE)] == [("a", 1)]


def test_reset_sweep_cursors_reads_every_shard_again(mock_client, table):
    """In-process moto: after a reset (0.1's name), the next sweep reads every shard and
    finds a row another process wrote meanwhile."""
    store = make_store(mock_client, table)
    store.claim_due(T0, 10, "n1", MINUTE)
    make_store(mock_client, table).commit(Commit(timers_put=(timer("a", 1, T0),)))
    assert store.claim_due(T0 + 1, 10, "n1", MINUTE) == []   # hints are fresh: not read
    store.reset_sweep_cursors()
    assert [r.key for r in store.claim_due(T0 + 2, 10, "n1", MINUTE)] == [("a", 1)]


def test_retired_sweep_settings_are_accepted_with_a_warning(mock_client, table):
    """0.1's bucket settings still construct a store (a deployment's config keeps working)."""
    with pytest.warns(DeprecationWarning, match="bucket_ms"):
        make_store(mock_client, table, bucket_ms=60_000)
    with pytest.raises(TypeError, match="bucket_msx"):
        make_store(mock_client, table, bucket_msx=1)


def test_a_0_1_table_is_migrated_by_the_first_sweep(mock_client, table, calls):
    """In-process moto: items laid out as 0.1 wrote them (bucketed due partitions, one dead
    partition, sweep cursors) are moved by the first sweep; rows fire, dead rows list, and
    a second migration finds nothing to do."""
    store = make_store(mock_client, table)
    create(store, "old", timers_put=[timer("old", 1, T0 - MINUTE), timer("old", 2, T0 + MINUTE),
                                     timer("old", 3, T0)])
    for ordinal, due in ((1, T0 - MINUTE), (2, T0 + MINUTE)):   # rewrite them the 0.1 way
        mock_client.update_item(TableName=table, Key={"pk": {"S": "old"}, "sk": {"S": codec.timer_sk(ordinal)}},
                                UpdateExpression="SET gsi_pk = :p",
                                ExpressionAttributeValues={":p": {"S": f"{due // MINUTE}#{store.shard_of(('old', ordinal))}"}})
    mock_client.update_item(TableName=table, Key={"pk": {"S": "old"}, "sk": {"S": codec.timer_sk(3)}},
                            UpdateExpression="SET #s = :dead, dead_pk = :p, dead_sk = :k REMOVE gsi_pk, gsi_due",
                            ExpressionAttributeNames={"#s": "state"},
                            ExpressionAttributeValues={":dead": {"S": DEAD}, ":p": {"S": "dead"},
                                                       ":k": {"S": codec.dead_sort_key(("old", 3))}})
    for shard in range(store.shards):
        mock_client.put_item(TableName=table, Item={"pk": {"S": f"sweep#{shard}"}, "sk": {"S": "C"},
                                                    "bucket": {"N": str(T0 // MINUTE - 5)}})
        mock_client.put_item(TableName=table, Item={"pk": {"S": f"lease#{shard}"}, "sk": {"S": "L"},
                                                    "owner": {"S": "old-node"}, "expires_ms": {"N": "1"}})
    mock_client.put_item(TableName=table, Item={"pk": {"S": "lease#members"}, "sk": {"S": "N#old-node"},
                                                "node": {"S": "old-node"}, "expires_ms": {"N": "1"}})
    create(store, "lease#members")   # an instance in the members partition survives the clean-up
    sweeper = make_store(mock_client, table)
    calls.take()
    assert [r.key for r in sweeper.claim_due(T0, 10, "n1", 10 * MINUTE)] == [("old", 1)]
    names = calls.take()
    assert names.count("Scan") == 1   # the one-off migration
    assert {(i["pk"]["S"], i["sk"]["S"]) for i in table_items(mock_client, table)
            if i["pk"]["S"].startswith(("sweep#", "lease#"))} == {("lease#members", "P")}
    assert {i["gsi_pk"]["S"] for i in table_items(mock_client, table, DUE_INDEX)} == {
        f"due#{store.shard_of(k)}" for k in [("old", 1), ("old", 2)]}
    assert [r.key for r in sweeper.dead_timers()] == [("old", 3)]
    assert [r.key for r in sweeper.claim_due(T0 + MINUTE, 10, "n1", MINUTE)] == [("old", 2)]
    assert sweeper.migrate().due_rows == 0
    calls.take()
    make_store(mock_client, table).claim_due(T0 + 2 * MINUTE, 10, "n2", MINUTE)
    assert "Scan" not in calls.take()   # migrated once: a new process finds no cursor


def test_a_0_1_check_that_was_throttled_is_made_again_by_the_next_sweep(mock_client, table):
    """In-process moto: the first sweep's look for 0.1 cursors is throttled (StoreUnavailable,
    as every read is). Before, the store had already marked the check done, so it never
    migrated and the 0.1-keyed row never fired from that process; now the next sweep checks
    again, migrates, and the row fires."""
    import boto3
    from botocore.exceptions import ClientError
    store = make_store(mock_client, table)
    create(store, "old", timers_put=[timer("old", 1, T0 - MINUTE)])
    mock_client.update_item(TableName=table, Key={"pk": {"S": "old"}, "sk": {"S": codec.timer_sk(1)}},
                            UpdateExpression="SET gsi_pk = :p", ExpressionAttributeValues={
                                ":p": {"S": f"{(T0 - MINUTE) // MINUTE}#{store.shard_of(('old', 1))}"}})
    mock_client.put_item(TableName=table, Item={"pk": {"S": "sweep#0"}, "sk": {"S": "C"},
                                                "bucket": {"N": str(T0 // MINUTE - 5)}})
    throttled = boto3.client("dynamodb", region_name="us-east-1")
    left = {"n": 4}   # the store's own retries, all throttled

    def throttle(**kwargs):
        if left["n"]:
            left["n"] -= 1
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException",
                                         "Message": "throttled"}}, "BatchGetItem")
    throttled.meta.events.register("before-call.dynamodb.BatchGetItem", throttle)
    sweeper = make_store(throttled, table)
    with pytest.raises(StoreUnavailable):
        sweeper.claim_due(T0, 10, "n1", MINUTE)
    assert left["n"] == 0
    assert [r.key for r in sweeper.claim_due(T0, 10, "n1", MINUTE)] == [("old", 1)]


def test_a_due_item_that_cannot_be_read_is_parked_dead_and_the_sweep_goes_on(mock_client, table, dstore, caplog):
    """In-process moto: a timer item whose event is no longer msgpack failed every read of
    its shard (StoreError), so no sweeper fired anything of that shard again. It is now
    taken out of the due index as dead, with the reason, and the other rows are claimed."""
    dstore.commit(Commit(timers_put=tuple(timer(i, 1, T0) for i in ("a", "b", "c"))))
    mock_client.update_item(TableName=table, Key={"pk": {"S": "b"}, "sk": {"S": codec.timer_sk(1)}},
                            UpdateExpression="SET #e = :bad", ExpressionAttributeNames={"#e": "event"},
                            ExpressionAttributeValues={":bad": {"B": b"\xc1"}})
    claimed = dstore.claim_due(T0, 10, "n1", MINUTE)
    assert sorted(r.key for r in claimed) == [("a", 1), ("c", 1)]
    assert ("b", 1) not in due_members(mock_client, table)
    assert dead_members(mock_client, table) == {("b", 1)}
    [item] = [i for i in table_items(mock_client, table) if i["pk"]["S"] == "b"]
    assert item["state"]["S"] == DEAD and "cannot be read" in item["last_error"]["S"]
    assert "cannot be read" in caplog.text
    assert dstore.claim_due(T0 + 1, 10, "n2", MINUTE) == []   # a and c are claimed; b is gone
    [dead] = dstore.dead_timers()                             # and an operator still sees it
    assert (dead.key, dead.state, dead.event) == (("b", 1), DEAD, {}) and "cannot be read" in dead.last_error
    assert [r.key for r in dstore.pending_timers("b")] == [("b", 1)] and dstore.get_timer(("b", 1)).state == DEAD


def test_owned_shards_restrict_the_sweep(mock_client, table):
    """In-process moto: a store told its shards (a set, or anything with ``held``) claims only
    rows of those shards."""
    rows = [timer(f"i{n}", 1, T0) for n in range(16)]
    make_store(mock_client, table).commit(Commit(timers_put=tuple(rows)))
    probe = make_store(mock_client, table)
    by_shard = {probe.shard_of(r.key) for r in rows}
    mine = {min(by_shard)}

    class Leases:
        held = frozenset(mine)

    for owned in (mine, Leases()):
        store = make_store(mock_client, table, owned_shards=owned)
        got = store.claim_due(T0, 100, "n1", MINUTE)
        assert got and {store.shard_of(r.key) for r in got} == mine
    assert make_store(mock_client, table, owned_shards=set()).claim_due(T0, 100, "n1", MINUTE) == []


def test_next_due_far_future_without_a_scan(mock_client, table, calls):
    """In-process moto: a row 30 days out is next_due's answer straight from the shard
    Queries; nothing scans the index."""
    store = make_store(mock_client, table)
    far = T0 + 30 * DAY
    store.commit(Commit(timers_put=tuple(timer("a", i, far + i) for i in range(5))))
    calls.take()
    assert make_store(mock_client, table).next_due() == far
    assert set(calls.take()) == {"Query"}


def test_pending_between_lists_what_comes_due_without_claiming(mock_client, table):
    """In-process moto: the fallback's look-ahead reads only the rows due in its window."""
    store = make_store(mock_client, table)
    store.commit(Commit(timers_put=(timer("a", 1, T0 + 10), timer("b", 1, T0 + 5), timer("c", 1, T0 + DAY),
                                    timer("d", 1, T0))))
    assert [r.key for r in store.pending_between(T0, T0 + MINUTE)] == [("b", 1), ("a", 1)]
    assert [r.key for r in store.claim_due(T0 + MINUTE, 10, "n1", MINUTE)] == [("d", 1), ("b", 1), ("a", 1)]


# --------------------------------------------------------------------------- errors


class FlakyClient:
    """Wraps a client; the named operation raises the given errors first, then works."""

    def __init__(self, client, op, errors):
        self._client, self._op, self._errors = client, op, list(errors)
        self.attempts = 0

    def __getattr__(self, name):
        real = getattr(self._client, name)
        if name != self._op:
            return real

        def flaky(**kwargs):
            self.attempts += 1
            if self._errors:
                raise self._errors.pop(0)
            return real(**kwargs)
        return flaky


def client_error(code, message="x", **extra):
    return ClientError({"Error": {"Code": code, "Message": message}, **extra}, "Op")


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException",
                                  "ThrottlingException", "RequestLimitExceeded"])
def test_throttling_is_retried_then_succeeds(mock_client, table, code):
    """In-process moto behind a wrapper that throttles the first two calls: the third lands."""
    flaky = FlakyClient(mock_client, "put_item", [client_error(code), client_error(code)])
    store = make_store(flaky, table)
    create(store, "a")
    assert flaky.attempts == 3
    assert store.load("a").version == 1


def test_persistent_throttling_becomes_store_unavailable(mock_client, table):
    """In-process moto behind a throttling wrapper: after ``retries`` attempts, StoreUnavailable."""
    flaky = FlakyClient(mock_client, "put_item",
                        [client_error("ThrottlingException")] * 10)
    store = make_store(flaky, table, retries=3)
    with pytest.raises(StoreUnavailable, match="3 attempts"):
        create(store, "a")
    assert flaky.attempts == 3


def test_transaction_conflict_reason_is_retried(mock_client, table):
    """In-process moto behind a wrapper: a cancellation for TransactionConflict is retried."""
    cancelled = client_error("TransactionCanceledException", CancellationReasons=[
        {"Code": "TransactionConflict"}, {"Code": "None"}])
    flaky = FlakyClient(mock_client, "transact_write_items", [cancelled])
    store = make_store(flaky, table)
    create(store, "a", timers_put=[timer("a", 1, 10)])
    assert flaky.attempts == 2
    assert store.get_timer(("a", 1)).state == PENDING


@pytest.mark.parametrize("error, expected", [
    (client_error("ConditionalCheckFailedException"), ConflictError),
    (client_error("ResourceNotFoundException"), StoreUnavailable),
    (client_error("ValidationException", "Item size has exceeded the maximum allowed size"),
     ItemTooLarge),
    (client_error("AccessDeniedException"), StoreError),
    (EndpointConnectionError(endpoint_url="http://nowhere"), StoreUnavailable),
])
def test_only_statebound_errors_escape(mock_client, table, error, expected):
    """In-process moto behind a failing wrapper: each botocore error maps to a typed error."""
    store = make_store(FlakyClient(mock_client, "get_item", [error]), table)
    with pytest.raises(expected) as err:
        store.load("a")
    assert isinstance(err.value.__cause__, type(error))


def test_conflict_names_the_instance_and_its_version(dstore):
    """In-process moto: the cancellation reason is pinned on the right position."""
    create(dstore, "a")
    create(dstore, "b")
    dstore.commit(Commit(writes=(update("b", 1),)))
    with pytest.raises(ConflictError) as err:
        dstore.commit(Commit(writes=(update("a", 1), update("b", 1)),
                             timers_put=(timer("a", 1, 10),)))
    assert (err.value.instance_id, err.value.current) == ("b", 2)


def test_a_lost_fire_reports_the_row_not_the_version(dstore):
    """In-process moto: when the fired row is done and the position moved too, the
    ConflictError is about the row (retrying after a reload cannot help)."""
    create(dstore, "a", timers_put=[timer("a", 1, 10)])
    dstore.commit(Commit(writes=(update("a", 1),), complete=TimerCompletion(("a", 1), "fired")))
    with pytest.raises(ConflictError, match="no longer claimable") as err:
        dstore.commit(Commit(writes=(update("a", 1),), complete=TimerCompletion(("a", 1), "fired")))
    assert err.value.instance_id is None


class RepeatingClient:
    """Wraps a client; the named operation is sent twice, as when botocore retries a
    request whose first response was lost. The caller sees the second response."""

    def __init__(self, client, op):
        self._client, self._op = client, op

    def __getattr__(self, name):
        real = getattr(self._client, name)
        if name != self._op:
            return real

        def twice(**kwargs):
            real(**kwargs)
            return real(**kwargs)
        return twice


@pytest.mark.parametrize("op", ["put_item", "transact_write_items"])
def test_a_retried_delete_that_already_landed_reports_success(mock_client, table, op):
    """In-process moto: a delete sent twice (its first answer lost) finds, the second time,
    its condition failed by its own write; the host used to reload and raise InstanceNotFound
    for an instance it had just deleted. Without timers the delete is one PutItem (of the
    tombstone, ADR 0028), with one a transaction."""
    import statebound as sb
    chart = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="t" '
        'initial="s"><state id="s"><transition event="arm"><send event="x" delay="1h"/></transition>'
        '</state></scxml>')
    host = sb.Host([chart], store=make_store(RepeatingClient(mock_client, op), table),
                   clock=sb.ManualClock(T0))
    host.start("t", "a")
    if op == "transact_write_items":
        host.send("a", "arm")
    host.delete("a")
    assert not host.exists("a") and host.store.load("a").status == "deleted"
    assert [i["sk"]["S"] for i in table_items(mock_client, table) if i["pk"]["S"] == "a"] == ["P"]  # the tombstone
    with pytest.raises(sb.InstanceNotFound):   # a delete of an instance that is not there still says so
        host.delete("a")


@pytest.mark.parametrize("op", ["put_item", "transact_write_items"])
def test_a_retried_commit_that_already_landed_is_not_a_conflict(mock_client, table, op):
    """In-process moto: the repeated request's condition fails on the commit's own write;
    the ``commit_token`` shows it, so the commit succeeds once instead of raising
    ConflictError (which would make the host apply the event a second time). moto ignores
    ClientRequestToken, so this also stands in for DynamoDB's own idempotency window."""
    store = make_store(RepeatingClient(mock_client, op), table)
    timers = [timer("a", 1, 10)] if op == "transact_write_items" else []
    create(store, "a", timers_put=timers)
    store.commit(Commit(writes=(update("a", 1, blob=b"two"),), timers_put=tuple(timers)))
    rec = store.load("a")
    assert (rec.version, rec.blob) == (2, b"two")
    other = make_store(mock_client, table)
    with pytest.raises(ConflictError):  # a genuine conflict is still one
        other.commit(Commit(writes=(update("a", 1, blob=b"stale"),), timers_put=tuple(timers)))


def test_soft_claims_are_per_store_object(mock_client, table):
    """In-process moto: another store object (another process) is not stopped by a soft
    claim; only one of the two completions commits."""
    a, b = make_store(mock_client, table), make_store(mock_client, table)
    create(a, "x", timers_put=[timer("x", 1, 10)])
    [ra] = a.claim_due(10, 10, "n1", MINUTE)
    [rb] = b.claim_due(10, 10, "n2", MINUTE)
    assert ra.key == rb.key
    a.commit(Commit(writes=(update("x", 1),), complete=TimerCompletion(ra.key, "fired", node_id="n1")))
    with pytest.raises(ConflictError):
        b.commit(Commit(writes=(update("x", 2),), complete=TimerCompletion(rb.key, "fired",
                                                                           node_id="n2")))
    assert a.get_timer(("x", 1)).state == DONE


def test_threads_sharing_a_store_never_get_the_same_row(dstore):
    """In-process moto, threads on one store object: soft claims are taken under the
    store's lock, so the rows handed out are disjoint and all are handed out."""
    import threading

    dstore.commit(Commit(timers_put=tuple(timer(f"i{n}", 1, 10) for n in range(40))))
    got: list = []
    start = threading.Barrier(4)

    def sweep(node):
        start.wait()
        while rows := dstore.claim_due(10, 3, node, MINUTE):
            got.extend(r.key for r in rows)

    threads = [threading.Thread(target=sweep, args=(f"n{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == sorted((f"i{n}", 1) for n in range(40))


def test_dead_timers_ordering_and_state(dstore):
    """In-process moto: dead rows list by key from the dead index."""
    dstore.commit(Commit(timers_put=(timer("b", 2, 10), timer("a", 9, 10), timer("a", 10, 10))))
    dstore.claim_due(10, 10, "n1", MINUTE)
    for key in [("b", 2), ("a", 10), ("a", 9)]:
        dstore.release(key, "n1", error="x", next_attempt_at_ms=20, dead=True)
    assert [r.key for r in dstore.dead_timers()] == [("a", 9), ("a", 10), ("b", 2)]
    assert {r.state for r in dstore.dead_timers()} == {DEAD}


def test_long_error_text_is_truncated(dstore):
    """In-process moto: a huge traceback cannot push a row over the item limit on release."""
    dstore.commit(Commit(timers_put=(timer("a", 1, 10),)))
    dstore.claim_due(10, 10, "n1", MINUTE)
    dstore.release(("a", 1), "n1", error="E" * 1_000_000, next_attempt_at_ms=20, dead=False)
    assert len(dstore.get_timer(("a", 1)).last_error) == 8_000


def _row_of_size(size, ordinal=1, **kw):
    """A pending row whose item is exactly ``size`` bytes (event data past msgpack's str32)."""
    base = timer("a", ordinal, 10, event={"name": "x", "data": "y" * 70_000}, **kw)
    n = 70_000 + size - codec.item_size(codec.timer_item(base, shards=4))
    row = timer("a", ordinal, 10, event={"name": "x", "data": "y" * n}, **kw)
    assert codec.item_size(codec.timer_item(row, shards=4)) == size
    return row


@pytest.mark.parametrize("dead", [False, True])
def test_a_timer_row_keeps_room_to_record_its_failure(dstore, dead):
    """In-process moto: a row is written only if it leaves ``TIMER_HEADROOM_BYTES`` free, so
    a failed delivery can always record itself on it, even with the longest error in
    multi-byte characters; before, a row within a few KB of the limit could not be released,
    and the sweeper that fired it crashed on every restart."""
    from statebound.dynamodb.store import MAX_ITEM_BYTES, TIMER_HEADROOM_BYTES
    biggest = MAX_ITEM_BYTES - TIMER_HEADROOM_BYTES
    with pytest.raises(ItemTooLarge, match="failed delivery") as err:
        dstore.commit(Commit(timers_put=(_row_of_size(biggest + 1),)))
    assert (err.value.size, err.value.limit) == (biggest + 1, biggest)
    assert dstore.get_timer(("a", 1)) is None
    dstore.commit(Commit(timers_put=(_row_of_size(biggest),)))
    assert dstore.claim_due(10, 10, "n1", MINUTE)
    dstore.release(("a", 1), "n1", error="é" * 20_000, next_attempt_at_ms=20, dead=dead)
    row = dstore.get_timer(("a", 1))
    assert (row.state, row.attempts) == (DEAD if dead else PENDING, 1)
    assert 0 < len(row.last_error.encode()) <= 8_000 and set(row.last_error) == {"é"}


def test_a_row_written_without_headroom_shortens_its_error_to_record_a_failure(mock_client, table, dstore):
    """In-process moto: a row put before the headroom existed (straight to the table here)
    still records its failure: the error is cut to what fits."""
    from statebound.dynamodb.store import MAX_ITEM_BYTES
    item = codec.timer_item(_row_of_size(MAX_ITEM_BYTES - 300), shards=dstore.shards)
    mock_client.put_item(TableName=table, Item=item)
    assert dstore.claim_due(10, 10, "n1", MINUTE)
    dstore.release(("a", 1), "n1", error="E" * 1_000_000, next_attempt_at_ms=20, dead=True)
    row = dstore.get_timer(("a", 1))
    assert (row.state, row.attempts) == (DEAD, 1)
    assert 0 < len(row.last_error) < 300


def test_positions_write_through_position_write_fields(dstore):
    """In-process moto: a PositionWrite with no parent leaves none; refs round-trip."""
    dstore.commit(Commit(writes=(PositionWrite("a", "c", None, b"b", "running",
                                               (TimerRef(0, "s0"),)),)))
    rec = dstore.load("a")
    assert (rec.parent, rec.timers) == (None, (TimerRef(0, "s0"),))
