"""Wake-ups (host/wakeup.py) on the embedded stores: what the host asks for after a commit,
and how a sweeper fires the rows a wake-up names. The rows stay the truth: a lost wake-up
costs latency, a duplicated or stale one an empty read.
"""

from __future__ import annotations

import pytest

import statebound as sb
from statebound.host import MemoryWakeup, WakeupRequest

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

CHART = sb.Chart.from_scxml(f"""<scxml {NS} name="w" initial="s">
  <datamodel><data id="got" expr="[]"/></datamodel>
  <state id="s">
    <transition event="arm"><send id="soon" event="soon" delay="5s"/><send id="late" event="late" delay="2h"/></transition>
    <transition event="disarm"><cancel sendid="soon"/></transition>
    <transition event="soon"><assign location="got" expr="got + ['soon']"/></transition>
    <transition event="late"><assign location="got" expr="got + ['late']"/></transition>
  </state>
</scxml>""")


class Broken:
    """A wake-up backend that always fails (SQS down)."""

    horizon_ms = None

    def request(self, requests, now_ms):
        raise RuntimeError("queue unreachable")


def test_a_commit_asks_for_the_rows_due_within_the_horizon(store):
    """Only pending rows within the backend's horizon; a row two hours out is left to the
    fallback; a commit that writes no pending row asks for nothing."""
    clock = sb.ManualClock(T0)
    wake = MemoryWakeup(horizon_ms=15 * 60_000)
    host = sb.Host([CHART], store=store, clock=clock, wakeup=wake)
    host.start(CHART, "i")
    assert wake.requested == []
    host.send("i", "arm")
    assert wake.requested == [WakeupRequest("i", 1, T0 + 5_000)]
    host.send("i", "disarm")
    assert len(wake.requested) == 1


def test_a_failing_wakeup_backend_never_fails_the_call(store, caplog):
    """The commit landed: the event is applied, the row is stored, the failure logged."""
    host = sb.Host([CHART], store=store, clock=sb.ManualClock(T0), wakeup=Broken())
    host.start(CHART, "i")
    host.send("i", "arm")
    assert len(host.pending_timers("i")) == 2
    assert "queue unreachable" in caplog.text


def test_a_sweeper_fires_woken_rows_only_when_due_and_only_once(store):
    """A writer host and a sweeper host share the store and a MemoryWakeup. The sweeper
    fires the row at its due time; a duplicated wake-up is one empty read."""
    clock = sb.ManualClock(T0)
    wake = MemoryWakeup()
    writer = sb.Host([CHART], store=store, clock=clock, wakeup=wake)
    sweeper = sb.Sweeper(sb.Host([CHART], store=store, clock=clock, wakeup=wake), wakeups=wake)
    writer.start(CHART, "i")
    writer.send("i", "arm")
    assert sweeper.sleep_time() == pytest.approx(1.0, abs=0.21)
    clock.set(T0 + 5_000)
    report = sweeper.run_once()
    assert (report.fired, report.lag_ms) == (1, (0,))
    assert writer.get("i").datamodel["got"] == ["soon"]
    again = sweeper.handle_wakeups([WakeupRequest("i", 1, T0 + 5_000)])
    assert (again.fired, again.empty) == (0, 1)


def test_an_early_wakeup_asks_again_for_the_rows_due_time(store):
    """A wake-up arriving before its row is due (clock skew, a chained long delay) fires
    nothing and is asked for again at the row's time."""
    clock = sb.ManualClock(T0)
    wake = MemoryWakeup()
    host = sb.Host([CHART], store=store, clock=clock, wakeup=wake)
    host.start(CHART, "i")
    host.send("i", "arm")
    report = sb.Sweeper(host).handle_wakeups([WakeupRequest("i", 2, T0 + 1_000)])
    assert report.total == 0
    assert wake.requested[-1] == WakeupRequest("i", 2, T0 + 2 * 3_600_000)


def test_a_released_row_and_a_retried_dead_row_ask_for_wakeups(store):
    """Backoff after a failed delivery, and an operator's retry, each ask for a wake-up at
    the row's new ready time."""
    clock = sb.ManualClock(T0)
    wake = MemoryWakeup()
    host = sb.Host([CHART], store=store, clock=clock, wakeup=wake, max_attempts=2, backoff_ms=1_000)
    host.start(CHART, "i")
    host.send("i", "arm")
    clock.set(T0 + 5_000)
    [row] = store.claim_due(clock.now_ms(), 1, "n1", 30_000)
    original = host._drain
    host._drain = lambda u: (_ for _ in ()).throw(RuntimeError("downstream down"))
    try:
        assert host.fire(row, node_id="n1").outcome == "failed"
    finally:
        host._drain = original
    assert wake.requested[-1] == WakeupRequest("i", 1, T0 + 6_000)
    store.release(row.key, "n1", error="x", next_attempt_at_ms=T0, dead=True)
    assert host.retry_timer("i", 1)
    assert wake.requested[-1] == WakeupRequest("i", 1, T0 + 5_000)


def test_a_thread_pool_sweep_fires_each_row_once(store):
    """workers=4: forty instances with two due rows each; every row fires exactly once and
    each instance sees its two events in due order."""
    clock = sb.ManualClock(T0)
    chart = sb.Chart.from_scxml(f"""<scxml {NS} name="two" initial="s">
      <datamodel><data id="got" expr="[]"/></datamodel>
      <state id="s">
        <onentry><send event="a" delay="1s"/><send event="b" delay="2s"/></onentry>
        <transition event="a"><assign location="got" expr="got + ['a']"/></transition>
        <transition event="b"><assign location="got" expr="got + ['b']"/></transition>
      </state>
    </scxml>""")
    host = sb.Host([chart], store=store, clock=clock)
    for i in range(40):
        host.start(chart, f"i{i}")
    clock.set(T0 + 2_000)
    sweeper = sb.Sweeper(host, workers=4, batch=200)
    try:
        report = sweeper.run_until_idle()
    finally:
        sweeper.close()
    assert report.fired == 80 and report.failed == report.skipped == 0
    assert all(host.get(f"i{i}").datamodel["got"] == ["a", "b"] for i in range(40))
