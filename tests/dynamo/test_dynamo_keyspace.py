"""Instance ids cannot reach internal items (issue #12, item 2), on in-process moto.

Leases, membership heartbeats and sweep cursors share the table with instances, and an
instance id is whatever a client sends. Before the fix, ``POST /instances/lease%23members``
created an instance whose position item sat in the membership partition, and every
``ShardLeases.live_members`` crashed on it with ``KeyError 'expires_ms'``. These tests drive
hostile ids through the host and the store, then run leases and a sweeper beside them.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings

import statebound as sb
from statebound.dynamodb import MAX_INSTANCE_ID_BYTES, ShardLeases
from statebound.exceptions import InvalidInstanceId
from store_contract import hostile_ids, portable

from .helpers import make_store, tick_chart

T0 = 1_800_000_000_000
SHARDS = 4

TICK = tick_chart("1s")


def _host_accepts(iid: str) -> bool:
    """Whether Host.start's own id check lets ``iid`` through (the store may still refuse)."""
    try:
        sb.Host([TICK]).start(TICK, iid)
        return True
    except ValueError:
        return False


@pytest.fixture
def world(mock_client, table):
    """A host on DynamoStore whose sweeps are restricted to the shards a lease holder owns."""
    clock = sb.ManualClock(T0)
    leases = ShardLeases(mock_client, table, "sweeper-1", SHARDS, 30_000, clock)
    store = make_store(mock_client, table, shards=SHARDS, owned_shards=leases)
    host = sb.Host([TICK], store=store, clock=clock)
    return host, leases, clock


def test_an_instance_named_like_the_membership_partition_does_not_break_leases(world):
    """The reported break: an instance called ``lease#members``, then a lease round."""
    host, leases, clock = world
    host.start(TICK, "lease#members")
    assert leases.acquire() == set(range(SHARDS))
    assert leases.live_members() == ["sweeper-1"]
    clock.advance(1_000)
    assert sb.Sweeper(host).run_until_idle().fired == 1
    assert host.get("lease#members").configuration == frozenset({"fired"})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(iid=hostile_ids())
@example(iid="lease#members")
@example(iid="sweep#0")
@example(iid="lease#0")
@example(iid="x" * MAX_INSTANCE_ID_BYTES)
@example(iid="x" * (MAX_INSTANCE_ID_BYTES + 1))
@example(iid="😀" * 256)   # 1,024 bytes: within the host's 512 characters, over the key limit
def test_hostile_ids_through_the_host_never_disturb_leases_or_the_sweeper(world, iid):
    """Any id either runs a whole timer life (start, lease round, sweep, fire) or is
    refused with InvalidInstanceId (the host's rules or the key limits)
    with nothing written, and the lease and sweep machinery keeps working either way."""
    host, leases, clock = world
    store = host.store
    started = False
    try:
        host.start(TICK, iid)
    except InvalidInstanceId as exc:
        if _host_accepts(iid):           # the key limits, the store's
            assert not portable(iid), f"{iid!r} should be storable: {exc}"
            with pytest.raises(InvalidInstanceId):
                store.load(iid)
        # else the host's own rules ('::', length), which the store need not share
    else:
        assert _host_accepts(iid)
        started = True
        # (one row; its ordinal goes on from a deleted instance of the same id: ADR 0028)
        assert [r.instance_id for r in host.pending_timers(iid)] == [iid]
    assert leases.acquire() == set(range(SHARDS))
    assert leases.live_members() == ["sweeper-1"]
    clock.advance(1_000)
    report = sb.Sweeper(host).run_until_idle()
    if started:
        assert report.fired == 1
        assert host.get(iid).configuration == frozenset({"fired"})
        host.delete(iid)
    else:
        assert report.total == 0
    # a cold-started store (new process) reads the same cursors and leases without tripping
    fresh = make_store(store.client, store.table_name, shards=SHARDS)
    assert fresh.claim_due(clock.now_ms(), 10, "probe", 1_000) == []
    leases.release()


def test_store_refuses_ids_over_the_key_limit_before_any_request(mock_client, table, calls):
    """The 1,024-byte sort-key limit of the dead index, checked before DynamoDB sees it."""
    store = make_store(mock_client, table)
    calls.take()
    for iid in ("é" * (MAX_INSTANCE_ID_BYTES // 2 + 1), "\ud800", ""):
        with pytest.raises(InvalidInstanceId):
            store.load(iid)
        with pytest.raises(InvalidInstanceId):
            store.pending_timers(iid)
    assert calls.take() == []
