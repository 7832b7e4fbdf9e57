"""An untrusted chart reaches only its own family and the types the host offers it.

A chart loaded with ``trust="untrusted"`` shares a host (and a store) with other
instances. Without a boundary it could drive them: ``<send target="#_scxml_victim">``, a
Basic HTTP URL naming the victim's event route, or a delayed send that fires later. It
could also reach every send processor and invoke handler the host was given (charge a
card, enqueue a message). Each way is tried here against a trusted victim that counts
what reaches it. The same charts loaded as trusted do reach the victim, so each refusal
is the boundary at work and not a chart that never sent anything.

These run in-process: no chart code here runs as python, so there is nothing for the
subprocess sandbox of the other security tests to contain.
"""

from __future__ import annotations

import pytest

import statebound as sb

from .helpers import CATCH, scxml

VICTIM = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="victim">
  <datamodel><data id="pokes" expr="0"/></datamodel>
  <state id="s"><transition event="poke"><assign location="pokes" expr="pokes + 1"/></transition></state>
</scxml>"""

HTTP = "http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor"


def _attacker(body: str, children: str = "") -> str:
    return scxml(f'<state id="a">{CATCH}<onentry>{body}</onentry>{children}</state>', attrs='name="attacker"')


def _run(body: str, trust: str, children: str = "", **host_kw):
    logs: list[tuple[str, str | None, object]] = []
    host = sb.Host([sb.Chart.from_scxml(VICTIM)], clock=sb.ManualClock(now_ms=0),
                   on_log=lambda iid, label, value: logs.append((iid, label, value)), **host_kw)
    host.start("victim", "victim")
    host.start(sb.Chart.from_scxml(_attacker(body, children), name="attacker", trust=trust), "attacker")
    return host, [v for iid, label, v in logs if iid == "attacker" and label == "error"]


SENDS = {
    "scxml target": '<send target="#_scxml_victim" event="poke"/>',
    "scxml targetexpr": "<send targetexpr=\"'#_scxml_' + 'victim'\" event=\"poke\"/>",
    "basic http url": f'<send type="{HTTP}" target="http://statebound.invalid/instances/victim/events" event="poke"/>',
    "delayed scxml": '<send target="#_scxml_victim" event="poke" delay="1s"/>',
}


@pytest.mark.parametrize("body", list(SENDS.values()), ids=list(SENDS))
def test_an_untrusted_chart_cannot_send_to_another_instance(body):
    host, errors = _run(body, "untrusted")
    host.clock.advance(5_000)
    host.fire_due()
    assert host.get("victim").datamodel["pokes"] == 0
    assert host.pending_timers("attacker") == []          # nothing was armed either
    assert errors and all("unreachable" in str(e) or "not reachable" in str(e) for e in errors), errors


@pytest.mark.parametrize("body", list(SENDS.values()), ids=list(SENDS))
def test_the_same_sends_from_a_trusted_chart_arrive(body):
    host, errors = _run(body, "trusted")
    host.clock.advance(5_000)
    host.fire_due()
    assert host.get("victim").datamodel["pokes"] == 1, errors


def test_processors_and_handlers_are_not_offered_to_untrusted_charts():
    sent, started = [], []

    class Handler:
        def start(self, request):
            started.append(request)
            return {"ok": True}

    host, errors = _run('<send type="app" event="charge"/>', "untrusted", '<invoke type="payment"/>', processors={"app": sent.append}, invokers={"payment": Handler()})
    host.fire_due()
    assert sent == [] and started == []
    assert any("app" in str(e) for e in errors) and any("payment" in str(e) for e in errors), errors


def test_a_host_can_offer_named_types_to_untrusted_charts():
    sent, started = [], []

    class Handler:
        def start(self, request):
            started.append(request)
            return {"ok": True}

    _host, errors = _run('<send type="app" event="charge"/>', "untrusted", '<invoke type="payment"/>', processors={"app": sent.append}, invokers={"payment": Handler()},
                        untrusted_may_use={"app", "payment"})
    assert [d.event for d in sent] == ["charge"] and len(started) == 1, errors


def test_an_untrusted_family_still_talks_among_itself():
    child = scxml('<state id="c"><onentry><send target="#_parent" event="hello"/></onentry>'
                  '<transition event="ping"><send target="#_parent" event="pong"/></transition></state>')
    parent = scxml(f"""<datamodel><data id="got" expr="[]"/></datamodel>
      <state id="p">{CATCH}
        <invoke id="kid"><content>{child}</content></invoke>
        <transition event="hello"><assign location="got" expr="got.concat(['hello'])"/>
          <send target="#_kid" event="ping"/><send target="#_scxml_family" event="self"/></transition>
        <transition event="pong"><assign location="got" expr="got.concat(['pong'])"/></transition>
        <transition event="self"><assign location="got" expr="got.concat(['self'])"/></transition>
      </state>""", attrs='name="family"')
    host = sb.Host(clock=sb.ManualClock(now_ms=0))
    host.start(sb.Chart.from_scxml(parent, name="family", trust="untrusted"), "family")
    assert sorted(host.get("family").datamodel["got"]) == ["hello", "pong", "self"]
