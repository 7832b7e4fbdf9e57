"""The ecmascript datamodel's boundary with Python: what crosses it, what the commit stores,
and what a later drive (in this process or another) gets back.

Each test here failed before the fix it names: a compile failure caused by a full heap was
remembered for the chart; ``performance.now()`` was a clock of the shared realm; a set in
event data reached the chart in hash-seed order; a global named ``__tmp`` or ``""`` was
committed and then refused by ``Position.from_bytes``; stored non-ASCII text took six times
its room when loaded, and loading had no room of its own, so a value that committed near the
heap cap never loaded again; ``*expr`` attributes that name something were converted with
Python's ``str()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from xml.sax.saxutils import quoteattr

import pytest

import statebound as sb
from statebound.datamodel.base import datamodel_for
from statebound.exceptions import EvaluationError

quickjs = pytest.importorskip("quickjs", reason="the ecmascript extra is not installed")
from _ecma import chart  # noqa: E402

MIB = 1024 * 1024


def errors(effects):
    """The messages of the drive's error.execution events (logged by ERR_TO_LOG, or unhandled)."""
    return [e.value for e in effects if type(e).__name__ == "Log" and e.label in ("error", "error.execution")]


ERR_TO_LOG = '<transition event="error.execution"><log label="error" expr="_event.data.message"/></transition>'


def reload(pos: sb.Position, c: sb.Chart) -> sb.Position:
    """What another process (or this one after a restart) loads from the store."""
    return sb.Position.from_bytes(pos.to_bytes(), c)


# --------------------------------------------------------------------------- compile failures
def test_a_compile_that_runs_out_of_the_drives_heap_is_not_remembered_for_later_drives():
    # The source must be new to this thread's realm: a realm compiles each source once.
    src = "x + 1 + 0 * 918273"
    c = chart(f"""<state id="a"><transition event="e">
      <if cond="_event.data &amp;&amp; _event.data.hog"><script>
        hog = [];
        var sizes = [4096, 256, 16, 1];
        for (var si = 0; si &lt; sizes.length; si++) {{
          try {{ while (true) hog.push(new Array(sizes[si]).fill(1.5)); }} catch (e) {{ }}
        }}
        try {{ while (true) hog.push({{}}); }} catch (e) {{ }}
      </script></if>
      <assign location="x" expr="{src}"/>
      <assign location="hog" expr="null"/>
    </transition></state>""", '<data id="x" expr="0"/><data id="hog" expr="null"/>',
              memory_bytes=2 * MIB)
    it = sb.Interpreter(c)
    hungry, _ = it.start("hungry")
    hungry, effects = it.drive(hungry, sb.Event("e", data={"hog": True}))
    assert any("does not compile" in m for m in errors(effects))  # that drive had no heap left to compile in
    for sid in ("b", "c"):  # later sessions, with the heap to themselves, compile it
        pos, _ = it.start(sid)
        pos, effects = it.drive(reload(pos, c), sb.Event("e", data={"hog": False}))
        assert errors(effects) == []
        assert pos.datamodel["x"] == 1


def test_an_expression_that_does_not_parse_fails_alike_in_every_session():
    c = chart(f'<state id="a"><transition event="e"><assign location="x" expr="1 +* 2"/></transition>{ERR_TO_LOG}'
              "</state>", '<data id="x" expr="0"/>')
    it = sb.Interpreter(c)
    seen = []
    for sid in ("a", "b"):
        pos, _ = it.start(sid)
        pos, effects = it.drive(pos, "e")
        seen.append(errors(effects))
        assert pos.datamodel["x"] == 0
    assert seen[0] == seen[1] and "does not compile" in seen[0][0] and "SyntaxError" in seen[0][0]


# --------------------------------------------------------------------------- clocks
def test_there_is_no_performance_clock():
    c = chart('<state id="a"/>', '<data id="t" expr="[typeof performance, \'performance\' in globalThis, '
                                 'typeof Date.now]"/>')
    pos, _ = sb.Interpreter(c).start("s")
    # Date stays (documented: it reads the machine); performance would be a clock of the shared realm
    assert pos.datamodel["t"] == ["undefined", False, "function"]


# --------------------------------------------------------------------------- sets in event data
_SET_SCRIPT = textwrap.dedent("""
    import sys
    import statebound as sb
    CHART = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="a" datamodel="ecmascript">
    <datamodel><data id="got" expr="null"/></datamodel>
    <state id="a"><transition event="go" target="b"><assign location="got" expr="_event.data"/></transition></state>
    <state id="b"/></scxml>'''
    c = sb.Chart.from_scxml(CHART, name="c")
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    data = {"tags": frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"}),
            "mixed": {1, "1", None, 2.5, (1, 2), frozenset({"x", "y"}), b"b"}}
    pos, _ = it.drive(pos, sb.Event("go", data=data))
    sys.stdout.write(pos.to_bytes().hex())
""")


def test_a_set_in_event_data_reaches_the_chart_in_the_same_order_under_every_hash_seed():
    blobs = set()
    for seed in ("0", "1", "7"):
        r = subprocess.run([sys.executable, "-c", _SET_SCRIPT], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr[-2000:]
        blobs.add(r.stdout)
    assert len(blobs) == 1
    got = sb.Position.from_bytes(bytes.fromhex(blobs.pop()), sb.Chart.from_scxml(
        _SET_SCRIPT.split("'''")[1], name="c")).datamodel["got"]
    assert got["tags"] == sorted(got["tags"])
    assert sorted(map(json.dumps, got["mixed"])) == sorted(map(json.dumps, [1, "1", None, 2.5, [1, 2], ["x", "y"],
                                                                            "b"]))


# --------------------------------------------------------------------------- names no position holds
NAMES = '<data id="n" expr="0"/>'


@pytest.mark.parametrize("script", ["var __tmp = 1;", "__tmp = 1;", "globalThis[''] = 1;",
                                    "__f = function () { return 1; };",
                                    "Object.defineProperty(globalThis, '__proto__', {value: 1, enumerable: true, "
                                    "configurable: true, writable: true});"])
def test_a_global_no_position_can_hold_is_not_stored_and_the_position_loads_again(script):
    c = chart(f"""<state id="a">
      <transition event="go"><script>{script}</script><assign location="n" expr="n + 1"/></transition>
      <transition event="inc"><assign location="n" expr="n + 1"/></transition>{ERR_TO_LOG}</state>""", NAMES)
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    pos, effects = it.drive(pos, "go")
    assert errors(effects) == [] and dict(pos.datamodel) == {"n": 1}
    pos, effects = it.drive(reload(pos, c), "inc")  # CorruptPosition before: '__tmp' is not a variable name
    assert errors(effects) == [] and dict(pos.datamodel) == {"n": 2}


def test_a_dunder_global_lives_for_the_drive_like_a_local():
    c = chart(f"""<state id="a">
      <transition event="go"><script>var __tmp = 41;</script><assign location="n" expr="__tmp + 1"/></transition>
      <transition event="look"><assign location="n" expr="typeof __tmp"/></transition>{ERR_TO_LOG}</state>""", NAMES)
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    pos, effects = it.drive(pos, "go")
    assert errors(effects) == [] and pos.datamodel["n"] == 42
    pos, effects = it.drive(reload(pos, c), "look")
    assert errors(effects) == [] and pos.datamodel["n"] == "undefined"


def test_a_host_commits_only_positions_it_can_load_again(tmp_path):
    c = chart(f"""<state id="a">
      <transition event="go"><script>var __tmp = 1; globalThis[''] = 2;</script></transition>
      <transition event="inc"><assign location="n" expr="n + 1"/></transition>{ERR_TO_LOG}</state>""", NAMES)
    db = str(tmp_path / "s.db")
    sb.Host([c], store=sb.SQLiteStore(db), clock=sb.ManualClock(now_ms=0)).start(c, "i1")
    sb.Host([c], store=sb.SQLiteStore(db), clock=sb.ManualClock(now_ms=0)).send("i1", "go")
    later = sb.Host([c], store=sb.SQLiteStore(db), clock=sb.ManualClock(now_ms=0))  # another process
    later.send("i1", "inc")
    assert dict(later.get("i1").datamodel) == {"n": 1}


def test_foreach_refuses_an_item_or_index_no_position_can_hold():
    c = chart(f"""<state id="a"><transition event="go"><foreach array="xs" item="__i" index="__j">
      <assign location="n" expr="n + 1"/></foreach></transition>{ERR_TO_LOG}</state>""",
              '<data id="xs" expr="[1, 2]"/>' + NAMES)
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    pos, effects = it.drive(pos, "go")
    assert any("'__i'" in m for m in errors(effects))
    assert dict(reload(pos, c).datamodel) == {"xs": [1, 2], "n": 0}


def test_data_named_with_a_dunder_is_refused():
    try:
        c = chart(f'<state id="a">{ERR_TO_LOG}</state>', '<data id="__d" expr="1"/><data id="n" expr="0"/>')
    except sb.ChartError:
        return  # refused when the chart loads: as good
    pos, effects = sb.Interpreter(c).start("s")
    assert any("'__d'" in m for m in errors(effects))
    assert dict(reload(pos, c).datamodel) == {"n": 0}


def test_declare_refuses_names_a_position_cannot_hold():
    c = chart('<state id="a"/>', NAMES)
    ctx = datamodel_for(c).open({"n": 0}, "s", "c", {}, lambda _: True)
    for name in ("__x", "", "_event"):
        with pytest.raises(EvaluationError, match="cannot declare"):
            ctx.declare(name, 1)
    ctx.declare("_x1", 1)  # one underscore is an ordinary name
    assert ctx.variables() == {"n": 0, "_x1": 1}


# --------------------------------------------------------------------------- non-ASCII text
def test_a_long_non_ascii_string_that_committed_loads_again():
    # 1M chars of U+00E9: 1 MB in the heap, 2 MB to commit; written \u00e9 it took 7 MB to load
    c = chart(f"""<state id="a">
      <transition event="go"><script>v = '\\u00e9'.repeat(1000000);</script></transition>
      <transition event="inc"><assign location="n" expr="n + 1"/></transition>{ERR_TO_LOG}</state>""",
              '<data id="v" expr="\'\'"/>' + NAMES, memory_bytes=4 * MIB)
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    pos, effects = it.drive(pos, "go")
    assert errors(effects) == [] and len(pos.datamodel["v"]) == 1_000_000
    for n in (1, 2):
        pos, effects = it.drive(reload(pos, c), "inc")
        assert errors(effects) == []
        assert pos.datamodel["n"] == n and pos.datamodel["v"] == "\u00e9" * 1_000_000


# (one byte a character in QuickJS, and two; each range crosses the edge of what commits)
@pytest.mark.parametrize(("char", "sizes"), [("\\u00e9", range(900_000, 1_300_001, 20_000)),
                                             ("\\u20ac", range(440_000, 800_001, 20_000))])
def test_whatever_commits_near_the_heap_cap_loads_again(char, sizes):
    # Loading needs room beside the values (the text, JSON.parse's buffers) that the commit never
    # paid for: sizes just under the commit's edge committed and then never loaded.
    committed = 0
    for n in sizes:
        c = chart(f"""<state id="a">
          <transition event="go"><script>v = '{char}'.repeat({n});</script></transition>
          <transition event="inc"><assign location="n" expr="n + 1"/></transition>{ERR_TO_LOG}</state>""",
                  '<data id="v" expr="\'\'"/>' + NAMES, memory_bytes=3 * MIB)
        it = sb.Interpreter(c)
        pos, _ = it.start("s")
        pos, effects = it.drive(pos, "go")
        if errors(effects):  # past what a commit takes: the edge is crossed
            break
        committed = n
        pos, effects = it.drive(reload(pos, c), "inc")
        assert errors(effects) == [], n
        assert pos.datamodel["n"] == 1 and len(pos.datamodel["v"]) == n
    assert sizes[0] < committed < sizes[-1]  # the edge was reached, from below


def test_text_past_ascii_crosses_both_ways_unchanged():
    text = "é\u2028\u2029\x00\x1f\"\\ \U0001F600 \u00ff\u0100 \x01j"
    c = chart(f"""<state id="a">
      <transition event="go"><assign location="got" expr="_event.data"/>
        <assign location="len" expr="_event.data.s.length"/></transition>
      <transition event="inc"><assign location="n" expr="n + 1"/></transition>{ERR_TO_LOG}</state>""",
              '<data id="got" expr="null"/><data id="len" expr="0"/>' + NAMES)
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    pos, effects = it.drive(pos, sb.Event("go", data={"s": text, text: [text]}))
    assert errors(effects) == []
    pos, effects = it.drive(reload(pos, c), "inc")
    assert errors(effects) == []
    assert pos.datamodel["got"] == {"s": text, text: [text]}
    assert pos.datamodel["len"] == len(text) + 1  # the emoji is two UTF-16 units in JS


def test_a_lone_surrogate_in_event_data_still_reaches_the_chart():
    # (unescaped, the binding cannot pass it: such text is escaped as before)
    c = chart(f"""<state id="a"><transition event="go"><assign location="n" expr="_event.data.s.length"/>
      <assign location="m" expr="_event.data.t"/></transition>{ERR_TO_LOG}</state>""",
              NAMES + '<data id="m" expr="null"/>')
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    pos, effects = it.drive(pos, sb.Event("go", data={"s": "\ud800é", "t": "é"}))
    assert errors(effects) == [] and pos.datamodel["n"] == 2 and pos.datamodel["m"] == "é"


# --------------------------------------------------------------------------- evaluate_text
TEXTS = {
    "undefined": "undefined",
    "null": "null",
    "true": "true",
    "NaN": "NaN",
    "-0": "0",
    "1e21": "1e+21",
    "0.1 + 0.2": "0.30000000000000004",
    "2 ** 53 + 2": "9007199254740994",
    "[1, 2]": "1,2",
    "[undefined, null, [3]]": ",,3",
    "({a: 1})": "[object Object]",
    "({toString() { return 'x'; }, valueOf() { return 1; }})": "x",
    "(function f() {})": "function f() {}",
    "'caf\\u00e9 \\u0000 \\ud83d\\ude00'": "café \x00 \U0001F600",
    "'\\u0001j' + 1": "\x01j1",
    "In('a')": "true",
    "_event.name + '!'": "go!",
    "'x'.repeat(3)": "xxx",
    "''": "",
}
REFUSED = {
    "Symbol('s')": "symbol",
    "({toString() { throw new Error('no'); }})": "no",
    "({toString: null, valueOf: null})": "TypeError",
    "nope": "ReferenceError",
}


def _context(exprs, **limits):
    c = chart('<state id="a"><onentry>' + "".join(f"<log expr={quoteattr(e)}/>" for e in exprs) + "</onentry></state>",
              **limits)
    ctx = datamodel_for(c).open({}, "s", "c", {}, lambda s: s == "a")
    ctx.set_event(sb.Event("go"))
    return ctx, {e.src: e for e in c.expressions}


def test_evaluate_text_converts_as_ecmascript_string_does():
    ctx, by_src = _context(TEXTS)
    assert {src: ctx.evaluate_text(by_src[src]) for src in TEXTS} == TEXTS


def test_evaluate_text_refuses_what_ecmascript_cannot_convert():
    ctx, by_src = _context(REFUSED)
    for src, why in REFUSED.items():
        with pytest.raises(EvaluationError, match=why):
            ctx.evaluate_text(by_src[src])


def test_evaluate_text_stops_a_looping_to_string_at_the_time_limit():
    ctx, by_src = _context(["({toString() { for (;;) {} }})"], time_ms=50)
    with pytest.raises(EvaluationError, match="time limit"):
        ctx.evaluate_text(by_src["({toString() { for (;;) {} }})"])


SENT = {"undefined": "undefined", "null": "null", "true": "true", "NaN": "NaN", "({a:1})": "[object Object]",
        "[1,2]": "1,2"}


@pytest.mark.parametrize("expr", SENT)
def test_send_eventexpr_names_the_event_as_ecmascript_converts_it(expr):
    c = chart(f"""<state id="s">
      <transition event="go"><send eventexpr={quoteattr(expr)} target="#_internal"/></transition>
      <transition event="*" cond="_event.name !== 'go'" target="got"><assign location="t" expr="_event.name"/></transition>
    </state><state id="got"/>""", '<data id="t" expr="null"/>')
    it = sb.Interpreter(c)
    pos, _ = it.start("x")
    pos, _ = it.drive(pos, "go")
    assert pos.datamodel["t"] == SENT[expr]


def test_send_eventexpr_of_a_symbol_is_an_execution_error():
    c = chart(f"""<state id="s"><transition event="go"><send eventexpr="Symbol('s')" target="#_internal"/>
      </transition>{ERR_TO_LOG}</state>""")
    it = sb.Interpreter(c)
    pos, _ = it.start("x")
    pos, effects = it.drive(pos, "go")
    assert any("symbol" in m for m in errors(effects))


def test_cancel_sendidexpr_is_converted_as_ecmascript_does():
    c = chart("""<state id="s"><transition event="go"><send id="true" event="later" delay="1s"/>
      <cancel sendidexpr="true"/></transition></state>""")
    it = sb.Interpreter(c)
    pos, _ = it.start("x")
    pos, effects = it.drive(pos, "go")
    assert [e.send_id for e in effects if type(e).__name__ == "Cancel"] == ["true"]


@pytest.mark.parametrize("where, src", [
    ("expr", "1); side = 7; (1"),
    ("expr", "1), (side = 7), (1"),
    ("location", "x)=5; side = 7; undeclared_var = 9; (x"),
    # closing the whole wrapper made the compile itself a program that ran
    ("expr", "1)}), side = 7, undeclared_var = 9, (function(){(1"),
    ("location", "x)=__sb_value__;}), side = 7, undeclared_var = 9, (function(__sb_value__){(x"),
])
def test_a_source_that_closes_its_wrapper_does_not_compile(where, src):
    # one wrapper alone let it through: the statements after the early return were dead code
    # in an expr, and ran in a location (creating a variable past the "declared" check)
    assign = (f'<assign location="x" expr={quoteattr(src)}/>' if where == "expr"
              else f'<assign location={quoteattr(src)} expr="1"/>')
    # (the <raise> keeps the drive off the static path, whose full-path re-run from the
    # untouched position hid what the compile ran)
    c = chart(f'<state id="a"><transition event="e"><raise event="f"/>{assign}</transition>{ERR_TO_LOG}</state>',
              '<data id="x" expr="0"/><data id="side" expr="0"/>')
    it = sb.Interpreter(c)
    pos, effects = it.drive(it.start("s")[0], "e")
    assert dict(pos.datamodel) == {"x": 0, "side": 0}   # (no undeclared_var either)
    assert any("does not compile" in m for m in errors(effects))


def test_aliased_values_that_would_not_load_again_are_refused_at_the_commit():
    # new Array(n).fill({}) is three bytes of JSON a slot and, loaded, n objects: it committed
    # under the cap and every later drive failed to load it (the session was stuck for good)
    c = chart('<state id="a"><transition event="go"><assign location="a" expr="new Array(30000).fill({})"/>'
              '</transition><transition event="inc"><assign location="n" expr="n + 1"/></transition></state>',
              '<data id="a" expr="null"/><data id="n" expr="0"/>')
    it = sb.Interpreter(c, max_memory_bytes=1024 * 1024)
    pos, _ = it.start("s")
    after, effects = it.drive(pos, "go")
    assert after.to_bytes() == pos.to_bytes()
    assert [(type(e).__name__, getattr(e, "reason", None)) for e in effects] == [("BudgetExhausted", "memory")]
    n, effects = it.drive(reload(after, c), "inc")
    assert n.datamodel["n"] == 1 and not errors(effects)


def test_a_regexp_that_runs_out_of_heap_while_compiling_is_not_remembered_for_the_chart():
    # QuickJS reports a failed allocation in its regexp compiler as SyntaxError("out of
    # memory"): taken for the source's fault, one session that filled its heap broke the
    # expression for every later session of the chart in the process
    regexp = "/" + "a" * 3000 + "(b|c)*d{1,50}/.test('x')"
    cond = "r === null &amp;&amp; (typeof __step === 'undefined' || __step())"
    guard = "typeof __hog !== 'undefined'"
    c = chart(f'''<state id="s">
     <transition event="fill"><script>
       var __hog = [];
       var __step = function () {{ __hog.pop(); __hog.pop(); k++; return k &lt; 3000; }};
     </script><if cond="{cond}"/><if cond="{guard}"/>
     <script>
       var sizes = [4096, 256, 16, 1];
       for (var si = 0; si &lt; sizes.length; si++) {{ try {{ while (true) __hog.push(new Array(sizes[si]).fill(1.5)); }} catch (e) {{}} }}
       try {{ while (true) __hog.push({{}}); }} catch (e) {{}}
     </script><raise event="try"/></transition>
     <transition event="try" cond="{cond}"><if cond="{guard}"><raise event="try"/></if>
       <assign location="r" expr="{regexp}"/></transition>
     <transition event="error.execution"><log label="err"/></transition>
    </state>''', '<data id="r" expr="null"/><data id="k" expr="0"/>')
    it = sb.Interpreter(c, max_memory_bytes=1024 * 1024)
    it.drive(it.start("attacker")[0], "fill")
    victim = sb.Interpreter(c)
    v, effects = victim.drive(victim.start("victim")[0], "try")
    assert v.datamodel["r"] is False and not [e for e in effects if getattr(e, "label", "") == "err"]


def test_a_source_that_leans_on_its_wrapper_is_refused_in_every_process():
    # "1), (side = 7), (1" is an expression only inside the wrapper's own parentheses: parsed
    # first inside random brackets, it passed whenever the innermost one drawn was "(" (half
    # the processes) and failed otherwise. Each chart below compiles it afresh, with new brackets.
    src = "1), (side = 7), (1"
    for k in range(24):
        c = chart(f'<state id="a"><transition event="e"><raise event="f"/><assign location="x" expr={quoteattr(src)}/>'
                  f'</transition>{ERR_TO_LOG}</state>', '<data id="x" expr="0"/><data id="side" expr="0"/>')
        it = sb.Interpreter(c)
        pos, effects = it.drive(it.start(f"s{k}")[0], "e")
        assert dict(pos.datamodel) == {"x": 0, "side": 0}, k
        assert any("does not compile" in m for m in errors(effects)), k
