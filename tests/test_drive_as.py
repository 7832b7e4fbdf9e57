"""``Interpreter.drive_as``: a drive of a position kept without per-driver fields.

A host keeps positions as they were decoded and hands each drive the fields it offers
(routes, ``_ioprocessors``, invokers) beside the position. That must be exactly a drive of
the stamped position: the same blob, the same effects, the same errors, whichever path
(cached or full) answers. These tests drive both ways from the same start.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statebound as sb
from statebound.datamodel.budget import Budget
from statebound.effects import Send

from test_static_path import _EVENT, _events, random_charts

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'


class _Driver:
    """``() -> (routes, ioprocessors, invokers)``: routes that reach only ``reachable``
    (everything when ``None``), a processor and an invoker type; counts its calls."""

    def __init__(self, reachable: set[str] | None = None) -> None:
        def routes(session_id: str) -> bool:
            return reachable is None or session_id in reachable
        self.fields = (routes, {"basichttp": {"location": "http://h.invalid/x"}, "sb.queue": {}},
                       frozenset({"sb.job"}))
        self.calls = 0

    def __call__(self) -> tuple[Any, Any, Any]:
        self.calls += 1
        return self.fields


_driver = _Driver


def _stamped(pos: sb.Position, driver: _Driver) -> sb.Position:
    routes, iop, invokers = driver.fields
    return pos.restamp(routes=routes, ioprocessors=iop, invokers=invokers)


def assert_drive_as_is_a_stamped_drive(text: str, events: list[Any], driver: _Driver,
                                       static_path: bool = True) -> None:
    chart = sb.Chart.from_scxml(text)
    it = sb.Interpreter(chart, max_rounds=60, static_path=static_path)
    try:
        start, _ = it.start(session_id="p")
    except sb.BudgetExceeded:
        return
    bare = start.restamp()      # as a host keeps it: no per-driver fields
    stamped = _stamped(bare, driver)
    for ev in events:
        if not bare.running:
            break
        calls = driver.calls
        got, got_effects = it.drive_as(bare, driver, ev)
        assert driver.calls - calls <= 1
        want, want_effects = it.drive(stamped, ev)
        assert got.to_bytes() == want.to_bytes(), ev
        assert got_effects == want_effects, ev
        assert got == want          # per-driver fields never take part in equality
        if want is stamped:         # nothing changed: nothing is copied either
            assert got is bare
        bare, stamped = got.restamp(), _stamped(want, driver)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=random_charts(), events=st.lists(_EVENT, max_size=12), static_path=st.booleans())
def test_drive_as_equals_a_drive_of_the_stamped_position_on_random_charts(text, events, static_path):
    assert_drive_as_is_a_stamped_drive(text, _events(events), _driver(), static_path)


# A chart that reads _ioprocessors in the content of a transition the cache would answer,
# validates a <send type> against the offer, and sends to a session the routes may refuse.
IOP_CHART = f"""<scxml {NS} datamodel="python" initial="s">
  <datamodel><data id="n" expr="0"/><data id="where" expr="''"/></datamodel>
  <state id="s">
    <transition event="look"><assign location="where" expr="_ioprocessors['basichttp']['location']"/></transition>
    <transition event="count"><assign location="n" expr="n + 1"/></transition>
    <transition event="queue"><send type="sb.queue" event="job"/></transition>
    <transition event="bogus"><send type="nowhere" event="job"/></transition>
    <transition event="other"><send target="#_scxml_other" event="hello"/></transition>
    <transition event="error.*"><assign location="n" expr="n - 100"/></transition>
  </state>
</scxml>"""


# The same without _ioprocessors: the cached path may keep the fields out, the full one may not.
ROUTE_CHART = IOP_CHART.replace("""<transition event="look"><assign location="where" expr="_ioprocessors['basichttp']['location']"/></transition>""", "")


@pytest.mark.parametrize(("text", "events"), [
    (IOP_CHART, ["look", "count"]), (IOP_CHART, ["queue", "bogus", "count"]), (IOP_CHART, ["other", "count"]),
    (ROUTE_CHART, ["queue", "bogus", "count"]), (ROUTE_CHART, ["other", "count"]),
], ids=["iop-look", "iop-types", "iop-routes", "types", "routes"])
@pytest.mark.parametrize("reachable", [None, set()])
def test_the_fields_the_drive_reads_come_from_the_driver(text, events, reachable):
    driver = _driver(reachable)
    assert_drive_as_is_a_stamped_drive(text, events, driver)
    it = sb.Interpreter(sb.Chart.from_scxml(text))
    pos, _ = it.start(session_id="p")
    pos = pos.restamp()
    for ev in events:
        pos, effects = it.drive_as(pos, driver, ev)
        if ev == "look":
            assert pos.datamodel["where"] == "http://h.invalid/x"
        if ev == "queue":
            assert [type(e) for e in effects] == [Send] and effects[0].type == "sb.queue"
        if ev == "other":   # refused routes: error.communication, handled by error.*
            assert pos.datamodel["n"] == (0 if reachable is None else -100)


LOOP_CHART = f"""<scxml {NS} datamodel="python" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="count"><assign location="n" expr="n + 1"/></transition>
    <transition event="spin"><script>while True: n = n + 1</script></transition>
    <transition event="spin-full"><script>while True: n = n + 1</script><raise event="x"/></transition>
  </state>
</scxml>"""


@pytest.mark.parametrize("event", ["spin", "spin-full"])
def test_a_drive_out_of_budget_returns_the_given_position_itself(event):
    it = sb.Interpreter(sb.Chart.from_scxml(LOOP_CHART))
    pos, _ = it.start(session_id="p")
    bare = pos.restamp()
    same, effects = it.drive_as(bare, _driver(), event, budget=Budget(cpu_ms=20))
    assert same is bare     # a host tells "nothing happened" by identity
    assert [type(e).__name__ for e in effects] == ["BudgetExhausted"]


def test_a_cached_drive_copies_no_per_driver_field_into_the_new_position():
    it = sb.Interpreter(sb.Chart.from_scxml(LOOP_CHART))
    pos, _ = it.start(session_id="p")
    driver = _driver()
    new, _ = it.drive_as(pos.restamp(), driver, "count")
    assert new.datamodel["n"] == 1
    assert (new.routes, new.ioprocessors, new.invokers) == (None, None, None)
    assert driver.calls == 0    # nothing read the fields, so none were built


def test_a_chart_that_reads_ioprocessors_gets_the_driver_s_in_the_new_position_too():
    it = sb.Interpreter(sb.Chart.from_scxml(IOP_CHART))
    pos, _ = it.start(session_id="p")
    driver = _driver()
    new, _ = it.drive_as(pos.restamp(), driver, "count")
    assert (new.routes, new.ioprocessors, new.invokers) == driver.fields
    assert driver.calls == 1


def test_without_a_driver_it_is_drive():
    it = sb.Interpreter(sb.Chart.from_scxml(IOP_CHART))
    pos, _ = it.start(session_id="p")
    stamped = _stamped(pos, _driver(set()))
    a, ea = it.drive_as(stamped, None, "other")
    b, eb = it.drive(stamped, "other")
    assert a.to_bytes() == b.to_bytes() and ea == eb
    assert a.routes is stamped.routes


def test_an_untrusted_chart_reaches_only_what_its_routes_allow():
    pytest.importorskip("quickjs")
    chart = sb.Chart.from_scxml(ROUTE_CHART.replace('"python"', '"ecmascript"'), trust="untrusted")
    it = sb.Interpreter(chart)
    pos, _ = it.start(session_id="p")
    refused, _ = it.drive_as(pos.restamp(), _driver(set()), "other")
    allowed, effects = it.drive_as(pos.restamp(), _driver({"other"}), "other")
    assert refused.datamodel["n"] == -100
    assert allowed.datamodel["n"] == 0 and [type(e) for e in effects] == [Send]
