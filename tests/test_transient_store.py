"""A store that is busy for a moment (SQLite's write lock held past the busy timeout by
another process) or other writers that win every conflict retry are not a delivery's
fault: no row may lose an attempt to them, be parked as dead, wait out its lease, or stop
the sweeper. Every case is made deterministic: the other writer acts at a moment the test
chooses (a chart's <log>, or just before each commit)."""

from __future__ import annotations

import sqlite3
import threading

import pytest

import statebound as sb

TICK = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="t" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><onentry><send event="tick" delay="1s"/></onentry>
    <transition event="tick"><log label="tick" expr="n"/><assign location="n" expr="n + 1"/></transition>
  </state></scxml>"""

TWO = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="x" initial="s">
  <datamodel><data id="log" expr="[]"/></datamodel>
  <state id="s"><onentry><send event="a" delay="1s"/><send event="b" delay="2s"/></onentry>
    <transition event="a"><log label="a" expr="1"/><assign location="log" expr="log + ['a']"/></transition>
    <transition event="b"><assign location="log" expr="log + ['b']"/></transition></state></scxml>"""


class Locker:
    """Another connection takes the write lock when told, and gives it back after ``hold_s``."""

    def __init__(self, db, hold_s):
        self.db, self.hold_s, self.timers = db, hold_s, []

    def take(self):
        c = sqlite3.connect(self.db, isolation_level=None, check_same_thread=False)
        c.execute("BEGIN IMMEDIATE")
        t = threading.Timer(self.hold_s, lambda: (c.execute("COMMIT"), c.close()))
        t.start()
        self.timers.append(t)

    def wait(self):
        for t in self.timers:
            t.join(30)


@pytest.mark.parametrize("max_batch", [1, 100])
def test_a_locked_store_costs_no_attempt_and_parks_nothing(tmp_path, max_batch):
    # each of five sweeps met the lock: every row of the group lost an attempt each time,
    # and after max_attempts (5) all of them were dead, none of them at fault
    db = str(tmp_path / "lock.db")
    lock = Locker(db, 0.3)            # past the commit's busy timeout, inside the release's
    clock = sb.ManualClock(0)
    host = sb.Host([sb.Chart.from_scxml(TICK)], store=sb.SQLiteStore(db, timeout_s=0.2), clock=clock,
                   on_log=lambda iid, *_: lock.take() if iid == "x" and locking else None, max_batch=max_batch)
    locking = True
    for iid in ("x", "y1", "y2", "y3"):
        host.start("t", iid)
    sweeper = sb.Sweeper(host, node_id="s1")
    for _ in range(host.max_attempts + 1):
        clock.set(max(clock.now_ms(), *(r.ready_at_ms for r in host.pending_timers("x"))))
        try:
            sweeper.run_once()
        except sb.StoreUnavailable:
            pass                                   # the release met the lock too: the claim is given back later
        lock.wait()
        clock.advance(sweeper.lease_ms)            # whatever kept a claim has it lapse
    assert host.dead_timers() == []
    assert {r.attempts for i in ("x", "y1", "y2", "y3") for r in host.pending_timers(i)} == {0}
    locking = False
    clock.advance(60_000)
    sweeper.run_until_idle()
    assert [host.get(i).datamodel["n"] for i in ("x", "y1", "y2", "y3")] == [1, 1, 1, 1]


def test_a_sweep_the_store_fails_part_way_gives_its_rows_back_in_order(tmp_path):
    # the rows it had claimed and not fired kept their claims for the whole lease, and the
    # instance's later timer (due meanwhile, claimed by the next sweep) fired before them
    db = str(tmp_path / "mid.db")
    lock = Locker(db, 0.5)
    clock = sb.ManualClock(0)
    host = sb.Host([sb.Chart.from_scxml(TWO)], store=sb.SQLiteStore(db, timeout_s=0.1), clock=clock,
                   on_log=lambda iid, label, _v: lock.take() if label == "a" and not lock.timers else None)
    host.start("x", "x")
    sweeper = sb.Sweeper(host, node_id="s1")
    clock.set(1_000)
    try:
        sweeper.run_once()
    except sb.StoreUnavailable:
        pass
    lock.wait()
    clock.set(2_000)
    sweeper.run_until_idle()            # gives the stranded claim back first, then claims in order
    assert host.get("x").datamodel["log"] == ["a", "b"]


def test_an_outbox_row_whose_completion_loses_every_retry_does_not_stop_the_sweeper(tmp_path):
    # the ConflictError escaped Host.fire and fire_many, and run_forever (which survived only
    # StoreUnavailable) died: no timer of any instance fired after it
    hot = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="hot" initial="s">
      <datamodel><data id="n" expr="0"/></datamodel>
      <state id="s"><onentry><send type="app" event="out" delay="20ms"/></onentry>
        <transition event="inc"><assign location="n" expr="n + 1"/></transition></state></scxml>"""
    db = str(tmp_path / "hot.db")
    chart = sb.Chart.from_scxml(hot)
    other = sb.Host([chart], store=sb.SQLiteStore(db))           # another process
    contended = {"on": True}

    class Contended:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            if name == "commit_many":
                raise AttributeError(name)
            return getattr(self._inner, name)

        def commit(self, commit):
            if contended["on"] and any(w.instance_id == "h" and w.expected_version is not None
                                       for w in commit.writes):
                other.send("h", "inc")                         # wins the race before each commit
            return self._inner.commit(commit)
    delivered = []
    clock = sb.ManualClock(0)
    host = sb.Host([chart], store=Contended(sb.SQLiteStore(db)), clock=clock, processors={"app": delivered.append},
                   max_conflict_retries=2, conflict_backoff_s=0.0)
    host.start("hot", "h")
    clock.advance(20)
    report = sb.Sweeper(host, node_id="s1").run_once()        # raised ConflictError before
    assert report.failed == 1 and len(delivered) == 1
    (row,) = host.pending_timers("h")
    assert (row.state, row.attempts) == ("pending", 0)
    contended["on"] = False
    clock.advance(host.backoff_ms)
    assert sb.Sweeper(host, node_id="s1").run_once().delivered == 1     # at least once: called again
    assert host.pending_timers("h") == [] and len(delivered) == 2


class _BusyFor(sb.MemoryStore):
    """A store whose writes for instance ``a`` fail as a locked database does, while ``busy``."""

    busy = False
    #: whose releases of ``a``'s rows fail too: everyone's, or only a pool worker's (the
    #: sweep's give-back, after the workers, finds the store free again)
    release_busy = "all"

    def commit(self, commit):
        if self.busy and any(w.instance_id == "a" for w in commit.writes):
            raise sb.StoreUnavailable("database is locked")
        return super().commit(commit)

    def release(self, key, node_id, **kw):
        if self.busy and key[0] == "a" and (
                self.release_busy == "all" or threading.current_thread().name.startswith("sweeper-")):
            raise sb.StoreUnavailable("database is locked")
        return super().release(key, node_id, **kw)


SENDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="c" initial="Idle">
  <datamodel><data id="seen" expr="[]"/></datamodel>
  <state id="Idle">
    <transition event="Arm"><send event="First" delay="1s"/><send event="Second" delay="2s"/></transition>
    <transition event="ArmA"><send event="T" delay="1s"/></transition>
    <transition event="Notify"><send type="app" event="Notified" target="ops"/></transition>
    <transition event="First"><script>seen.append('First')</script></transition>
    <transition event="Second"><script>seen.append('Second')</script></transition>
    <transition event="T"/>
  </state></scxml>"""


def test_a_pooled_sweep_waits_for_every_worker_before_it_gives_rows_back():
    # the first worker's StoreUnavailable was raised at once: the sweep gave back the row
    # another worker was still handing to its processor, and the next claim called it again
    started, release, calls = threading.Event(), threading.Event(), []

    def processor(delivery):
        calls.append(delivery.idempotency_key)
        started.set()
        release.wait(5)              # bounded: the fixed sweep waits for this worker to end

    store, clock = _BusyFor(), sb.ManualClock(0)
    host = sb.Host([sb.Chart.from_scxml(SENDER)], store=store, clock=clock, processors={"app": processor},
                   deliver_after_commit=False)
    host.start("c", "a")
    host.start("c", "b")
    host.send("a", "ArmA")
    clock.advance(1_000)
    host.send("b", "Notify")
    store.busy, store.release_busy = True, "workers"
    first = sb.Sweeper(host, node_id="s1", workers=2)
    failed = []

    def sweep_once():
        try:
            first.run_once()
        except sb.StoreUnavailable as exc:
            failed.append(exc)
    sweep = threading.Thread(target=sweep_once)
    sweep.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()
    sweep.join(30)
    assert failed                                        # the sweep met the busy store
    sb.Sweeper(host, node_id="s2").run_once()           # a second sweeper, right after the failure
    assert calls == ["b:1"]
    assert store.get_timer(("b", 1)) is None or store.get_timer(("b", 1)).state == "done"
    first.close()


def test_a_sweep_with_a_deadline_the_store_fails_part_way_gives_its_rows_back_in_order():
    store, clock = _BusyFor(), sb.ManualClock(0)
    host = sb.Host([sb.Chart.from_scxml(SENDER)], store=store, clock=clock)
    host.start("c", "a")
    host.start("c", "b")
    host.send("a", "ArmA")
    host.send("b", "Arm")
    clock.advance(1_000)
    sweeper = sb.Sweeper(host, node_id="s")
    store.busy = True
    with pytest.raises(sb.StoreUnavailable):
        sweeper.run_once(stop=lambda: False)
    store.busy = False
    clock.advance(1_000)                                 # Second is due now
    for _ in range(3):
        sweeper.run_once(stop=lambda: False)
    assert host.get("b").datamodel["seen"] == ["First", "Second"]
