"""Group commit on DynamoDB (``dynamodb/_batch.py``), on in-process moto and the moto server:
``BatchGetItem`` loads (100 keys a request, unprocessed keys asked for again), and the
conditional writes of a group sent by a bounded thread pool, each its own request.
"""

from __future__ import annotations

import threading
import time

import pytest

import statebound as sb
from statebound.host.store import Commit, PositionWrite

from .helpers import make_store, server_client

T0 = 1_800_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'
COUNTER = sb.Chart.from_scxml(f"""<scxml {NS} name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <onentry><send event="inc" delay="1s"/></onentry>
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>""")


def _create(store, ids):
    out = store.commit_many([Commit(writes=(PositionWrite(i, "counter", None, i.encode(), "running"),))
                             for i in ids])
    assert out == [None] * len(ids)


class PartialClient:
    """The real client, except that the first ``partial`` BatchGetItem answers hand back
    the keys past ``keep`` of each request as UnprocessedKeys, as DynamoDB does when throttled."""

    def __init__(self, client, partial, keep=0.5):
        self._client = client
        self.partial = partial
        self.keep = keep
        self.batch_calls = 0

    def batch_get_item(self, RequestItems):
        self.batch_calls += 1
        if self.partial <= 0:
            return self._client.batch_get_item(RequestItems=RequestItems)
        self.partial -= 1
        [(table, spec)] = RequestItems.items()
        keys = spec["Keys"]
        half = int(len(keys) * self.keep)
        answer = self._client.batch_get_item(RequestItems={table: {**spec, "Keys": keys[:half]}}) if half \
            else {"Responses": {table: []}}
        if keys[half:]:
            answer["UnprocessedKeys"] = {table: {**spec, "Keys": keys[half:]}}
        return answer

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_load_many_is_one_consistent_batch_get_per_100_keys(mock_client, table, calls):
    store = make_store(mock_client, table)
    ids = [f"o{i:03d}" for i in range(250)]
    _create(store, ids)
    calls.take()
    got = store.load_many(ids + ["ghost", "o001"])
    assert sorted(got) == ids and got["o007"] == store.load("o007")
    assert calls.take()[:3] == ["BatchGetItem"] * 3


def test_unprocessed_keys_are_asked_for_again(mock_client, table):
    store = make_store(mock_client, table)
    ids = [f"o{i:02d}" for i in range(40)]
    _create(store, ids)
    flaky = PartialClient(mock_client, partial=2)
    slept = []
    got = make_store(flaky, table, sleep=slept.append).load_many(ids)
    assert sorted(got) == ids
    assert flaky.batch_calls == 3 and len(slept) == 2 and slept[1] > 0


def test_keys_left_unprocessed_for_good_are_store_unavailable(mock_client, table):
    store = make_store(mock_client, table)
    _create(store, ["a", "b"])
    with pytest.raises(sb.StoreUnavailable, match="unprocessed"):
        make_store(PartialClient(mock_client, partial=99, keep=0), table, retries=3).load_many(["a", "b"])


class SlowPuts:
    """The real client, with every PutItem held for a moment; counts how many overlap."""

    def __init__(self, client):
        self._client = client
        self._lock = threading.Lock()
        self.now = self.most = self.puts = 0

    def put_item(self, **kw):
        with self._lock:
            self.now += 1
            self.puts += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(0.02)
            return self._client.put_item(**kw)
        finally:
            with self._lock:
                self.now -= 1

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_commit_many_sends_each_commit_on_its_own_from_a_bounded_pool(moto_endpoint, server_table):
    """Serialised moto server (in-process moto is not thread-safe): the writes are in flight
    together on the client side, at most ``batch_workers`` at once."""
    slow = SlowPuts(server_client(moto_endpoint))
    store = make_store(slow, server_table, batch_workers=4)
    ids = [f"o{i:02d}" for i in range(20)]
    _create(store, ids)
    assert slow.puts == 20                      # one conditional PutItem each, no transaction
    assert 1 < slow.most <= 4
    assert sorted(store.load_many(ids)) == ids
    stale = store.commit_many([Commit(writes=(PositionWrite(i, "counter", None, b"again", "running"),))
                               for i in ids])
    assert all(isinstance(err, sb.ConflictError) for err in stale)     # each refused on its own


def _counters(client, table, n):
    """A host on DynamoDB with ``n`` started counters (each with a timer due in a second)."""
    clock = sb.ManualClock(T0)
    host = sb.Host([COUNTER], store=make_store(client, table), clock=clock)
    ids = [f"c{i:02d}" for i in range(n)]
    for iid in ids:
        host.start("counter", iid)
    return host, clock, ids


def test_host_send_many_on_dynamodb_costs_one_batch_get_and_one_write_each(mock_client, table, calls):
    host, _clock, ids = _counters(mock_client, table, 30)
    calls.take()
    results = host.send_many([(iid, "inc") for iid in ids])
    assert all(r.ok and r.position.datamodel["n"] == 1 for r in results)
    names = calls.take()
    assert names.count("BatchGetItem") == 1 and "GetItem" not in names
    assert names.count("PutItem") == 30 and len(names) == 31


def test_fire_due_on_dynamodb_fires_a_group(mock_client, table, calls):
    host, clock, ids = _counters(mock_client, table, 12)
    clock.advance(1000)
    calls.take()
    results = host.fire_due()
    assert sorted(r.key for r in results) == [(iid, 1) for iid in ids]
    assert {r.outcome for r in results} == {"fired"}
    names = calls.take()
    fire = names[max(i for i, n in enumerate(names) if n in ("Query", "Scan")) + 1:]   # after the claim
    # one read of the 12 instances, then position + completion, each its own transaction
    assert fire == ["BatchGetItem"] + ["TransactWriteItems"] * 12
    assert all(host.get(iid).datamodel["n"] == 1 for iid in ids)


def test_two_hosts_racing_batches_on_the_moto_server_lose_nothing(moto_endpoint, server_table):
    """Two hosts, two clients, the same 20 counters: every event of both batches lands
    once (the losers of a race re-run alone), on a server that makes writes atomic."""
    stores = [make_store(server_client(moto_endpoint), server_table) for _ in range(2)]
    hosts = [sb.Host([COUNTER], store=s, clock=sb.ManualClock(T0)) for s in stores]
    ids = [f"r{i:02d}" for i in range(20)]
    for iid in ids:
        hosts[0].start("counter", iid)
    results: list = [None, None]

    def run(k):
        results[k] = hosts[k].send_many([(iid, "inc", None, f"k{k}") for iid in ids] * 2)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.ok for rs in results for r in rs)
    assert [hosts[0].get(iid).datamodel["n"] for iid in ids] == [2] * 20   # one per key, per host
