"""Session 7's sandbox faults, each attacked from a host process that serves two tenants.

Every case runs in a child process (``RLIMIT_AS`` and a timeout, so a crash or a blow-up
fails its test, never the run): a harmless ecmascript tenant is served, the hostile chart
does its worst, and the harmless tenant is served again. The host must survive (no signal,
no foreign exception) and answer with a typed error or ``error.execution``.

* A chain of Iterator helpers: each helper's native ``next`` called the next natively, with
  no stack check, so a chain of 100,000 recursed off the C stack (SIGSEGV) instead of
  raising the documented ``RangeError``.
* Copies the memory budget did not count: every ``<send>`` copied its inline ``<content>``
  (a 7 MB copy a send), and every failing evaluation quoted its whole source (megabytes)
  in an event and a log.
* ``set_limits`` did not reach the children a chart compiles at run time (``srcexpr``,
  ``<content expr>``): they ran under the defaults.
* Content nested within the cap, started from a caller deep in its own stack, let a bare
  ``RecursionError`` out of the host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .helpers import CATCH, CATCH_PY, scxml

pytest.importorskip("quickjs")

TIMEOUT_S = 120

_CHILD = r'''
import json, resource, sys
with open(sys.argv[1]) as f:
    spec = json.load(f)
limit = spec["rlimit_mib"] << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import statebound as sb
from statebound.datamodel.ecmascript import set_limits
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
benign = sb.Chart.from_scxml(f'<scxml {NS} datamodel="ecmascript"><datamodel><data id="n" expr="0"/></datamodel>'
                             '<state id="a"><transition event="tick"><assign location="n" expr="n + 1"/></transition>'
                             '</state></scxml>', name="benign", trust="untrusted")
charts = [benign]
for c in spec["charts"]:
    chart = sb.Chart.from_scxml(c["text"], name=c["name"], trust=c["trust"], base_path=spec["base"])
    if c.get("limits"):
        set_limits(chart, **c["limits"])
    charts.append(chart)
logs = []
host = sb.Host(charts, on_log=lambda iid, label, value: logs.append([iid, label, str(value)[:400], len(str(value))]))

def at_depth(n, call):
    return call() if n <= 0 else at_depth(n - 1, call)

out = {"outcomes": [], "logs": logs}
host.start("benign", "b1")
host.send("b1", "tick")
for verb, a, b, depth in spec["actions"]:
    try:
        if verb == "start":
            at_depth(depth, lambda: host.start(a, b))
        elif verb == "send":
            at_depth(depth, lambda: host.send(a, b))
        else:  # "limits": chart name, fields
            set_limits(host.chart(a), **b)
        out["outcomes"].append(None)
    except BaseException as exc:
        out["outcomes"].append({"type": type(exc).__name__, "statebound": isinstance(exc, sb.StateboundError),
                                "message": str(exc)[:400]})
host.send("b1", "tick")
out["benign"] = host.get("b1").datamodel["n"]
print("\n" + json.dumps(out))
'''


def _serve(tmp_path: Path, charts: list[dict[str, Any]], actions: list[tuple[Any, ...]], *,
           rlimit_mib: int = 2048, files: dict[str, str] | None = None) -> dict[str, Any]:
    """Serve the harmless tenant, run ``actions`` (``(verb, a, b, caller depth)``), serve it again."""
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    for c in charts:
        c.setdefault("trust", "untrusted")
    spec = {"rlimit_mib": rlimit_mib, "base": str(tmp_path), "charts": charts, "actions": [list(a) for a in actions]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, "spec.json"], capture_output=True, text=True,
                              timeout=TIMEOUT_S, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the host ran past {TIMEOUT_S}s:\n{exc.stderr}")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the host process died (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    assert out["benign"] == 2, "the harmless tenant was not served after the attack"
    for o in out["outcomes"]:
        assert o is None or o["statebound"], f"a foreign exception escaped: {o}"
    return out


def _errors(out: dict[str, Any], iid: str = "x1") -> list[str]:
    return [v for i, label, v, _ in out["logs"] if i == iid and label == "error"]


# ---------------------------------------------------------------- Iterator helper chains

#: Chains of Iterator helpers 100,000 deep, stepped once: each took the process down.
CHAINS = {
    "take": "it.take(1)",
    "map": "it.map(f)",
    "filter": "it.filter(f)",
    "flatMap": "it.flatMap(function (x) { return [x]; })",
    "chunks": "it.chunks(1)",
    "windows": "it.windows(1)",
}
#: Natives that step a chain themselves (a take chain under each).
STEPPERS = {
    "next": "it.next().value",
    "toArray": "it.toArray().length",
    "reduce": "it.reduce(function (a, b) { return a + b; }, 0)",
    "spread": "[...it].length",
    "Array.from": "Array.from(it).length",
}


def _chain_chart(link: str, step: str) -> str:
    expr = ("(function () { var f = function (x) { return x; }, it = [1].values();"
            f" for (var i = 0; i &lt; 100000; i++) it = {link}; return {step}; }})()")
    return scxml(f'<state id="a">{CATCH}<transition event="go"><log label="r" expr="{expr}"/></transition></state>')


def _assert_chain_contained(out: dict[str, Any]) -> None:
    assert out["outcomes"] == [None, None], out["outcomes"]
    errors = _errors(out)
    assert errors, out["logs"]
    # the stack limit, or the heap filling up first (a helper and its stepper are ~500 bytes)
    assert any("RangeError" in e or "memory ran out" in e or "memory limit" in e for e in errors), errors


@pytest.mark.parametrize("helper", sorted(CHAINS))
def test_a_chain_of_iterator_helpers_is_error_execution_not_a_crash(tmp_path, helper):
    chart = _chain_chart(CHAINS[helper], STEPPERS["next"])
    out = _serve(tmp_path, [{"name": "hostile", "text": chart}], [("start", "hostile", "x1", 0),
                                                                  ("send", "x1", "go", 0)])
    _assert_chain_contained(out)


@pytest.mark.parametrize("step", sorted(set(STEPPERS) - {"next"}))
def test_a_native_stepping_a_chain_of_helpers_is_error_execution_not_a_crash(tmp_path, step):
    chart = _chain_chart(CHAINS["take"], STEPPERS[step])
    out = _serve(tmp_path, [{"name": "hostile", "text": chart}], [("start", "hostile", "x1", 0),
                                                                  ("send", "x1", "go", 0)])
    _assert_chain_contained(out)


# ---------------------------------------------------------------- copies the budget did not count

BIG = '["' + "a" * 7_500_000 + '"]'


#: A chart within the budget: three sends of the same content (22.5 MB of 64 MiB).
MODEST = scxml(f'<state id="a"><onentry><foreach array="[1, 2, 3]" item="i"><send event="e" target="#_internal">'
               f'<content>{BIG}</content></send></foreach></onentry><transition event="e" target="b">'
               '<log label="len" expr="_event.data[0].length"/></transition></state><final id="b"/>')


@pytest.mark.parametrize("datamodel", ["ecmascript", "null"])
def test_copies_of_inline_content_count_against_the_memory_budget(tmp_path, datamodel):
    # 100 sends of a 7.5 MB <content>: 750 MB of copies against a 64 MiB budget. Under
    # RLIMIT_AS of 1 GiB they were a MemoryError (or the process was killed).
    if datamodel == "ecmascript":
        body = (f'<onentry><foreach array="new Array(100).fill(0)" item="i">'
                f'<send event="e" target="#_internal"><content>{BIG}</content></send></foreach></onentry>')
    else:  # no expressions at all: a raise loop, one <send> a round
        body = f'<onentry><send event="e"><content>{BIG}</content></send><raise event="loop"/></onentry>' \
               '<transition event="loop" target="a"/>'
    chart = scxml(f'<state id="a">{body}<transition event="e" target="b"/></state><final id="b"/>',
                  datamodel=datamodel)
    out = _serve(tmp_path, [{"name": "hostile", "text": chart}, {"name": "modest", "text": MODEST}],
                 [("start", "hostile", "x1", 0), ("start", "modest", "m1", 0)], rlimit_mib=1024)
    o = out["outcomes"][0]
    assert o is not None and o["type"] == "BudgetExceeded" and "memory budget" in o["message"], o
    # what fits the budget is sent as before
    assert out["outcomes"][1] is None
    assert [v for i, label, v, _ in out["logs"] if i == "m1" and label == "len"] == ["7500000"]


HUGE_SOURCE = "A" * 7_000_000


def test_an_error_quotes_a_few_hundred_characters_of_a_huge_expression(tmp_path):
    chart = scxml(f'<state id="a">{CATCH}<transition event="go">'
                  f'<log label="x" expr="null.x /*{HUGE_SOURCE}*/"/></transition></state>')
    out = _serve(tmp_path, [{"name": "hostile", "text": chart}], [("start", "hostile", "x1", 0),
                                                                  ("send", "x1", "go", 0)], rlimit_mib=1024)
    lengths = [n for i, label, _, n in out["logs"] if i == "x1" and label in ("error", "error.execution")]
    assert lengths and max(lengths) < 1000, lengths
    assert "TypeError" in _errors(out)[0] and "…" in _errors(out)[0]


#: A python chart whose one error quotes 100 kB of source: within the budget, it reaches the chart.
MODEST_PY = scxml(f'<state id="a">{CATCH_PY}<transition event="go"><log label="x" expr="[None.x, \'{"A" * 100_000}\']"/>'
                  '</transition></state>', datamodel="python")


@pytest.mark.parametrize("datamodel", ["ecmascript", "python"])
def test_error_messages_in_a_loop_count_against_the_memory_budget(tmp_path, datamodel):
    # Each failing evaluation made an error event and a log quoting all 7 MB of the source:
    # re-entered in a loop, gigabytes in one host call. The ecmascript datamodel now quotes a
    # few hundred characters; the python one still quotes it all, and the budget counts it.
    if datamodel == "ecmascript":
        log, trust = f'<log label="x" expr="null.x /*{HUGE_SOURCE}*/"/>', "untrusted"
    else:
        log, trust = f'<log label="x" expr="[None.x, \'{HUGE_SOURCE}\']"/>', "trusted"
    chart = scxml(f'<state id="a"><onentry><raise event="again"/>{log}</onentry>'
                  '<transition event="again" target="a"/></state>', datamodel=datamodel)
    out = _serve(tmp_path, [{"name": "hostile", "text": chart, "trust": trust},
                            {"name": "modest", "text": MODEST_PY, "trust": "trusted"}],
                 [("start", "hostile", "x1", 0), ("start", "modest", "m1", 0), ("send", "m1", "go", 0)],
                 rlimit_mib=1024)
    o = out["outcomes"][0]
    # it never settles: the rounds run out (ecmascript, 250 bytes an error) or the memory budget
    assert o is not None and o["type"] == "BudgetExceeded", o
    if datamodel == "python":
        assert "memory budget" in o["message"], o
    assert out["outcomes"][1:] == [None, None] and _errors(out, "m1")


# ---------------------------------------------------------------- set_limits and run-time children

#: A child that builds a 20 MB string: over a 2 MiB heap, under the default 64 MiB.
CHILD = scxml('<state id="c"><onentry><log label="child" expr="\'x\'.repeat(20e6).length"/></onentry>'
              '<transition event="error.*"><log label="child-error" expr="_event.data.message"/></transition>'
              '</state>')
TIGHT = {"memory_bytes": 2 * 1024 * 1024, "time_ms": 50}


def _escaped(text: str) -> str:
    return text.replace("'", "\\'").replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


INVOKES = {
    "srcexpr": '<invoke id="k" srcexpr="\'child.scxml\'"/>',
    "content expr": f'<invoke id="k"><content expr="\'{_escaped(CHILD)}\'"/></invoke>',
}


def _child_logs(out: dict[str, Any], parent: str) -> list[tuple[str, str]]:
    return [(label, v) for i, label, v, _ in out["logs"] if i.startswith(parent + "::")]


@pytest.mark.parametrize("how", sorted(INVOKES))
def test_set_limits_reaches_the_children_a_chart_compiles_at_run_time(tmp_path, how):
    parent = scxml(f'<state id="p">{INVOKES[how]}</state>')
    out = _serve(tmp_path, [{"name": "tenant", "text": parent, "limits": TIGHT}], [("start", "tenant", "t1", 0)],
                 files={"child.scxml": CHILD})
    logs = _child_logs(out, "t1")
    assert ("child", "20000000") not in logs, logs
    assert any(label == "child-error" and "memory" in v for label, v in logs), logs


def test_a_document_two_parents_invoke_runs_under_each_parents_own_limits(tmp_path):
    # The host ran a document on one interpreter, that of the chart registered first: the
    # loose tenant's child came first, and the tight tenant's child ran under its limits.
    # Each child now runs on an interpreter of its own name, under its own parent's limits.
    loose = scxml(f'<state id="p">{INVOKES["srcexpr"]}</state>')
    tight = scxml(f'<state id="q">{INVOKES["srcexpr"]}</state>')
    out = _serve(tmp_path, [{"name": "loose", "text": loose}, {"name": "tight", "text": tight, "limits": TIGHT}],
                 [("start", "loose", "l1", 0), ("start", "tight", "t1", 0)], files={"child.scxml": CHILD})
    assert ("child", "20000000") in _child_logs(out, "l1")
    logs = _child_logs(out, "t1")
    assert ("child", "20000000") not in logs, logs
    assert any(label == "child-error" and "memory" in v for label, v in logs), logs


def test_a_run_time_child_follows_its_parents_limits_as_they_change(tmp_path):
    parent = scxml(f'<state id="p">{INVOKES["srcexpr"]}</state>')
    out = _serve(tmp_path, [{"name": "tenant", "text": parent}],
                 [("start", "tenant", "t1", 0), ("limits", "tenant", TIGHT, 0), ("start", "tenant", "t2", 0)],
                 files={"child.scxml": CHILD})
    assert ("child", "20000000") in _child_logs(out, "t1")
    logs = _child_logs(out, "t2")
    assert ("child", "20000000") not in logs, logs
    assert any(label == "child-error" and "memory" in v for label, v in logs), logs


# ---------------------------------------------------------------- a caller deep in its stack

def test_nested_content_from_a_deep_caller_is_error_execution(tmp_path):
    inner = '<log label="deep" expr="1"/>'
    for _ in range(196):
        inner = f'<if cond="true">{inner}</if>'
    chart = scxml(f'<datamodel><data id="n" expr="5"/></datamodel><state id="a"><onentry>{inner}</onentry>'
                  f'{CATCH}</state>')
    out = _serve(tmp_path, [{"name": "hostile", "text": chart}], [("start", "hostile", "x1", 800),
                                                                  ("start", "hostile", "x2", 0)])
    assert out["outcomes"] == [None, None], out["outcomes"]
    assert any("nests too deep" in e for e in _errors(out)), out["logs"]
    # the same chart from a shallow caller runs to the end
    assert [v for i, label, v, _ in out["logs"] if i == "x2" and label == "deep"] == ["1"]


def test_a_run_time_child_matching_another_tenants_chart_shares_no_limits_with_it():
    """The host kept one interpreter per document: a tenant's run-time child built to match
    another tenant's chart ran on that chart's interpreter, under its looser limits, and
    sharing limits the other way round would let a tenant tighten another's chart. One
    interpreter per chart name and document: each runs under its own chart's limits."""
    import statebound as sb
    from statebound.datamodel.ecmascript.limits import set_limits
    ns = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="ecmascript"'
    doc = (f'<scxml {ns} name="b" initial="s"><state id="s"><onentry>'
           '<log label="size" expr="\'x\'.repeat(20000000).length"/></onentry></state></scxml>')
    other = sb.Chart.from_scxml(doc)                                   # tenant B: default limits
    mine = sb.Chart.from_scxml(f'''<scxml {ns} name="a" initial="idle">
      <state id="idle"><transition event="go" target="run"/></state>
      <state id="run"><invoke type="scxml" id="kid"><content expr="_event.data"/></invoke></state></scxml>''')
    set_limits(mine, memory_bytes=2 * 1024 * 1024)                     # tenant A: tight
    logs = []
    host = sb.Host([other, mine], on_log=lambda iid, label, value: logs.append((iid, label, value)))
    host.start("b", "b1")
    host.start("a", "a1")
    host.send("a1", "go", doc)
    host.start("b", "b2")
    sizes = {iid for iid, label, _v in logs if label == "size"}
    assert sizes == {"b1", "b2"}, logs            # A's child ran under A's limits; B's chart kept its own


def test_the_js_stack_cap_stays_under_a_threads_c_stack():
    # QuickJS checks its stack against this cap only: set at or past the C stack (8 MiB),
    # a chart's plain recursion crashed the process
    from statebound.datamodel.ecmascript.limits import MAX_STACK_BYTES, Limits
    from statebound.exceptions import InvalidArgument
    assert Limits(stack_bytes=MAX_STACK_BYTES).stack_bytes == 4 * 1024 * 1024
    for bad in (MAX_STACK_BYTES + 1, 64 * 1024 * 1024, 1024):
        with pytest.raises(InvalidArgument, match="stack_bytes"):
            Limits(stack_bytes=bad)


def test_a_srcexpr_child_keeps_its_parents_limits_in_another_process(tmp_path):
    """Any other host (a restart, a sweeper, the CLI) reloads a srcexpr child from beside its
    parent: it did so without the parent's limits, so the child ran 50x longer than its
    parent is allowed to everywhere but in the process that invoked it."""
    import statebound as sb
    from statebound.datamodel.ecmascript.limits import set_limits
    (tmp_path / "parent.scxml").write_text(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="ecmascript" name="parent" '
        'initial="run"><datamodel><data id="which" expr="\'child.scxml\'"/></datamodel>'
        '<state id="run"><invoke id="c" type="scxml" srcexpr="which"/></state></scxml>')
    (tmp_path / "child.scxml").write_text(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="ecmascript" initial="idle">'
        '<datamodel><data id="n" expr="0"/></datamodel><state id="idle"><transition event="spin" target="spun">'
        '<script>for (var i = 0; i &lt; 20000000; i++) { n = i; }</script></transition>'
        '<transition event="error.execution" target="failed"/></state>'
        '<state id="spun"><transition event="error.execution" target="failed"/></state><state id="failed"/></scxml>')
    db = tmp_path / "s.db"

    def host():                      # every process loads the parent and sets its limits the same way
        parent = sb.Chart.from_file(tmp_path / "parent.scxml", trust="untrusted")
        set_limits(parent, time_ms=20)
        return sb.Host([parent], store=sb.SQLiteStore(db), max_cpu_ms=60_000)
    first = host()
    first.start("parent", "p1")
    first.start("parent", "p2")
    first.send("p1::c", "spin")
    assert first.get("p1::c").configuration == {"failed"}          # a loop of most of a second: over 20 ms
    other = host()                                                 # another process
    other.send("p2::c", "spin")
    assert other.get("p2::c").configuration == {"failed"}
