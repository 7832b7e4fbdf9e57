"""One budget per drive, and per host call: CPU across every evaluation and round, and memory.

Issue 10: the ECMAScript CPU cap was per evaluation, so a 100 ms cap over 20 rounds took
5 s, and 10,000 rounds of 1 s were hours. Now one host call (``start``, ``send``, a fire)
has one CPU budget (``max_cpu_ms``) shared by all its drives and all their evaluations,
and one memory budget (``max_memory_bytes``) for the values they bring out of the
datamodel and the events and effects they queue. Running out ends the drive at work with
``BudgetExhausted`` and the position unchanged (``BudgetExceeded`` for a start, which has
no earlier position). Each chart here would run for minutes or fill gigabytes without it.
"""

from __future__ import annotations

import pytest

from .helpers import CATCH, CATCH_PY, scxml

BUDGET = {"max_cpu_ms": 600}

# Every round burns 90 ms of CPU, far under the per-evaluation cap of 200 ms, and the chart
# never settles: only the drive's budget stops it.
SLOW_ROUNDS_JS = scxml("""<datamodel><data id="n" expr="0"/></datamodel>
  <state id="idle"><transition event="go" target="spin"/></state>
  <state id="spin">
    <onentry><script>var t = Date.now(); while (Date.now() - t &lt; 90) {} n = n + 1;</script></onentry>
    <transition target="spin"/>
  </state>""")


def test_slow_rounds_end_in_budget_exhausted_with_the_position_unchanged(hostile):
    out = hostile({"main.scxml": SLOW_ROUNDS_JS}, events=[("go", None)], host=BUDGET,
                  ecma_limits={"time_ms": 200})
    out.assert_contained()
    assert out.error is None
    assert out.raw["metrics"]["budget_exhausted"] == 1
    assert out.raw["configuration"] == ["idle"] and out.raw["datamodel"] == {"n": 0}


def test_a_start_that_never_settles_within_the_budget_is_refused(hostile):
    chart = SLOW_ROUNDS_JS.replace('<state id="idle"><transition event="go" target="spin"/></state>', "")
    out = hostile({"main.scxml": chart}, host=BUDGET, ecma_limits={"time_ms": 200})
    out.assert_contained()
    assert out.error["type"] == "BudgetExceeded" and "CPU budget" in out.error["message"]


@pytest.mark.parametrize("script", [
    "while True:\n    pass",
    "x = [i for i in iter(int, 1)]",                                  # an endless comprehension
    "f = lambda f, n: n and (f(f, n - 1), f(f, n - 1))\nf(f, 40)",    # 2**40 calls, 40 deep
    "while True:\n    try:\n        while True:\n            pass\n    except Exception:\n        pass",
])
def test_python_loops_are_stopped_by_the_budget(hostile, script):
    chart = scxml(f"""<datamodel><data id="n" expr="0"/></datamodel><state id="idle">{CATCH_PY}
      <transition event="go"><assign location="n" expr="1"/><script>{script}</script></transition></state>""",
                  datamodel=None)
    out = hostile({"main.scxml": chart}, trust=None, events=[("go", None)], host=BUDGET)
    out.assert_contained()
    assert out.error is None and out.raw["metrics"]["budget_exhausted"] == 1
    assert out.raw["datamodel"] == {"n": 0}  # the drive was abandoned: nothing it did stuck


def test_one_host_call_shares_one_budget_and_keeps_what_it_could_not_deliver(hostile):
    # each drive does about 150 ms of CPU work and sends itself the next event: 20 drives
    # would take 3 s (work, not Date.now(): a loaded machine must not change the count)
    chart = scxml("""<datamodel><data id="n" expr="0"/></datamodel><state id="a">
      <transition event="tick" cond="n &lt; 20">
        <script>var k = 0; for (var i = 0; i &lt; 3.5e6; i++) k += i; n = n + 1;</script>
        <send event="tick"/>
      </transition></state>""")
    out = hostile({"main.scxml": chart}, events=[("tick", None)], host=BUDGET)
    out.assert_contained()
    n = out.raw["datamodel"]["n"]
    assert 2 <= n < 20, n
    # the event in flight when the budget ran out was kept as a row due now, not dropped
    # (earlier drives spent the budget): firing it goes on with a fresh budget
    out = hostile({"main.scxml": chart}, events=[("tick", None)], host=BUDGET, fire=30)
    assert out.raw["datamodel"]["n"] == 20, out.raw


def test_queued_events_are_bounded_by_the_memory_budget(hostile):
    # each entry raises 500 events and re-enters: the internal queue grows without end
    raises = '<raise event="e"/>' * 500
    chart = scxml(f"""<state id="idle"><transition event="go" target="a"/></state>
      <state id="a"><onentry>{raises}</onentry><transition event="e" target="a"/></state>""", datamodel="null")
    out = hostile({"main.scxml": chart}, events=[("go", None)], host={"max_memory_bytes": 4 * 1024 * 1024})
    out.assert_contained()
    assert out.raw["metrics"]["budget_exhausted"] == 1 and out.raw["configuration"] == ["idle"]


def test_big_values_brought_out_of_the_sandbox_are_bounded(hostile):
    # a 4 MiB string logged over and over: each copy lives on in the Log effects
    chart = scxml("""<datamodel><data id="s" expr="'x'.repeat(4 * 1024 * 1024)"/></datamodel>
      <state id="idle"><transition event="go" target="a"/></state>
      <state id="a"><onentry><log label="big" expr="s"/></onentry><transition target="a"/></state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)], host={"max_memory_bytes": 32 * 1024 * 1024})
    out.assert_contained()
    assert out.raw["metrics"]["budget_exhausted"] == 1 and out.raw["configuration"] == ["idle"]


def test_the_ecmascript_heap_is_capped_by_the_memory_budget(hostile):
    chart = scxml(f"""<state id="idle">{CATCH}<transition event="go"><script>
        (function () {{ var a = []; while (true) a.push('x'.repeat(1000) + a.length); }})();
      </script></transition></state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)], host={"max_memory_bytes": 16 * 1024 * 1024})
    out.assert_error_execution("memory")


def test_a_superlinear_microstep_is_stopped_inside_the_microstep(hostile):
    # every region takes a transition on the same event, none conflicting: removing conflicts
    # compares every pair, hours of work for one microstep
    body = "".join(f'<state id="r{i}"><state id="s{i}"><transition event="e" target="t{i}"/></state>'
                   f'<state id="t{i}"/></state>' for i in range(1000))
    chart = scxml(f'<parallel id="p">{body}</parallel>', datamodel="null")
    out = hostile({"main.scxml": chart}, events=[("e", None)], host={"max_cpu_ms": 1000})
    out.assert_contained()
    assert out.error is None, out.error
    assert out.raw["metrics"]["budget_exhausted"] == 1


# --------------------------------------------------------------------------- the API, in process

def test_limits_are_checked_when_they_are_given():
    import statebound as sb
    from statebound.datamodel.budget import Budget
    chart = sb.Chart.from_scxml(scxml('<state id="a"/>', datamodel="null"))
    for bad in ({"max_cpu_ms": 0}, {"max_cpu_ms": 1.5}, {"max_memory_bytes": 1024}):
        with pytest.raises(ValueError):
            sb.Interpreter(chart, **bad)
        with pytest.raises(ValueError):
            sb.Host([chart], **bad)
    with pytest.raises(ValueError):
        Budget(cpu_ms=-1)
    assert sb.Interpreter(chart).max_cpu_ms == 5000 and sb.Host().max_cpu_ms == 5000
    assert sb.Interpreter(chart, max_cpu_ms=None, max_memory_bytes=None).max_cpu_ms is None


def test_a_spent_budget_given_to_drive_ends_it_at_once():
    import time

    import statebound as sb
    from statebound.datamodel.budget import Budget
    chart = sb.Chart.from_scxml(scxml('<datamodel><data id="n" expr="0"/></datamodel><state id="a">'
                                      '<transition event="go"><assign location="n" expr="n + 1"/></transition>'
                                      '</state>'))
    it = sb.Interpreter(chart)
    pos, _ = it.start()
    budget = Budget(cpu_ms=1).start()
    t = time.thread_time()
    while time.thread_time() - t < 0.005:
        pass
    new, effects = it.drive(pos, "go", budget=budget)
    assert new is pos and [type(e).__name__ for e in effects] == ["BudgetExhausted"]
    assert effects[0].reason == "cpu" and effects[0].event == "go"
    assert it.drive(pos, "go")[0].datamodel["n"] == 1  # a fresh budget per drive by default


def test_sessions_holding_big_datamodels_are_bounded_per_call(hostile):
    # every child stores 6 MiB: a host call holds every session it touched until it commits,
    # so forty of them would be 240 MiB of positions in one call
    child = scxml('<datamodel><data id="big" expr="\'x\'.repeat(6 * 1024 * 1024)"/></datamodel><state id="c"/>')
    kids = "".join(f'<invoke id="k{i}"><content>{child}</content></invoke>' for i in range(40))
    chart = scxml(f'<state id="a">{CATCH}{kids}</state>')
    # (the parent's error events wait as rows due now: the call's budget is spent; a fire delivers them)
    out = hostile({"main.scxml": chart}, host={"max_memory_bytes": 32 * 1024 * 1024}, fire=2)
    out.assert_error_execution("memory budget")
    assert 1 <= 40 - len(out.messages) <= 5, len(out.messages)  # a few children fit, the rest do not


# Chart code made in one block (onexit) and run from outside the evaluation that made it,
# in the next (the transition): called by a straight-line expression, iterated by <foreach>
# in the interpreter itself, or called back by a builtin.
LATER = {
    "a lambda called by a later expression": (
        '<log expr="fs.append(lambda: any(0 for _ in iter(int, 1)))"/>', '<assign location="n" expr="fs[0]()"/>'),
    "a generator iterated by foreach": (
        '<log expr="fs.append(x for x in iter(int, 1) if x)"/>',
        '<foreach array="fs[0]" item="i"><assign location="n" expr="i"/></foreach>'),
    "a def'd generator iterated by foreach": (
        "<script>def g():\n    while True:\n        yield 0\nfs.append(g)</script>",
        '<foreach array="fs[0]()" item="i"><assign location="n" expr="i"/></foreach>'),
    "a lambda called by a builtin": (
        '<log expr="fs.append(lambda x: any(0 for _ in iter(int, 1)))"/>',
        '<assign location="n" expr="list(map(fs[0], [1]))"/>'),
}


@pytest.mark.parametrize("name", list(LATER))
def test_chart_functions_run_under_the_budget_wherever_they_are_called(hostile, name):
    made, used = LATER[name]  # the script fails its own checks (fs holds a function), but fs keeps it
    chart = scxml(f"""<datamodel><data id="n" expr="0"/><data id="fs" expr="[]"/></datamodel><state id="idle">
      {CATCH_PY}<onexit>{made}</onexit><transition event="go" target="idle">{used}</transition></state>""",
                  datamodel=None)
    out = hostile({"main.scxml": chart}, trust=None, events=[("go", None)], host=BUDGET)
    out.assert_contained()
    assert out.error is None and out.raw["metrics"]["budget_exhausted"] == 1, out.raw
    assert out.raw["datamodel"] == {"n": 0, "fs": []}


def test_a_plan_that_steps_aside_hands_its_budget_to_the_full_macrostep(monkeypatch):
    """``Interpreter.drive`` without a budget makes one per drive. When the cached static
    plan stepped aside (its content raised), the full macrostep made a second, fresh one:
    a script that burned most of ``max_cpu_ms`` and then threw ran twice, each time under
    a whole budget, so one drive could spend twice the cap, and whether it ran out depended
    on whether the plan was cached yet. Now a drive has one budget, whichever path it takes."""
    import statebound as sb
    from statebound.datamodel import budget as budget_mod
    chart = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" initial="a">'
        '<datamodel><data id="n" expr="0"/></datamodel><state id="a"><transition event="go">'
        '<script>n = n + 1\nfor i in range(3):\n    n = n + i\nraise ValueError("boom")</script>'
        '</transition></state></scxml>')
    interp = sb.Interpreter(chart, max_cpu_ms=2_000)
    pos, _ = interp.start("s")
    made: list[object] = []
    real = budget_mod.Budget.unchecked.__func__

    def counted(cls, cpu_ms, memory_bytes):
        b = real(cls, cpu_ms, memory_bytes)
        made.append(b)
        return b
    monkeypatch.setattr(budget_mod.Budget, "unchecked", classmethod(counted))
    for _ in range(4):   # the first drives plan and cache; the later ones step aside from the plan
        made.clear()
        new, effects = interp.drive(pos, "go")
        assert len(made) == 1, made
        assert new.datamodel["n"] == 0 and [e.label for e in effects] == ["error.execution"]
