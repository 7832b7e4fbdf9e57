"""Group commit: ``host.send_many`` and ``host.fire_many``/``fire_due`` (``host/batch.py``).

Every batch is checked against the same calls made one by one: equal results, equal
stored positions. Transactions are counted on SQLite (``BEGIN`` statements through the
store's ``_execute`` seam) and with ``MemoryStore.group_commits``.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statebound as sb
from statebound.host import SendResult
from statebound.host.store import DONE, PENDING

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

# every event is written down, in order; "stop" halts
LOG = f"""<scxml {NS} name="log" initial="s">
  <datamodel><data id="got" expr="[]"/></datamodel>
  <state id="s">
    <transition event="stop" target="end"/>
    <transition event="*"><assign location="got" expr="got + [_event.name]"/></transition>
  </state>
  <final id="end"/>
</scxml>"""

# the parent writes down what it hears; its child tells it when told to
PARENT = f"""<scxml {NS} name="parent" initial="p">
  <datamodel><data id="got" expr="[]"/></datamodel>
  <state id="p">
    <invoke id="kid">
      <content>
        <scxml {NS} name="kid" initial="k">
          <state id="k"><transition event="tell"><send event="told" target="#_parent"/></transition></state>
        </scxml>
      </content>
    </invoke>
    <transition event="*"><assign location="got" expr="got + [_event.name]"/></transition>
  </state>
</scxml>"""

# one delayed inc at start; each inc logs (the on_log hook can fail a delivery)
TICKER = f"""<scxml {NS} name="ticker" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <onentry><send event="inc" delay="1s"/></onentry>
    <transition event="inc"><assign location="n" expr="n + 1"/><log label="inc" expr="n"/></transition>
    <transition event="again"><send event="inc" delay="1s"/></transition>
    <transition event="ship"><send type="receipts" event="shipped" delay="1s"/></transition>
  </state>
</scxml>"""

# an outbox send at once, on an external event
SHOP = f"""<scxml {NS} name="shop" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="buy"><assign location="n" expr="n + 1"/>
      <send type="receipts" event="receipt"><param name="n" expr="n"/></send></transition>
  </state>
</scxml>"""

CHARTS = [sb.Chart.from_scxml(t) for t in (LOG, PARENT, TICKER, SHOP)]


class Counted:
    """Counts a store's transactions (SQLite ``BEGIN``s) and single loads."""

    def __init__(self, store):
        self.store = store
        self.begins = 0
        self.loads = 0
        orig_load = store.load

        def load(iid):
            self.loads += 1
            return orig_load(iid)
        store.load = load
        if isinstance(store, sb.SQLiteStore):
            orig = store._execute

            def execute(sql, params=()):
                if sql.startswith("BEGIN"):
                    self.begins += 1
                return orig(sql, params)
            store._execute = execute

    def reset(self):
        self.begins = self.loads = 0


def _store(kind, tmp_path, name="b.db"):
    return sb.SQLiteStore(tmp_path / name) if kind == "sqlite" else sb.MemoryStore()


@pytest.fixture(params=["sqlite", "memory"])
def kind(request):
    return request.param


def _host(store, clock=None, **kw):
    kw.setdefault("on_log", lambda *a: None)
    return sb.Host(CHARTS, store=store, clock=clock or sb.ManualClock(T0), **kw)


def _got(host, iid):
    return host.get(iid).datamodel["got"]


# ----------------------------------------------------------------------------- send_many


def test_one_group_commit_for_independent_instances(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    for i in range(5):
        host.start("log", f"o{i}")
    c = Counted(host.store)
    results = host.send_many([(f"o{i}", "pay", {"i": i}) for i in range(5)])
    assert [r.index for r in results] == list(range(5))
    assert all(isinstance(r, SendResult) and r.ok for r in results)
    assert c.loads == 0                                   # one load_many, no single loads
    assert [r.position.datamodel["got"] for r in results] == [["pay"]] * 5
    assert [_got(host, f"o{i}") for i in range(5)] == [["pay"]] * 5
    assert host.metrics["group_commits"] == 1
    if kind == "sqlite":
        assert c.begins == 1                              # one transaction, one fsync
    else:
        assert host.store.group_commits == 1


def test_max_batch_bounds_each_group(tmp_path):
    host = _host(sb.MemoryStore(), max_batch=40)
    for i in range(100):
        host.start("log", f"o{i}")
    assert all(r.ok for r in host.send_many([(f"o{i}", "e") for i in range(100)]))
    assert host.store.group_commits == 3
    one = _host(sb.MemoryStore(), max_batch=1)
    one.start("log", "x")
    one.start("log", "y")
    assert all(r.ok for r in one.send_many([("x", "e"), ("y", "e")]))
    assert one.store.group_commits == 0 and one.metrics["commits"] == 4


def test_items_of_one_instance_apply_in_input_order(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    host.start("log", "a")
    host.start("log", "b")
    results = host.send_many([("a", "one"), ("b", "one"), ("a", "two"), ("a", "three"), ("b", "two")])
    assert all(r.ok for r in results)
    assert _got(host, "a") == ["one", "two", "three"] and _got(host, "b") == ["one", "two"]
    assert results[2].position.datamodel["got"] == ["one", "two"]   # each result is its own moment
    assert host.metrics["group_commits"] == 3                        # split where "a" came back


def test_every_item_gets_its_own_typed_error_and_the_rest_apply(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    host.start("log", "ok")
    host.start("log", "halted")
    host.send("halted", "stop")
    before = host.store.load("halted").version
    results = host.send_many([
        ("ghost", "e"),                          # 0
        ("halted", "e"),                         # 1
        ("ok",),                                 # 2
        42,                                      # 3
        ("ok", "e", None, 5),                    # 4 a key that is not a string
        ("ok", sb.Event("e", 1), 2),             # 5 data twice
        (7, "e"),                                # 6
        ("ok", "e", {"bad": {1, 2}}, "k9"),      # 7 keyed data that cannot be stored
        ("", "e"),                               # 8
        ("ok", "good"),                          # 9
    ])
    errors = [type(r.error) for r in results]
    assert errors == [sb.InstanceNotFound, sb.NotRunning, sb.InvalidBatchItem, sb.InvalidBatchItem,
                      sb.InvalidArgument, sb.InvalidArgument, sb.InvalidBatchItem, sb.SerializationError,
                      sb.InvalidInstanceId, type(None)]
    assert isinstance(results[4].error, ValueError) and isinstance(results[5].error, TypeError)   # as before
    assert [r.index for r in results] == list(range(10))
    assert results[0].instance_id == "ghost" and results[3].instance_id is None
    assert results[2].error.index == 2
    assert results[9].ok and results[9].unwrap().datamodel["got"] == ["good"]
    with pytest.raises(sb.NotRunning):
        results[1].unwrap()
    assert _got(host, "ok") == ["good"]                    # nothing of the bad items was written
    assert host.store.load("halted").version == before


def test_idempotency_keys_hold_within_and_across_batches(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    host.start("log", "a")
    host.start("log", "b")
    batch = [("a", "pay", {"n": 1}, "k1"), ("a", "pay", {"n": 1}, "k1"), ("b", "pay", {"n": 1}, "k1"),
             ("a", "pay", {"n": 2}, "k1"), ("a", "ship", None, "k2")]
    first = host.send_many(batch)
    assert [type(r.error) for r in first] == [type(None), type(None), type(None), sb.IdempotencyKeyReused,
                                              type(None)]
    assert _got(host, "a") == ["pay", "ship"] and _got(host, "b") == ["pay"]
    assert first[1].position.datamodel["got"] == ["pay"]      # the repeat returns the position as it was
    version = host.store.load("a").version
    again = host.send_many(batch)                             # a client re-sending the whole batch
    assert [type(r.error) for r in again] == [type(r.error) for r in first]
    assert _got(host, "a") == ["pay", "ship"] and _got(host, "b") == ["pay"]
    assert host.store.load("a").version == version
    assert host.metrics["duplicates"] == 1 + 4


def test_a_send_routed_into_the_group_waits_for_its_commit(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    host.start("parent", "p")
    kid = "p::kid"
    assert host.exists(kid)
    # p first, then the child, whose send goes to p: found only when the child runs
    results = host.send_many([("p", "note"), (kid, "tell"), ("p", "after")])
    assert all(r.ok for r in results)
    assert _got(host, "p") == ["note", "told", "after"]
    assert host.metrics["group_commits"] == 3
    seq = _host(_store(kind, tmp_path, "seq.db"))
    seq.start("parent", "p")
    for iid, ev in (("p", "note"), (kid, "tell"), ("p", "after")):
        seq.send(iid, ev)
    assert seq.store.load("p").blob == host.store.load("p").blob


def test_a_conflicting_item_commits_alone_and_the_others_in_the_group(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    other = _host(host.store)
    for i in range(3):
        host.start("log", f"o{i}")
    orig = host.store.commit_many
    calls = []

    def commit_many(commits):
        if not calls:
            other.send("o1", "meanwhile")     # another process wins the race for o1
        calls.append(len(commits))
        return orig(commits)
    host.store.commit_many = commit_many
    results = host.send_many([(f"o{i}", "e") for i in range(3)])
    assert all(r.ok for r in results)
    assert calls == [3]
    assert [_got(host, f"o{i}") for i in range(3)] == [["e"], ["meanwhile", "e"], ["e"]]
    assert results[1].position.datamodel["got"] == ["meanwhile", "e"]
    assert host.metrics["conflicts"] == 1


def test_an_item_the_store_cannot_take_fails_alone(tmp_path):
    host = _host(sb.SQLiteStore(tmp_path / "b.db"))
    for i in range(3):
        host.start("log", f"o{i}")
    orig = host.store.commit_many

    def commit_many(commits):          # the store refuses o1's commit in its slot
        out = orig([c for c in commits if c.writes[0].instance_id != "o1"])
        return [sb.ItemTooLarge("o1 is too big", 500_000, 400_000) if c.writes[0].instance_id == "o1"
                else out.pop(0) for c in commits]
    host.store.commit_many = commit_many
    results = host.send_many([(f"o{i}", "e") for i in range(3)])
    assert [type(r.error) for r in results] == [type(None), sb.ItemTooLarge, type(None)]
    assert [_got(host, f"o{i}") for i in range(3)] == [["e"], [], ["e"]]


def test_a_failed_transaction_is_every_items_error_and_writes_nothing(kind, tmp_path):
    host = _host(_store(kind, tmp_path))
    for i in range(3):
        host.start("log", f"o{i}")

    def down(commits):
        raise sb.StoreUnavailable("disk gone")
    host.store.commit_many = down
    results = host.send_many([(f"o{i}", "e") for i in range(3)])
    assert all(isinstance(r.error, sb.StoreUnavailable) for r in results)
    assert [_got(host, f"o{i}") for i in range(3)] == [[], [], []]


def test_a_store_without_group_commit_gets_one_commit_per_item(tmp_path):
    class Plain:
        """Only the Store protocol: a wrapper written before group commit existed."""

        def __init__(self, inner):
            self.inner = inner
            self.commits = 0

        def commit(self, commit):
            self.commits += 1
            return self.inner.commit(commit)

        def __getattr__(self, name):
            if name in ("commit_many", "load_many"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    store = Plain(sb.SQLiteStore(tmp_path / "plain.db"))
    host = _host(store)
    host.start("log", "a")
    host.start("log", "b")
    results = host.send_many([("a", "e"), ("b", "e"), ("ghost", "e"), ("a", "f")])
    assert [type(r.error) for r in results] == [type(None), type(None), sb.InstanceNotFound, type(None)]
    assert _got(host, "a") == ["e", "f"] and store.commits == 2 + 3
    assert host.metrics["group_commits"] == 0   # the key is there from the start (docs/batch.md)


def test_outbox_rows_of_a_batch_are_delivered_after_its_commit(kind, tmp_path):
    seen = []
    store = _store(kind, tmp_path)

    def receipts(d):
        # the commit that asked for the receipt has landed when it is handed over
        seen.append((d.instance_id, d.data["n"], sb.Host(CHARTS, store=store).get(d.instance_id).datamodel["n"]))
    host = _host(store, processors={"receipts": receipts})
    for i in range(3):
        host.start("shop", f"s{i}")
    results = host.send_many([("s0", "buy"), ("s1", "buy"), ("s2", "buy"), ("s0", "buy")])
    assert all(r.ok for r in results)
    assert sorted(seen) == [("s0", 1, 1), ("s0", 2, 2), ("s1", 1, 1), ("s2", 1, 1)]
    assert all(r.state == DONE for i in range(3) for r in [store.get_timer((f"s{i}", 1))])
    assert [host.pending_timers(f"s{i}") for i in range(3)] == [[], [], []]


ITEMS = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "ghost", "p", "p::kid"]),
                           st.sampled_from(["x", "y", "stop", "tell"]),
                           st.sampled_from([None, {"v": 1}]),
                           st.sampled_from([None, None, "k1", "k2"])), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS, max_batch=st.sampled_from([1, 2, 3, 100]))
def test_a_batch_equals_the_same_sends_one_by_one(items, max_batch):
    batch, seq = _host(sb.MemoryStore(), max_batch=max_batch), _host(sb.MemoryStore())
    for h in (batch, seq):
        for iid in "abc":
            h.start("log", iid)
        h.start("parent", "p")
    got = batch.send_many(items)
    for r, (iid, ev, data, key) in zip(got, items, strict=True):
        try:
            pos = seq.send(iid, ev, data, idempotency_key=key)
        except Exception as exc:  # whatever send raises, send_many must report
            assert type(r.error) is type(exc)
        else:
            assert r.ok and r.position == pos
    assert {i: r.blob for i, r in batch.store._positions.items()} == \
        {i: r.blob for i, r in seq.store._positions.items()}


# ----------------------------------------------------------------------------- fire_many


def _tickers(host, n, clock):
    for i in range(n):
        host.start("ticker", f"t{i:03d}")
    clock.advance(1000)


def test_fire_due_fires_independent_rows_in_one_group_commit(kind, tmp_path):
    clock = sb.ManualClock(T0)
    host = _host(_store(kind, tmp_path), clock)
    _tickers(host, 30, clock)
    c = Counted(host.store)
    results = host.fire_due(limit=100)
    assert c.loads == 0
    assert [r.key for r in results] == [(f"t{i:03d}", 1) for i in range(30)]
    assert {r.outcome for r in results} == {"fired"} and host.metrics["fired"] == 30
    assert all(host.get(f"t{i:03d}").datamodel["n"] == 1 for i in range(30))
    assert all(host.store.get_timer((f"t{i:03d}", 1)).state == DONE for i in range(30))
    if kind == "sqlite":
        assert c.begins == 2                              # the claim, then one group commit
    assert host.fire_due() == []


def test_fire_many_keeps_the_order_of_one_instances_rows(kind, tmp_path):
    clock = sb.ManualClock(T0)
    host = _host(_store(kind, tmp_path), clock)
    _tickers(host, 2, clock)
    host.send("t000", "again")                # a second row of t000, due a second later
    clock.advance(1000)
    results = host.fire_due()
    assert [(r.key, r.outcome) for r in results] == [(("t000", 1), "fired"), (("t001", 1), "fired"),
                                                     (("t000", 2), "fired")]
    assert host.get("t000").datamodel["n"] == 2 and host.get("t001").datamodel["n"] == 1
    assert host.metrics["group_commits"] == 2


def test_a_failing_delivery_is_released_alone(kind, tmp_path):
    clock = sb.ManualClock(T0)

    def on_log(iid, label, value):
        if iid == "t001":
            raise RuntimeError("log sink down")
    host = _host(_store(kind, tmp_path), clock, on_log=on_log)
    _tickers(host, 3, clock)
    results = host.fire_due()
    assert [r.outcome for r in results] == ["fired", "failed", "fired"]
    row = host.store.get_timer(("t001", 1))
    assert row.state == PENDING and row.attempts == 1 and "log sink down" in row.last_error
    assert [host.get(f"t{i:03d}").datamodel["n"] for i in range(3)] == [1, 0, 1]


def test_a_failure_the_store_cannot_record_never_stops_the_sweep(kind, tmp_path, caplog):
    """A store that refuses to record a failed delivery (a row too large to write back, a
    row it can no longer decode) loses that row's record, not the sweep: the other rows
    fire, the sweeper is not crashed, the row is tried again when its claim lapses."""
    clock = sb.ManualClock(T0)

    def on_log(iid, label, value):
        if iid == "t001":
            raise RuntimeError("log sink down")
    store = _store(kind, tmp_path)

    def refuse(*args, **kwargs):
        raise sb.StoreError("row cannot be written back")
    store.release = refuse
    host = _host(store, clock, on_log=on_log)
    _tickers(host, 3, clock)
    report = sb.Sweeper(host, batch=10, lease_s=5).run_once()
    assert (report.fired, report.failed) == (2, 1)
    assert [host.get(f"t{i:03d}").datamodel["n"] for i in range(3)] == [1, 0, 1]
    assert "could not be recorded" in caplog.text and "('t001', 1)" in caplog.text
    clock.advance(5_001)    # the claim lapsed: the row is delivered again
    del store.release
    assert [r.outcome for r in host.fire_due()] == ["failed"]
    assert host.store.get_timer(("t001", 1)).attempts == 1


def test_a_row_completed_elsewhere_is_skipped_and_the_rest_fire(kind, tmp_path):
    clock = sb.ManualClock(T0)
    host = _host(_store(kind, tmp_path), clock)
    _tickers(host, 3, clock)
    rows = host.store.claim_due(clock.now_ms(), 10, "me", 30_000)
    host.fire(rows[1], node_id="me")          # fired already, by a retry of this node
    results = host.fire_many(rows, node_id="me")
    assert [r.outcome for r in results] == ["fired", "skipped", "fired"]
    assert [host.get(f"t{i:03d}").datamodel["n"] for i in range(3)] == [1, 1, 1]


def test_outbox_rows_fire_alone_in_their_place(kind, tmp_path):
    clock = sb.ManualClock(T0)
    got = []
    host = _host(_store(kind, tmp_path), clock, processors={"receipts": lambda d: got.append(d.instance_id)})
    _tickers(host, 2, clock)
    host.send("t000", "ship")                 # a delayed processor send, due with the timers
    clock.advance(1000)
    results = host.fire_due()
    assert sorted((r.key, r.outcome) for r in results) == [(("t000", 1), "fired"), (("t000", 2), "delivered"),
                                                           (("t001", 1), "fired")]
    assert got == ["t000"]


def _sqlite_state(path):
    con = sqlite3.connect(path)
    try:
        return (con.execute("SELECT instance_id, version, blob, status FROM positions ORDER BY 1").fetchall(),
                con.execute("SELECT instance_id, ordinal, state, outcome, attempts FROM timers ORDER BY 1, 2")
                .fetchall())
    finally:
        con.close()


def test_a_batched_sweep_leaves_the_store_as_one_fire_at_a_time(tmp_path):
    ends = []
    for max_batch in (100, 1):
        clock = sb.ManualClock(T0)
        path = tmp_path / f"sweep-{max_batch}.db"
        host = _host(sb.SQLiteStore(path), clock, max_batch=max_batch)
        _tickers(host, 12, clock)
        host.send("t003", "again")
        host.send("t005", "again")
        clock.advance(1000)
        sweeper = sb.Sweeper(host, batch=5, node_id="n")
        assert sweeper.run_until_idle().fired == 14
        host.store.close()
        ends.append(_sqlite_state(path))
    assert ends[0] == ends[1]


def test_a_host_that_overrides_fire_still_sees_every_fire(tmp_path):
    seen = []

    class Observed(sb.Host):
        def fire(self, row, *, node_id=None):
            result = super().fire(row, node_id=node_id)
            seen.append((row.key, result.outcome))
            return result
    clock = sb.ManualClock(T0)
    host = Observed(CHARTS, store=sb.MemoryStore(), clock=clock, on_log=lambda *a: None)
    _tickers(host, 3, clock)
    results = host.fire_due()
    assert seen == [(r.key, "fired") for r in results] and len(seen) == 3
    assert host.store.group_commits == 0                  # each through its own fire, as before
    wrapped = _host(sb.MemoryStore(), clock)
    _tickers(wrapped, 2, clock)
    orig = wrapped.fire
    wrapped.fire = lambda row, **kw: seen.append(row.key) or orig(row, **kw)
    assert len(wrapped.fire_due()) == 2 and seen[-2:] == [("t000", 1), ("t001", 1)]


# ----------------------------------------------------------------------------- with history, suspend, tracing


def test_a_batch_records_the_history_of_each_item_as_sends_would(tmp_path):
    hosts = [_host(sb.SQLiteStore(tmp_path / f"h{k}.db"), history=True) for k in range(2)]
    for h in hosts:
        for iid in ("a", "b"):
            h.start("log", iid)
    items = [("a", "x", None, "k1"), ("b", "y"), ("a", "z")]
    assert all(r.ok for r in hosts[0].send_many(items))
    for iid, ev, *rest in items:
        hosts[1].send(iid, ev, *rest[:1], idempotency_key=rest[1] if len(rest) > 1 else None)

    def trail(h, iid):
        return [(r.version, r.kind, r.steps, r.configuration, r.call) for r in h.store.history(iid)]
    for iid in ("a", "b"):
        assert trail(hosts[0], iid) == trail(hosts[1], iid) and len(trail(hosts[0], iid)) >= 2
        assert hosts[0].replay(iid).identical


def test_a_suspended_instance_refuses_its_items_and_parks_its_timers_in_a_group(kind, tmp_path):
    clock = sb.ManualClock(T0)
    host = _host(_store(kind, tmp_path), clock)
    _tickers(host, 3, clock)
    rows = host.store.claim_due(clock.now_ms(), 10, "me", 30_000)     # claimed before the suspend
    host.suspend("t001")
    results = host.fire_many(rows, node_id="me")
    assert [r.outcome for r in results] == ["fired", "parked", "fired"]
    assert host.store.get_timer(("t001", 1)).state == "suspended"
    got = host.send_many([("t000", "again"), ("t001", "again")])
    assert got[0].ok and isinstance(got[1].error, sb.InstanceSuspended)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_with_a_tracer_every_item_is_its_own_span_and_group_commit_stays(tmp_path, store):
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    clock = sb.ManualClock(T0)
    host = _host(sb.MemoryStore() if store == "memory" else sb.SQLiteStore(tmp_path / "t.db"), clock, tracer=tracer)
    _tickers(host, 2, clock)
    exporter.clear()
    groups = host.metrics.get("group_commits", 0)
    with tracer.start_as_current_span("batch job") as job:
        results = host.send_many([("t000", "again"), ("ghost", "again"), ("t001", "again")])
    assert [type(r.error) for r in results] == [type(None), sb.InstanceNotFound, type(None)]
    assert host.metrics["group_commits"] == groups + 1          # both applied items: one transaction
    sends = sorted((s for s in exporter.get_finished_spans() if s.name == "statebound.send"),
                   key=lambda s: s.start_time)
    assert [s.attributes["statebound.instance"] for s in sends] == ["t000", "ghost", "t001"]
    assert [s.attributes["statebound.outcome"] for s in sends] == ["ok", "InstanceNotFound", "ok"]
    assert all(s.parent.span_id == job.get_span_context().span_id for s in sends)
    assert [s.attributes.get("statebound.chart") for s in sends] == ["ticker", None, "ticker"]
    assert sends[1].status.status_code == StatusCode.ERROR and [e.name for e in sends[1].events] == ["exception"]
    # each applied item's rows carry its own span's traceparent...
    for s in (sends[0], sends[2]):
        rows = host.pending_timers(s.attributes["statebound.instance"])
        assert {r.caller_context["traceparent"].split("-")[2] for r in rows} >= {f"{s.context.span_id:016x}"}
    exporter.clear()
    clock.advance(1000)
    groups = host.metrics.get("group_commits", 0)
    assert [r.outcome for r in host.fire_due()] == ["fired"] * 4       # the starts' rows and the sends'
    assert host.metrics["group_commits"] == groups + 2                 # one row per instance per group
    fires = [s for s in exporter.get_finished_spans() if s.name == "statebound.fire"]
    # ...and each fire's span links to the call that armed its row
    assert len(fires) == 4 and all(len(s.links) == 1 for s in fires)
    assert {s.links[0].context.span_id for s in fires} >= {sends[0].context.span_id, sends[2].context.span_id}
    assert [s.attributes["statebound.outcome"] for s in fires] == ["fired"] * 4
    assert all(s.parent is None for s in fires)


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys):
    root = Path(__file__).resolve().parents[1]
    [block] = re.findall(r"```python\n(.*?)```", (root / "docs" / "batch.md").read_text(), re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(block.replace('"examples/', f'"{root}/examples/'), "batch.md", "exec"), {})
    # (a test elsewhere may have pointed the statebound logger at stdout)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("order-")]
    assert lines[:3] == [f"order-{i} ['Started']" for i in (1, 2, 3)]
    assert lines[3].startswith("order-9 refused: InstanceNotFound(")
