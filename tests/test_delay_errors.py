"""An invalid delay in ``<send delayexpr>`` or ``<sb:timeout afterexpr>`` raises
``error.execution`` (SCXML 6.2.4: a delay that is not a valid duration is an execution
error), schedules nothing, and shows in the log even when the chart has no handler."""

from __future__ import annotations

import logging

import pytest

import statebound as sb
from statebound.effects import Log, Send, SendDelayed

HEAD = ('<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound" version="1.0" '
        'datamodel="python" initial="a"><datamodel><data id="d" expr="None"/><data id="err" expr="None"/>'
        '</datamodel>')

SEND = HEAD + '''<state id="a"><onentry><send event="later" delayexpr="d"/></onentry>
  <transition event="error.execution" target="failed"><assign location="err" expr="_event.data['message']"/>
  </transition></state><state id="failed"/></scxml>'''

TIMEOUT = HEAD + '''<state id="a"><sb:timeout event="late" afterexpr="d"/>
  <transition event="error.execution" target="failed"><assign location="err" expr="_event.data['message']"/>
  </transition></state><state id="failed"/></scxml>'''

INVALID = ["soon", "-5s", "", float("nan"), float("inf"), float("-inf"), -5, -0.5, 1e30, True, None, [1]]


@pytest.mark.parametrize("chart_text,what", [(SEND, "<send delayexpr>"), (TIMEOUT, "<sb:timeout afterexpr>")])
@pytest.mark.parametrize("delay", INVALID, ids=repr)
def test_invalid_delay_is_error_execution_and_schedules_nothing(chart_text, what, delay):
    chart = sb.Chart.from_scxml(chart_text)
    pos, effects = sb.Interpreter(chart).start(data={"d": delay})
    assert pos.configuration == {"failed"}
    assert what in pos.datamodel["err"]
    assert not any(isinstance(e, (SendDelayed, Send)) for e in effects)
    assert [(e.label, e.value) for e in effects if isinstance(e, Log)] == [("error.execution", pos.datamodel["err"])]


@pytest.mark.parametrize("chart_text", [SEND, TIMEOUT])
@pytest.mark.parametrize("delay,ms", [("2s", 2000), (1500, 1500), (2.9, 2), ("100ms", 100)])
def test_valid_delays_still_schedule(chart_text, delay, ms):
    pos, effects = sb.Interpreter(sb.Chart.from_scxml(chart_text)).start(data={"d": delay})
    assert pos.configuration == {"a"}
    assert [e.delay_ms for e in effects if isinstance(e, SendDelayed)] == [ms]
    assert not any(isinstance(e, Log) for e in effects)


def test_an_unhandled_delay_error_reaches_the_hosts_log(caplog):
    """The issue's case: no error.execution transition, and the operator still sees why."""
    chart = sb.Chart.from_scxml(HEAD + '<state id="a"><sb:timeout event="late" afterexpr="d"/></state></scxml>',
                                name="quiet")
    seen = []
    host = sb.Host([chart], on_log=lambda iid, label, value: seen.append((iid, label, value)))
    host.start("quiet", "q1", {"d": "soon"})
    assert host.pending_timers("q1") == []
    assert [(iid, label) for iid, label, _ in seen] == [("q1", "error.execution")]
    assert "'soon'" in seen[0][2]

    with caplog.at_level(logging.INFO, logger="statebound"):
        sb.Host([chart]).start("quiet", "q2", {"d": float("nan")})
    assert any("q2" in r.getMessage() and "error.execution" in r.getMessage() for r in caplog.records)
