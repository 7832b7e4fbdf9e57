"""A 0.1 table on which no 0.1 sweeper ever ran, upgraded by the first sweep.

0.1 keyed the due index by time bucket and shard (``gsi_pk = "<bucket>#<shard>"``), and
only its sweepers wrote the per-shard cursors (``sweep#<shard>``). A table that only 0.1
writers touched (``statebound start``, an API) therefore has 0.1-keyed rows and no cursor.
The sweeper used to look for cursors alone, took such a table for a new one and never read
its rows: the timers stayed pending forever, silently. It now also looks for the rows
themselves, once per table (a layout marker remembers the answer), and migrates.

The tables here are built the way the migration tests in ``test_dynamo_store.py`` build
them: the schema is 0.1's (``table_spec`` has not changed), the rows are written by this
version's host and their index keys rewritten to 0.1's form, and nothing else of 0.1 (no
cursor, no lease item) is left, as a table only 0.1 writers touched has none.
Requests are counted with botocore ``before-call`` hooks (``CallLog``).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import boto3
import pytest
from botocore.exceptions import ClientError

import statebound as sb
from statebound.dynamodb import DEAD_INDEX, DUE_INDEX, DynamoStore
from statebound.dynamodb import _codec as codec
from statebound.exceptions import StoreUnavailable
from statebound.host import SweepReport
from statebound.host.store import DEAD, Commit
from store_contract import timer

from .helpers import REGION, CallLog, make_store, server_client, table_items

MINUTE = 60_000
T0 = 1_800_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'
#: Two timers per instance, due in different 0.1 buckets (0.1's default bucket was a
#: minute); each ``tick`` counts, so a double fire shows as ``n == 3``.
COUNTER = sb.Chart.from_scxml(f"""<scxml {NS} name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <onentry><send event="tick" delay="1s"/><send event="tick" delay="150s"/></onentry>
    <transition event="tick"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>""")
TICKS = 2
LAYOUT_KEY = (codec.LAYOUT_PK, codec.LAYOUT_SK)


def legacy_table(client, name: str) -> str:
    """An empty table as 0.1 created it: the same schema, and no layout marker (0.1's
    ``create_table`` wrote no item)."""
    client.create_table(**DynamoStore.table_spec(name))
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    return name


def write_as_0_1(client, table: str, instances: int, *, shards: int = 4) -> list[str]:
    """``instances`` counter instances started at T0 by a writer only, their rows keyed
    the 0.1 way: ``gsi_pk = "<ready // bucket_ms>#<shard>"`` with 0.1's default bucket."""
    host = sb.Host([COUNTER], store=make_store(client, table, shards=shards), clock=sb.ManualClock(T0))
    ids = [f"c{i}" for i in range(instances)]
    for iid in ids:
        host.start(COUNTER, iid)
    for item in table_items(client, table, DUE_INDEX):
        key = (item["pk"]["S"], int(item["ordinal"]["N"]))
        legacy = f"{int(item['gsi_due']['N']) // MINUTE}#{codec.shard_of(key, shards)}"
        client.update_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]},
                           UpdateExpression="SET gsi_pk = :p", ExpressionAttributeValues={":p": {"S": legacy}})
    return ids


def assert_left_as_0_1_writers_leave_it(client, table: str) -> None:
    """Positions and timer rows only (no cursor, lease or marker), every row 0.1-keyed."""
    items = table_items(client, table)
    assert all(i["sk"]["S"] == codec.POSITION_SK or i["sk"]["S"].startswith(codec.TIMER_PREFIX) for i in items)
    partitions = {i["gsi_pk"]["S"] for i in table_items(client, table, DUE_INDEX)}
    assert partitions and all(codec.is_legacy_due_partition(p) for p in partitions)


def counts(host, ids) -> dict[str, int]:
    return {iid: host.get(iid).datamodel["n"] for iid in ids}


def marker(client, table):
    return client.get_item(TableName=table, Key={"pk": {"S": LAYOUT_KEY[0]}, "sk": {"S": LAYOUT_KEY[1]}},
                           ConsistentRead=True).get("Item")


# --------------------------------------------------------------------------- the fault


def test_a_0_1_table_without_cursors_fires_every_row_once(mock_client):
    """In-process moto, manual clock. Twelve instances, two timers each (due 1 s and 150 s
    out, so in different 0.1 buckets), written as 0.1 writers left them: no cursor. A
    sweeper of this version, run through the 150 s, fires all 24 rows, each exactly once;
    the table ends with no 0.1 partition left and the layout marker written. Before the fix
    it fired none."""
    table = legacy_table(mock_client, "upgrade-0-1")
    ids = write_as_0_1(mock_client, table, 12)
    assert_left_as_0_1_writers_leave_it(mock_client, table)

    clock = sb.ManualClock(T0)
    host = sb.Host([COUNTER], store=make_store(mock_client, table), clock=clock)
    sweeper = sb.Sweeper(host, node_id="new")
    fired = 0
    while clock.now_ms() <= T0 + 160_000:
        clock.advance(1_000)
        fired += sweeper.run_once().fired
    assert fired == TICKS * len(ids)
    assert counts(host, ids) == dict.fromkeys(ids, TICKS)
    assert [r for iid in ids for r in host.pending_timers(iid) if r.state != "done"] == []
    assert table_items(mock_client, table, DUE_INDEX) == []
    assert marker(mock_client, table)["layout"] == {"N": str(codec.LAYOUT)}


def test_the_check_costs_one_request_per_process_once_the_table_is_marked(mock_client):
    """In-process moto, botocore hooks. The first sweeper on the unmarked 0.1 table pays for
    the look once (the marker read rides in the cursor BatchGetItem; then one Query of 0.1's
    dead partition, a Scan of the due index stopped at the first 0.1 row, and the
    migration); a sweeper started afterwards pays one BatchGetItem and its shard reads, as
    on a table created by this version; an idle sweep after that sends nothing."""
    table = legacy_table(mock_client, "upgrade-cost")
    write_as_0_1(mock_client, table, 4)
    calls = CallLog(mock_client)
    try:
        first = make_store(mock_client, table)
        assert len(first.claim_due(T0 + 1_000, 100, "a", MINUTE)) == 4
        names = calls.take()
        assert names[:4] == ["BatchGetItem", "Query", "Scan", "Scan"]   # look, then the migration's Scan
        assert names[-first.shards:] == ["Query"] * first.shards and names.count("PutItem") == 1
        later = make_store(mock_client, table)
        assert len(later.claim_due(T0 + 1_000, 100, "b", MINUTE)) == 4   # still pending: never fired here
        assert calls.take() == ["BatchGetItem"] + ["Query"] * later.shards
        assert later.claim_due(T0 + 2_000, 100, "b", MINUTE) == []
        assert calls.take() == []
    finally:
        calls.close()


def test_an_unmarked_table_with_no_0_1_row_is_checked_once_and_marked(mock_client):
    """In-process moto, botocore hooks. A table this version's schema made without
    ``create_table`` (infrastructure code, or before the marker existed) holds only
    shard-keyed rows: the first sweeper's look is one Query, one Scan and the marker's
    PutItem, nothing is rewritten, and the next sweeper sees the marker."""
    table = legacy_table(mock_client, "iac-made")
    make_store(mock_client, table).commit(Commit(timers_put=(timer("a", 1, T0),)))
    calls = CallLog(mock_client)
    try:
        store = make_store(mock_client, table)
        assert [r.key for r in store.claim_due(T0, 10, "a", MINUTE)] == [("a", 1)]
        assert calls.take() == ["BatchGetItem", "Query", "Scan", "PutItem"] + ["Query"] * store.shards
        assert marker(mock_client, table) is not None
        calls.take()
        make_store(mock_client, table).claim_due(T0, 10, "b", MINUTE)
        assert calls.take() == ["BatchGetItem"] + ["Query"] * store.shards
    finally:
        calls.close()


def test_create_table_marks_only_a_table_it_created(mock_client):
    """In-process moto. ``create_table`` writes the marker on the table it creates, so a new
    table's first sweep is one BatchGetItem and its shard reads; run again on an existing
    0.1 table (a deploy script calling it at every start) it writes nothing, and the first
    sweep still migrates that table."""
    DynamoStore.create_table("fresh", mock_client)
    assert marker(mock_client, "fresh") is not None
    table = legacy_table(mock_client, "old")
    ids = write_as_0_1(mock_client, table, 3)
    DynamoStore.create_table(table, mock_client)   # exists: accepted, and left unmarked
    assert marker(mock_client, table) is None
    store = make_store(mock_client, table)
    assert sorted(r.key[0] for r in store.claim_due(T0 + 1_000, 100, "a", MINUTE)) == ids


def test_a_0_1_dead_row_alone_is_moved_too(mock_client):
    """In-process moto. An unmarked table whose only 0.1 trace is a dead row under 0.1's
    single ``"dead"`` partition: the look finds it with one Query, and the migration moves
    it to its shard's dead partition; it still lists."""
    table = legacy_table(mock_client, "dead-only")
    store = make_store(mock_client, table)
    store.commit(Commit(timers_put=(timer("d", 1, T0),)))
    mock_client.update_item(TableName=table, Key={"pk": {"S": "d"}, "sk": {"S": codec.timer_sk(1)}},
                            UpdateExpression="SET #s = :dead, dead_pk = :p, dead_sk = :k REMOVE gsi_pk, gsi_due",
                            ExpressionAttributeNames={"#s": "state"},
                            ExpressionAttributeValues={":dead": {"S": DEAD}, ":p": {"S": "dead"},
                                                       ":k": {"S": codec.dead_sort_key(("d", 1))}})
    assert store.claim_due(T0, 10, "a", MINUTE) == []
    assert {i["dead_pk"]["S"] for i in table_items(mock_client, table, DEAD_INDEX)} == {
        codec.dead_partition(store.shard_of(("d", 1)))}
    assert [r.key for r in store.dead_timers()] == [("d", 1)]


# --------------------------------------------------------------------------- half-way


def test_a_migration_cut_short_is_finished_by_the_next_sweep(mock_client):
    """In-process moto. The migration of an unmarked 0.1 table is throttled for good after
    its first row (StoreUnavailable out of the sweep, as every read and write is): one row
    is shard-keyed, the others still 0.1-keyed, no marker. The next sweep of the same store
    object looks again, finds the rest, and every row is claimed exactly once."""
    table = legacy_table(mock_client, "half")
    ids = write_as_0_1(mock_client, table, 6)
    client = boto3.client("dynamodb", region_name=REGION)
    state = {"updates": 0, "throttle": True}

    def throttle(**kwargs):
        state["updates"] += 1
        if state["throttle"] and state["updates"] > 1:
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException",
                                         "Message": "throttled"}}, "UpdateItem")
    client.meta.events.register("before-call.dynamodb.UpdateItem", throttle)
    store = make_store(client, table)
    with pytest.raises(StoreUnavailable):
        store.claim_due(T0 + 1_000, 100, "a", MINUTE)
    partitions = Counter(codec.is_legacy_due_partition(i["gsi_pk"]["S"])
                         for i in table_items(mock_client, table, DUE_INDEX))
    assert partitions == {True: TICKS * len(ids) - 1, False: 1} and marker(mock_client, table) is None
    state["throttle"] = False
    claimed = store.claim_due(T0 + 1_000, 100, "a", MINUTE)
    assert sorted(r.key[0] for r in claimed) == sorted(ids)
    assert marker(mock_client, table) is not None


# --------------------------------------------------------------------------- together


def test_sweepers_starting_together_on_a_0_1_table_fire_every_row_once(moto_endpoint):
    """Serialised moto server (one request at a time, so each conditional write is atomic
    as on DynamoDB); three sweepers, each with its own client and store as separate
    processes would have, start at once on an unmarked 0.1 table past every row's due
    time. Each may look and migrate; the migration's updates are conditional, the fires
    complete their rows conditionally: every row fires once, every counter counts two."""
    admin = server_client(moto_endpoint)
    table = legacy_table(admin, f"sb-up-{uuid.uuid4().hex[:8]}")
    ids = write_as_0_1(admin, table, 15)
    clock = sb.ManualClock(T0 + 200_000)
    sweepers = [sb.Sweeper(sb.Host([COUNTER], store=make_store(server_client(moto_endpoint), table), clock=clock,
                                   conflict_backoff_s=0.002), node_id=name) for name in "abc"]
    start = threading.Barrier(len(sweepers))
    reports: dict[str, SweepReport] = {}
    errors: list[BaseException] = []

    def run(sweeper):
        try:
            start.wait()
            reports[sweeper.node_id] = sweeper.run_until_idle()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in sweepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sum(r.fired for r in reports.values()) == TICKS * len(ids)   # the losers fired nothing
    checker = sb.Host([COUNTER], store=make_store(admin, table), clock=clock)
    assert counts(checker, ids) == dict.fromkeys(ids, TICKS)
    assert table_items(admin, table, DUE_INDEX) == []
