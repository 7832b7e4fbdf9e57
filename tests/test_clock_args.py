"""Bad arguments to the clock and to ``Host.migrate`` are ``InvalidArgument``s, with nothing
changed: they used to be raw ``ValueError``/``OverflowError``/``TypeError``s from deep inside."""

from __future__ import annotations

import pytest

import statebound as sb

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="m" initial="a">
  <state id="a"><transition event="go" target="b"/></state><state id="b"/></scxml>"""


@pytest.mark.parametrize("start", [float("nan"), float("inf"), "soon", None, True])
def test_a_manual_clock_refuses_a_start_that_is_no_time(start):
    with pytest.raises(sb.InvalidArgument, match="starting time"):
        sb.ManualClock(start)


@pytest.mark.parametrize("call", [
    lambda c: c.advance(float("inf")), lambda c: c.advance(float("nan")), lambda c: c.advance("5"),
    lambda c: c.advance(None), lambda c: c.set(None), lambda c: c.set(float("inf")), lambda c: c.set("2030"),
    lambda c: c.sleep(float("inf")),
])
def test_a_manual_clock_refuses_a_step_that_is_no_time_and_stays_put(call):
    clock = sb.ManualClock(1_000)
    with pytest.raises(sb.InvalidArgument):
        call(clock)
    assert clock.now_ms() == 1_000


def test_a_manual_clock_still_takes_whole_and_fractional_milliseconds():
    clock = sb.ManualClock(1_000.0)
    assert clock.advance(2.5) == 1_002 and clock.set(5_000) == 5_000
    clock.sleep(0.25)
    assert clock.now_ms() == 5_250
    with pytest.raises(sb.InvalidArgument, match="backwards"):
        clock.advance(-1)


@pytest.mark.parametrize("mapping", [{"a": ["b"]}, {"a": None}, {1: "b"}])
def test_migrate_refuses_a_mapping_of_anything_but_state_ids(mapping):
    chart = sb.Chart.from_scxml(CHART)
    host = sb.Host([chart])
    host.start("m", "i")
    before = host.store.load("i")
    with pytest.raises(sb.InvalidArgument, match="mapping"):
        host.migrate("i", chart, mapping=mapping)
    assert host.store.load("i") == before


@pytest.mark.parametrize("call", [
    lambda sw: sw.run_once(stop=30), lambda sw: sw.run_until_idle(max_sweeps="3"),
    lambda sw: sw.run_until_idle(max_sweeps=0), lambda sw: sw.run_until_idle(stop="soon"),
    lambda sw: sw.run_forever(stop=1.5),
])
def test_sweeper_runs_refuse_a_stop_or_count_they_cannot_use_before_claiming(call):
    chart = sb.Chart.from_scxml("""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="t"
      initial="a"><state id="a"><onentry><send event="go" delay="1s"/></onentry>
      <transition event="go" target="b"/></state><final id="b"/></scxml>""")
    clock = sb.ManualClock(0)
    host = sb.Host([chart], clock=clock)
    host.start("t", "i")
    clock.advance(1_000)
    with pytest.raises(sb.InvalidArgument):
        call(sb.Sweeper(host))
    assert [r.state for r in host.pending_timers("i")] == ["pending"]      # nothing claimed


def test_fire_due_refuses_a_lease_that_lapses_as_it_is_taken():
    # Sweeper(lease_s=0) was refused for this (another sweeper could hand the same outbox row
    # over at once), but host.fire_due(lease_ms=0) claimed with it
    chart = sb.Chart.from_scxml(CHART)
    host = sb.Host([chart])
    with pytest.raises(sb.InvalidArgument, match="lease_ms"):
        host.fire_due(lease_ms=0)
    assert host.fire_due(lease_ms=1) == []
