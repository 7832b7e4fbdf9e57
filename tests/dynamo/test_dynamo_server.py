"""Races between processes, refereed by a **serialised moto server** (``moto_endpoint``):
werkzeug with ``threaded=False``, one request at a time, so each conditional write is
atomic as on DynamoDB. Each sweeper or node has its own boto3 session and client, as
separate processes would. In-process ``mock_aws`` cannot referee these races (its
condition check and write are not atomic across threads).
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from statebound.dynamodb import DUE_INDEX, DynamoStore, ShardLeases
from statebound.exceptions import ConflictError
from statebound.host.clock import ManualClock
from statebound.host.store import DONE, Commit, PositionWrite, TimerCompletion
from store_contract import timer

from .helpers import index_keys, make_store, server_client

NOW = 1_800_000_000_000
LEASE_MS = 30_000


def fire_all(store: DynamoStore, node: str, start: threading.Barrier, fired: list, lost: list):
    """A minimal sweeper: claim everything due, fire each row as the host would (load the
    target, commit its new position together with the completion), until nothing is due.

    A version conflict on the target (another row of the same instance fired meanwhile)
    is retried after a reload; a conflict because the row is already done is a lost race.
    DynamoStore reports the latter without an ``instance_id`` (it is about the row, not a
    version), so the sweeper needs no extra read to tell them apart.
    """
    order = random.Random(node)  # each sweeper its own order, so both win some races
    rows = store.claim_due(NOW, 500, node, LEASE_MS)
    start.wait()  # both have claimed before either fires: every row is contested
    while rows:
        order.shuffle(rows)
        for row in rows:
            for _ in range(50):
                rec = store.load(row.target_id)
                try:
                    store.commit(Commit(
                        writes=(PositionWrite(rec.instance_id, rec.chart, rec.version,
                                              rec.blob + b"!", rec.status, rec.timers),),
                        complete=TimerCompletion(row.key, "fired", node_id=node)))
                    fired.append(row.key)
                    break
                except ConflictError as exc:
                    if exc.instance_id is None:  # the row is done: the other sweeper won
                        lost.append(row.key)
                        break
            else:
                raise AssertionError(f"{node} kept conflicting on {row.key}")
        rows = store.claim_due(NOW, 500, node, LEASE_MS)


def race(endpoint, table, stores, timeout=120):
    """Run one ``fire_all`` thread per (node, store); return what each fired and lost."""
    start = threading.Barrier(len(stores))
    results = {node: ([], []) for node in stores}
    threads = [threading.Thread(target=fire_all, args=(store, node, start, *results[node]))
               for node, store in stores.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a sweeper hung"
    return results


def seed(endpoint, table, instances, per_instance):
    """Create the instances and their due timer rows (all due by NOW), several per commit."""
    store = make_store(server_client(endpoint), table)
    batch = max(1, 100 // (1 + per_instance))  # actions per commit stay within 100
    for first in range(0, instances, batch):
        ids = [f"order-{i}" for i in range(first, min(first + batch, instances))]
        store.commit(Commit(
            writes=tuple(PositionWrite(iid, "chart", None, b"start", "running") for iid in ids),
            timers_put=tuple(timer(iid, n, NOW - n) for iid in ids for n in range(per_instance))))
    return store


def test_two_sweepers_fire_each_of_200_rows_exactly_once(moto_endpoint, server_table):
    """Serialised moto server. Two sweepers, each with its own client and store, race over
    the same 200 due rows (40 instances x 5) without leases. Every row is fired exactly
    once in total, the losers got ConflictError, and each instance's position moved once
    per row: no fire was applied twice or lost."""
    checker = seed(moto_endpoint, server_table, instances=40, per_instance=5)
    stores = {node: make_store(server_client(moto_endpoint), server_table)
              for node in ("sweeper-a", "sweeper-b")}
    results = race(moto_endpoint, server_table, stores)

    fired = Counter(key for node_fired, _ in results.values() for key in node_fired)
    assert len(fired) == 200 and set(fired.values()) == {1}
    # both claimed all 200, so each row was attempted twice: one win, one ConflictError
    lost = Counter(key for _, node_lost in results.values() for key in node_lost)
    assert lost == fired
    assert all(results[node][0] for node in stores), "one sweeper won every race"
    for i in range(40):
        rec = checker.load(f"order-{i}")
        assert (rec.version, rec.blob) == (1 + 5, b"start" + b"!" * 5)
        assert all(checker.get_timer((f"order-{i}", n)).state == DONE for n in range(5))
    assert index_keys(server_client(moto_endpoint), server_table, DUE_INDEX) == set()


def test_sweepers_on_leased_shards_do_not_collide(moto_endpoint, server_table):
    """Serialised moto server. Two nodes split the shards with ShardLeases and sweep only
    their own (``owned_shards=leases``): all 60 rows fire once and no completion is lost
    to the other node."""
    seed(moto_endpoint, server_table, instances=60, per_instance=1)
    clock = ManualClock(NOW)
    leases = {node: ShardLeases(server_client(moto_endpoint), server_table, node, 4, LEASE_MS,
                                clock) for node in ("node-a", "node-b")}
    for _ in range(2):  # the second round hands over what the first node took alone
        for lease in leases.values():
            lease.acquire()
    assert leases["node-a"].held.isdisjoint(leases["node-b"].held)
    assert leases["node-a"].held | leases["node-b"].held == set(range(4))
    stores = {node: make_store(server_client(moto_endpoint), server_table, owned_shards=lease)
              for node, lease in leases.items()}
    results = race(moto_endpoint, server_table, stores)
    fired = Counter(key for node_fired, _ in results.values() for key in node_fired)
    assert len(fired) == 60 and set(fired.values()) == {1}
    assert sum(len(lost) for _, lost in results.values()) == 0
    assert all(results[node][0] for node in stores)  # both nodes did some of the work


# --------------------------------------------------------------------------- leases


def nodes(endpoint, table, clock, *names, shards=8):
    """ShardLeases for each name, each with its own client."""
    return [ShardLeases(server_client(endpoint), table, name, shards, LEASE_MS, clock)
            for name in names]


def test_leases_split_disjointly_and_hand_over(moto_endpoint, server_table):
    """Serialised moto server. The first node takes every shard; a second node takes its
    share at once (from a live holder that no longer prefers it); the first drops that share
    at its next renewal; then both hold disjoint, even halves."""
    clock = ManualClock(NOW)
    a, b = nodes(moto_endpoint, server_table, clock, "node-a", "node-b")
    assert a.acquire() == set(range(8))
    assert b.acquire() == {1, 3, 5, 7}  # taken at once, not after a's next renewal
    assert a.held == frozenset(range(8))   # a's view until it renews: a moment of overlap
    assert a.renew() == {0, 2, 4, 6}
    assert a.held.isdisjoint(b.held) and a.held | b.held == set(range(8))
    clock.advance(LEASE_MS // 2)
    assert a.acquire() == {0, 2, 4, 6} and b.renew() == {1, 3, 5, 7}  # steady state


def test_released_shards_can_be_taken(moto_endpoint, server_table):
    """Serialised moto server. After one node releases on shutdown, the other takes them all
    at once (the released node is no longer a member)."""
    clock = ManualClock(NOW)
    a, b = nodes(moto_endpoint, server_table, clock, "node-a", "node-b")
    a.acquire(), b.acquire(), a.renew(), b.acquire()
    a.release()
    assert a.held == frozenset()
    assert b.acquire() == set(range(8))


def test_expired_lease_is_taken_over(moto_endpoint, server_table):
    """Serialised moto server. A node that stops renewing loses its leases when they lapse:
    its own ``held`` empties, and another node takes the shards."""
    clock = ManualClock(NOW)
    a, b = nodes(moto_endpoint, server_table, clock, "node-a", "node-b")
    assert a.acquire() == set(range(8))
    clock.advance(LEASE_MS // 2)
    assert b.acquire() == {1, 3, 5, 7}  # its share; a is live and keeps the rest
    assert b.next_renewal_ms() == clock.now_ms() + b.renew_ms
    clock.set(b.next_renewal_ms())
    assert b.maybe_acquire() == {1, 3, 5, 7}
    assert b.next_renewal_ms() == NOW + LEASE_MS + 1   # the moment a's heartbeat runs out
    clock.set(b.next_renewal_ms())      # a never renewed: everything has lapsed
    assert a.held == frozenset()
    assert b.maybe_acquire() == set(range(8))
    assert a.renew() == set()          # too late: b owns them now
    assert b.held == frozenset(range(8))


def board_owners(endpoint, table):
    """The lease board's shard -> owner map, read straight from the table."""
    item = server_client(endpoint).get_item(TableName=table, Key={"pk": {"S": "lease#board"},
                                                                   "sk": {"S": "B"}})["Item"]
    return {int(s): v["S"] for s, v in item["owner"]["M"].items()}


def test_concurrent_acquires_converge_to_one_owner_per_shard(moto_endpoint, server_table):
    """Serialised moto server. Three nodes acquire at the same moment, several rounds: the
    board names one owner per shard at every step (it is one map), and once each node has
    renewed after the last change their views are disjoint and split the shards evenly."""
    clock = ManualClock(NOW)
    members = nodes(moto_endpoint, server_table, clock, "n1", "n2", "n3", shards=12)
    for _ in range(3):
        start = threading.Barrier(len(members))

        def run(lease, start=start):
            start.wait()
            lease.acquire()

        threads = [threading.Thread(target=run, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        owners = board_owners(moto_endpoint, server_table)
        assert set(owners) <= set(range(12)) and set(owners.values()) <= {"n1", "n2", "n3"}
    for m in members:   # a node that lost a race retries (RETRY_MS later, here at once)
        m.acquire()
    for m in members:
        m.renew()
    held = [m.held for m in members]
    for i, mine in enumerate(held):
        for other in held[i + 1:]:
            assert mine.isdisjoint(other)
    assert frozenset().union(*held) == frozenset(range(12))
    assert sorted(len(h) for h in held) == [4, 4, 4]
    assert board_owners(moto_endpoint, server_table) == {s: m.node_id for m in members for s in m.held}


@pytest.mark.parametrize("shards", [1])
def test_single_shard_lease_has_one_owner(moto_endpoint, server_table, shards):
    """Serialised moto server. With one shard, one of two nodes holds it, never both."""
    clock = ManualClock(NOW)
    a, b = nodes(moto_endpoint, server_table, clock, "node-a", "node-b", shards=shards)
    a.acquire(), b.acquire(), a.renew(), b.acquire()
    assert len(a.held) + len(b.held) == 1
