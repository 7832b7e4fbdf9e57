"""Host and Sweeper semantics, on SQLiteStore (and MemoryStore where it is cheap).

Every refusal is checked to write nothing: the store's ``commit`` is spied on, and for
SQLite the whole database is dumped before and after and compared.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

import statebound as sb
import statebound.host.host as host_mod
from statebound.host.store import DEAD, DONE, PENDING

ROOT = Path(__file__).resolve().parent.parent
ORDER = ROOT / "examples" / "order" / "order.scxml"
T0 = 1_700_000_000_000

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

COUNTER = f"""<scxml {NS} name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
    <transition event="stop" target="end"/>
  </state>
  <final id="end"/>
</scxml>"""

# go sends a, b, c to itself; a sends d. FIFO gives a b c d; a LIFO/stack would give a d b c.
FIFO = f"""<scxml {NS} name="fifo" initial="s">
  <datamodel><data id="log" expr="[]"/></datamodel>
  <state id="s">
    <transition event="go">
      <send event="a"/><send event="b"/><send event="c"/>
    </transition>
    <transition event="a"><assign location="log" expr="log + ['a']"/><send event="d"/></transition>
    <transition event="b"><assign location="log" expr="log + ['b']"/></transition>
    <transition event="c"><assign location="log" expr="log + ['c']"/></transition>
    <transition event="d"><assign location="log" expr="log + ['d']"/></transition>
  </state>
</scxml>"""

# Delayed sends with author ids (twice the same id), a cancel, a cancel of nothing.
TIMERS = f"""<scxml {NS} name="timers" initial="s">
  <datamodel><data id="got" expr="[]"/></datamodel>
  <state id="s">
    <transition event="arm">
      <send id="t" event="x" delay="5s"/>
      <send id="t" event="y" delay="7s"/>
      <send id="other" event="z" delay="9s"/>
    </transition>
    <transition event="cancel_t"><cancel sendid="t"/></transition>
    <transition event="cancel_none"><cancel sendid="no-such-send"/></transition>
    <transition event="x"><assign location="got" expr="got + ['x']"/></transition>
    <transition event="y"><assign location="got" expr="got + ['y']"/></transition>
    <transition event="z"><assign location="got" expr="got + ['z']"/></transition>
    <transition event="ping"><send event="pong" target="#_scxml_peer" delay="1s"/></transition>
    <transition event="finish" target="end"/>
    <transition event="later"><send event="x" delay="1s"/></transition>
  </state>
  <final id="end"/>
</scxml>"""

PEER = f"""<scxml {NS} name="peer" initial="s">
  <datamodel><data id="pongs" expr="0"/></datamodel>
  <state id="s">
    <transition event="pong"><assign location="pongs" expr="pongs + 1"/></transition>
    <transition event="finish" target="end"/>
  </state>
  <final id="end"/>
</scxml>"""

PARENT = f"""<scxml {NS} name="parent" initial="p">
  <datamodel><data id="got" expr="[]"/></datamodel>
  <state id="p">
    <invoke id="kid">
      <content>
        <scxml {NS} name="kid" initial="k">
          <datamodel><data id="pokes" expr="0"/></datamodel>
          <state id="k">
            <onentry><send event="hello" target="#_parent" delay="1s"/></onentry>
            <transition event="poke"><assign location="pokes" expr="pokes + 1"/></transition>
          </state>
        </scxml>
      </content>
    </invoke>
    <transition event="hello"><assign location="got" expr="got + ['hello']"/></transition>
    <transition event="go"><send event="poke" target="#_kid" delay="2s"/></transition>
    <transition event="mine"><send event="hello" delay="30s"/></transition>
  </state>
</scxml>"""


def chart(text: str) -> sb.Chart:
    return sb.Chart.from_scxml(text)


# ----------------------------------------------------------------------------- fixtures


class Spy:
    """Wraps a store and counts commits (a refusal must make none), the ones a group
    commit applied included."""

    def __init__(self, store):
        self.store = store
        self.commits = 0
        orig = store.commit
        orig_many = store.commit_many

        def commit(c):
            self.commits += 1
            return orig(c)

        def commit_many(cs):
            out = orig_many(cs)
            self.commits += sum(1 for c, err in zip(cs, out, strict=True) if err is None and not c.empty)
            return out
        store.commit = commit
        store.commit_many = commit_many


def dump(path) -> list[str]:
    """Every row of the SQLite file, as SQL text (for 'nothing was written')."""
    con = sqlite3.connect(path)
    try:
        return list(con.iterdump())
    finally:
        con.close()


@pytest.fixture(params=["sqlite", "memory"])
def env(request, tmp_path):
    """(host, clock, spy, snapshot) over a fresh store of each kind."""
    clock = sb.ManualClock(T0)
    if request.param == "sqlite":
        path = tmp_path / "host.db"
        store = sb.SQLiteStore(path)
        snap = lambda: dump(path)  # noqa: E731
    else:
        store = sb.MemoryStore()
        snap = lambda: (dict(store._positions), dict(store._timers))  # noqa: E731
    spy = Spy(store)
    host = sb.Host([chart(COUNTER), chart(FIFO), chart(TIMERS), chart(PEER), chart(PARENT),
                    sb.Chart.from_file(ORDER)], store=store, clock=clock)
    yield host, clock, spy, snap
    if request.param == "sqlite":
        store.close()


@pytest.fixture
def sq(tmp_path):
    """A SQLite-backed host only, with its file path."""
    clock = sb.ManualClock(T0)
    path = tmp_path / "host.db"
    store = sb.SQLiteStore(path)
    host = sb.Host([chart(COUNTER), chart(TIMERS), chart(PEER), chart(PARENT), sb.Chart.from_file(ORDER)],
                   store=store, clock=clock)
    yield host, clock, path
    store.close()


# ----------------------------------------------------------------------------- refusals


def test_start_existing_id_raises_and_writes_nothing(env):
    host, _clock, spy, snap = env
    host.start("counter", "c1")
    host.send("c1", "inc")
    before, commits, version = snap(), spy.commits, host.store.load("c1").version
    with pytest.raises(sb.InstanceExists):
        host.start("counter", "c1")
    with pytest.raises(sb.InstanceExists):
        host.start("fifo", "c1")  # another chart under a taken id: still refused
    assert spy.commits == commits
    assert snap() == before
    assert host.store.load("c1").version == version
    assert host.get("c1").datamodel["n"] == 1


def test_send_unknown_raises_and_writes_nothing(env):
    host, _clock, spy, snap = env
    host.start("counter", "c1")
    before, commits = snap(), spy.commits
    with pytest.raises(sb.InstanceNotFound):
        host.send("nope", "inc")
    with pytest.raises(sb.InstanceNotFound):
        host.get("nope")
    with pytest.raises(sb.InstanceNotFound):
        host.delete("nope")
    assert spy.commits == commits
    assert snap() == before
    assert not host.exists("nope")


def test_send_to_halted_raises_not_running_and_writes_nothing(env):
    host, _clock, spy, snap = env
    host.start("counter", "c1")
    pos = host.send("c1", "stop")
    assert pos.status == "done"
    before, commits, version = snap(), spy.commits, host.store.load("c1").version
    with pytest.raises(sb.NotRunning) as ei:
        host.send("c1", "inc")
    assert ei.value.status == "done"
    assert spy.commits == commits
    assert snap() == before
    assert host.store.load("c1").version == version


def test_one_commit_per_call_and_versions(env):
    host, _clock, spy, _snap = env
    host.start("counter", "c1")
    assert host.store.load("c1").version == 1
    for _i in range(3):
        host.send("c1", "inc")
    assert spy.commits == 4
    rec = host.store.load("c1")
    assert rec.version == 4 and rec.status == "running" and rec.chart == "counter"
    assert host.get("c1").datamodel["n"] == 3


# ----------------------------------------------------------------------------- immediate sends


def test_immediate_self_sends_are_fifo_in_one_call(env):
    host, _clock, spy, _snap = env
    host.start("fifo", "f")
    commits, version = spy.commits, host.store.load("f").version
    pos = host.send("f", "go")
    assert list(pos.datamodel["log"]) == ["a", "b", "c", "d"]
    # all processed inside the same host call: one commit, one version step
    assert spy.commits == commits + 1
    assert host.store.load("f").version == version + 1
    assert list(host.get("f").datamodel["log"]) == ["a", "b", "c", "d"]
    assert host.pending_timers("f") == []


def test_delivery_budget_spills_to_due_rows(sq):
    """Over max_deliveries, the rest become rows due now: nothing lost, still FIFO."""
    host, clock, _path = sq
    host.register(chart(FIFO))
    small = sb.Host(host.charts.values(), store=host.store, clock=clock, max_deliveries=2)
    small.start("fifo", "f")
    pos = small.send("f", "go")          # deliveries: go, a; then b, c, d spill
    assert list(pos.datamodel["log"]) == ["a"]
    rows = small.pending_timers("f")
    assert [r.event["name"] for r in rows] == ["b", "c", "d"]
    assert all(r.due_at_ms == clock.now_ms() for r in rows)
    while small.fire_due():
        pass
    assert list(small.get("f").datamodel["log"]) == ["a", "b", "c", "d"]


# ----------------------------------------------------------------------------- timers


def test_timer_rows_key_due_and_cancel_by_send_id(env):
    host, clock, _spy, _snap = env
    host.start("timers", "t1")
    clock.advance(123)
    armed_at = clock.now_ms()
    host.send("t1", "arm")
    rows = host.pending_timers("t1")
    assert [(r.instance_id, r.ordinal) for r in rows] == [("t1", 1), ("t1", 2), ("t1", 3)]
    assert [r.send_id for r in rows] == ["t", "t", "other"]
    assert [r.due_at_ms for r in rows] == [armed_at + 5000, armed_at + 7000, armed_at + 9000]
    assert all(r.target_id == "t1" and r.state == PENDING for r in rows)
    assert rows[0].dedup["id_from_author"] is True
    assert host.next_due() == armed_at + 5000
    # due_at is computed once: the clock moving (and other commits) never changes it
    clock.advance(1000)
    host.send("t1", "cancel_none")
    assert [r.due_at_ms for r in host.pending_timers("t1")] == [armed_at + 5000, armed_at + 7000,
                                                                 armed_at + 9000]
    # a cancel matching nothing is a no-op on the rows
    before_rows = host.pending_timers("t1")
    host.send("t1", "cancel_none")
    assert host.pending_timers("t1") == before_rows
    # one cancel removes both rows of the author id used twice, and leaves the other
    host.send("t1", "cancel_t")
    rows = host.pending_timers("t1")
    assert [(r.ordinal, r.send_id) for r in rows] == [(3, "other")]
    assert [r.ordinal for r in host.store.load("t1").timers] == [3]
    assert host.store.get_timer(("t1", 1)) is None and host.store.get_timer(("t1", 2)) is None
    clock.set(armed_at + 10_000)
    res = host.fire_due()
    assert [(r.key, r.outcome) for r in res] == [(("t1", 3), "fired")]
    assert list(host.get("t1").datamodel["got"]) == ["z"]
    assert host.pending_timers("t1") == []
    assert host.next_due() is None


def test_fire_only_when_due_and_in_order(env):
    host, clock, spy, _snap = env
    host.start("timers", "t1")
    host.send("t1", "arm")
    clock.advance(4999)
    commits = spy.commits
    assert host.fire_due() == []
    assert spy.commits == commits
    clock.advance(1)
    assert [r.key for r in host.fire_due()] == [("t1", 1)]
    assert spy.commits == commits + 1     # delivery and completion: one commit
    clock.advance(10_000)
    res = host.fire_due()
    assert [r.key for r in res] == [("t1", 2), ("t1", 3)]
    assert res[0].lag_ms == 10_000 - 2000
    assert list(host.get("t1").datamodel["got"]) == ["x", "y", "z"]
    done = host.store.get_timer(("t1", 1))
    assert done.state == DONE and done.outcome == "fired"
    assert host.fire_due() == []  # nothing fires twice


def test_delayed_sends_to_parent_and_child_are_durable(sq):
    host, clock, _path = sq
    host.start("parent", "P")
    assert host.exists("P::kid")
    kid_rows = host.pending_timers("P::kid")
    assert [(r.instance_id, r.target_id, r.event["name"], r.due_at_ms) for r in kid_rows] == \
        [("P::kid", "P", "hello", T0 + 1000)]
    host.send("P", "go")
    p_rows = host.pending_timers("P")
    assert [(r.instance_id, r.target_id, r.event["name"], r.due_at_ms) for r in p_rows] == \
        [("P", "P::kid", "poke", T0 + 2000)]
    # a restart: a new store and host on the same file fire them
    store2 = sb.SQLiteStore(host.store.path)
    host2 = sb.Host(host.charts.values(), store=store2, clock=clock)
    clock.advance(2000)
    res = host2.fire_due()
    assert sorted((r.key, r.outcome) for r in res) == [(("P", 1), "fired"), (("P::kid", 1), "fired")]
    assert list(host2.get("P").datamodel["got"]) == ["hello"]
    assert host2.get("P::kid").datamodel["pokes"] == 1
    assert host2.pending_timers("P") == [] and host2.pending_timers("P::kid") == []
    store2.close()


def test_delete_purges_position_timers_and_children(sq):
    host, clock, path = sq
    host.start("parent", "P")
    host.send("P", "go")
    host.send("P", "mine")
    assert len(host.pending_timers("P")) == 2 and len(host.pending_timers("P::kid")) == 1
    host.start("counter", "bystander")
    host.delete("P")
    assert not host.exists("P") and not host.exists("P::kid")
    assert host.pending_timers("P") == [] and host.pending_timers("P::kid") == []
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT count(*) FROM timers").fetchone()[0] == 0
        # what is left of P and its child is a tombstone each: no blob of theirs, no rows
        assert sorted(con.execute("SELECT instance_id, status FROM positions")) == [
            ("P", "deleted"), ("P::kid", "deleted"), ("bystander", "running")]
        assert all(blob.startswith(b"SBDELETED") for (blob,) in con.execute(
            "SELECT blob FROM positions WHERE status = 'deleted'"))
    finally:
        con.close()
    clock.advance(60_000)
    assert host.fire_due() == []
    assert host.next_due() is None
    with pytest.raises(sb.InstanceNotFound):
        host.send("P", "go")
    host.start("parent", "P")  # the id is free again
    assert host.exists("P::kid")


def test_delete_on_memory_store():
    host = sb.Host([chart(PARENT)], clock=sb.ManualClock(T0))
    host.start("parent", "P")
    host.send("P", "go")
    host.delete("P")
    assert not host.exists("P") and not host.exists("P::kid")
    assert host.store._timers == {}
    assert {i: r.status for i, r in host.store._positions.items()} == {"P": "deleted", "P::kid": "deleted"}
    assert host.store.list_positions() == []


# ----------------------------------------------------------------------------- liveness at fire


def test_fire_discards_when_target_missing_or_halted(env):
    host, clock, _spy, _snap = env
    host.start("peer", "peer")
    host.start("timers", "t1")
    host.send("t1", "ping")                 # row (t1, 1) -> peer
    host.send("t1", "ping")                 # row (t1, 2) -> peer
    assert [r.target_id for r in host.pending_timers("t1")] == ["peer", "peer"]
    host.send("peer", "finish")             # target halted
    clock.advance(1000)
    [res] = host.fire_due(limit=1)
    assert res.outcome == "discarded" and "peer" in res.reason and "done" in res.reason
    row = host.store.get_timer(("t1", 1))
    assert row.state == DONE and row.outcome == "discarded" and "done" in row.reason
    host.delete("peer")                     # target gone
    [res] = host.fire_due()
    assert res.outcome == "discarded" and "not found" in res.reason
    assert host.store.get_timer(("t1", 2)).reason == res.reason
    assert host.pending_timers("t1") == []


def test_fire_discards_when_scheduler_halted(env):
    host, clock, _spy, _snap = env
    host.start("timers", "t1")
    host.send("t1", "later")                # x to itself in 1 s
    host.send("t1", "finish")
    version = host.store.load("t1").version
    clock.advance(1000)
    [res] = host.fire_due()
    assert res.outcome == "discarded" and "done" in res.reason
    pos = host.get("t1")
    assert list(pos.datamodel["got"]) == []  # no delivery
    assert host.store.get_timer(("t1", 1)).outcome == "discarded"
    assert host.store.load("t1").version >= version  # the ref was dropped, nothing delivered
    assert host.pending_timers("t1") == []


def test_named_timeout_fires_and_stale_row_is_not_delivered(sq):
    """The order chart's sb:timeout fires; a row for a timeout the position no longer has
    armed (e.g. re-armed since) completes as stale without delivery."""
    from dataclasses import replace

    from statebound.host.store import Commit
    host, clock, _path = sq
    host.start("order", "o", {"payment_timeout": "3s"})
    host.send("o", "StartPayment")
    [row] = host.pending_timers("o")
    assert row.name == "PaymentTimeout" and row.due_at_ms == T0 + 3000
    host.start("order", "o2", {"payment_timeout": "3s"})
    host.send("o2", "StartPayment")
    host.store.commit(Commit(timers_put=(replace(host.pending_timers("o2")[0], ordinal=99,
                                                    due_at_ms=T0 + 2999),)))
    clock.advance(3000)
    res = {r.key: r for r in host.fire_due()}
    assert res[("o", 1)].outcome == "fired" and res[("o2", 1)].outcome == "fired"
    assert res[("o2", 99)].outcome == "stale"
    assert host.store.get_timer(("o2", 99)).outcome == "stale"
    assert host.get("o").configuration == frozenset({"Cancelled"})
    assert host.get("o2").macrostep == 2     # the stale row delivered nothing


def test_cancel_while_claimed_wins_and_late_fire_is_skipped(sq):
    host, clock, _path = sq
    host.start("order", "o", {"payment_timeout": "3s"})
    host.send("o", "StartPayment")
    clock.advance(3000)
    [row] = host.store.claim_due(clock.now_ms(), 10, "sweeper-x", 30_000)
    host.send("o", "Complete")                 # the cancel deletes the claimed row
    res = host.fire(row, node_id="sweeper-x")
    assert res.outcome == "skipped"
    assert host.get("o").configuration == frozenset({"Done"})
    assert host.store.get_timer(("o", 1)) is None


# ----------------------------------------------------------------------------- failures


@pytest.fixture
def failing(monkeypatch):
    """Make every drive of the ``timers`` chart raise, until ``state['on'] = False``
    (the host drives through ``Interpreter.drive_as``)."""
    state = {"on": True, "calls": 0}
    orig = sb.Interpreter.drive_as

    def drive_as(self, position, driver, event, **kw):
        if state["on"] and self.chart.name == "timers" and getattr(event, "name", event) == "x":
            state["calls"] += 1
            raise RuntimeError("delivery exploded")
        return orig(self, position, driver, event, **kw)
    monkeypatch.setattr(sb.Interpreter, "drive_as", drive_as)
    return state


def test_failed_delivery_backs_off_then_parks_dead_then_retry(env, failing):
    host, clock, _spy, _snap = env
    host.max_attempts, host.backoff_ms = 3, 1000
    host.start("timers", "t1")
    host.send("t1", "later")
    key = ("t1", 1)
    version = host.store.load("t1").version
    clock.advance(1000)
    due = clock.now_ms()
    [res] = host.fire_due()
    assert res.outcome == "failed" and "exploded" in res.reason
    row = host.store.get_timer(key)
    assert (row.state, row.attempts, row.next_attempt_at_ms) == (PENDING, 1, due + 1000)
    assert "RuntimeError" in row.last_error and row.claimed_by is None
    assert host.store.load("t1").version == version   # nothing of the failed unit committed
    assert host.next_due() == due + 1000
    clock.advance(999)
    assert host.fire_due() == []                      # backoff holds
    clock.advance(1)
    [res] = host.fire_due()
    assert res.outcome == "failed"
    row = host.store.get_timer(key)
    assert (row.state, row.attempts, row.next_attempt_at_ms) == (PENDING, 2, clock.now_ms() + 2000)
    clock.advance(2000)
    [res] = host.fire_due()
    row = host.store.get_timer(key)
    assert row.state == DEAD and row.attempts == 3
    assert [r.key for r in host.dead_timers()] == [key]
    assert [r.key for r in host.pending_timers("t1")] == [key]   # operators still see it
    clock.advance(3_600_000)
    assert host.fire_due() == []                                   # dead rows never fire
    assert host.metrics["failed"] == 3 and host.metrics["dead"] == 1
    assert failing["calls"] == 3
    # revive
    failing["on"] = False
    assert host.retry_timer("t1", 1) is True
    assert host.retry_timer("t1", 1) is False   # not dead any more
    row = host.store.get_timer(key)
    assert (row.state, row.attempts) == (PENDING, 0)
    assert host.dead_timers() == []
    [res] = host.fire_due()
    assert res.outcome == "fired"
    assert list(host.get("t1").datamodel["got"]) == ["x"]
    assert host.store.get_timer(key).outcome == "fired"


# ----------------------------------------------------------------------------- conflicts


def test_conflict_between_two_hosts_reloads_and_retries(sq):
    host_a, clock, path = sq
    store_b = sb.SQLiteStore(path)
    host_b = sb.Host(host_a.charts.values(), store=store_b, clock=clock)
    host_a.start("counter", "c")
    orig = host_a.store.commit
    calls = {"n": 0}

    def commit(c):
        calls["n"] += 1
        if calls["n"] == 1:
            host_b.send("c", "inc")      # B commits between A's load and A's commit
        return orig(c)
    host_a.store.commit = commit
    pos = host_a.send("c", "inc")
    assert pos.datamodel["n"] == 2      # A re-drove on B's result: both increments kept
    assert host_a.metrics["conflicts"] == 1 and calls["n"] == 2
    assert host_b.get("c").datamodel["n"] == 2
    assert store_b.load("c").version == 3
    store_b.close()


def test_conflict_retries_are_bounded(sq):
    host_a, clock, path = sq
    store_b = sb.SQLiteStore(path)
    host_b = sb.Host(host_a.charts.values(), store=store_b, clock=clock)
    host_a.max_conflict_retries = 3
    host_a.start("counter", "c")
    orig = host_a.store.commit

    def commit(c):
        host_b.send("c", "inc")          # always loses
        return orig(c)
    host_a.store.commit = commit
    with pytest.raises(sb.ConflictError):
        host_a.send("c", "inc")
    assert host_a.metrics["conflicts"] == 3
    assert host_b.get("c").datamodel["n"] == 3   # only B's increments landed
    store_b.close()


def test_concurrent_start_of_same_id_is_instance_exists(sq):
    host_a, clock, path = sq
    store_b = sb.SQLiteStore(path)
    host_b = sb.Host(host_a.charts.values(), store=store_b, clock=clock)
    orig = host_a.store.commit

    def commit(c):
        host_b.start("counter", "c")
        return orig(c)
    host_a.store.commit = commit
    with pytest.raises(sb.InstanceExists):
        host_a.start("counter", "c")
    store_b.close()


def test_expired_claim_is_taken_over_and_fires_once(sq):
    """A sweeper that dies mid-claim loses it when the lease runs out; its late fire is skipped."""
    host_a, clock, path = sq
    store_b = sb.SQLiteStore(path)
    host_b = sb.Host(host_a.charts.values(), store=store_b, clock=clock)
    host_a.start("timers", "t1")
    host_a.send("t1", "later")
    clock.advance(1000)
    [row] = host_a.store.claim_due(clock.now_ms(), 10, "node-a", 5000)   # then node-a stalls
    assert host_b.fire_due(node_id="node-b") == []                       # claim holds
    clock.advance(5000)
    [res] = host_b.fire_due(node_id="node-b")                            # lease ran out
    assert res.outcome == "fired"
    late = host_a.fire(row, node_id="node-a")
    assert late.outcome == "skipped"
    assert list(host_b.get("t1").datamodel["got"]) == ["x"]              # delivered once
    assert host_b.store.get_timer(("t1", 1)).outcome == "fired"
    store_b.close()


# ----------------------------------------------------------------------------- sweeper


def test_sweeper_run_once_report_and_metrics(env):
    host, clock, _spy, _snap = env
    host.start("peer", "peer")
    host.start("timers", "t1")
    host.send("t1", "arm")       # 3 rows at +5, +7, +9 s
    host.send("t1", "ping")      # row -> peer at +1 s
    host.send("peer", "finish")  # so that row is discarded
    sw = sb.Sweeper(host, interval_s=1.0, jitter=0.2, batch=100, node_id="sw-1")
    assert sw.node_id == "sw-1"
    rep = sw.run_once()
    assert (rep.fired, rep.discarded, rep.failed, rep.total) == (0, 0, 0, 0)
    clock.advance(8000)
    rep = sw.run_once()
    assert (rep.fired, rep.discarded, rep.failed) == (2, 1, 0)
    assert sorted(rep.lag_ms) == [1000, 3000] and rep.max_lag_ms == 3000
    clock.advance(1000)
    rep2 = sw.run_once()
    assert rep2.fired == 1 and rep2.lag_ms == (0,)
    m = sw.metrics
    assert (m.sweeps, m.fired, m.discarded, m.failed, m.max_lag_ms) == (3, 3, 1, 0, 3000)


def test_sweeper_batch_and_run_until_idle(env):
    host, clock, _spy, _snap = env
    host.start("timers", "t1")
    host.send("t1", "arm")
    clock.advance(10_000)
    sw = sb.Sweeper(host, batch=2)
    assert sw.run_once().fired == 2
    rep = sw.run_until_idle()
    assert rep.fired == 1
    assert sw.metrics.fired == 3


def test_sweeper_reports_failures(env, failing):
    host, clock, _spy, _snap = env
    host.start("timers", "t1")
    host.send("t1", "later")
    clock.advance(1000)
    rep = sb.Sweeper(host).run_once()
    assert rep.failed == 1 and rep.fired == 0


def test_sweeper_validates_arguments(env):
    host = env[0]
    for kw in ({"interval_s": 0}, {"batch": 0}, {"jitter": 1.5}, {"lease_s": 0}):
        with pytest.raises(ValueError):
            sb.Sweeper(host, **kw)


def test_sweeper_sleep_time(env):
    host, clock, _spy, _snap = env
    sw = sb.Sweeper(host, interval_s=1.0, jitter=0.2)
    for _ in range(20):
        assert 1.0 <= sw.sleep_time() <= 1.2   # nothing due: the interval plus jitter
    host.start("timers", "t1")
    host.send("t1", "later")                   # due in 1 s
    clock.advance(700)
    assert sw.sleep_time() == pytest.approx(0.3)
    clock.advance(1000)
    assert sw.sleep_time() == 0.0              # overdue: no sleep


def test_sweeper_run_forever_manual_clock_sleeps_until_due(env):
    host, clock, _spy, _snap = env
    host.start("timers", "t1")
    host.send("t1", "arm")                     # due at +5, +7, +9 s
    sw = sb.Sweeper(host, interval_s=60.0, jitter=0.0)
    seen = []

    def stop():
        seen.append(clock.now_ms() - T0)
        return sw.metrics.fired >= 3
    metrics = sw.run_forever(stop)
    assert metrics is sw.metrics and metrics.fired == 3
    # the loop slept exactly until each due time, never the whole interval; once
    # nothing is due it sleeps the interval, then sees the stop
    assert seen == [0, 5000, 7000, 9000, 69000]
    assert metrics.max_lag_ms == 0
    assert list(host.get("t1").datamodel["got"]) == ["x", "y", "z"]


def test_sweeper_run_forever_interval_when_idle(env):
    host, clock, _spy, _snap = env
    sw = sb.Sweeper(host, interval_s=2.0, jitter=0.0)
    sw.run_forever(lambda: sw.metrics.sweeps >= 3)
    assert clock.now_ms() - T0 == 3 * 2000   # sweep, sleep 2 s, three times
    assert sw.metrics.sweeps == 3


def test_sweeper_run_forever_system_clock_thread_stops_gracefully(tmp_path):
    store = sb.SQLiteStore(tmp_path / "s.db")
    host = sb.Host([chart(TIMERS)], store=store, clock=sb.SystemClock())
    host.start("timers", "t1")
    host.send("t1", "later")               # due in 1 s, real time
    due = host.pending_timers("t1")[0].due_at_ms
    sw = sb.Sweeper(host, interval_s=0.05, jitter=0.2, node_id="thread-sweeper")
    stop = threading.Event()
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("m", sw.run_forever(stop)))
    th.start()
    deadline = time.monotonic() + 10
    while sw.metrics.fired < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    th.join(timeout=2)
    assert not th.is_alive()
    assert out["m"].fired == 1
    assert out["m"].max_lag_ms < 1000
    assert list(host.get("t1").datamodel["got"]) == ["x"]
    assert store.get_timer(("t1", 1)).state == DONE
    assert sw.metrics.sweeps >= 2
    assert time.time_ns() // 1_000_000 >= due
    store.close()


def test_srcexpr_invoked_child_loads_in_another_host(tmp_path):
    """A chart an <invoke srcexpr> loads at run time is found again by a fresh host (a
    restarted process or a sweeper that never ran the invoke)."""
    (tmp_path / "kid.scxml").write_text(
        f'<scxml {NS} name="kidfile" initial="k"><state id="k">'
        '<onentry><send event="hello" target="#_parent" delay="1s"/></onentry></state></scxml>')
    (tmp_path / "par.scxml").write_text(
        f'<scxml {NS} name="par" initial="p">'
        '<datamodel><data id="got" expr="0"/><data id="which" expr="\'kid.scxml\'"/></datamodel>'
        '<state id="p"><invoke id="b" srcexpr="which"/>'
        '<transition event="hello"><assign location="got" expr="got + 1"/></transition></state></scxml>')
    clock = sb.ManualClock(T0)
    db = tmp_path / "src.db"
    with sb.SQLiteStore(db) as store:
        sb.Host([sb.Chart.from_file(tmp_path / "par.scxml")], store=store, clock=clock).start("par", "P")
    with sb.SQLiteStore(db) as store:
        fresh = sb.Host([sb.Chart.from_file(tmp_path / "par.scxml")], store=store, clock=clock)
        assert fresh.get("P::b").configuration == frozenset({"k"})
        clock.advance(1000)
        assert [r.outcome for r in fresh.fire_due()] == ["fired"]
        assert fresh.get("P").datamodel["got"] == 1
    with sb.SQLiteStore(db) as store, pytest.raises(sb.UnknownChart):
        sb.Host([], store=store, clock=clock).get("P::b")   # without the parent chart there is nothing to resolve


def test_run_forever_survives_a_transient_store_failure():
    """A StoreUnavailable (locked database, throttling) backs off and sweeping continues."""
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s" datamodel="python">
      <datamodel><data id="n" expr="0"/></datamodel>
      <state id="s"><onentry><send event="inc" delay="1s"/></onentry>
        <transition event="inc"><assign location="n" expr="n + 1"/></transition></state></scxml>''')
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([chart], clock=clock)
    host.start(chart, "x")
    real = host.store.claim_due
    calls = {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise sb.StoreUnavailable("database is locked")
        return real(*a, **kw)

    host.store.claim_due = flaky  # type: ignore[method-assign]
    sweeper = sb.Sweeper(host, interval_s=0.5)
    metrics = sweeper.run_forever(lambda: host.get("x").datamodel["n"] == 1 or clock.now_ms() > 60_000)
    assert host.get("x").datamodel["n"] == 1 and metrics.fired == 1 and calls["n"] > 2


def test_two_revisions_of_a_chart_drain_side_by_side(tmp_path):
    """Story 1 of docs/persistence.md: old positions finish on the old revision while new
    instances start on the new one, both registered under the same name."""
    v1 = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="flow" initial="a">
      <state id="a"><transition event="go" target="b"/></state><final id="b"/></scxml>''', version="1")
    v2 = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="flow" initial="a">
      <state id="a"><transition event="go" target="review"/></state>
      <state id="review"><transition event="ok" target="b"/></state><final id="b"/></scxml>''', version="2")
    db = tmp_path / "flow.db"
    old_host = sb.Host([v1], store=sb.SQLiteStore(db))
    old_host.start("flow", "old")
    host = sb.Host([v1, v2], store=sb.SQLiteStore(db))     # a deploy that keeps v1 for draining
    host.start("flow", "new")                                # new instances: the last registered
    assert host.get("new").chart.identity == v2.identity
    assert host.get("old").chart.identity == v1.identity
    assert host.send("old", "go").configuration == {"b"}    # v1 semantics
    assert host.send("new", "go").configuration == {"review"}  # v2 semantics
    # a host that no longer has v1 refuses the old blob with a typed error
    with pytest.raises(sb.ChartIdentityMismatch):
        sb.Host([v2], store=sb.SQLiteStore(db)).get("old")


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_purge_done_deletes_completed_rows_only(tmp_path, kind):
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s" datamodel="python">
      <state id="s"><onentry><send event="a" delay="1s"/><send event="b" delay="1h"/></onentry>
        <transition event="a"/></state></scxml>''')
    store = sb.SQLiteStore(tmp_path / "p.db") if kind == "sqlite" else sb.MemoryStore()
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([chart], store=store, clock=clock)
    host.start(chart, "x")
    clock.advance(1000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert store.get_timer(("x", 1)).state == "done"
    assert store.purge_done(due_before_ms=500) == 0          # due at 1000: not old enough
    assert store.purge_done(due_before_ms=2000) == 1
    assert store.get_timer(("x", 1)) is None
    assert [r.event["name"] for r in host.pending_timers("x")] == ["b"]   # pending rows untouched


@pytest.mark.parametrize("instance_id", ["order-1", "t00001", "a_b.c~d", "a b", "a/b", "ü", "100%", "a?b#c"])
def test_the_basic_http_location_quotes_the_id_in_one_path_segment(instance_id):
    host = sb.Host(http_base="http://h.example/")
    loc = host.http_location(instance_id)
    prefix, suffix = "http://h.example/instances/", "/events"
    assert loc.startswith(prefix) and loc.endswith(suffix)
    segment = loc[len(prefix):-len(suffix)]
    assert "/" not in segment and "?" not in segment and "#" not in segment and " " not in segment
    assert unquote(segment) == instance_id


def test_a_kept_basic_http_location_follows_a_changed_base(monkeypatch):
    host = sb.Host(http_base="http://a.example")
    assert host.http_location("o-1") == "http://a.example/instances/o-1/events"
    host.http_base = "http://b.example"                       # a caller may move the host
    assert host.http_location("o-1") == "http://b.example/instances/o-1/events"
    monkeypatch.setattr(host_mod, "_LOCATIONS_KEPT", 2)      # bounded: emptied when full
    for i in range(5):
        assert host.http_location(f"x{i}").endswith(f"/instances/x{i}/events")
    assert len(host._locations) <= 2
