"""The static path never changes behaviour: the cache on against the cache off.

``Interpreter(chart)`` answers a macrostep whose shape does not depend on data from a
per-chart plan; ``Interpreter(chart, static_path=False)`` runs the full W3C macrostep
every time. Driven with the same events from the same start, the two must give
byte-identical position blobs and equal effects after every drive.

The charts come from two places: a hypothesis strategy that builds random charts with
executable content (nested and parallel states, history, final states, conditions that
read data, ``In()`` and ``_event``, content that fails, raises, sends or stores what
cannot be stored), and the compiler fuzzer's corpus (``tests/test_chart_fuzz.py``) with
its mutations, keeping the mutants that still compile.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statebound as sb
from statebound.interpreter.algorithm import Machine
from statebound.interpreter.static import Plan

from test_chart_fuzz import CORPUS, mutate

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
EVENTS = ["a", "b", "c"]

#: Conditions: pure data, _event, and one that fails (error.execution).
CONDS = [None, None, None, "n % 2 == 0", "n > 3", "len(xs) &lt; 3", "_event.name == 'a'", "nope > 1"]
#: Content: what the static path can run, what makes it step aside, and what fails.
ACTIONS = [
    '<assign location="n" expr="n + 1"/>',
    '<assign location="xs" expr="xs + [n]"/>',
    '<log label="n" expr="n"/>',
    '<log label="only a label"/>',
    '<log label="ev" expr="_event.name"/>',
    '<if cond="n % 3 == 0"><assign location="n" expr="n + 2"/><elseif cond="n % 3 == 1"/>'
    '<log label="one" expr="n"/><else/><assign location="xs" expr="[]"/></if>',
    '<script>n = n * 2 % 97</script>',
    '<foreach array="xs[:2]" item="it" index="ix"><assign location="n" expr="n + it"/></foreach>',
    '<assign location="n" expr="n // 0"/>',          # error.execution
    '<assign location="undeclared" expr="1"/>',       # error.execution
    '<assign location="xs" expr="{1, 2}"/>',          # unstorable: error.execution
    '<script>xs.append({n})</script>',                # unstorable in place: caught at the end
    '<raise event="b"/>',                             # an internal event: the full path
    '<send event="c" delay="1s"/>',                   # a timer: the full path
    '<send event="a"/>',                              # an external send to self
]
#: The same for the ecmascript datamodel (its context methods, not per-expression closures).
ECMA_CONDS = [None, None, None, "n % 2 == 0", "n > 3", "xs.length &lt; 3", "_event.name == 'a'", "nope > 1"]
ECMA_ACTIONS = [
    '<assign location="n" expr="n + 1"/>',
    '<assign location="xs" expr="xs.concat([n])"/>',
    '<log label="n" expr="n"/>',
    '<log label="ev" expr="_event.name"/>',
    '<if cond="n % 3 == 0"><assign location="n" expr="n + 2"/><else/><log label="other" expr="n"/></if>',
    '<script>n = (n * 2) % 97</script>',
    '<assign location="n" expr="nope.x"/>',           # error.execution
    '<raise event="b"/>',
]


@st.composite
def _state(draw, ids: list[str], depth: int, parent_kind: str, actions: list[str]) -> str:
    sid = f"s{len(ids)}"
    ids.append(sid)
    kinds = ["atomic", "atomic", "final"] if depth >= 2 else ["atomic", "atomic", "compound", "parallel", "final"]
    if parent_kind == "parallel":
        kinds = [k for k in kinds if k != "final"]
    kind = draw(st.sampled_from(kinds))
    if kind == "final":
        return f'<final id="{sid}"/>'
    tag = "parallel" if kind == "parallel" else "state"
    inner = ""
    if kind in ("compound", "parallel"):
        children = []
        for _ in range(draw(st.integers(2, 3))):
            children.append(f"s{len(ids)}")
            inner += draw(_state(ids, depth + 1, kind, actions))
        if kind == "compound" and draw(st.booleans()):
            hid = f"h{sid}"
            inner += (f'<history id="{hid}" type="{draw(st.sampled_from(["shallow", "deep"]))}">'
                      f'<transition target="{draw(st.sampled_from(children))}"/></history>')
    for block in ("onentry", "onexit"):
        acts = draw(st.lists(st.sampled_from(actions), max_size=2))
        if acts:
            inner = f"<{block}>{''.join(acts)}</{block}>" + inner
    return f'<{tag} id="{sid}">{inner}</{tag}>'


def _transitions(draw, body: str, ids: list[str], conds: list[str | None], actions: list[str]) -> str:
    """Add 0-3 transitions to every non-final state, targets drawn from every id."""
    import re

    targets = ids + [h for h in re.findall(r'<history id="(\w+)"', body)]

    def add(m: re.Match) -> str:
        out = m.group(0)
        for _ in range(draw(st.integers(0, 3))):
            event = draw(st.sampled_from(EVENTS + [None]))
            cond = draw(st.sampled_from(conds))
            target = draw(st.sampled_from(targets + [None]))
            if event is None and target is None:
                continue  # a targetless eventless transition would loop without a microstep
            attrs = (f' event="{event}"' if event else "") + (f' cond="{cond}"' if cond else "") + \
                (f' target="{target}"' if target else "") + \
                (' type="internal"' if draw(st.integers(0, 4)) == 0 else "")
            acts = "".join(draw(st.lists(st.sampled_from(actions), max_size=2)))
            out += f"<transition{attrs}>{acts}</transition>"
        return out

    return re.sub(r'<(?:state|parallel) id="s\d+">', add, body)


@st.composite
def random_charts(draw, datamodel: str = "python") -> str:
    conds, actions = (CONDS, ACTIONS) if datamodel == "python" else (ECMA_CONDS, ECMA_ACTIONS)
    ids: list[str] = []
    body = "".join(draw(_state(ids, 0, "root", actions)) for _ in range(draw(st.integers(1, 3))))
    if all(f'<final id="{i}"/>' in body for i in ids):
        body += f'<state id="s{len(ids)}"/>'
        ids.append(f"s{len(ids)}")
    body = _transitions(draw, body, ids, conds, actions)
    return (f'<scxml {NS} datamodel="{datamodel}"><datamodel><data id="n" expr="0"/><data id="xs" expr="[]"/>'
            f"</datamodel>{body}</scxml>")


def _events(draw_list: list[str | tuple[str, int]]) -> list[sb.Event | str]:
    return [sb.Event(e[0], data={"k": e[1]}) if isinstance(e, tuple) else e for e in draw_list]


def assert_same_behaviour(text: str, events: list[sb.Event | str]) -> int:
    """Drive both interpreters; return how many drives the static path answered."""
    chart = sb.Chart.from_scxml(text)
    fast = sb.Interpreter(chart, max_rounds=60)
    slow = sb.Interpreter(chart, max_rounds=60, static_path=False)
    try:
        pf, ef = fast.start(session_id="p")
    except sb.BudgetExceeded:
        with pytest.raises(sb.BudgetExceeded):
            slow.start(session_id="p")
        return 0
    ps, es = slow.start(session_id="p")
    assert pf.to_bytes() == ps.to_bytes() and ef == es
    answered = 0
    for ev in events:
        if not pf.running:
            assert not ps.running
            break
        built = _machines_built[0]
        pf, ef = fast.drive(pf, ev)
        answered += _machines_built[0] == built
        ps, es = slow.drive(ps, ev)
        assert pf.to_bytes() == ps.to_bytes(), (ev, pf, ps)
        assert pf == ps
        assert ef == es, (ev, ef, es)
    return answered


_machines_built = [0]


@pytest.fixture(autouse=True)
def _count_machines(monkeypatch):
    """Count full-path machines: a drive that builds none was answered by the static path."""
    init = Machine.__init__

    def counting(self, *args, **kwargs):
        _machines_built[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(Machine, "__init__", counting)


_EVENT = st.one_of(st.sampled_from(EVENTS + ["zz"]), st.tuples(st.sampled_from(EVENTS), st.integers(0, 3)))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=random_charts(), events=st.lists(_EVENT, max_size=14))
def test_cache_on_and_off_agree_on_random_charts(text, events):
    assert_same_behaviour(text, _events(events))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=random_charts("ecmascript"), events=st.lists(_EVENT, max_size=8))
def test_cache_on_and_off_agree_on_random_ecmascript_charts(text, events):
    pytest.importorskip("quickjs")
    assert_same_behaviour(text, _events(events))


def test_cache_on_and_off_agree_on_the_fuzz_corpus_and_its_compiling_mutants():
    rng = random.Random(1515)
    texts = list(CORPUS)
    while len(texts) < len(CORPUS) + 150:
        mutant = mutate(rng, rng.choice(CORPUS))
        try:
            sb.Chart.from_scxml(mutant)
        except sb.StateboundError:
            continue
        texts.append(mutant)  # type: ignore[arg-type]
    names = ["go", "back", "one", "e", "f.x", "flip", "chk", "tick", "idle", "stop", "q", "StartPayment",
             "Complete", "PaymentTimeout", "in", "out", "done.invoke.kid", "zz"]
    answered = 0
    for text in texts:
        events: list[sb.Event | str] = [rng.choice(names) for _ in range(10)]
        answered += assert_same_behaviour(text, events)  # type: ignore[arg-type]
    assert answered > 50, "the static path was hardly exercised"


REALISTIC = f"""<scxml {NS} datamodel="python" initial="a"><datamodel><data id="n" expr="0"/></datamodel>
  <state id="a"><onexit><assign location="n" expr="n + 1"/><log label="x" expr="n"/></onexit>
    <transition event="next" cond="n &gt;= 0" target="b"><assign location="n" expr="n + 1"/></transition>
    <transition event="fail" target="b"><assign location="n" expr="n // 0"/></transition>
  </state>
  <state id="b"><onentry><log label="in b" expr="n"/></onentry><transition event="next" target="a"/>
    <transition event="error.execution" target="err"/></state>
  <state id="err"/></scxml>"""


def test_a_chart_with_content_is_answered_without_a_machine():
    chart = sb.Chart.from_scxml(REALISTIC)
    it = sb.Interpreter(chart)
    pos, _ = it.start()
    logs = []
    for k in range(6):
        if k == 2:  # planning (first use) builds scratch machines; after that, none is built
            before = _machines_built[0]
        pos, effects = it.drive(pos, "next")
        assert all(isinstance(e, sb.effects.Log) for e in effects)
        logs += [(e.label, e.value, e.macrostep, e.microstep) for e in effects]
    assert _machines_built[0] == before
    assert logs == [("x", 1, 1, 1), ("in b", 2, 1, 1), ("x", 3, 3, 1), ("in b", 4, 3, 1), ("x", 5, 5, 1),
                    ("in b", 6, 5, 1)]
    assert pos.datamodel["n"] == 6 and pos.configuration == {"a"}
    assert any(isinstance(v, Plan) for v in chart._caches["static"].values())


def test_a_failing_action_abandons_the_plan_and_the_full_path_raises_the_error():
    chart = sb.Chart.from_scxml(REALISTIC)
    fast, slow = sb.Interpreter(chart), sb.Interpreter(chart, static_path=False)
    pf, _ = fast.start()
    ps, _ = slow.start()
    assert pf == ps
    start = pf
    pf, ef = fast.drive(start, "fail")  # plans, then steps aside
    pg, eg = fast.drive(start, "fail")  # the plan is known now, and still steps aside
    ps, es = slow.drive(start, "fail")
    assert isinstance(chart._caches["static"][(start.states, "fail")], Plan)
    assert pf.configuration == {"err"} and pf.to_bytes() == ps.to_bytes() == pg.to_bytes() and ef == es == eg


def test_static_path_off_never_consults_the_plans():
    chart = sb.Chart.from_scxml(REALISTIC)
    it = sb.Interpreter(chart, static_path=False)
    pos, _ = it.start()
    before = _machines_built[0]
    for _ in range(3):
        pos, _ = it.drive(pos, "next")
    assert _machines_built[0] == before + 3
    assert not chart._caches.get("static")


def test_a_plan_that_keeps_failing_is_dropped_for_the_full_path():
    from statebound.interpreter.interpreter import ABANDON_LIMIT
    chart = sb.Chart.from_scxml(f"""<scxml {NS} datamodel="python"><datamodel><data id="n" expr="0"/></datamodel>
      <state id="a"><transition event="poke"><assign location="n" expr="n // 0"/></transition></state></scxml>""")
    it = sb.Interpreter(chart)
    pos, _ = it.start()
    key = (pos.states, "poke")
    for _ in range(ABANDON_LIMIT - 1):
        pos, _ = it.drive(pos, "poke")
    assert isinstance(chart._caches["static"][key], Plan)  # still tried: the failure may pass
    pos, effects = it.drive(pos, "poke")
    assert chart._caches["static"][key] is None  # now straight to the full macrostep
    before = _machines_built[0]
    pos, effects = it.drive(pos, "poke")
    assert _machines_built[0] == before + 1
    assert [e.label for e in effects] == ["error.execution"]  # and it still raises the error


# --------------------------------------------------------------------------- the CPU budget on the static path

def _burn_cpu(seconds: float) -> None:
    import time
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.parametrize("where", [
    '<transition event="go" cond="sum(1 for _ in iter(int, 1)) > 0" target="b"/>',
    '<transition event="go" target="b"><assign location="n" expr="[i for i in iter(int, 1)]"/></transition>',
])
@pytest.mark.parametrize("static_path", [True, False])
def test_a_loop_in_planned_content_is_stopped_by_the_budget(where, static_path):
    chart = sb.Chart.from_scxml(f"""<scxml {NS} datamodel="python"><datamodel><data id="n" expr="0"/></datamodel>
      <state id="a">{where}</state><state id="b"/></scxml>""")
    it = sb.Interpreter(chart, max_cpu_ms=200, static_path=static_path)
    pos, _ = it.start()
    new, effects = it.drive(pos, "go")
    assert new == pos
    assert [(type(e).__name__, e.reason) for e in effects] == [("BudgetExhausted", "cpu")]
    if static_path:
        assert isinstance(chart._caches["static"][(pos.states, "go")], Plan)


def test_a_budget_given_to_a_planned_drive_is_checked():
    from statebound.datamodel.budget import Budget
    assigns = '<assign location="n" expr="n + 1"/>' * 20  # more work than one check's worth
    chart = sb.Chart.from_scxml(f"""<scxml {NS} datamodel="python"><datamodel><data id="n" expr="0"/></datamodel>
      <state id="a"><transition event="go" target="b">{assigns}</transition></state><state id="b"/></scxml>""")
    it = sb.Interpreter(chart)
    pos, _ = it.start()
    fresh, _ = it.drive(pos, "go", budget=Budget(cpu_ms=5_000))
    assert fresh.datamodel["n"] == 20
    spent = Budget(cpu_ms=1).start()
    _burn_cpu(0.01)
    new, effects = it.drive(pos, "go", budget=spent)
    assert new == pos and [e.reason for e in effects] == ["cpu"]


def test_a_short_drive_makes_no_budget_of_its_own(monkeypatch):
    from statebound.datamodel import budget as budget_module
    made = []
    unchecked = budget_module.Budget.unchecked.__func__  # type: ignore[attr-defined]

    def counting(cls, *args):
        made.append(args)
        return unchecked(cls, *args)

    monkeypatch.setattr(budget_module.Budget, "unchecked", classmethod(counting))
    for static_path in (True, False):
        it = sb.Interpreter(sb.Chart.from_scxml(REALISTIC), static_path=static_path)
        pos, _ = it.start()
        for _ in range(4):
            pos, _ = it.drive(pos, "next")
        made.clear()
        for _ in range(6):
            pos, _ = it.drive(pos, "next")
        # nothing could loop and no check fell due: a budget nobody would read is not made
        assert made == [], static_path
    # a chart whose code can loop gets its budget up front, for the tracer
    loops = sb.Interpreter(sb.Chart.from_scxml(REALISTIC.replace('expr="n + 1"', 'expr="n + sum(1 for _ in [1])"')))
    pos, _ = loops.start()
    made.clear()
    loops.drive(pos, "next")
    assert made


@pytest.mark.parametrize("datamodel, big", [("python", "'x' * 600000"), ("ecmascript", "'x'.repeat(600000)")])
@pytest.mark.parametrize("given", [False, True])
def test_a_plan_that_steps_aside_hands_over_its_cpu_not_its_memory(datamodel, big, given):
    # The plan logs a big value, then fails: the full macrostep runs the same content and
    # brings the value out again. Counted twice, the drive was refused on the static path
    # (and so for ABANDON_LIMIT drives, then accepted once the plan was dropped) while the
    # same drive passed with the cache off.
    if datamodel == "ecmascript":
        pytest.importorskip("quickjs")
    from statebound.datamodel.budget import Budget
    from statebound.interpreter.interpreter import ABANDON_LIMIT
    text = f"""<scxml {NS} datamodel="{datamodel}"><datamodel><data id="n" expr="0"/></datamodel>
      <state id="a"><transition event="e"><log label="big" expr="{big}"/>
        <assign location="undeclared" expr="1"/></transition></state></scxml>"""
    mib = 1024 * 1024
    results = {}
    for static_path in (True, False):
        it = sb.Interpreter(sb.Chart.from_scxml(text), max_memory_bytes=mib, static_path=static_path)
        pos, _ = it.start("s")
        seen = set()
        for _ in range(ABANDON_LIMIT + 2):
            budget = Budget(cpu_ms=5_000, memory_bytes=mib) if given else None
            new, effects = it.drive(pos, "e", budget=budget)
            seen.add((new.to_bytes(), tuple((type(e).__name__, getattr(e, "label", None)) for e in effects)))
        assert len(seen) == 1, seen   # the same drive, the same answer, every time
        results[static_path] = seen.pop()
    assert results[True] == results[False]
    assert results[True][1] == (("Log", "big"), ("Log", "error.execution"))
