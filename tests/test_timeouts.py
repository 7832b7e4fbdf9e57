"""Named durable timeouts (``<sb:timeout>``) on the SQLite host.

The three stories of the mechanoid seed (``shared/seeds/durable-timeouts-mechanoid.txt``)
run against the charts in ``examples/timeouts/``; ``docs/timeouts.md`` teaches them.
Then: the generation check (stale rows), validation, every deadline kind, payloads,
parallel and compound states, and the ``statebound timers`` command.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

import statebound as sb
from statebound.cli import main as cli_main
from statebound.effects import Cancel, SendDelayed
from statebound.host.store import Commit

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "timeouts"
EPOCH = 1_767_225_600_000          # 2026-01-01T00:00:00Z
HOUR = 3_600_000


def make_host(chart: sb.Chart, tmp_path: Path, now_ms: int = 0) -> tuple[sb.Host, sb.ManualClock]:
    clock = sb.ManualClock(now_ms=now_ms)
    host = sb.Host(charts=[chart], store=sb.SQLiteStore(tmp_path / "t.db"), clock=clock)
    return host, clock


def rows(host: sb.Host, iid: str) -> list[tuple[int, str | None, int]]:
    """``(ordinal, name, due_at_ms)`` of the pending rows, by ordinal."""
    return [(r.ordinal, r.name, r.due_at_ms) for r in host.pending_timers(iid)]


def row(host: sb.Host, iid: str, name: str):
    found = [r for r in host.pending_timers(iid) if r.name == name]
    assert len(found) == 1, f"expected one {name!r} row, got {found}"
    return found[0]


def armed(host: sb.Host, iid: str) -> dict[str, int]:
    """name -> ordinal of the current generation, as the position records it."""
    return {t.name: t.ordinal for t in host.get(iid).timeouts}


def scxml(body: str, initial: str, datamodel: str = "") -> str:
    return ('<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound" '
            f'version="1.0" datamodel="python" initial="{initial}">\n'
            f"{datamodel}{body}\n</scxml>")


# --------------------------------------------------------------------------- story 1: order


@pytest.fixture
def order_chart() -> sb.Chart:
    return sb.Chart.from_file(EXAMPLES / "order.scxml")


def test_order_payment_timeout_cancels(order_chart, tmp_path):
    host, clock = make_host(order_chart, tmp_path, EPOCH)
    host.start(order_chart, "order-1")
    assert host.pending_timers("order-1") == []           # Pending declares no timeout
    host.send("order-1", "StartPayment")
    (r,) = host.pending_timers("order-1")
    assert (r.name, r.event["name"], r.due_at_ms) == ("PaymentTimeout", "PaymentTimeout", EPOCH + HOUR)

    clock.advance(HOUR - 1)
    assert host.fire_due() == []                          # not due yet
    clock.advance(1)
    (res,) = host.fire_due()
    assert (res.key, res.outcome) == (("order-1", r.ordinal), "fired")
    pos = host.get("order-1")
    assert pos.configuration == {"Cancelled"} and pos.status == "done"
    assert host.pending_timers("order-1") == [] and pos.timeouts == ()
    assert host.metrics["fired"] == 1


def test_order_complete_first_leaves_no_row(order_chart, tmp_path):
    host, clock = make_host(order_chart, tmp_path, EPOCH)
    host.start(order_chart, "order-2")
    host.send("order-2", "StartPayment")
    assert len(host.pending_timers("order-2")) == 1
    clock.advance(HOUR // 2)
    host.send("order-2", "Complete")
    assert host.get("order-2").configuration == {"Done"}
    assert host.pending_timers("order-2") == []
    assert host.next_due() is None
    clock.advance(HOUR)
    assert host.fire_due() == []


def test_order_effects_from_the_pure_core(order_chart):
    """Entering arms (SendDelayed with the name), exiting cancels (Cancel of that send id)."""
    interp = sb.Interpreter(order_chart)
    pos, _ = interp.start(session_id="o")
    pos, effects = interp.drive(pos, "StartPayment")
    (arm,) = [e for e in effects if isinstance(e, SendDelayed)]
    assert (arm.name, arm.event, arm.delay_ms, arm.at_ms) == ("PaymentTimeout", "PaymentTimeout", HOUR, None)
    assert [(t.name, t.ordinal) for t in pos.timeouts] == [("PaymentTimeout", arm.ordinal)]
    pos2, effects = interp.drive(pos, "Complete")
    (cancel,) = [e for e in effects if isinstance(e, Cancel)]
    assert cancel.send_id == arm.send_id and cancel.ordinal > arm.ordinal
    assert pos2.timeouts == ()
    # the position survives the blob round trip with its armed generations
    back = sb.Position.from_bytes(pos.to_bytes(), order_chart)
    assert back.timeouts == pos.timeouts


# --------------------------------------------------------------------------- story 2: campaign


@pytest.fixture
def campaign_chart() -> sb.Chart:
    return sb.Chart.from_file(EXAMPLES / "campaign.scxml")


def test_campaign_timeouts_for_live(campaign_chart):
    specs = campaign_chart.timeouts_for("Live")
    assert {t.name for t in specs} == {"DailyCheck", "EndCycle"}
    by_name = {t.name: t for t in specs}
    assert (by_name["DailyCheck"].kind, by_name["DailyCheck"].duration_ms) == ("after", 3_000)
    assert (by_name["EndCycle"].event, by_name["EndCycle"].duration_ms) == ("EndCycle", 9_000)
    assert campaign_chart.timeouts_for("Draft") == ()


def test_campaign_daily_check_rearms_and_end_cycle_stays_put(campaign_chart, tmp_path):
    host, clock = make_host(campaign_chart, tmp_path, 0)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    end = row(host, "c", "EndCycle")
    assert end.due_at_ms == 9_000
    assert row(host, "c", "DailyCheck").due_at_ms == 3_000

    for now, next_due in ((3_000, 6_000), (6_000, 9_000)):
        clock.set(now)
        fired_row = row(host, "c", "DailyCheck")
        (res,) = host.fire_due()
        assert (res.key, res.outcome) == (fired_row.key, "fired")
        daily = row(host, "c", "DailyCheck")
        assert daily.due_at_ms == next_due and daily.ordinal > fired_row.ordinal   # a new generation
        assert armed(host, "c")["DailyCheck"] == daily.ordinal
        # EndCycle is untouched: same row, same due time, same ordinal
        e = row(host, "c", "EndCycle")
        assert (e.key, e.due_at_ms) == (end.key, 9_000)
        assert armed(host, "c")["EndCycle"] == end.ordinal
        assert host.get("c").configuration == {"Live"}
    assert host.get("c").datamodel["checks"] == 2

    # At 9 s two rows are due: EndCycle (armed at 0 s, lower ordinal) and the DailyCheck
    # re-armed at 6 s. Rows fire in (due, instance, ordinal) order, so EndCycle goes first;
    # leaving Live cancels DailyCheck, deleting its (already claimed) row, and the claim
    # comes back "skipped".
    clock.set(9_000)
    daily = row(host, "c", "DailyCheck")
    assert end.ordinal < daily.ordinal
    results = host.fire_due()
    assert [(r.key, r.outcome) for r in results] == [(end.key, "fired"), (daily.key, "skipped")]
    pos = host.get("c")
    assert pos.configuration == {"Ended"} and pos.status == "done"
    assert pos.datamodel["checks"] == 2                   # the third DailyCheck was never delivered
    assert host.pending_timers("c") == [] and host.next_due() is None
    assert host.metrics["fired"] == 3 and host.metrics.get("stale", 0) == 0


def test_campaign_daily_check_first_at_nine_seconds(campaign_chart, tmp_path):
    """Whichever fires first at 9 s, the campaign ends with no rows: here DailyCheck goes first."""
    host, clock = make_host(campaign_chart, tmp_path, 0)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    for now in (3_000, 6_000):
        clock.set(now)
        host.fire_due()
    clock.set(9_000)
    daily, end = row(host, "c", "DailyCheck"), row(host, "c", "EndCycle")
    assert host.fire(daily).outcome == "fired"            # a stay: re-armed to 12 s
    assert row(host, "c", "DailyCheck").due_at_ms == 12_000
    assert host.get("c").datamodel["checks"] == 3
    assert host.fire(end).outcome == "fired"
    assert host.get("c").configuration == {"Ended"}
    assert host.pending_timers("c") == []


def test_campaign_end_cycle_cancels_both(campaign_chart, tmp_path):
    host, _clock = make_host(campaign_chart, tmp_path, 0)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    host.send("c", "EndCycle")                            # early, from outside
    assert host.get("c").configuration == {"Ended"}
    assert host.pending_timers("c") == []


def test_campaign_sweeper(campaign_chart, tmp_path):
    host, clock = make_host(campaign_chart, tmp_path, 0)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    sweeper = sb.Sweeper(host)
    clock.set(3_000)
    assert sweeper.run_once().fired == 1
    clock.set(9_000)      # late: the DailyCheck due at 6 s goes first (re-armed to 12 s), then EndCycle
    report = sweeper.run_until_idle()
    assert (report.fired, report.skipped, report.stale) == (2, 0, 0)
    assert host.get("c").configuration == {"Ended"}
    assert host.get("c").datamodel["checks"] == 2
    assert host.pending_timers("c") == []


# --------------------------------------------------------------------------- story 3: moving deadline


@pytest.fixture
def deadline_chart() -> sb.Chart:
    return sb.Chart.from_file(EXAMPLES / "deadline.scxml")


def test_moving_deadline(deadline_chart, tmp_path):
    near, far = EPOCH + 5_000, EPOCH + 100_000
    host, clock = make_host(deadline_chart, tmp_path, EPOCH)
    host.start(deadline_chart, "stay-due", data={"due_ms": far})
    watch0, beat0 = row(host, "stay-due", "Watch"), row(host, "stay-due", "Beat")
    assert (watch0.due_at_ms, beat0.due_at_ms) == (far, EPOCH + HOUR)

    host.send("stay-due", "Edit", {"due": near})
    moved = row(host, "stay-due", "Watch")
    assert moved.due_at_ms == near and moved.ordinal > watch0.ordinal
    assert armed(host, "stay-due")["Watch"] == moved.ordinal

    host.send("stay-due", "Edit", {"due": near})
    same = row(host, "stay-due", "Watch")
    assert (same.key, same.due_at_ms) == (moved.key, near)      # same row, same ordinal
    assert armed(host, "stay-due")["Watch"] == moved.ordinal

    beat1 = row(host, "stay-due", "Beat")
    assert (beat1.key, beat1.due_at_ms) == (beat0.key, beat0.due_at_ms)
    assert len(host.pending_timers("stay-due")) == 2

    clock.set(near)
    (res,) = host.fire_due()
    assert (res.key, res.outcome) == (moved.key, "fired")
    assert host.get("stay-due").configuration == {"Expired"}
    assert host.pending_timers("stay-due") == []


def test_moving_deadline_effects(deadline_chart):
    """The core emits nothing for an Edit that does not move Watch, and Cancel+SendDelayed(at_ms) when it does."""
    interp = sb.Interpreter(deadline_chart)
    pos, effects = interp.start(session_id="s", data={"due_ms": EPOCH + 100_000})
    pos, effects = interp.drive(pos, sb.Event("Edit", {"due": EPOCH + 5_000}))
    kinds = [(type(e).__name__, getattr(e, "name", None)) for e in effects if isinstance(e, (Cancel, SendDelayed))]
    assert kinds == [("Cancel", None), ("SendDelayed", "Watch")]
    (arm,) = [e for e in effects if isinstance(e, SendDelayed)]
    assert (arm.at_ms, arm.delay_ms) == (EPOCH + 5_000, None)
    pos2, effects = interp.drive(pos, sb.Event("Edit", {"due": EPOCH + 5_000}))
    assert not [e for e in effects if isinstance(e, (Cancel, SendDelayed))]
    assert pos2.timeouts == pos.timeouts and pos2.ordinal == pos.ordinal


def test_beat_rearms_only_itself(deadline_chart, tmp_path):
    host, clock = make_host(deadline_chart, tmp_path, EPOCH)
    host.start(deadline_chart, "s", data={"due_ms": EPOCH + 10 * HOUR})
    watch = row(host, "s", "Watch")
    clock.advance(HOUR)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert row(host, "s", "Beat").due_at_ms == EPOCH + 2 * HOUR
    w = row(host, "s", "Watch")
    assert (w.key, w.due_at_ms) == (watch.key, watch.due_at_ms)
    assert host.get("s").datamodel["beats"] == 1


# --------------------------------------------------------------------------- story 4: the generation check


def test_stale_row_is_discarded_and_counted(campaign_chart, tmp_path):
    """A row from an older generation never delivers, even if its cancel was missed."""
    host, clock = make_host(campaign_chart, tmp_path, 0)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    old = row(host, "c", "DailyCheck")                    # generation 1, due at 3 s
    clock.set(1_000)
    host.send("c", "DailyCheck")                          # a stay on its own event: re-armed from now
    new = row(host, "c", "DailyCheck")
    assert new.due_at_ms == 4_000 and new.ordinal > old.ordinal
    assert host.get("c").datamodel["checks"] == 1

    # the cancel deleted the old row; write it back, as a missed cancel would leave it
    host.store.commit(Commit(timers_put=(old,)))
    assert {r.ordinal for r in host.pending_timers("c")} == {old.ordinal, new.ordinal, row(host, "c", "EndCycle").ordinal}
    macrostep = host.get("c").macrostep

    clock.set(3_000)                                      # the old row is due: early for the new generation
    (res,) = host.fire_due()
    assert (res.key, res.outcome) == (old.key, "stale")
    assert "DailyCheck" in res.reason
    pos = host.get("c")
    assert pos.datamodel["checks"] == 1 and pos.macrostep == macrostep     # nothing delivered
    assert host.metrics["stale"] == 1 and host.metrics.get("fired", 0) == 0
    assert old.key not in {r.key for r in host.pending_timers("c")}
    assert row(host, "c", "DailyCheck").key == new.key  # the live generation is untouched

    clock.set(4_000)
    (res,) = host.fire_due()
    assert (res.key, res.outcome) == (new.key, "fired")
    assert host.get("c").datamodel["checks"] == 2


def test_stale_direct_fire_and_sweeper_report(deadline_chart, tmp_path):
    host, clock = make_host(deadline_chart, tmp_path, EPOCH)
    host.start(deadline_chart, "s", data={"due_ms": EPOCH + 100_000})
    old = row(host, "s", "Watch")
    host.send("s", "Edit", {"due": EPOCH + 200_000})      # moved: old generation cancelled
    assert old.key not in {r.key for r in host.pending_timers("s")}

    host.store.commit(Commit(timers_put=(old,)))
    res = host.fire(old)                                  # forced, before it is even due
    assert res.outcome == "stale"
    assert host.get("s").configuration == {"Open"}
    assert host.metrics["stale"] == 1

    host.store.commit(Commit(timers_put=(old,)))          # once more, through a sweeper
    clock.set(EPOCH + 100_000)
    report = sb.Sweeper(host).run_once()
    assert (report.stale, report.fired) == (1, 0)
    assert host.metrics["stale"] == 2
    assert host.get("s").configuration == {"Open"}
    assert row(host, "s", "Watch").due_at_ms == EPOCH + 200_000


def test_row_of_a_cancelled_name_is_stale(order_chart, tmp_path):
    """The name is no longer armed at all (the state was exited, another state entered)."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="A">
    <sb:timeout event="T" after="1s"/>
    <transition event="go" target="B"/>
  </state>
  <state id="B">
    <transition event="T" target="Wrong"/>
  </state>
  <final id="Wrong"/>""", "A"))
    host, clock = make_host(chart, tmp_path, 0)
    host.start(chart, "x")
    old = row(host, "x", "T")
    host.send("x", "go")
    host.store.commit(Commit(timers_put=(old,)))
    clock.set(1_000)
    (res,) = host.fire_due()
    assert res.outcome == "stale"
    assert host.get("x").configuration == {"B"}           # T never reached B's transition


def test_plain_delayed_send_is_not_generation_checked(tmp_path):
    """Rows without a name are ordinary <send delay> rows: they share the table and sweeper."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="A">
    <onentry><send event="ping" delay="2s"/></onentry>
    <sb:timeout event="T" after="1s"/>
    <transition event="T"/>
    <transition event="ping" target="Done"/>
  </state>
  <final id="Done"/>""", "A"))
    host, clock = make_host(chart, tmp_path, 0)
    host.start(chart, "x")
    assert [(n, d) for _, n, d in rows(host, "x")] == [(None, 2_000), ("T", 1_000)]
    clock.set(1_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    ping, tick = host.pending_timers("x")                 # both due at 2 s now; ping has the lower ordinal
    assert (ping.name, tick.name, tick.due_at_ms) == (None, "T", 2_000)
    clock.set(2_000)
    assert [(r.key, r.outcome) for r in host.fire_due()] == [(ping.key, "fired"), (tick.key, "skipped")]
    assert host.get("x").configuration == {"Done"}
    assert host.pending_timers("x") == []


# --------------------------------------------------------------------------- validation


def _problems(text: str) -> list[sb.exceptions.Problem]:
    with pytest.raises(sb.ChartValidationError) as info:
        sb.Chart.from_scxml(text)
    return list(info.value.problems)


def test_validation_duplicate_name_with_line():
    (p,) = _problems(scxml("""
  <state id="A">
    <sb:timeout event="T" after="1s"/>
    <sb:timeout event="U" name="T" after="2s"/>
  </state>""", "A"))
    assert "duplicate timeout name 'T'" in p.message and p.line == 5 and p.element == "timeout"


def test_validation_name_defaults_to_event():
    (p,) = _problems(scxml("""
  <state id="A">
    <sb:timeout event="T" after="1s"/>
    <sb:timeout event="T" after="2s"/>
  </state>""", "A"))
    assert "duplicate timeout name 'T'" in p.message and p.line == 5


def test_same_name_on_different_states_is_fine():
    chart = sb.Chart.from_scxml(scxml("""
  <state id="A">
    <sb:timeout event="T" after="1s"/>
    <state id="A1"><sb:timeout event="T" after="2s"/></state>
  </state>""", "A"))
    assert [t.name for t in chart.timeouts_for("A")] == [t.name for t in chart.timeouts_for("A1")] == ["T"]


def test_validation_two_deadline_kinds_with_line():
    (p,) = _problems(scxml("""
  <state id="A">
    <sb:timeout event="T" after="1s" at="2026-01-01T00:00:00Z"/>
  </state>""", "A"))
    assert "exactly one of after, afterexpr, at, atexpr" in p.message and "after, at" in p.message
    assert p.line == 4


def test_validation_unparseable_duration_with_line():
    (p,) = _problems(scxml("""
  <state id="A">

    <sb:timeout event="T" after="5 parsecs"/>
  </state>""", "A"))
    assert "not a duration" in p.message and p.line == 5


def test_validation_lists_every_problem():
    problems = _problems(scxml("""
  <state id="A">
    <sb:timeout event="T" after="soon"/>
    <sb:timeout event="T" after="1s"/>
    <sb:timeout event="U"/>
    <sb:timeout after="1s"/>
    <sb:timeout event="V" at="yesterday"/>
    <sb:timeout event="W" after="1s" afterexpr="'2s'"/>
  </state>
  <final id="F"><sb:timeout event="Q" after="1s"/></final>""", "A"))
    lines = [p.line for p in problems]
    assert lines == [4, 5, 6, 7, 8, 9, 11]
    text = " | ".join(p.message for p in problems)
    for needle in ("not a duration", "duplicate timeout name", "needs exactly one", "needs an event",
                   "not an ISO-8601 instant", "not allowed inside <final>"):
        assert needle in text


def test_duration_syntax():
    chart = sb.Chart.from_scxml(scxml("""
  <state id="A">
    <sb:timeout event="a" after="5s"/>
    <sb:timeout event="b" after="100ms"/>
    <sb:timeout event="c" after="1h"/>
    <sb:timeout event="d" after="2d"/>
    <sb:timeout event="e" after="1.5s"/>
  </state>""", "A"))
    assert [t.duration_ms for t in chart.timeouts_for("A")] == [5_000, 100, HOUR, 2 * 24 * HOUR, 1_500]


def test_timeout_outside_the_namespace_is_ignored_by_scxml():
    """Only urn:statebound's <timeout> is ours; elements of other namespaces are skipped."""
    chart = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:x="urn:other" initial="A">'
        '<state id="A"><x:timeout event="T" after="1s"/></state></scxml>')
    assert chart.timeouts_for("A") == ()


# --------------------------------------------------------------------------- deadline kinds


def test_at_iso_instant(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Open">
    <sb:timeout event="Close" at="2026-01-01T00:00:00Z"/>
    <transition event="Close" target="Closed"/>
  </state>
  <final id="Closed"/>""", "Open"))
    (spec,) = chart.timeouts_for("Open")
    assert (spec.kind, spec.at_ms, spec.duration_ms) == ("at", EPOCH, None)
    host, clock = make_host(chart, tmp_path, EPOCH - 60_000)
    host.start(chart, "x")
    assert rows(host, "x") == [(1, "Close", EPOCH)]       # stored as given, not now + something
    clock.set(EPOCH - 1)
    assert host.fire_due() == []
    clock.set(EPOCH)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("x").configuration == {"Closed"}


def test_at_in_the_past_fires_on_the_next_sweep(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Open">
    <sb:timeout event="Close" at="2026-01-01T00:00:00Z"/>
    <transition event="Close" target="Closed"/>
  </state>
  <final id="Closed"/>""", "Open"))
    host, _clock = make_host(chart, tmp_path, EPOCH + HOUR)
    host.start(chart, "x")
    (res,) = host.fire_due()
    assert res.outcome == "fired" and res.lag_ms == HOUR
    assert host.get("x").configuration == {"Closed"}


def test_at_timer_with_a_stay_on_its_event_does_not_refire(tmp_path):
    """An absolute deadline is not re-armed by its own stay: it would be due again at once, forever."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Open">
    <sb:timeout event="Close" at="2026-01-01T00:00:00Z"/>
    <transition event="Close"><assign location="n" expr="n + 1"/></transition>
  </state>""", "Open", '<datamodel><data id="n" expr="0"/></datamodel>'))
    host, _clock = make_host(chart, tmp_path, EPOCH)
    host.start(chart, "x")
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    for _ in range(3):
        assert host.fire_due() == []
    assert host.get("x").datamodel["n"] == 1
    assert host.pending_timers("x") == []


def test_atexpr_epoch_ms_and_iso_string(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Open">
    <sb:timeout event="Watch" atexpr="due"/>
    <transition event="Edit"><assign location="due" expr="_event.data"/></transition>
    <transition event="Watch" target="Done"/>
  </state>
  <final id="Done"/>""", "Open", '<datamodel><data id="due" expr="0"/></datamodel>'))
    (spec,) = chart.timeouts_for("Open")
    assert spec.kind == "atexpr" and spec.expr is not None
    host, clock = make_host(chart, tmp_path, EPOCH)
    host.start(chart, "x", data={"due": "2026-01-01T00:00:05Z"})
    assert rows(host, "x") == [(1, "Watch", EPOCH + 5_000)]
    host.send("x", "Edit", EPOCH + 7_000)                 # epoch ms
    assert [d for _, _, d in rows(host, "x")] == [EPOCH + 7_000]
    host.send("x", "Edit", "2026-01-01T00:00:07Z")        # the same instant, as a string: unchanged
    (r,) = host.pending_timers("x")
    assert r.due_at_ms == EPOCH + 7_000 and r.ordinal == armed(host, "x")["Watch"]
    ordinal = r.ordinal
    host.send("x", "Edit", "2026-01-01T00:00:07+00:00")
    assert row(host, "x", "Watch").ordinal == ordinal
    clock.set(EPOCH + 7_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("x").configuration == {"Done"}


def test_atexpr_bad_value_is_error_execution(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Open">
    <sb:timeout event="Watch" atexpr="due"/>
    <transition event="error.execution" target="Failed"/>
  </state>
  <final id="Failed"/>""", "Open", '<datamodel><data id="due" expr="\'next tuesday\'"/></datamodel>'))
    host, _ = make_host(chart, tmp_path, EPOCH)
    pos = host.start(chart, "x")
    assert pos.configuration == {"Failed"}
    assert host.pending_timers("x") == []


def test_afterexpr(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Wait">
    <sb:timeout event="Ring" afterexpr="snooze"/>
    <transition event="Ring" target="Up"/>
  </state>
  <final id="Up"/>""", "Wait", '<datamodel><data id="snooze" expr="\'90s\'"/></datamodel>'))
    (spec,) = chart.timeouts_for("Wait")
    assert spec.kind == "afterexpr"
    host, clock = make_host(chart, tmp_path, 1_000)
    host.start(chart, "a")
    assert rows(host, "a") == [(1, "Ring", 91_000)]
    host.start(chart, "b", data={"snooze": 1_500})        # a number is milliseconds
    assert rows(host, "b") == [(1, "Ring", 2_500)]
    clock.set(2_500)
    assert [r.key for r in host.fire_due()] == [("b", 1)]
    assert host.get("b").configuration == {"Up"}


def test_afterexpr_bad_value_is_error_execution(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Wait">
    <sb:timeout event="Ring" afterexpr="snooze"/>
    <transition event="error.execution" target="Failed"/>
  </state>
  <final id="Failed"/>""", "Wait", '<datamodel><data id="snooze" expr="\'a while\'"/></datamodel>'))
    host, _ = make_host(chart, tmp_path)
    assert host.start(chart, "x").configuration == {"Failed"}
    assert host.pending_timers("x") == []


# --------------------------------------------------------------------------- payloads


PAYLOAD = """
  <state id="Wait">
    <sb:timeout event="Expire" after="1s" data="{'order': order_id, 'n': amount * 2}"/>
    <sb:timeout event="Remind" after="2s" namelist="order_id amount"/>
    <transition event="Expire"><assign location="got_data" expr="_event.data"/></transition>
    <transition event="Remind"><assign location="got_namelist" expr="_event.data"/></transition>
  </state>"""
PAYLOAD_DM = """<datamodel>
  <data id="order_id" expr="'o-7'"/><data id="amount" expr="21"/>
  <data id="got_data" expr="None"/><data id="got_namelist" expr="None"/>
</datamodel>"""


def test_data_and_namelist_payload(tmp_path):
    chart = sb.Chart.from_scxml(scxml(PAYLOAD, "Wait", PAYLOAD_DM))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "x")
    assert row(host, "x", "Expire").event["data"] == {"order": "o-7", "n": 42}
    clock.set(2_000)
    assert [r.outcome for r in host.fire_due()] == ["fired", "fired"]
    dm = host.get("x").datamodel
    assert dm["got_data"] == {"order": "o-7", "n": 42}
    assert dm["got_namelist"] == {"order_id": "o-7", "amount": 21}


def test_payload_evaluated_again_on_rearm(tmp_path):
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Tick">
    <sb:timeout event="Tick" after="1s" data="n"/>
    <transition event="Tick"><assign location="n" expr="n + 1"/><assign location="seen" expr="_event.data"/></transition>
  </state>""", "Tick", '<datamodel><data id="n" expr="0"/><data id="seen" expr="None"/></datamodel>'))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "x")
    for t, want in ((1_000, 0), (2_000, 1), (3_000, 2)):
        clock.set(t)
        host.fire_due()
        assert host.get("x").datamodel["seen"] == want
    assert row(host, "x", "Tick").event["data"] == 3


def test_unserializable_payload_is_error_execution(tmp_path):
    """Like <send>, a payload that cannot be stored is error.execution, never a failed host call."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Wait">
    <sb:timeout event="T" after="1s" data="{1, 2}"/>
    <transition event="error.execution" target="Failed"/>
  </state>
  <final id="Failed"/>""", "Wait"))
    host, _ = make_host(chart, tmp_path)
    assert host.start(chart, "x").configuration == {"Failed"}
    assert host.pending_timers("x") == []


def test_payload_error_on_rearm_is_error_execution(tmp_path):
    """A payload that fails when a stay re-arms raises error.execution; the delivery still succeeds."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Open">
    <sb:timeout event="Tick" after="1s" data="{'k': 1 // (1 - n)}"/>
    <transition event="Tick"><assign location="n" expr="n + 1"/></transition>
    <transition event="error.execution"><assign location="errors" expr="errors + 1"/></transition>
  </state>""", "Open", '<datamodel><data id="n" expr="0"/><data id="errors" expr="0"/></datamodel>'))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "x")
    clock.set(1_000)
    (res,) = host.fire_due()
    assert res.outcome == "fired"
    dm = host.get("x").datamodel
    assert (dm["n"], dm["errors"]) == (1, 1)
    assert host.pending_timers("x") == []                 # no Cancel without its replacement either


# --------------------------------------------------------------------------- parallel and compound states


PARALLEL = """
  <parallel id="Work">
    <sb:timeout event="Deadline" after="10s"/>
    <state id="Left">
      <sb:timeout event="LeftPing" after="2s"/>
      <transition event="LeftPing"><assign location="left" expr="left + 1"/></transition>
    </state>
    <state id="Right" initial="R1">
      <state id="R1">
        <sb:timeout event="RightStep" after="3s"/>
        <transition event="RightStep" target="R2"/>
      </state>
      <state id="R2"/>
    </state>
    <transition event="Deadline" target="Over"/>
  </parallel>
  <final id="Over"/>"""


def test_parallel_state_timeouts(tmp_path):
    chart = sb.Chart.from_scxml(scxml(PARALLEL, "Work", '<datamodel><data id="left" expr="0"/></datamodel>'))
    assert [t.name for t in chart.timeouts_for("Work")] == ["Deadline"]
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "p")
    assert sorted((n, d) for _, n, d in rows(host, "p")) == [("Deadline", 10_000), ("LeftPing", 2_000),
                                                            ("RightStep", 3_000)]
    deadline = row(host, "p", "Deadline")
    clock.set(2_000)
    host.fire_due()
    assert row(host, "p", "LeftPing").due_at_ms == 4_000
    clock.set(3_000)
    host.fire_due()                                       # R1 -> R2: RightStep cancelled with R1
    assert host.get("p").configuration == {"Work", "Left", "Right", "R2"}
    assert "RightStep" not in armed(host, "p")
    assert sorted(n for _, n, _ in rows(host, "p")) == ["Deadline", "LeftPing"]
    assert row(host, "p", "Deadline").key == deadline.key  # the parallel stayed active
    ping = row(host, "p", "LeftPing")
    clock.set(10_000)     # LeftPing (due 4 s) fires first and re-arms to 14 s; then Deadline ends it all
    results = host.fire_due()
    assert [(r.key, r.outcome) for r in results] == [(ping.key, "fired"), (deadline.key, "fired")]
    assert host.get("p").configuration == {"Over"}
    assert host.pending_timers("p") == []
    assert host.get("p").datamodel["left"] == 2


COMPOUND = """
  <state id="Flow" initial="A">
    <sb:timeout event="FlowTimeout" after="10s"/>
    <state id="A"><transition event="next" target="B"/></state>
    <state id="B"><transition event="next" target="A"/></state>
    <transition event="FlowTimeout" target="Expired"/>
  </state>
  <final id="Expired"/>"""


def test_compound_timeout_survives_child_transitions(tmp_path):
    chart = sb.Chart.from_scxml(scxml(COMPOUND, "Flow"))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "f")
    first = row(host, "f", "FlowTimeout")
    for t in (2_000, 4_000, 6_000, 8_000):
        clock.set(t)
        host.send("f", "next")
        r = row(host, "f", "FlowTimeout")
        assert (r.key, r.due_at_ms) == (first.key, 10_000)   # not re-armed: Flow never left
        assert armed(host, "f") == {"FlowTimeout": first.ordinal}
    assert host.get("f").configuration == {"Flow", "A"}
    clock.set(10_000)
    host.fire_due()
    assert host.get("f").configuration == {"Expired"}
    assert host.pending_timers("f") == []


def test_compound_timeout_rearmed_by_its_own_event_between_children(tmp_path):
    """The parent's own event moving between its children is a stay for the parent: re-armed from now."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="Flow" initial="A">
    <sb:timeout event="Tick" after="5s"/>
    <state id="A"/>
    <state id="B"/>
    <transition event="Tick" target="B" type="internal"/>
    <transition event="other" target="A" type="internal"/>
  </state>""", "Flow"))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "f")
    first = row(host, "f", "Tick")
    clock.set(1_000)
    host.send("f", "other")                               # children change, not Flow's event: untouched
    assert row(host, "f", "Tick").key == first.key
    clock.set(5_000)
    host.fire_due()
    assert host.get("f").configuration == {"Flow", "B"}
    again = row(host, "f", "Tick")
    assert again.ordinal > first.ordinal and again.due_at_ms == 10_000


def test_external_self_transition_exits_and_rearms(tmp_path):
    """A targeted self-transition exits and re-enters: every timer of the state starts over."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="S">
    <sb:timeout event="A" after="5s"/>
    <sb:timeout event="B" after="7s"/>
    <transition event="reset" target="S"/>
  </state>""", "S"))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "s")
    before = {n: o for o, n, _ in rows(host, "s")}
    clock.set(2_000)
    host.send("s", "reset")
    after = {n: (o, d) for o, n, d in rows(host, "s")}
    assert {n: d for n, (_, d) in after.items()} == {"A": 7_000, "B": 9_000}
    assert all(after[n][0] > before[n] for n in before)


def test_unhandled_stay_event_leaves_other_timers(tmp_path):
    """A targetless transition on some other event re-arms nothing."""
    chart = sb.Chart.from_scxml(scxml("""
  <state id="S">
    <sb:timeout event="A" after="5s"/>
    <transition event="poke"/>
  </state>""", "S"))
    host, clock = make_host(chart, tmp_path)
    host.start(chart, "s")
    first = row(host, "s", "A")
    clock.set(3_000)
    host.send("s", "poke")
    r = row(host, "s", "A")
    assert (r.key, r.due_at_ms) == (first.key, 5_000)


# --------------------------------------------------------------------------- lifecycle and introspection


def test_delete_purges_named_timers(campaign_chart, tmp_path):
    host, _clock = make_host(campaign_chart, tmp_path)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    host.delete("c")
    assert host.pending_timers("c") == [] and host.next_due() is None


def test_named_timers_survive_a_new_host(campaign_chart, tmp_path):
    """The rows and the armed generations are durable: a fresh host on the same file fires them."""
    host, _clock = make_host(campaign_chart, tmp_path)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    host2 = sb.Host(charts=[campaign_chart], store=sb.SQLiteStore(tmp_path / "t.db"),
                    clock=sb.ManualClock(now_ms=3_000))
    assert [r.outcome for r in host2.fire_due()] == ["fired"]
    assert row(host2, "c", "DailyCheck").due_at_ms == 6_000


def test_pending_timers_show_names(campaign_chart, tmp_path):
    host, _ = make_host(campaign_chart, tmp_path)
    host.start(campaign_chart, "c")
    host.send("c", "GoLive")
    found = host.pending_timers("c")
    assert [(r.name, r.event["name"], r.send_id) for r in found] == [
        ("DailyCheck", "DailyCheck", "sb.timeout.Live.DailyCheck"),
        ("EndCycle", "EndCycle", "sb.timeout.Live.EndCycle")]


def test_cli_timers_lists_names_and_due_times(tmp_path, capsys):
    chart_path = tmp_path / "close.scxml"
    chart_path.write_text(scxml("""
  <state id="Open">
    <sb:timeout event="Close" at="2030-06-01T12:00:00Z" name="Closing"/>
    <sb:timeout event="Beat" after="1h"/>
    <transition event="Close" target="Closed"/>
  </state>
  <final id="Closed"/>""", "Open").replace("<scxml ", '<scxml name="close" '))
    db = str(tmp_path / "cli.db")
    assert cli_main(["--db", db, "start", str(chart_path), "inst-1"]) == 0
    capsys.readouterr()

    assert cli_main(["--db", db, "timers", "inst-1"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert re.search(r"Closing\s+Close\s+due 2030-06-01T12:00:00Z", out)
    assert re.search(r"Beat\s+Beat\s+due \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", out)

    assert cli_main(["--db", db, "--json", "timers", "inst-1"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {t["name"]: t for t in data}
    assert by_name["Closing"]["due_at"] == "2030-06-01T12:00:00Z"
    assert by_name["Closing"]["due_at_ms"] == 1_906_545_600_000
    assert by_name["Beat"]["event"] == "Beat"

    assert cli_main(["--db", db, "send", "inst-1", "Close"]) == 0
    capsys.readouterr()
    assert cli_main(["--db", db, "timers", "inst-1"]) == 0
    assert "no pending timers" in capsys.readouterr().out


# --------------------------------------------------------------------------- the docs


def test_stories_script_runs(capsys):
    spec = importlib.util.spec_from_file_location("timeout_stories", EXAMPLES / "stories.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main() == 0
    out = capsys.readouterr().out
    assert "order-1: ['Cancelled'] done" in out and "c-1: ['Ended']" in out


def _blocks(lang: str) -> list[str]:
    text = (ROOT / "docs" / "timeouts.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_docs_charts_match_the_examples():
    files = {p.read_text().strip() for p in EXAMPLES.glob("*.scxml")}
    blocks = [b.strip() for b in _blocks("xml")]
    assert blocks, "docs/timeouts.md shows no charts"
    for b in blocks:
        if b.startswith("<?xml"):
            assert b in files, f"a chart in docs/timeouts.md differs from examples/timeouts/:\n{b[:200]}"


def test_docs_python_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    blocks = _blocks("python")
    assert blocks
    ns: dict = {"__name__": "docs_timeouts", "TMP": tmp_path}
    for b in blocks:
        exec(compile(b, "docs/timeouts.md", "exec"), ns)


def test_two_timers_sharing_an_event_do_not_starve_each_other(tmp_path):
    """A stay on Fast's delivery re-arms Fast only: Slow still fires at 5 s."""
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound"
        initial="S" datamodel="python"><datamodel><data id="n" expr="0"/></datamodel>
      <state id="S"><sb:timeout event="Tick" name="Fast" after="1s"/><sb:timeout event="Tick" name="Slow" after="5s"/>
        <transition event="Tick"><assign location="n" expr="n + 1"/></transition></state></scxml>''')
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([chart], store=sb.SQLiteStore(tmp_path / "t.db"), clock=clock)
    host.start(chart, "x")
    slow_due = []
    for _ in range(5):
        clock.advance(1000)
        host.fire_due()
        slow_due.append(next(r.due_at_ms for r in host.pending_timers("x") if r.name == "Slow"))
    # Slow kept its 5 s deadline through four Fast firings, fired at 5 s, then re-armed to 10 s.
    assert slow_due == [5000, 5000, 5000, 5000, 10_000]
    assert host.get("x").datamodel["n"] == 6
