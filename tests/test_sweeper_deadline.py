"""``Sweeper.run_once(stop=...)`` and ``handle_wakeups(stop=...)``: a deadline checked
before every row, so a sweep behind slow fires ends when it must (a Lambda invocation's
timeout) instead of when its batch is done.

Time is a ManualClock that the receiver advances by one second per delivery (a slow
outbox send), and every ``stop`` reads that clock: nothing here depends on wall time.
"""

from __future__ import annotations

import threading


import statebound as sb
from statebound.host.memory_wakeup import MemoryWakeup
from statebound.host.processors import Delivery
from statebound.host.store import PENDING
from statebound.host.wakeup import WakeupRequest

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

# Two delayed outbox sends per instance, due a second after start: the sweeper hands them over.
NOTIFY = f"""<scxml {NS} name="notify" initial="a">
  <state id="a"><onentry>
    <send type="app" event="first" target="ops" delay="1s"/>
    <send type="app" event="second" target="ops" delay="1s"/>
  </onentry></state>
</scxml>"""
TICK = f"""<scxml {NS} name="tick" initial="a">
  <state id="a"><onentry><send event="t" delay="1s"/></onentry><transition event="t" target="b"/></state>
  <state id="b"/>
</scxml>"""


class SlowReceiver:
    """A send processor taking ``ms`` of the host's clock per delivery (under a lock, so
    worker threads advance it one at a time); remembers every idempotency key it got."""

    def __init__(self, clock: sb.ManualClock, ms: int = 1_000) -> None:
        self.clock, self.ms = clock, ms
        self.keys: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, d: Delivery) -> None:
        with self.lock:
            self.clock.advance(self.ms)
            self.keys.append(d.idempotency_key)


def _host(store, n: int, *, wakeup=None):
    clock = sb.ManualClock(T0)
    receiver = SlowReceiver(clock)
    host = sb.Host([sb.Chart.from_scxml(NOTIFY)], store=store, clock=clock, processors={"app": receiver},
                   wakeup=wakeup)
    for i in range(n):
        host.start("notify", f"n{i}")
    clock.advance(1_000)
    return host, clock, receiver


def _rows(host, n):
    return [r for i in range(n) for r in host.pending_timers(f"n{i}")]


def test_a_sweep_stops_at_its_deadline_and_gives_the_rest_back_without_an_attempt(store):
    """10 rows, each a second to deliver, a deadline 3.5 s away: four are handed over and
    the sweep returns saying more is due. The six it claimed and did not reach are given
    back at once (no attempt counted, nothing fired), and the next sweep delivers each once."""
    host, clock, receiver = _host(store, 5)
    start = clock.now_ms()
    sweeper = sb.Sweeper(host, node_id="a", lease_s=30)
    report = sweeper.run_once(stop=lambda: clock.now_ms() >= start + 3_500)
    assert (report.delivered, report.more, len(report.unreached)) == (4, True, 6)
    assert clock.now_ms() == start + 4_000                      # one row past the deadline at most
    left = {r.key: r for r in _rows(host, 5)}
    assert set(left) == set(report.unreached)
    assert all(r.state == PENDING and r.claimed_by is None and r.attempts == 0 and r.last_error is None
               for r in left.values())
    rest = sb.Sweeper(host, node_id="b").run_once()            # the next run, long before a lease lapses
    assert (rest.delivered, rest.more, rest.unreached) == (6, False, ())
    assert sorted(receiver.keys) == sorted(set(receiver.keys)) and len(receiver.keys) == 10
    assert _rows(host, 5) == []


ORDERED = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="ordered" initial="a" datamodel="python">
 <state id="a">
  <onentry><send event="e1" delay="1s"/><send event="e2" delay="2s"/></onentry>
  <transition event="e1" target="b"/><transition event="e2" target="bad"/>
 </state>
 <state id="b"><transition event="e2" target="ok"/></state>
 <state id="ok"/><state id="bad"/>
</scxml>"""


def test_a_row_a_deadline_left_fires_before_a_later_row_of_its_instance(store):
    # left claimed until its lease lapsed, e1 fired 30 s late, after e2, which the next run
    # had claimed as soon as it came due: the chart took its timers in the wrong order
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(ORDERED)], store=store, clock=clock)
    host.start("ordered", "i1")
    clock.advance(1_000)
    claimed: list = []
    report = sb.Sweeper(host, node_id="a").run_once(stop=lambda: bool(claimed) or bool(claimed.append(1)))
    assert report.more and report.unreached == (("i1", 1),)
    clock.advance(1_000)
    assert sb.Sweeper(host, node_id="b").run_once().fired == 2
    assert host.get("i1").configuration == frozenset({"ok"})


def test_without_a_stop_the_sweep_keeps_group_commit_and_with_one_fires_row_by_row(store, monkeypatch):
    """The default path is unchanged: the claimed rows go to ``host.fire_many`` together.
    With a stop each row is its own commit, so that the sweep can end between any two."""
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(TICK)], store=store, clock=clock)
    for i in range(6):
        host.start("tick", f"t{i}")
    clock.advance(1_000)
    calls: list[int] = []
    fire_many = host.fire_many
    monkeypatch.setattr(host, "fire_many", lambda rows, **kw: calls.append(len(rows)) or fire_many(rows, **kw))
    assert sb.Sweeper(host, batch=3).run_once().fired == 3
    assert calls == [3]
    report = sb.Sweeper(host, batch=3).run_once(stop=lambda: False)
    assert (report.fired, report.more, report.unreached) == (3, False, ())
    assert calls == [3]


def test_a_stop_already_set_claims_nothing(store):
    host, _, receiver = _host(store, 2)
    done = threading.Event()
    done.set()
    report = sb.Sweeper(host).run_once(stop=done)                 # an Event works as in run_forever
    assert (report.total, report.more, report.unreached) == (0, True, ())
    assert all(r.state == PENDING and r.claimed_by is None for r in _rows(host, 2))
    assert receiver.keys == []


def test_wakeups_stop_before_reading_or_firing_and_name_the_rows_not_reached(store, monkeypatch):
    """A wake-up batch stops before its reads too (one store read each), and leaves the rows
    it did not reach untouched: getting them woken again is the caller's part."""
    host, clock, _ = _host(store, 3)
    rows = _rows(host, 3)
    requests = [WakeupRequest(r.instance_id, r.ordinal, r.due_at_ms) for r in rows]
    reads: list[tuple[str, int]] = []
    get_timer = store.get_timer
    monkeypatch.setattr(store, "get_timer", lambda key: reads.append(key) or get_timer(key))
    report = sb.Sweeper(host).handle_wakeups(requests, stop=lambda: True)
    assert reads == [] and report.more and report.unreached == tuple(r.key for r in rows)
    start = clock.now_ms()
    report = sb.Sweeper(host).handle_wakeups(requests, stop=lambda: clock.now_ms() >= start + 2_000)
    assert (report.delivered, report.more, len(report.unreached)) == (2, True, 4)
    left = _rows(host, 3)
    assert {r.key for r in left} == set(report.unreached)
    assert all(r.state == PENDING and r.attempts == 0 for r in left)   # untouched: the caller redelivers


def test_workers_stop_too_and_keep_each_instances_rows_in_order(store):
    """Four workers check the same deadline before each of their rows: what is left of an
    instance is always its later rows, and the next sweep delivers exactly those."""
    host, clock, receiver = _host(store, 8)
    every = {r.key for r in _rows(host, 8)}
    start = clock.now_ms()
    sweeper = sb.Sweeper(host, workers=4, lease_s=30)
    try:
        report = sweeper.run_once(stop=lambda: clock.now_ms() >= start + 5_000)
    finally:
        sweeper.close()
    assert report.more and report.delivered + len(report.unreached) == 16
    assert 5 <= report.delivered <= 5 + 3                         # one row in flight per other worker
    unreached = set(report.unreached)
    by_instance: dict[str, list[int]] = {}
    for iid, ordinal in unreached:
        by_instance.setdefault(iid, []).append(ordinal)
    for iid, ordinals in by_instance.items():
        assert sorted(ordinals) == sorted(r.ordinal for r in host.store.pending_timers(iid))
        fired = [o for i, o in every - unreached if i == iid]
        assert all(o < min(ordinals) for o in fired)              # never a later row before an earlier one
    clock.advance(30_000)
    rest = sb.Sweeper(host).run_once()
    assert rest.delivered == len(unreached)
    assert len(receiver.keys) == len(set(receiver.keys)) == 16


def test_in_process_wakeups_taken_and_not_reached_are_given_back(store):
    """``Sweeper(wakeups=MemoryWakeup)``: the wake-ups a stopped sweep took from the source
    and did not reach go back to it, so the next sweep fires them rather than losing them."""
    wake = MemoryWakeup()
    host, clock, receiver = _host(store, 4, wakeup=wake)
    assert len(wake) == 8
    start = clock.now_ms()
    sweeper = sb.Sweeper(host, wakeups=wake)
    report = sweeper.run_once(stop=lambda: clock.now_ms() >= start + 2_000)
    assert (report.delivered, report.more, len(report.unreached)) == (2, True, 6)
    assert len(wake) == 6                                         # back in the source, not lost
    assert all(r.state == PENDING and r.attempts == 0 for r in _rows(host, 4))   # woken rows are never claimed
    rest = sweeper.run_once()
    assert (rest.delivered, rest.more) == (6, False) and len(wake) == 0
    assert len(receiver.keys) == len(set(receiver.keys)) == 8


def test_merged_reports_carry_more_and_unreached():
    from statebound.host.sweeper import SweepReport, _merge
    merged = _merge([SweepReport(fired=1), SweepReport(fired=2, more=True, unreached=(("a", 1),))])
    assert (merged.fired, merged.more, merged.unreached) == (3, True, (("a", 1),))
