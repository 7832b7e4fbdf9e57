"""The pure interpreter: W3C semantics, budget, determinism and the static fast path.

What this module proves, each with a chart small enough to read:

* Structure: compound and parallel states, shallow and deep history (default and
  recorded), final states with ``<donedata>``, ``done.state.*`` for compound and for
  parallel completion, eventless transitions, internal vs external transitions (whether the
  source's onexit/onentry run), document-order conflict resolution.
* Data: early vs late binding (late variables are ``None`` until their state is first
  entered), start data overriding ``<data>``.
* Executable content: raise, send, cancel, assign, log, if/elseif/else, foreach, script;
  an ``error.execution`` stops the rest of its block, not the next block.
* ``max_rounds``: a chart that never settles (an event loop with ``<raise>``, an eventless
  cycle that raises) returns the *unchanged* position and exactly one ``BudgetExhausted``.
* ``drive`` on a halted position raises ``NotRunning``; bare names and ``Event``\\ s both drive.
* Determinism: the same inputs give equal positions and equal effect tuples.
* The static fast path (a flat chart without content) reaches exactly the positions of
  the general path (the same chart plus content that forces the slow path).
"""

from __future__ import annotations

import gc
import re

import pytest

import statebound as sb
from statebound.effects import BudgetExhausted, Done, Log

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'


def chart(body: str, attrs: str = "") -> sb.Chart:
    return sb.Chart.from_scxml(f"<scxml {NS} {attrs}>{body}</scxml>")


def machine(body: str, attrs: str = "", **kw):
    c = chart(body, attrs)
    return c, sb.Interpreter(c, **kw)


def run(body: str, *events, attrs: str = "", data=None, **kw):
    """Start, drive each event; return (final position, all effects in order)."""
    _, it = machine(body, attrs, **kw)
    pos, effects = it.start(data=data)
    out = list(effects)
    for ev in events:
        pos, effects = it.drive(pos, ev)
        out.extend(effects)
    return pos, out


def logs(effects) -> list:
    """The chart's own <log> output (not the Log effects that report a raised error.*)."""
    return [e.value if e.label is None else (e.label, e.value) for e in effects
            if isinstance(e, Log) and not (e.label or "").startswith("error.")]


def L(text: str) -> str:
    """A <log> of a string constant."""
    return f"<log expr=\"'{text}'\"/>"


# --------------------------------------------------------------------------- basics

def test_start_enters_initial_configuration_with_ancestors():
    pos, effects = run('<state id="a" initial="a2"><state id="a1"/><state id="a2"/></state>')
    assert pos.configuration == {"a", "a2"}
    assert pos.status == "running" and pos.macrostep == 0
    assert effects == []


def test_default_initial_is_first_child_in_document_order():
    pos, _ = run('<state id="a"><state id="x"/><state id="y"/></state><state id="b"/>')
    assert pos.configuration == {"a", "x"}


def test_initial_element_runs_its_transition_content():
    pos, effects = run(f'<state id="a"><initial><transition target="y">{L("init")}</transition></initial>'
                       '<state id="x"/><state id="y"/></state>')
    assert pos.configuration == {"a", "y"}
    assert logs(effects) == ["init"]


def test_bare_name_and_event_drive_the_same():
    _, it = machine('<state id="a"><transition event="go" target="b"/></state><state id="b"/>')
    pos, _ = it.start()
    assert it.drive(pos, "go")[0] == it.drive(pos, sb.Event("go"))[0]
    assert it.drive(pos, "go")[0].configuration == {"b"}


def test_drive_never_modifies_its_input():
    _, it = machine('<datamodel><data id="n" expr="0"/></datamodel>'
                    '<state id="a"><transition event="go" target="b"><assign location="n" expr="1"/>'
                    '</transition></state><state id="b"/>')
    pos, _ = it.start()
    snapshot = (pos.states, pos.data, pos.macrostep)
    it.drive(pos, "go")
    assert (pos.states, pos.data, pos.macrostep) == snapshot
    assert pos.configuration == {"a"}


def test_unmatched_event_only_advances_macrostep():
    _, it = machine('<state id="a"><transition event="go" target="b"/></state><state id="b"/>')
    pos, _ = it.start()
    new, effects = it.drive(pos, "nothing")
    assert new.configuration == pos.configuration and effects == ()
    assert new.macrostep == pos.macrostep + 1


def test_event_descriptor_prefix_and_wildcard_matching():
    body = ('<state id="a"><transition event="error" target="err"/><transition event="x.*" target="x"/>'
            '<transition event="*" target="any"/></state><state id="err"/><state id="x"/><state id="any"/>')
    _, it = machine(body)
    pos, _ = it.start()
    assert it.drive(pos, "error.execution")[0].configuration == {"err"}
    assert it.drive(pos, "x.y.z")[0].configuration == {"x"}
    assert it.drive(pos, "xy")[0].configuration == {"any"}
    assert it.drive(pos, "errors")[0].configuration == {"any"}  # a token prefix, not a string prefix


def test_first_transition_in_document_order_wins():
    pos, _ = run('<state id="a"><transition event="e" target="b"/><transition event="e" target="c"/></state>'
                 '<state id="b"/><state id="c"/>', "e")
    assert pos.configuration == {"b"}


def test_child_transition_preempts_ancestor():
    pos, _ = run('<state id="p"><state id="c"><transition event="e" target="x"/></state>'
                 '<transition event="e" target="y"/></state><state id="x"/><state id="y"/>', "e")
    assert pos.configuration == {"x"}


def test_conditions_pick_the_transition():
    body = ('<datamodel><data id="n" expr="2"/></datamodel><state id="a">'
            '<transition event="e" cond="n &gt; 5" target="big"/>'
            '<transition event="e" cond="n &gt; 1" target="mid"/>'
            '<transition event="e" target="small"/></state>'
            '<state id="big"/><state id="mid"/><state id="small"/>')
    assert run(body, "e")[0].configuration == {"mid"}
    assert run(body, "e", data={"n": 9})[0].configuration == {"big"}
    assert run(body, "e", data={"n": 0})[0].configuration == {"small"}


# --------------------------------------------------------------------------- parallel, final, done

def test_parallel_enters_every_region_and_transitions_in_each():
    body = """<parallel id="p">
      <state id="r1"><state id="a1"><transition event="e" target="b1"/></state><state id="b1"/></state>
      <state id="r2"><state id="a2"><transition event="e" target="b2"/></state><state id="b2"/></state>
    </parallel>"""
    _, it = machine(body)
    pos, _ = it.start()
    assert pos.configuration == {"p", "r1", "a1", "r2", "a2"}
    pos, _ = it.drive(pos, "e")
    assert pos.configuration == {"p", "r1", "b1", "r2", "b2"}


def test_parallel_conflict_document_order_wins():
    body = """<parallel id="p">
      <state id="r1"><state id="a1"><transition event="e" target="out1"/></state></state>
      <state id="r2"><state id="a2"><transition event="e" target="out2"/></state></state>
    </parallel><state id="out1"/><state id="out2"/>"""
    assert run(body, "e")[0].configuration == {"out1"}


def test_done_state_of_compound():
    body = """<state id="c"><state id="w"><transition event="finish" target="f"/></state>
        <final id="f"><donedata><param name="code" expr="7"/></donedata></final>
        <transition event="done.state.c" target="after">
          <log expr="_event.data"/></transition></state><state id="after"/>"""
    pos, effects = run(body, "finish")
    assert pos.configuration == {"after"}
    assert logs(effects) == [{"code": 7}]


def test_done_state_of_parallel_only_when_all_regions_final():
    body = f"""<parallel id="p">
      <state id="r1"><state id="a1"><transition event="e1" target="f1"/></state><final id="f1"/></state>
      <state id="r2"><state id="a2"><transition event="e2" target="f2"/></state><final id="f2"/></state>
      <transition event="done.state.r1">{L("r1 done")}</transition>
      <transition event="done.state.p" target="all">{L("p done")}</transition>
    </parallel><state id="all"/>"""
    _, it = machine(body)
    pos, _ = it.start()
    half, effects = it.drive(pos, "e1")
    assert {"p", "f1", "a2"} <= half.configuration
    assert logs(effects) == ["r1 done"]
    full, effects = it.drive(half, "e2")
    assert full.configuration == {"all"}
    assert logs(effects) == ["p done"]


def test_top_level_final_gives_done_with_donedata_and_halts():
    body = """<datamodel><data id="amount" expr="10"/></datamodel>
      <state id="a"><transition event="pay" target="paid"/></state>
      <final id="paid"><donedata><param name="amount" expr="amount"/><param name="ok" expr="True"/></donedata>
      </final>"""
    pos, effects = run(body, "pay")
    assert pos.status == "done" and not pos.running
    assert pos.configuration == {"paid"}  # a halted position keeps the configuration it halted in
    dones = [e for e in effects if isinstance(e, Done)]
    assert len(dones) == 1 and dones[0].donedata == {"amount": 10, "ok": True}


def test_donedata_content():
    pos, effects = run('<final id="f"><donedata><content expr="[1, 2]"/></donedata></final>')
    assert [e.donedata for e in effects if isinstance(e, Done)] == [[1, 2]]
    assert pos.status == "done"


def test_final_without_donedata_gives_done_none():
    _, effects = run('<final id="f"/>')
    assert [e.donedata for e in effects if isinstance(e, Done)] == [None]


def test_final_onexit_runs_when_halting():
    _, effects = run(f'<final id="f"><onentry>{L("in")}</onentry><onexit>{L("out")}</onexit></final>')
    assert logs(effects) == ["in", "out"]
    assert isinstance(effects[-1], Done)


def test_drive_on_halted_position_raises_not_running():
    _, it = machine('<state id="a"><transition event="end" target="f"/></state><final id="f"/>')
    pos, _ = it.start()
    done, _ = it.drive(pos, "end")
    with pytest.raises(sb.NotRunning) as ei:
        it.drive(done, "anything")
    assert ei.value.status == "done"
    with pytest.raises(sb.NotRunning):
        it.drive(done, sb.Event("end"))


def test_start_straight_into_final_is_done():
    pos, _effects = run('<final id="f"/>')
    assert pos.status == "done"
    with pytest.raises(sb.NotRunning):
        sb.Interpreter(pos.chart).drive(pos, "x")


# --------------------------------------------------------------------------- history

HISTORY = """
<state id="work" initial="a">
  <history id="hs" type="shallow"><transition target="b"/></history>
  <history id="hd" type="deep"><transition target="b"/></history>
  <state id="a" initial="a1">
    <state id="a1"><transition event="next" target="a2"/></state>
    <state id="a2"/>
  </state>
  <state id="b"/>
  <transition event="pause" target="paused"/>
</state>
<state id="paused">
  <transition event="resume_shallow" target="hs"/>
  <transition event="resume_deep" target="hd"/>
</state>"""


def test_history_default_when_nothing_recorded():
    _, it = machine(HISTORY.replace('<state id="work" initial="a">', '<state id="work" initial="a">', 1)
                    + '<state id="cold"><transition event="go_s" target="hs"/><transition event="go_d" '
                      'target="hd"/></state>', attrs='initial="cold"')
    pos, _ = it.start()
    assert pos.configuration == {"cold"}
    assert it.drive(pos, "go_s")[0].configuration == {"work", "b"}
    assert it.drive(pos, "go_d")[0].configuration == {"work", "b"}


def test_shallow_history_restores_child_with_its_default_descendant():
    _, it = machine(HISTORY)
    pos, _ = it.start()
    pos, _ = it.drive(pos, "next")
    assert pos.configuration == {"work", "a", "a2"}
    pos, _ = it.drive(pos, "pause")
    back, _ = it.drive(pos, "resume_shallow")
    assert back.configuration == {"work", "a", "a1"}  # child a remembered, a's own default entered


def test_deep_history_restores_atomic_descendants():
    _, it = machine(HISTORY)
    pos, _ = it.start()
    pos, _ = it.drive(pos, "next")
    pos, _ = it.drive(pos, "pause")
    back, _ = it.drive(pos, "resume_deep")
    assert back.configuration == {"work", "a", "a2"}


def test_history_default_transition_content_runs():
    pos, effects = run(f"""<state id="w"><history id="h"><transition target="y">{L("default")}</transition>
        </history><state id="x"/><state id="y"/></state>
        <state id="o"><transition event="back" target="h"/></state>""", "back", attrs='initial="o"')
    assert pos.configuration == {"w", "y"}
    assert logs(effects) == ["default"]


def test_deep_history_in_parallel():
    body = """<state id="outer"><history id="h" type="deep"><transition target="p"/></history>
      <parallel id="p">
        <state id="r1"><state id="x1"><transition event="m" target="y1"/></state><state id="y1"/></state>
        <state id="r2"><state id="x2"/><state id="y2"/></state>
      </parallel>
      <transition event="out" target="away"/></state>
      <state id="away"><transition event="in" target="h"/></state>"""
    pos, _ = run(body, "m", "out", "in")
    assert pos.configuration == {"outer", "p", "r1", "y1", "r2", "x2"}


# --------------------------------------------------------------------------- eventless, internal/external

def test_eventless_transitions_chain_until_stable():
    pos, effects = run(f"""<datamodel><data id="n" expr="0"/></datamodel>
        <state id="a"><transition target="b">{L("a->b")}</transition></state>
        <state id="b"><transition cond="n == 0" target="c"/></state>
        <state id="c"/>""")
    assert pos.configuration == {"c"}
    assert logs(effects) == ["a->b"]


def test_eventless_transitions_run_after_an_external_event():
    pos, _ = run('<datamodel><data id="n" expr="0"/></datamodel>'
                 '<state id="a"><transition event="e" target="b"><assign location="n" expr="3"/></transition>'
                 '</state><state id="b"><transition cond="n == 3" target="c"/></state><state id="c"/>', "e")
    assert pos.configuration == {"c"}


def test_eventless_before_internal_events():
    pos, _effects = run("""<state id="a"><onentry><raise event="ev"/></onentry>
        <transition target="b"/><transition event="ev" target="wrong"/></state>
        <state id="b"><transition event="ev" target="c"/></state><state id="c"/><state id="wrong"/>""")
    assert pos.configuration == {"c"}


EXT_INT = f"""<state id="p" initial="c1">
  <onentry>{L("enter p")}</onentry><onexit>{L("exit p")}</onexit>
  <state id="c1"><onexit>{L("exit c1")}</onexit></state>
  <state id="c2"><onentry>{L("enter c2")}</onentry></state>
  <transition event="ext" type="external" target="c2"/>
  <transition event="int" type="internal" target="c2"/>
</state>"""


def test_external_transition_exits_and_reenters_its_source():
    pos, effects = run(EXT_INT, "ext")
    assert pos.configuration == {"p", "c2"}
    assert logs(effects) == ["enter p", "exit c1", "exit p", "enter p", "enter c2"]


def test_internal_transition_does_not_exit_its_source():
    pos, effects = run(EXT_INT, "int")
    assert pos.configuration == {"p", "c2"}
    assert logs(effects) == ["enter p", "exit c1", "enter c2"]


def test_targetless_transition_exits_nothing():
    pos, effects = run(f'<state id="a"><onexit>{L("exit")}</onexit><onentry>{L("enter")}</onentry>'
                       f'<transition event="e">{L("body")}</transition></state>', "e")
    assert pos.configuration == {"a"}
    assert logs(effects) == ["enter", "body"]


def test_self_transition_exits_and_reenters():
    _, effects = run(f'<state id="a"><onexit>{L("exit")}</onexit><onentry>{L("enter")}</onentry>'
                     '<transition event="e" target="a"/></state>', "e")
    assert logs(effects) == ["enter", "exit", "enter"]


def test_exit_and_entry_order_across_levels():
    body = f"""<state id="a"><onexit>{L("x a")}</onexit>
        <state id="a1"><onexit>{L("x a1")}</onexit><transition event="e" target="b1"/></state></state>
      <state id="b"><onentry>{L("n b")}</onentry>
        <state id="b1"><onentry>{L("n b1")}</onentry></state></state>"""
    _, effects = run(body, "e")
    assert logs(effects) == ["x a1", "x a", "n b", "n b1"]


# --------------------------------------------------------------------------- binding

BINDING = """<state id="a">
  <datamodel><data id="va" expr="1"/></datamodel>
  <onentry><assign location="seen" expr="vb"/></onentry>
  <transition event="go" target="b"/>
</state>
<state id="b"><datamodel><data id="vb" expr="2"/></datamodel></state>
<datamodel><data id="seen" expr="'unset'"/></datamodel>"""


def test_early_binding_initialises_everything_at_start():
    pos, _ = run(BINDING)
    assert dict(pos.datamodel) == {"va": 1, "vb": 2, "seen": 2}


def test_late_binding_values_are_none_until_first_entry():
    _, it = machine(BINDING, attrs='binding="late"')
    pos, _ = it.start()
    assert dict(pos.datamodel) == {"va": 1, "vb": None, "seen": None}
    pos, _ = it.drive(pos, "go")
    assert pos.datamodel["vb"] == 2


def test_late_binding_initialises_once():
    body = """<state id="a"><transition event="go" target="b"/></state>
      <state id="b"><datamodel><data id="v" expr="1"/></datamodel>
        <onentry><assign location="v" expr="v + 10"/></onentry>
        <transition event="back" target="a"/></state>"""
    pos, _ = run(body, "go", "back", "go", attrs='binding="late"')
    assert pos.datamodel["v"] == 21  # declared once (1), then +10 on each of two entries


def test_start_data_overrides_declarations_and_adds_variables():
    pos, _ = run('<datamodel><data id="a" expr="1"/><data id="b" expr="a + 1"/></datamodel><state id="s"/>',
                 data={"a": 10, "extra": "x"})
    assert dict(pos.datamodel) == {"a": 10, "b": 11, "extra": "x"}


# --------------------------------------------------------------------------- executable content

def test_raise_is_processed_after_the_current_block():
    pos, effects = run(f"""<state id="a"><onentry><raise event="r"/>{L("after raise")}</onentry>
        <transition event="r" target="b">{L("got r")}</transition></state><state id="b"/>""")
    assert pos.configuration == {"b"}
    assert logs(effects) == ["after raise", "got r"]


def test_internal_events_are_fifo():
    pos, _effects = run("""<state id="a"><onentry><raise event="one"/><raise event="two"/></onentry>
        <transition event="one" target="b"/><transition event="two" target="wrong"/></state>
        <state id="b"><transition event="two" target="c"/></state><state id="c"/><state id="wrong"/>""")
    assert pos.configuration == {"c"}


def test_assign_log_if_elseif_else():
    body = """<datamodel><data id="n" expr="0"/></datamodel><state id="a">
      <transition event="e"><assign location="n" expr="n + 1"/>
        <if cond="n == 1"><log label="b" expr="'one'"/>
        <elseif cond="n == 2"/><log label="b" expr="'two'"/>
        <else/><log label="b" expr="'many'"/></if></transition></state>"""
    pos, effects = run(body, "e", "e", "e", "e")
    assert logs(effects) == [("b", "one"), ("b", "two"), ("b", "many"), ("b", "many")]
    assert pos.datamodel["n"] == 4


def test_log_without_expr_and_label():
    _, effects = run('<state id="a"><onentry><log label="only"/><log expr="5"/></onentry></state>')
    logs_ = [e for e in effects if isinstance(e, Log)]
    assert [(e.label, e.value) for e in logs_] == [("only", None), (None, 5)]


def test_foreach_with_index_and_shallow_copy():
    body = """<datamodel><data id="xs" expr="[10, 20, 30]"/><data id="acc" expr="[]"/></datamodel>
      <state id="a"><onentry><foreach array="xs" item="x" index="i">
        <assign location="acc" expr="acc + [(i, x)]"/><assign location="xs" expr="xs + [0]"/>
      </foreach></onentry></state>"""
    pos, _ = run(body)
    assert pos.datamodel["acc"] == [[0, 10], [1, 20], [2, 30]]
    assert pos.datamodel["xs"] == [10, 20, 30, 0, 0, 0]
    assert pos.datamodel["x"] == 30 and pos.datamodel["i"] == 2


def test_foreach_over_non_array_is_error_execution():
    pos, _ = run('<datamodel><data id="d" expr="5"/></datamodel><state id="a"><onentry>'
                 '<foreach array="d" item="x"><log expr="x"/></foreach></onentry>'
                 '<transition event="error.execution" target="failed"/></state><state id="failed"/>')
    assert pos.configuration == {"failed"}


def test_script_runs_statements():
    pos, _ = run('<datamodel><data id="n" expr="1"/></datamodel><state id="a"><onentry><script>\n'
                 '    for k in range(3):\n        n = n * 2\n</script></onentry></state>')
    assert pos.datamodel["n"] == 8


def test_top_level_script_runs_at_start():
    pos, _ = run('<script>boot = 41 + 1</script><state id="a"/>')
    assert pos.datamodel["boot"] == 42


def test_error_execution_stops_the_rest_of_the_block_only():
    body = f"""<datamodel><data id="n" expr="0"/><data id="err" expr="None"/></datamodel>
      <state id="a">
        <onentry>{L("1")}<assign location="n" expr="1 / 0"/>{L("skipped")}</onentry>
        <onentry>{L("next block runs")}</onentry>
        <transition event="error.execution" target="b">
          <assign location="err" expr="_event.data['message']"/></transition>
      </state><state id="b"/>"""
    pos, effects = run(body)
    assert logs(effects) == ["1", "next block runs"]
    assert pos.configuration == {"b"}
    assert "ZeroDivisionError" in pos.datamodel["err"]
    assert pos.datamodel["n"] == 0


def test_error_execution_event_is_platform_typed():
    pos, _ = run("""<datamodel><data id="t" expr="None"/></datamodel>
      <state id="a"><onentry><log expr="undefined_name"/></onentry>
      <transition event="error.execution" target="b"><assign location="t" expr="[_event.name, _event.type]"/>
      </transition></state><state id="b"/>""")
    assert pos.datamodel["t"] == ["error.execution", "platform"]


def test_error_in_if_condition_stops_the_block():
    _, effects = run(f'<state id="a"><onentry><if cond="1/0">{L("then")}<else/>{L("else")}</if>'
                     f'{L("after")}</onentry></state>')
    assert logs(effects) == []


def test_errors_never_reach_the_caller():
    body = """<state id="a"><onentry><assign location="x" expr="nope"/><script>raise ValueError('x')</script>
      <send event="e" targetexpr="1/0"/><cancel sendidexpr="1/0"/><log expr="{}['k']"/>
      <foreach array="None" item="y"/></onentry><transition event="go" cond="1/0" target="a"/></state>"""
    pos, _ = run(body, "go", "go")
    assert pos.configuration == {"a"} and pos.status == "running"


# --------------------------------------------------------------------------- budget

LOOPS = {
    "event loop": '<state id="s"><transition event="e" target="s"><raise event="e"/></transition></state>',
    "eventless cycle": '<state id="a"><transition target="b"><raise event="x"/></transition></state>'
                       '<state id="b"><transition target="a"/></state>',
    "raise on entry": '<state id="s"><onentry><raise event="e"/></onentry><transition event="e" target="s"/>'
                      '</state>',
    "ping pong": '<state id="a"><transition event="e" target="b"><raise event="e"/></transition></state>'
                 '<state id="b"><transition event="e" target="a"><raise event="e"/></transition></state>',
}


@pytest.mark.parametrize("name", ["event loop", "ping pong"])
def test_budget_exhausted_returns_unchanged_position(name):
    _, it = machine(LOOPS[name], max_rounds=50)
    pos, _ = it.start()
    new, effects = it.drive(pos, "e")
    assert new is pos or new == pos
    assert new.configuration == pos.configuration and new.macrostep == pos.macrostep
    assert len(effects) == 1
    (eff,) = effects
    assert isinstance(eff, BudgetExhausted)
    assert eff.rounds == 50 and eff.event == "e"
    assert eff.macrostep == pos.macrostep + 1


def test_budget_exhausted_discards_effects_of_the_abandoned_drive():
    body = ('<datamodel><data id="n" expr="0"/></datamodel><state id="s"><transition event="e" target="s">'
            '<assign location="n" expr="n + 1"/><log expr="n"/><send event="t" delay="1s"/><raise event="e"/>'
            '</transition></state>')
    _, it = machine(body, max_rounds=20)
    pos, _ = it.start()
    new, effects = it.drive(pos, "e")
    assert [type(e) for e in effects] == [BudgetExhausted]
    assert new.datamodel["n"] == 0 and new.send_counter == pos.send_counter and new.ordinal == pos.ordinal


def test_eventless_cycle_after_event_is_bounded():
    body = ('<state id="idle"><transition event="go" target="a"/></state>'
            '<state id="a"><transition target="b"><raise event="x"/></transition></state>'
            '<state id="b"><transition target="a"/></state>')
    _, it = machine(body, max_rounds=100)
    pos, _ = it.start()
    new, effects = it.drive(pos, "go")
    assert new == pos and new.configuration == {"idle"}
    assert len(effects) == 1 and isinstance(effects[0], BudgetExhausted)


def test_an_eventless_condition_that_always_fails_is_bounded_too():
    # each evaluation raises error.execution and enables nothing: no microstep ever runs,
    # so only counting the idle internal events stops it
    body = ('<state id="idle"><transition event="go" target="a"/></state>'
            '<state id="a"><transition cond="nope > 1" target="b"/></state><state id="b"/>')
    _, it = machine(body, max_rounds=40)
    pos, _ = it.start()
    new, effects = it.drive(pos, "go")
    assert new == pos and [type(e) for e in effects] == [BudgetExhausted]
    with pytest.raises(sb.BudgetExceeded):
        machine('<state id="a"><transition cond="nope > 1" target="b"/></state><state id="b"/>',
                max_rounds=40)[1].start()


def test_budget_is_per_drive_and_the_position_stays_usable():
    body = ('<datamodel><data id="n" expr="0"/></datamodel>'
            '<state id="s"><transition event="loop" target="s"><raise event="loop"/></transition>'
            '<transition event="inc"><assign location="n" expr="n + 1"/></transition></state>')
    _, it = machine(body, max_rounds=30)
    pos, _ = it.start()
    for _ in range(3):
        same, effects = it.drive(pos, "loop")
        assert same == pos and isinstance(effects[0], BudgetExhausted)
    pos, effects = it.drive(pos, "inc")
    assert pos.datamodel["n"] == 1 and effects == ()


def test_long_but_finite_chain_fits_default_budget():
    body = ('<datamodel><data id="n" expr="0"/></datamodel><state id="s">'
            '<transition cond="n &lt; 500" target="s"><assign location="n" expr="n + 1"/></transition></state>')
    pos, effects = run(body)
    assert pos.datamodel["n"] == 500
    assert effects == []


def test_max_rounds_must_be_positive():
    with pytest.raises(ValueError):
        sb.Interpreter(chart('<state id="a"/>'), max_rounds=0)


# --------------------------------------------------------------------------- determinism

DETERMINISTIC = """<datamodel><data id="n" expr="0"/><data id="ids" expr="[]"/></datamodel>
<parallel id="p">
  <state id="r1"><state id="a"><transition event="tick" target="b">
      <send event="later" delay="2s" idlocation="last"/><assign location="n" expr="n + 1"/></transition></state>
    <state id="b"><onentry><raise event="inner"/><send event="out" target="#_scxml_peer"><param name="n" expr="n"/>
    </send></onentry><transition event="tick" target="a"><cancel sendidexpr="last"/></transition></state></state>
  <state id="r2"><history id="h" type="deep"><transition target="x"/></history>
    <state id="x"><transition event="inner" target="y"/></state><state id="y"><transition event="tick" target="h"/>
    </state><invoke id="kid"><content><scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0">
    <state id="k"/></scxml></content></invoke></state>
</parallel>
<datamodel><data id="last" expr="None"/></datamodel>"""


_DET_CHART = chart(DETERMINISTIC)


def _trace(events):
    it = sb.Interpreter(_DET_CHART)  # a fresh interpreter each time, on the same chart
    pos, effects = it.start(session_id="det")
    trace = [(pos, effects)]
    for ev in events:
        pos, effects = it.drive(pos, ev)
        trace.append((pos, effects))
    return trace


def test_same_inputs_give_equal_positions_and_effects():
    events = ["tick", sb.Event("tick", data={"k": [1, 2]}), "noise", "tick", "tick"]
    one, two = _trace(events), _trace(events)
    assert [p for p, _ in one] == [p for p, _ in two]
    assert [e for _, e in one] == [e for _, e in two]
    assert [p.data for p, _ in one] == [p.data for p, _ in two]
    # and the trace is not trivially empty
    assert any(e for _, e in one[1:])
    assert len({p.states for p, _ in one}) > 1


def test_different_inputs_give_different_positions():
    assert _trace(["tick"])[-1][0] != _trace(["noise"])[-1][0]


def test_generated_ids_are_counters():
    _, effects = run('<state id="a"><onentry><send event="x" target="#_scxml_o"/><send event="y" delay="1s"/>'
                     '<send id="mine" event="z" delay="1s"/><send event="w" delay="2s"/></onentry></state>')
    ids = [e.send_id for e in effects if hasattr(e, "send_id")]
    assert ids == ["send.1", "send.2", "mine", "send.3"]


# --------------------------------------------------------------------------- static fast path

FLAT = """<state id="a"><transition event="next" target="b"/><transition event="jump" target="c"/></state>
<state id="b"><transition event="next" target="c"/><transition event="back" target="a"/></state>
<state id="c"><transition event="next" target="a"/><transition event="stay"/></state>"""


def _with_content(body: str) -> str:
    # the same chart plus a no-op <log> in every state: no macrostep is eligible for the fast path
    return re.sub(r'(<state id="\w+">)', r'\1<onexit><log expr="None"/></onexit>', body)


def test_static_fast_path_matches_general_path():
    fast_chart, slow_chart = chart(FLAT), chart(_with_content(FLAT))
    fast, slow = sb.Interpreter(fast_chart), sb.Interpreter(slow_chart)
    pf, _ = fast.start()
    ps, _ = slow.start()
    seq = ["next", "next", "stay", "next", "jump", "unknown", "next", "next", "back", "next", "next", "next",
           "stay", "jump", "next", "back"]
    slow_logs = 0
    for ev in seq:
        before = pf.states
        pf, ef = fast.drive(pf, ev)
        ps, es = slow.drive(ps, ev)
        assert pf.configuration == ps.configuration, ev
        assert pf.macrostep == ps.macrostep
        assert ef == ()
        assert all(isinstance(e, Log) for e in es)
        assert bool(es) == (pf.states != before)
        slow_logs += len(es)
    static = fast_chart._caches.get("static", {})
    assert any(v is not None for v in static.values()), "the fast path was never used"
    # every macrostep of the slow chart that moves runs its <log>s: it went the general way
    assert slow_logs > 0


def test_static_fast_path_is_deterministic_and_equal_to_uncached():
    c = chart(FLAT)
    it = sb.Interpreter(c)
    p0, _ = it.start()
    a, _ = it.drive(p0, "next")
    b, _ = it.drive(p0, "next")  # served from the cache
    fresh = sb.Interpreter(chart(FLAT))
    q0, _ = fresh.start()
    c2, _ = fresh.drive(q0, "next")
    assert a == b == c2


def test_static_fast_path_respects_nested_states_and_eventless():
    body = """<state id="p"><state id="p1"><transition event="e" target="p2"/></state><state id="p2"/>
      <transition event="out" target="q"/></state>
      <state id="q"><transition event="e" target="r"/></state>
      <state id="r"><transition target="p"/></state>"""
    fast = sb.Interpreter(chart(body))
    slow = sb.Interpreter(chart(body.replace('<state id="q">', '<state id="q"><onentry><log expr="1"/></onentry>')))
    pf, _ = fast.start()
    ps, _ = slow.start()
    for ev in ["e", "out", "e", "e", "out", "zzz", "e"]:
        pf, _ = fast.drive(pf, ev)
        ps, _ = slow.drive(ps, ev)
        assert pf.configuration == ps.configuration, ev
        assert pf.macrostep == ps.macrostep


# --------------------------------------------------------------------------- budget and storability edges

def test_start_on_never_settling_chart_raises_a_typed_error():
    _, it = machine(LOOPS["raise on entry"], max_rounds=50)
    with pytest.raises(sb.BudgetExceeded):
        it.start()


def test_in_place_mutation_to_unstorable_value_is_error_execution():
    _, it = machine('<datamodel><data id="xs" expr="[]"/></datamodel><state id="a">'
                    '<transition event="go"><log expr="xs.append({1})"/></transition>'
                    '<transition event="error.execution" target="failed"/></state><state id="failed"/>')
    pos, _ = it.start()
    new, _ = it.drive(pos, "go")
    assert new.configuration == {"failed"}
    assert new.datamodel["xs"] == []


def _spoiler(again: str) -> sb.Interpreter:
    """``go`` spoils ``xs`` in place; each error.execution spoils it again while ``again`` holds."""
    _, it = machine('<datamodel><data id="xs" expr="[7]"/><data id="k" expr="0"/></datamodel><state id="a">'
                    '<transition event="go"><log expr="xs.append({1})"/></transition>'
                    f'<transition event="error.execution" cond="{again}"><assign location="k" expr="k + 1"/>'
                    '<log expr="xs.append({2})"/></transition></state>')
    return it


def test_restoring_an_unstorable_variable_leaves_no_reference_cycle():
    # a kept exception would hold the drive's frames, its machine and its context in a
    # cycle: alive until the collector runs (an ecmascript context keeps its realm meanwhile);
    # the spoiling error transition makes the commit retry and fail a second time
    it = _spoiler("k == 0")
    pos, _ = it.start()
    gc.collect()
    gc.disable()
    try:
        new, _ = it.drive(pos, "go")
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert dict(new.datamodel) == {"xs": [7], "k": 1}


def test_a_chart_that_keeps_spoiling_a_variable_commits_it_as_it_was():
    # after the commit's last retry the variable keeps its value from before the drive
    # (the rest as the drive left them), and the drive still returns
    it = _spoiler("True")
    pos, _ = it.start()
    new, effects = it.drive(pos, "go")
    assert dict(new.datamodel) == {"xs": [7], "k": 8}
    assert sum(1 for e in effects if isinstance(e, Log) and e.label == "error.execution") == 8


# A property: on random flat/nested charts without content, the fast path and the general
# path (the same chart with a no-op <log> in every state) reach equal positions.
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_EVENTS = ["a", "b", "c", "d"]


@st.composite
def _random_chart(draw):
    n = draw(st.integers(2, 7))
    ids = [f"s{i}" for i in range(n)]
    nested = draw(st.booleans())
    parts = []
    for _i, sid in enumerate(ids):
        trans = []
        for _ in range(draw(st.integers(0, 3))):
            ev = draw(st.sampled_from(_EVENTS))
            tgt = draw(st.sampled_from(ids + [None]))
            typ = draw(st.sampled_from(["", ' type="internal"']))
            trans.append(f'<transition event="{ev}"{typ}' + (f' target="{tgt}"' if tgt else "") + "/>")
        parts.append((sid, "".join(trans)))
    if nested:  # s0 is a compound parent of s1 and s2
        inner = "".join(f'<state id="{sid}">{t}</state>' for sid, t in parts[1:3])
        rest = "".join(f'<state id="{sid}">{t}</state>' for sid, t in parts[3:])
        return f'<state id="{parts[0][0]}">{parts[0][1]}{inner}</state>{rest}'
    return "".join(f'<state id="{sid}">{t}</state>' for sid, t in parts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_random_chart(), events=st.lists(st.sampled_from(_EVENTS + ["zz"]), max_size=12))
def test_fast_path_equals_general_path_on_random_charts(body, events):
    fast = sb.Interpreter(chart(body))
    slow = sb.Interpreter(chart(_with_content(body)))
    pf, _ = fast.start()
    ps, _ = slow.start()
    assert pf == ps
    for ev in events:
        pf, _ = fast.drive(pf, ev)
        ps, _ = slow.drive(ps, ev)
        assert pf == ps, (ev, pf, ps)


def test_start_data_is_checked_before_anything_runs():
    _, it = machine('<state id="a"/>')
    with pytest.raises(ValueError):
        it.start(data={"_sessionid": "forged"})
    with pytest.raises(sb.SerializationError):
        it.start(data={"tags": {1, 2}})
    pos, _ = it.start(data={"extra": [1, 2]})
    assert pos.datamodel["extra"] == [1, 2]


def test_fast_constructors_build_what_the_dataclasses_build():
    from dataclasses import fields

    from statebound.interpreter.values import new_event, new_log
    e = new_event("x", {"k": 1}, "internal", "s1", "#_scxml_o", "t")
    assert e == sb.Event("x", {"k": 1}, "internal", "s1", "#_scxml_o", "t")
    assert all(hasattr(e, f.name) for f in fields(sb.Event))  # every slot set, defaults included
    assert new_event("y") == sb.Event("y") and hash(new_event("y")) == hash(sb.Event("y"))
    log = new_log(3, 2, 1, "lbl", [1])
    assert log == Log(label="lbl", value=[1], macrostep=3, microstep=2, round=1)
    with pytest.raises(AttributeError):
        log.label = "other"  # type: ignore[misc]


# --------------------------------------------------------------------------- values that cannot travel

def _errors(effects) -> list[str]:
    return [str(e.value) for e in effects if isinstance(e, Log) and e.label == "error.execution"]


def test_foreach_over_a_set_is_an_error_not_an_order_of_hashes():
    # a set's order is its hashes' (PYTHONHASHSEED): the same drive stored a different item
    # in each process
    c = chart("""<datamodel><data id="t" expr="None"/></datamodel>
      <state id="a"><transition event="go" target="b">
        <foreach array="_event.data" item="t"/></transition></state><state id="b"/>""",
              'datamodel="python" initial="a"')
    it = sb.Interpreter(c)
    pos, _ = it.start()
    new, effects = it.drive(pos, sb.Event("go", data=frozenset({"alpha", "beta", "gamma"})))
    assert new.datamodel["t"] is None
    assert any("is a set" in e for e in _errors(effects))
    new, _ = it.drive(pos, sb.Event("go", data=["alpha", "beta"]))
    assert new.datamodel["t"] == "beta"


@pytest.mark.parametrize("param", ["lambda: 0", "'\\ud800'"])
def test_donedata_a_store_cannot_hold_is_an_error_execution(param):
    # done data travels like a send's data (to the parent, into rows): an unstorable value
    # failed the parent's host call there, on every retry
    c = chart(f"""<state id="p" initial="f"><final id="f"><donedata><param name="v" expr="{param}"/></donedata></final>
        <transition event="done.state.p" target="got"/></state>
      <state id="got"><onentry><log label="data" expr="repr(_event.data)"/></onentry></state>""",
              'datamodel="python" initial="p"')
    pos, effects = sb.Interpreter(c).start()
    assert pos.configuration == frozenset({"got"})
    assert [e.value for e in effects if isinstance(e, Log) and e.label == "data"] == ["None"]
    assert any("donedata" in e for e in _errors(effects))


@pytest.mark.parametrize("delay", ["", ' delay="1s"'])
def test_a_send_whose_eventexpr_is_empty_is_an_error_at_the_send(delay):
    # kept as a row, the nameless event failed at its fire, after the chart could hear of it
    c = chart(f"""<state id="a"><transition event="go"><send eventexpr="''"{delay}/></transition>
        <transition event="error.execution" target="b"/></state><state id="b"/>""",
              'datamodel="python" initial="a"')
    it = sb.Interpreter(c)
    pos, _ = it.start()
    new, effects = it.drive(pos, "go")
    assert new.configuration == frozenset({"b"})
    assert not [e for e in effects if type(e).__name__ in ("Send", "SendDelayed")]


@pytest.mark.parametrize("datamodel", ["python", "ecmascript"])
def test_start_data_with_a_lone_surrogate_is_refused_like_a_nested_one(datamodel):
    if datamodel == "ecmascript":
        pytest.importorskip("quickjs")
    c = chart('<datamodel><data id="v" expr="0"/></datamodel><state id="a"/>', f'datamodel="{datamodel}"')
    it = sb.Interpreter(c)
    for data in ({"v": "\ud800"}, {"v": ["ok", "\udfff"]}, {"other": "a\ud800"}):
        with pytest.raises(sb.SerializationError):
            it.start("s", data=data)
    assert it.start("s", data={"v": "é"})[0].datamodel["v"] == "é"


def test_python_chart_code_cannot_read_the_hash_seed_nor_store_an_address():
    # a position must be the same bytes in every process: hash(str) follows PYTHONHASHSEED,
    # and an error text with an object's address became event data a chart could store
    c = chart("""<datamodel><data id="h" expr="0"/><data id="err" expr="''"/></datamodel>
      <state id="a"><transition event="go">
          <assign location="h" expr="hash('abc')"/>
          <assign location="h" expr="[].index(lambda: 0)"/></transition>
        <transition event="error.execution"><assign location="err" expr="_event.data['message']"/></transition>
      </state>""", 'datamodel="python" initial="a"')
    it = sb.Interpreter(c)
    pos, _ = it.start()
    new, effects = it.drive(pos, "go")
    texts = _errors(effects)
    assert len(texts) == 1 and "hash" in texts[0]   # the first assign failed, the block stopped there
    assert new.datamodel["h"] == 0
    c2 = chart("""<datamodel><data id="err" expr="''"/></datamodel>
      <state id="a"><transition event="go"><assign location="err" expr="[].index(lambda: 0)"/></transition>
        <transition event="error.execution"><assign location="err" expr="_event.data['message']"/></transition>
      </state>""", 'datamodel="python" initial="a"')
    it2 = sb.Interpreter(c2)
    new, _ = it2.drive(it2.start()[0], "go")
    assert "lambda" in new.datamodel["err"] and "0x" not in new.datamodel["err"]


@pytest.mark.parametrize("datamodel", ["python", "ecmascript"])
def test_foreach_item_that_is_a_path_declares_no_variable_named_after_it(datamodel):
    if datamodel == "ecmascript":
        pytest.importorskip("quickjs")
    c = chart("""<datamodel><data id="n" expr="0"/></datamodel>
      <state id="a"><transition event="go"><foreach array="[1, 2]" item="a.b"/></transition></state>""",
              f'datamodel="{datamodel}"')
    it = sb.Interpreter(c)
    new, effects = it.drive(it.start()[0], "go")
    assert dict(new.datamodel) == {"n": 0}
    assert len(_errors(effects)) == 1
