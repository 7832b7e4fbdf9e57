"""Effects a drive returns, and named durable timeouts in the pure core.

What this module proves:

* ``<send delay>`` gives ``SendDelayed`` with ``delay_ms`` (from ``delay`` and ``delayexpr``);
  ``<send>`` to an external target gives ``Send``; generated send ids are ``send.N`` and
  unique; ``ordinal`` strictly increases on every ``SendDelayed`` and every ``Cancel``,
  across drives (it is persisted in the position).
* ``<cancel>`` gives ``Cancel`` with the send id (literal or ``sendidexpr``).
* ``<invoke>`` gives ``Invoke`` carrying the compiled child chart (inline and ``src``), and
  exiting the invoking state gives ``CancelInvoke`` with the same id.
* ``<log>`` gives ``Log(label, value)``; a top-level final gives ``Done(donedata)``.
* Effects are frozen (assigning a field raises ``FrozenInstanceError``) and carry
  ``macrostep``/``microstep``/``round`` as they stood when produced.
* ``<sb:timeout>``: entering arms (``SendDelayed`` with ``name`` and ``delay_ms`` or
  ``at_ms``), exiting cancels with the same ``send_id``, a targetless transition on the
  timeout's own event re-arms it under a new ordinal, an ``atexpr`` whose value changed
  re-arms and an unchanged one does not, and ``after`` timers are unaffected by other stays.
"""

from __future__ import annotations

import dataclasses

import pytest

import statebound as sb
from statebound.effects import (BudgetExhausted, Cancel, CancelInvoke, Done, Invoke, Log, Send,
                                SendDelayed)

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
SBNS = 'xmlns:sb="urn:statebound"'


def chart(body: str, attrs: str = "") -> sb.Chart:
    return sb.Chart.from_scxml(f"<scxml {NS} {SBNS} {attrs}>{body}</scxml>")


def interp(body: str, attrs: str = "", **kw) -> sb.Interpreter:
    return sb.Interpreter(chart(body, attrs), **kw)


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


# --------------------------------------------------------------------------- send / cancel

def test_delayed_send_gives_send_delayed_with_delay_ms():
    it = interp('<datamodel><data id="d" expr="\'250ms\'"/></datamodel>'
                '<state id="a"><onentry><send event="t1" delay="1.5s"/><send event="t2" delayexpr="d"/>'
                '<send event="t3" delayexpr="40"/><send event="t4" delay="2m"><param name="k" expr="1"/></send>'
                '</onentry></state>')
    _, effects = it.start(session_id="me")
    sd = of(effects, SendDelayed)
    assert [(e.event, e.delay_ms) for e in sd] == [("t1", 1500), ("t2", 250), ("t3", 40), ("t4", 120_000)]
    assert all(e.at_ms is None and e.name is None and e.target is None for e in sd)
    assert sd[3].data == {"k": 1}
    assert all(e.origin == "#_scxml_me" for e in sd)
    assert all(e.type == "http://www.w3.org/TR/scxml/#SCXMLEventProcessor" for e in sd)


def test_generated_send_ids_are_unique_counters_and_authored_ids_are_kept():
    it = interp('<datamodel><data id="where" expr="None"/></datamodel><state id="a">'
                '<onentry><send event="x" delay="1s"/><send id="mine" event="y" delay="1s"/>'
                '<send event="z" delay="1s" idlocation="where"/></onentry>'
                '<transition event="again"><send event="w" delay="1s"/></transition></state>')
    pos, e1 = it.start()
    pos, e2 = it.drive(pos, "again")
    sd = of(e1 + e2, SendDelayed)
    assert [(e.send_id, e.id_from_author) for e in sd] == [("send.1", False), ("mine", True),
                                                          ("send.2", False), ("send.3", False)]
    assert pos.datamodel["where"] == "send.2"


def test_ordinal_increases_on_every_send_delayed_and_cancel_across_drives():
    it = interp('<state id="a"><onentry><send id="t" event="tick" delay="1s"/><cancel sendid="t"/>'
                '<send event="u" delay="2s"/></onentry>'
                '<transition event="go" target="b"><cancel sendid="t"/><send event="v" delay="3s"/></transition>'
                '</state><state id="b"><onentry><send event="w" target="#_scxml_other"/><cancel sendid="x"/></onentry>'
                '</state>')
    pos, e1 = it.start()
    pos, e2 = it.drive(pos, "go")
    timed = [e for e in e1 + e2 if isinstance(e, (SendDelayed, Cancel))]
    assert [type(e).__name__ for e in timed] == ["SendDelayed", "Cancel", "SendDelayed", "Cancel",
                                                 "SendDelayed", "Cancel"]
    assert [e.ordinal for e in timed] == [1, 2, 3, 4, 5, 6]
    assert pos.ordinal == 6
    # an immediate Send does not take an ordinal
    assert len(of(e2, Send)) == 1 and not hasattr(of(e2, Send)[0], "ordinal")


def test_cancel_effect_carries_the_send_id():
    it = interp('<datamodel><data id="sid" expr="None"/></datamodel><state id="a">'
                '<onentry><send event="t" delay="5s" idlocation="sid"/></onentry>'
                '<transition event="stop"><cancel sendidexpr="sid"/><cancel sendid="literal"/></transition></state>')
    pos, e1 = it.start()
    pos, e2 = it.drive(pos, "stop")
    (sent,) = of(e1, SendDelayed)
    cancels = of(e2, Cancel)
    assert [c.send_id for c in cancels] == [sent.send_id, "literal"]
    assert all(c.c_index is not None and c.owner is not None for c in cancels)


def test_immediate_external_send():
    it = interp('<datamodel><data id="n" expr="3"/></datamodel><state id="a"><onentry>'
                '<send event="hello" target="#_scxml_peer" namelist="n"/><send event="up" target="#_parent"/>'
                '</onentry><transition event="error.communication" target="nocomm"/></state><state id="nocomm"/>')
    pos, effects = it.start(session_id="me", parent="boss")
    sends = of(effects, Send)
    assert [(s.event, s.target, s.data) for s in sends] == [("hello", "#_scxml_peer", {"n": 3}),
                                                            ("up", "#_parent", None)]
    assert pos.configuration == {"a"}


def test_send_without_target_is_a_send_to_self():
    it = interp('<state id="a"><onentry><send event="self"/></onentry></state>')
    _, effects = it.start()
    (s,) = of(effects, Send)
    assert s.target is None and s.event == "self"


def test_send_to_internal_is_queued_not_emitted():
    it = interp('<state id="a"><onentry><send event="me" target="#_internal"/></onentry>'
                '<transition event="me" target="b"/></state><state id="b"/>')
    pos, effects = it.start()
    assert pos.configuration == {"b"} and effects == ()


def test_bad_delayexpr_is_error_execution_with_no_effect():
    it = interp('<state id="a"><onentry><send event="t" delayexpr="\'soon\'"/></onentry>'
                '<transition event="error.execution" target="b"/></state><state id="b"/>')
    pos, effects = it.start()
    assert pos.configuration == {"b"} and of(effects, SendDelayed) == []


# --------------------------------------------------------------------------- invoke

CHILD = f'<scxml {NS}><state id="k"><transition event="q" target="kf"/></state><final id="kf"/></scxml>'


def test_invoke_gives_compiled_child_and_exit_cancels_it():
    c = chart(f'<state id="a"><invoke id="kid"><param name="x" expr="1 + 1"/><content>{CHILD}</content>'
              '</invoke><transition event="leave" target="b"/></state><state id="b"/>')
    it = sb.Interpreter(c)
    pos, effects = it.start()
    (inv,) = of(effects, Invoke)
    assert inv.invokeid == "kid" and inv.state == "a" and inv.data == {"x": 2}
    assert isinstance(inv.chart, sb.Chart) and inv.chart.state("kf").kind == "final"
    assert inv.chart is c.state("a").invokes[0].chart
    pos, effects = it.drive(pos, "leave")
    assert of(effects, CancelInvoke) == [CancelInvoke(invokeid="kid", macrostep=1, microstep=1, round=0)]


def test_invoke_generated_id_and_from_src(tmp_path):
    (tmp_path / "child.scxml").write_text(CHILD)
    (tmp_path / "parent.scxml").write_text(
        f'<scxml {NS}><state id="a"><invoke src="child.scxml" idlocation="iid"/>'
        '<transition event="leave" target="b"/></state><state id="b"/>'
        '<datamodel><data id="iid" expr="None"/></datamodel></scxml>')
    it = sb.Interpreter(sb.Chart.from_file(tmp_path / "parent.scxml"))
    pos, effects = it.start()
    (inv,) = of(effects, Invoke)
    assert inv.chart is not None and inv.chart.state("k").kind == "atomic"
    assert pos.datamodel["iid"] == inv.invokeid
    pos, effects = it.drive(pos, "leave")
    assert [c.invokeid for c in of(effects, CancelInvoke)] == [inv.invokeid]


def test_invoke_in_state_left_in_the_same_macrostep_is_never_started():
    it = interp(f'<state id="a"><invoke id="kid"><content>{CHILD}</content></invoke><transition target="b"/>'
                '</state><state id="b"/>')
    pos, effects = it.start()
    assert pos.configuration == {"b"}
    assert of(effects, Invoke) == [] and of(effects, CancelInvoke) == []


def test_reaching_top_level_final_cancels_active_invokes_and_reports_done():
    it = interp(f'<state id="a"><invoke id="kid"><content>{CHILD}</content></invoke>'
                '<transition event="end" target="f"/></state><final id="f"/>')
    pos, _ = it.start()
    pos, effects = it.drive(pos, "end")
    assert [type(e) for e in effects] == [CancelInvoke, Done]
    assert pos.status == "done"


def test_autoforward_and_finalize():
    from statebound.effects import Autoforward
    it = interp(f'<state id="a"><invoke id="kid" autoforward="true"><content>{CHILD}</content>'
                '<finalize><log label="fin" expr="_event.name"/></finalize></invoke></state>')
    pos, _ = it.start()
    pos, effects = it.drive(pos, sb.Event("hello", data={"x": 1}))
    assert [(type(e), e.event.name, e.event.data) for e in effects] == [(Autoforward, "hello", {"x": 1})]
    pos, effects = it.drive(pos, sb.Event("reply", invokeid="kid"))
    assert [(e.label, e.value) for e in of(effects, Log)] == [("fin", "reply")]


# --------------------------------------------------------------------------- log, done, stamps, frozen

def test_log_effect():
    it = interp('<datamodel><data id="n" expr="4"/></datamodel><state id="a"><onentry>'
                '<log label="n is" expr="n * 2"/><log expr="[n]"/></onentry></state>')
    _, effects = it.start()
    assert effects == (Log(label="n is", value=8, macrostep=0, microstep=0, round=0),
                       Log(label=None, value=[4], macrostep=0, microstep=0, round=0))


def test_done_effect():
    it = interp('<state id="a"><transition event="end" target="f"/></state>'
                '<final id="f"><donedata><param name="why" expr="\'finished\'"/></donedata></final>')
    pos, _ = it.start()
    _, effects = it.drive(pos, "end")
    assert effects == (Done(donedata={"why": "finished"}, macrostep=1, microstep=1, round=0),)


def test_effects_carry_macrostep_microstep_round():
    it = interp('<state id="a"><onentry><log label="start"/></onentry>'
                '<transition event="go" target="b"><log label="t1"/><raise event="r"/></transition></state>'
                '<state id="b"><onentry><log label="enter b"/></onentry>'
                '<transition event="r" target="c"><log label="t2"/></transition></state><state id="c"/>')
    pos, e0 = it.start()
    pos, e1 = it.drive(pos, "go")
    pos, e2 = it.drive(pos, "nothing")
    stamps = [(e.label, e.macrostep, e.microstep, e.round) for e in e0 + e1]
    assert stamps == [("start", 0, 0, 0), ("t1", 1, 1, 0), ("enter b", 1, 1, 0), ("t2", 1, 2, 0)]
    assert pos.macrostep == 2 and e2 == ()


@pytest.mark.parametrize("effect", [
    Log(label="l", value=1),
    Done(donedata=None),
    Cancel(send_id="s", c_index=1, owner=1, ordinal=1),
    SendDelayed(event="e", target=None, type="t", data=None, send_id="s", delay_ms=1, c_index=1, owner=1,
                ordinal=1, id_from_author=False),
    Send(event="e", target=None, type="t", data=None, send_id="s", c_index=1, owner=1),
    CancelInvoke(invokeid="i"),
    BudgetExhausted(rounds=3),
])
def test_effects_are_frozen(effect):
    with pytest.raises(dataclasses.FrozenInstanceError):
        effect.macrostep = 99  # type: ignore[misc]
    field = [f.name for f in dataclasses.fields(effect)][-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(effect, field, "changed")
    assert {"macrostep", "microstep", "round"} <= {f.name for f in dataclasses.fields(effect)}


def test_effects_from_a_drive_are_frozen_and_hashable_where_plain():
    it = interp('<state id="a"><onentry><send event="t" delay="1s"/><log label="x" expr="1"/></onentry></state>')
    _, effects = it.start()
    assert isinstance(effects, tuple)
    for e in effects:
        with pytest.raises(dataclasses.FrozenInstanceError):
            e.round = 5  # type: ignore[misc]
    assert len({hash(e) for e in effects}) == len(effects)


def test_effects_never_alias_chart_constants():
    it = interp('<state id="a"><onentry><send event="t" target="#_scxml_o"><content>{"k": [1]}</content>'
                '</send></onentry><transition event="again" target="a"/></state>')
    pos, e1 = it.start()
    of(e1, Send)[0].data["k"].append("mutated")
    _, e2 = it.drive(pos, "again")
    assert of(e2, Send)[0].data == {"k": [1]}


# --------------------------------------------------------------------------- named timeouts

LIVE = """<datamodel><data id="deadline" expr="1000"/></datamodel>
<state id="Live">
  <sb:timeout name="idle" event="idle" after="5s"/>
  <sb:timeout name="hard" event="hard" atexpr="deadline"/>
  <sb:timeout name="fixed" event="fixed" after="1h"/>
  <transition event="idle"/>
  <transition event="poke"/>
  <transition event="move"><assign location="deadline" expr="deadline + 1"/></transition>
  <transition event="same"><assign location="deadline" expr="deadline"/></transition>
  <transition event="leave" target="Gone"/>
</state>
<state id="Gone"/>"""


@pytest.fixture
def live():
    it = interp(LIVE)
    pos, effects = it.start(session_id="inst")
    return it, pos, effects


def test_chart_lists_timeouts_for_state():
    c = chart(LIVE)
    assert [t.name for t in c.timeouts_for("Live")] == ["idle", "hard", "fixed"]
    assert [t.kind for t in c.timeouts_for("Live")] == ["after", "atexpr", "after"]


def test_entering_arms_every_timeout(live):
    _, pos, effects = live
    sd = of(effects, SendDelayed)
    assert [(e.name, e.event, e.delay_ms, e.at_ms) for e in sd] == [
        ("idle", "idle", 5000, None), ("hard", "hard", None, 1000), ("fixed", "fixed", 3_600_000, None)]
    assert [e.ordinal for e in sd] == [1, 2, 3]
    assert len({e.send_id for e in sd}) == 3
    assert all(e.target is None and e.origin == "#_scxml_inst" for e in sd)
    assert len(pos.timeouts) == 3


def test_exiting_cancels_with_the_same_send_ids(live):
    it, pos, armed = live
    pos, effects = it.drive(pos, "leave")
    cancels = of(effects, Cancel)
    assert sorted(c.send_id for c in cancels) == sorted(e.send_id for e in of(armed, SendDelayed))
    assert sorted(c.ordinal for c in cancels) == [4, 5, 6]
    assert of(effects, SendDelayed) == []
    assert pos.timeouts == () and pos.configuration == {"Gone"}


def test_targetless_transition_on_own_event_rearms_with_new_ordinal(live):
    it, pos, armed = live
    idle0 = of(armed, SendDelayed)[0]
    pos, effects = it.drive(pos, "idle")
    assert [type(e) for e in effects] == [Cancel, SendDelayed]
    cancel, rearm = effects
    assert cancel.send_id == idle0.send_id
    assert rearm.name == "idle" and rearm.send_id == idle0.send_id and rearm.delay_ms == 5000
    assert rearm.ordinal > cancel.ordinal > idle0.ordinal
    # and again: each re-arm takes a fresh ordinal
    pos, effects2 = it.drive(pos, "idle")
    assert of(effects2, SendDelayed)[0].ordinal > rearm.ordinal


def test_other_stays_leave_after_timers_alone(live):
    it, pos, _ = live
    new, effects = it.drive(pos, "poke")
    assert effects == ()
    assert new.timeouts == pos.timeouts


def test_atexpr_that_changes_rearms(live):
    it, pos, _ = live
    pos, effects = it.drive(pos, "move")
    assert [type(e) for e in effects] == [Cancel, SendDelayed]
    cancel, rearm = effects
    assert cancel.send_id == rearm.send_id and rearm.name == "hard"
    assert rearm.at_ms == 1001 and rearm.delay_ms is None


def test_atexpr_unchanged_does_not_rearm(live):
    it, pos, _ = live
    new, effects = it.drive(pos, "same")
    assert effects == ()
    assert new.timeouts == pos.timeouts


def test_reentering_rearms_from_scratch():
    it = interp('<state id="a"><sb:timeout event="t" after="1s"/><transition event="again" target="a"/></state>')
    pos, e0 = it.start()
    pos, e1 = it.drive(pos, "again")
    assert [type(e) for e in e1] == [Cancel, SendDelayed]
    assert e1[0].send_id == e1[1].send_id == of(e0, SendDelayed)[0].send_id
    assert e1[1].ordinal == 3


def test_timeout_on_parent_survives_child_transitions():
    it = interp('<state id="p"><sb:timeout event="deadline" after="10s"/>'
                '<state id="c1"><transition event="next" target="c2"/></state><state id="c2"/>'
                '<transition event="out" target="q"/></state><state id="q"/>')
    pos, e0 = it.start()
    assert len(of(e0, SendDelayed)) == 1
    pos, e1 = it.drive(pos, "next")
    assert e1 == () and pos.configuration == {"p", "c2"}
    pos, e2 = it.drive(pos, "out")
    assert [c.send_id for c in of(e2, Cancel)] == [of(e0, SendDelayed)[0].send_id]


def test_timeout_firing_transition_out_cancels_remaining_timers():
    it = interp('<state id="a"><sb:timeout event="t1" after="1s"/><sb:timeout event="t2" after="2s"/>'
                '<transition event="t1" target="b"/></state><state id="b"/>')
    pos, _ = it.start()
    pos, effects = it.drive(pos, "t1")
    assert sorted(c.send_id for c in of(effects, Cancel)) == ["sb.timeout.a.t1", "sb.timeout.a.t2"]
    assert of(effects, SendDelayed) == []


def test_at_timeout_gives_absolute_deadline():
    it = interp('<state id="a"><sb:timeout event="t" at="2026-01-01T00:00:00Z"/></state>')
    _, effects = it.start()
    (sd,) = of(effects, SendDelayed)
    assert (sd.at_ms, sd.delay_ms) == (1767225600000, None)


def test_afterexpr_timeout_and_bad_value():
    it = interp('<datamodel><data id="d" expr="\'30s\'"/></datamodel>'
                '<state id="a"><sb:timeout event="t" afterexpr="d"/>'
                '<transition event="error.execution" target="bad"/><transition event="go" target="b"/></state>'
                '<state id="b"><sb:timeout event="u" afterexpr="\'whenever\'"/>'
                '<transition event="error.execution" target="bad"/></state><state id="bad"/>')
    pos, effects = it.start()
    assert of(effects, SendDelayed)[0].delay_ms == 30_000
    pos, effects = it.drive(pos, "go")
    assert pos.configuration == {"bad"}
    assert of(effects, SendDelayed) == []


def test_timeout_data_from_namelist():
    it = interp('<datamodel><data id="who" expr="\'ann\'"/></datamodel>'
                '<state id="a"><sb:timeout event="t" after="1s" namelist="who"/></state>')
    _, effects = it.start()
    assert of(effects, SendDelayed)[0].data == {"who": "ann"}


def test_timeouts_are_deterministic(live):
    it, pos, _ = live
    seq = ["idle", "move", "poke", "same", "idle", "leave"]

    def go():
        p, out = pos, []
        for ev in seq:
            p, effects = it.drive(p, ev)
            out.append(effects)
        return p, out

    assert go() == go()
