"""The ecmascript datamodel: sandbox, limits, persistence and semantics (QuickJS via quickjs-ng)."""

from __future__ import annotations

import time

import pytest

import statebound as sb
from statebound.chart import compiler
from statebound.exceptions import ChartError

quickjs = pytest.importorskip("quickjs", reason="the ecmascript extra is not installed")
from _ecma import NS, chart  # noqa: E402

from statebound.datamodel import ecmascript as E  # noqa: E402


def run(c: sb.Chart, *events, data=None):
    """Start, drive every event through a blob round trip, return (position, all effects)."""
    interp = sb.Interpreter(c)
    pos, effects = interp.start("s1", data=data)
    effects = list(effects)
    for ev in events:
        pos = sb.Position.from_bytes(pos.to_bytes(), c)  # every drive decodes a stored position
        pos, more = interp.drive(pos, ev)
        effects.extend(more)
    return pos, effects


def logs(effects):
    return [(e.label, e.value) for e in effects if type(e).__name__ == "Log"]


ERR_TO_LOG = ('<transition event="error.execution" target="failed">'
              '<log label="error" expr="_event.data.message"/></transition>')


# --------------------------------------------------------------------------- availability
def test_chart_error_names_the_extra_when_the_binding_is_missing(monkeypatch):
    monkeypatch.setattr(compiler, "_ecmascript_available", lambda: False)
    with pytest.raises(ChartError, match=r"pip install 'statebound\[ecmascript\]'"):
        sb.Chart.from_scxml(f'<scxml {NS}><state id="a"/></scxml>')


def test_binding_is_quickjs_ng():
    from importlib.metadata import version
    assert version(E.BINDING) >= "0.17"


# --------------------------------------------------------------------------- the sandbox
ESCAPES = [
    "typeof require", "typeof process", "typeof std", "typeof os", "typeof print", "typeof scriptArgs",
    "typeof fetch", "typeof XMLHttpRequest", "typeof WebSocket", "typeof Deno", "typeof Bun",
    "typeof __import__", "typeof python", "typeof console",
]


@pytest.mark.parametrize("expr", ESCAPES)
def test_no_host_objects_are_reachable(expr):
    c = chart(f'<state id="a"><onentry><log label="t" expr="{expr}"/></onentry></state>')
    _, effects = run(c)
    assert logs(effects) == [("t", "undefined")]


def test_modules_cannot_be_loaded():
    c = chart('<state id="a"><onentry><script>'
              '["os", "qjs:os", "std", "/etc/passwd", "file:///etc/passwd"].forEach(function (m) {'
              ' import(m).then(function (x) { leaked = x; }, function (e) { failed = String(e); }); });'
              'seen = typeof os + typeof std;</script></onentry>'
              '<onentry><script>import * as os from "os";</script></onentry>'
              '<transition event="check" target="b"/></state><state id="b"/>')
    pos, _ = run(c, "check")
    d = dict(pos.datamodel)
    assert d == {"seen": "undefinedundefined"}  # no module loaded, no job ever ran


def test_event_data_is_data_never_code():
    c = chart('<state id="a"><transition event="e" target="b"><assign location="v" expr="_event.data"/>'
              '</transition></state><state id="b"/>', '<data id="v"/>')
    pos, _ = run(c, sb.Event("e", data={"x": "'); while(true){}; ('", "f": "function(){}"}))
    assert pos.datamodel["v"] == {"x": "'); while(true){}; ('", "f": "function(){}"}


def test_infinite_loop_is_stopped_by_the_time_cap():
    c = chart('<state id="a"><transition event="go" cond="(function(){ while(true){} })()" target="b"/>'
              f'{ERR_TO_LOG}</state><state id="b"/><state id="failed"/>', time_ms=100)
    t0 = time.monotonic()
    pos, effects = run(c, "go")
    assert time.monotonic() - t0 < 2.0
    assert "failed" in pos.configuration
    assert "time limit" in logs(effects)[0][1]


def test_loop_in_a_script_and_in_a_thrown_objects_tostring_does_not_hang():
    c = chart('<state id="a"><onentry><script>throw { toString: function () { while (true) {} } };</script>'
              '<script>try { InternalError.prototype.toString = function () { while (true) {} }; } catch (e) {}'
              '</script><script>while (true) {}</script></onentry>'
              f'{ERR_TO_LOG}</state><state id="failed"/>', time_ms=100)
    t0 = time.monotonic()
    pos, _ = run(c)
    assert time.monotonic() - t0 < 2.0
    assert "failed" in pos.configuration


@pytest.mark.parametrize("alloc", [
    "new ArrayBuffer(1024 * 1024 * 1024)",
    "new Array(256 * 1024 * 1024).fill(0)",
    "(function () { var a = []; while (true) a.push({ i: a.length }); })()",
    "'x'.repeat(Math.pow(2, 29)) + 'y'.repeat(Math.pow(2, 29))",
])
def test_a_1gb_allocation_is_stopped_by_the_memory_cap(alloc):
    c = chart(f'<state id="a"><onentry><assign location="v" expr="{alloc}"/></onentry>{ERR_TO_LOG}</state>'
              '<state id="failed"/>', '<data id="v" expr="1"/>', memory_bytes=32 * 1024 * 1024)
    pos, effects = run(c)
    assert "failed" in pos.configuration
    assert pos.datamodel["v"] == 1
    assert logs(effects)


def test_deep_recursion_is_an_error_not_a_crash():
    c = chart('<state id="a"><onentry><script>function f(n) { return f(n + 1) + 1; } f(0);</script></onentry>'
              f'{ERR_TO_LOG}</state><state id="failed"/>')
    pos, effects = run(c)
    assert "failed" in pos.configuration
    assert "stack" in logs(effects)[0][1].lower()


PROTO = {"__proto__": {"polluted": True}, "constructor": {"prototype": {"polluted": True}}}


def test_proto_keys_in_event_data_do_not_pollute():
    c = chart('<state id="a"><transition event="e" target="b"><assign location="v" expr="_event.data"/>'
              '<script>var merged = {}; for (var k in v) merged[k] = v[k]; copy = JSON.parse(JSON.stringify(v));'
              '</script></transition></state>'
              '<state id="b"><transition event="check" target="c"/></state>'
              '<state id="c"><onentry><log label="clean" expr="({}).polluted === undefined &amp;&amp; '
              'Object.prototype.polluted === undefined &amp;&amp; [].polluted === undefined"/>'
              '<log label="own" expr="Object.keys(v).sort().join()"/></onentry></state>', '<data id="v"/>')
    pos, effects = run(c, sb.Event("e", data=PROTO), "check")
    assert logs(effects) == [("clean", True), ("own", "__proto__,constructor")]
    assert pos.datamodel["v"] == PROTO


def test_proto_keys_in_start_data_do_not_pollute():
    c = chart('<state id="a"><transition event="check" target="b"/></state>'
              '<state id="b"><onentry><log label="clean" expr="({}).polluted === undefined"/></onentry></state>')
    pos, effects = run(c, "check", data={"x": PROTO})
    assert logs(effects) == [("clean", True)]
    assert pos.datamodel["x"] == PROTO


# --------------------------------------------------------------------------- semantics
def test_system_variables_are_read_only():
    for target in ("_sessionid", "_name", "_event", "_ioprocessors", "In", "_event.name"):
        c = chart(f'<state id="a"><onentry><assign location="{target}" expr="1"/></onentry>{ERR_TO_LOG}</state>'
                  '<state id="failed"/>')
        assert "failed" in run(c)[0].configuration, target
    c = chart('<state id="a"><onentry><script>_sessionid = "x";</script></onentry>'
              f'{ERR_TO_LOG}</state><state id="failed"/>')
    assert "failed" in run(c)[0].configuration


def test_undeclared_location_is_an_error():
    c = chart(f'<state id="a"><onentry><assign location="nope" expr="1"/></onentry>{ERR_TO_LOG}</state>'
              '<state id="failed"/>')
    pos, _effects = run(c)
    assert "failed" in pos.configuration and "nope" not in pos.datamodel


def test_event_fields_and_system_variables():
    c = chart('<state id="a"><transition event="e" target="b">'
              '<log label="ev" expr="[_event.name, _event.type, _event.data.k, typeof _event.sendid,'
              ' _sessionid, _name, _ioprocessors.scxml.location].join(\'|\')"/></transition></state>'
              '<state id="b"/>')
    _, effects = run(c, sb.Event("e", data={"k": 7}))
    assert logs(effects) == [("ev", "e|external|7|undefined|s1|chart|#_scxml_s1")]


def test_in_literal_dynamic_and_inside_functions():
    c = chart('<script>function inA() { return In("a"); }</script>'
              '<parallel id="p"><state id="a"><onentry><log label="lit" expr="In(\'a\') &amp;&amp; !In(\'zz\')"/>'
              '<log label="dyn" expr="In(which)"/><log label="fn" expr="inA()"/></onentry>'
              '<transition event="check" cond="In(which) &amp;&amp; inA()" target="c"/></state>'
              '<state id="b"/></parallel><state id="c"/>', '<data id="which" expr="\'b\'"/>')
    pos, effects = run(c, "check")
    # b is entered after a's onentry runs
    assert logs(effects) == [("lit", True), ("dyn", False), ("fn", True)]
    assert "c" in pos.configuration


def test_foreach_over_an_array_and_a_non_array():
    c = chart('<state id="a"><onentry><foreach array="xs" item="x" index="i">'
              '<assign location="sum" expr="sum + x * (i + 1)"/></foreach>'
              '<foreach array="notArray" item="y"><assign location="sum" expr="-1"/></foreach>'
              f'</onentry>{ERR_TO_LOG}</state><state id="failed"/>',
              '<data id="xs" expr="[1, 2, 3]"/><data id="sum" expr="0"/><data id="notArray" expr="({a: 1})"/>')
    pos, _ = run(c)
    assert pos.datamodel["sum"] == 14 and "failed" in pos.configuration


def test_json_and_xml_content():
    c = chart('<state id="a"><onentry><log label="j" expr="cfg.items[1].name"/>'
              '<log label="x" expr="doc.getElementsByTagName(\'book\')[1].getAttribute(\'title\')"/>'
              '</onentry></state>',
              '<data id="cfg">{"items": [{"name": "a"}, {"name": "b"}]}</data>'
              '<data id="doc"><books xmlns=""><book title="one"/><book title="two"/></books></data>')
    pos, effects = run(c)
    assert logs(effects) == [("j", "b"), ("x", "two")]
    assert pos.datamodel["doc"] == '<books><book title="one"/><book title="two"/></books>'


# --------------------------------------------------------------------------- persistence
def test_values_round_trip_through_the_position():
    c = chart('<state id="a"><onentry><script>'
              'nan = NaN; inf = -Infinity; marker = "\\u0000sb:NaN"; nested = {a: [1, 2.5, null, "é"], b: {}};'
              'undef = undefined; big = Math.pow(2, 60); when = new Date(0);</script></onentry>'
              '<transition event="check" target="b"/></state>'
              '<state id="b"><onentry><log label="ok" expr="nan !== nan &amp;&amp; inf === -Infinity &amp;&amp;'
              ' marker === \'\\u0000sb:NaN\' &amp;&amp; nested.a[3] === \'é\' &amp;&amp; undef === null"/>'
              '</onentry></state>')
    pos, effects = run(c, "check")
    d = dict(pos.datamodel)
    assert d["nan"] != d["nan"] and d["inf"] == float("-inf") and d["marker"] == "\x00sb:NaN"
    assert d["nested"] == {"a": [1, 2.5, None, "é"], "b": {}} and d["undef"] is None
    assert d["when"] == "1970-01-01T00:00:00.000Z" and d["big"] == 2.0 ** 60
    assert logs(effects) == [("ok", True)]


def test_top_level_functions_are_recreated_on_load():
    c = chart('<script>var calls = 0; function inc(x) { calls++; return x + 1; }</script>'
              '<state id="a"><transition event="e" target="a"><assign location="n" expr="inc(n)"/>'
              '<assign location="doubled" expr="twice(n)"/></transition></state>',
              '<data id="n" expr="0"/><data id="doubled"/><data id="twice" expr="function (x) { return 2 * x; }"/>')
    pos, _ = run(c, "e", "e", "e")
    d = dict(pos.datamodel)
    # inc and twice are code: not stored, re-created on every load; calls is data and persists
    assert "inc" not in d and "twice" not in d
    assert d["n"] == 3 and d["calls"] == 3 and d["doubled"] == 6


def test_a_function_assigned_is_refused_at_once():
    c = chart(f'<state id="a"><onentry><assign location="f" expr="function () {{}}"/></onentry>{ERR_TO_LOG}'
              '</state><state id="failed"/>', '<data id="f" expr="1"/>')
    pos, effects = run(c)
    assert "failed" in pos.configuration and pos.datamodel["f"] == 1
    assert "function" in logs(effects)[0][1]


def test_a_function_smuggled_by_a_script_is_refused_at_commit():
    c = chart('<state id="a"><transition event="e" target="a"><script>f = function () {}; m = new Map();'
              'ok = 2;</script></transition>'
              '<transition event="error.execution" target="failed"><log label="e" expr="_event.data.message"/>'
              '</transition></state><state id="failed"/>', '<data id="f" expr="1"/><data id="ok" expr="1"/>')
    pos, effects = run(c, "e")
    assert "failed" in pos.configuration
    assert pos.datamodel["f"] == 1 and pos.datamodel["ok"] == 2  # restored; the rest committed
    messages = " ".join(v for _, v in logs(effects))
    assert "a function in variable 'f'" in messages
    assert pos.datamodel["m"] is None  # did not exist before the drive


def test_same_inputs_give_byte_identical_positions():
    c = chart('<script>function f(x) { return {x: x, sq: x * x}; }</script>'
              '<state id="a"><transition event="e" target="a"><assign location="v" expr="f(_event.data)"/>'
              '</transition></state>', '<data id="v"/>')
    blobs = [run(c, sb.Event("e", data=3), sb.Event("e", data=4))[0].to_bytes() for _ in range(2)]
    assert blobs[0] == blobs[1]


def test_through_the_host():
    c = chart('<state id="a"><transition event="add" target="a"><script>items.push(_event.data);</script>'
              '</transition></state>', '<data id="items" expr="[]"/>')
    host = sb.Host(charts=[c], store=sb.MemoryStore(), clock=sb.ManualClock(now_ms=0))
    host.start(c, "i1")
    for k in range(3):
        host.send("i1", "add", data={"k": k})
    assert host.get("i1").datamodel["items"] == [{"k": 0}, {"k": 1}, {"k": 2}]


def test_limits_api():
    c = chart('<state id="a"/>')
    assert E.get_limits(c) == E.DEFAULT_LIMITS
    lim = E.set_limits(c, time_ms=50)
    assert lim.time_ms == 50 and lim.memory_bytes == E.DEFAULT_LIMITS.memory_bytes and E.get_limits(c) is lim
    with pytest.raises(ValueError):
        E.Limits(time_ms=0)


# --------------------------------------------------------------------------- the shared realm
def test_drives_reuse_one_realm_per_thread():
    from statebound.datamodel.ecmascript import realm
    c = chart('<state id="a"><transition event="e" target="a"><assign location="n" expr="n + 1"/></transition>'
              '</state>', '<data id="n" expr="0"/>')
    interp = sb.Interpreter(c)
    run(c)  # this thread has a realm now
    made = realm.realms_made()
    positions = [interp.start(f"s{i}")[0] for i in range(5)]
    for _ in range(4):
        positions = [interp.drive(p, "e")[0] for p in positions]
    assert [p.datamodel["n"] for p in positions] == [4] * 5
    assert realm.realms_made() == made  # twenty-five drives, not one prelude parsed


def test_standard_globals_can_be_shadowed_for_a_drive_but_never_changed():
    c = chart('<state id="a"><onentry><script>var Math = { kind: "mine" }; Array = 5;</script>'
              '<log label="mine" expr="Math.kind"/><log label="array" expr="typeof Array"/>'
              '</onentry><transition event="e" target="b"/></state>'
              '<state id="b"><onentry><log label="json" expr="JSON.length + Math.kind"/></onentry></state>',
              '<data id="JSON" expr="[1, 2, 3]"/>')
    pos, effects = run(c, "e")
    # var and <data> shadow a built-in with a variable of the chart's own (stored like any
    # other); a bare assignment cannot change the shared built-in
    assert logs(effects) == [("mine", "mine"), ("array", "function"), ("json", "3mine")]
    assert pos.datamodel["JSON"] == [1, 2, 3] and pos.datamodel["Math"] == {"kind": "mine"}
    other = chart('<state id="a"><onentry><log label="ok" expr="Math.max(1, 2) === 2 &amp;&amp; '
                  'JSON.stringify([1]) === \'[1]\' &amp;&amp; Array.isArray([])"/></onentry></state>')
    assert logs(run(other)[1]) == [("ok", True)]


def test_direct_eval_and_sloppy_this_still_see_their_scope():
    c = chart('<state id="a"><onentry><log label="eval" expr="(function () { var q = 5; return eval(\'q + 1\'); })()"/>'
              '<log label="this" expr="(function () { return this === globalThis; })()"/>'
              '<log label="global" expr="Function(\'return this\')() === globalThis &amp;&amp; globalThis.n === 1"/>'
              '</onentry></state>', '<data id="n" expr="1"/>')
    assert logs(run(c)[1]) == [("eval", 6), ("this", True), ("global", True)]


def test_a_failed_assignment_or_declaration_says_why_in_plain_words():
    # the realm tags a failure "\x01e": the tag's letter used to lead the message ("ey is not declared")
    c = chart('<state id="a"><onentry><assign location="y" expr="1"/></onentry>'
              '<onentry><assign location="v.x.z" expr="1"/></onentry>'
              '<transition event="error.execution"><log label="error" expr="_event.data.message"/></transition>'
              '</state>', '<data id="v" expr="({})"/>')
    _, effects = run(c)
    messages = [v for label, v in logs(effects) if label == "error"]
    assert messages[0] == "cannot assign to 'y': y is not declared"
    assert messages[1].startswith("cannot assign to 'v.x.z': TypeError"), messages


# --------------------------------------------------------------------------- natives that never poll
# The prelude wraps the natives QuickJS runs without polling its time limit (prelude.UNPOLLED,
# String.raw, JSON.stringify's replacer list, Iterator drop/includes/join, the Set methods):
# what they return must not change. tests/security/test_array_guard.py tries to get past them.
UNPOLLED_SEMANTICS = [
    ("[3, 1, 2].sort().join()", "1,2,3"),
    ("[1, 2, 3].reverse().join()", "3,2,1"),
    ("[1, 2, 3, 4].copyWithin(0, 2).join()", "3,4,3,4"),
    ("[1, 2, 3].toReversed().join() + [2, 1].toSorted().join() + [1, 2].with(0, 5).join() + [1, 2, 3].toSpliced(1, 1).join()",
     "3,2,11,25,21,3"),
    ("JSON.stringify(Array.prototype.slice.call({length: 3, 0: 'a', 2: 'c'}))", '["a",null,"c"]'),
    ("(function () { return Array.prototype.slice.call(arguments, 1).join(); })(1, 2, 3)", "2,3"),
    ("Array.prototype.join.call(new Uint8Array([1, 2]), '-') + Array.prototype.join.call('abc', '-')", "1-2a-b-c"),
    # what a Proxy, a length getter or a typed array is copied for, then written back to
    ("(function () { var t = [1, 2, 3], p = new Proxy(t, {}); p.reverse(); return t.join() + '|' + p.join(); })()",
     "3,2,1|3,2,1"),
    ("(function () { var o = {0: 'b', 1: 'a', get length() { return 2; }}; var r = Array.prototype.sort.call(o);"
     " return o[0] + o[1] + (r === o); })()", "abtrue"),
    ("(function () { var t = [1, 2, 3], p = new Proxy(t, {}); var x = p.shift(); return x + '|' + t.join() + '|' + t.length; })()",
     "1|2,3|2"),
    ("(function () { var t = [2], p = new Proxy(t, {}); var n = p.unshift(0, 1); return n + '|' + t.join(); })()", "3|0,1,2"),
    ("(function () { var t = [1, 2, 3, 4], p = new Proxy(t, {}); var r = p.splice(1, 2, 'x'); return r.join() + '|' + t.join(); })()",
     "2,3|1,x,4"),
    ("(function () { var t = [1, , 3], p = new Proxy(t, {}); p.reverse(); return [0 in t, 1 in t, 2 in t, t[0], t[2]].join(); })()",
     "true,false,true,3,1"),
    ("(function () { var u = new Uint8Array([3, 1, 2]); Array.prototype.sort.call(u); return u.join(); })()", "1,2,3"),
    # concat: what spreads and what does not, holes, species
    ("JSON.stringify([1].concat(2, [3, [4]], {length: 1, 0: 5}))", '[1,2,3,[4],{"0":5,"length":1}]'),
    ("(function () { var o = {length: 2, 0: 'a', 1: 'b'}; o[Symbol.isConcatSpreadable] = true; return [].concat(o).join(); })()",
     "a,b"),
    ("(function () { var a = [1, 2]; a[Symbol.isConcatSpreadable] = false; var r = [0].concat(a); return r.length + '|' + (r[1] === a); })()",
     "2|true"),
    ("(function () { var r = [, 1].concat([2, , 3]); return [r.length, 0 in r, 3 in r, r[4]].join(); })()", "5,false,false,3"),
    ("Array.prototype.concat.call(1, 2).length + '|' + typeof Array.prototype.concat.call(1)[0]", "2|object"),
    ("(function () { var p = new Proxy([1, 2], {}); return p.concat([3]).join() + '|' + [0].concat(p).join(); })()", "1,2,3|0,1,2"),
    ("(function () { class A extends Array {} var a = A.from([1, [2], 3]); return [a.slice(1) instanceof A,"
     " a.concat([4]) instanceof A, a.flat() instanceof A, a.flatMap(function (x) { return [x]; }) instanceof A,"
     " a.concat([4]).length, a.flat().length].join(); })()", "true,true,true,true,4,3"),
    # flat and flatMap
    ("JSON.stringify([1, [2, [3, [4]]], , 5].flat())", "[1,2,[3,[4]],5]"),
    ("[1, [2, [3, [4]]]].flat(Infinity).join() + '|' + [1, [2]].flat(0).length", "1,2,3,4|2"),
    ("[[1], [2]].flatMap(function (x, i, all) { return x.concat([i, all.length]); }).join()", "1,0,2,2,1,2"),
    ("[1].flatMap(function () { return this.v; }, {v: 7})[0]", 7),
    # the wrappers look like what they wrap
    ("[Array.prototype.concat.length, Array.prototype.flat.length, Array.prototype.flatMap.length,"
     " Array.prototype.join.length, Array.prototype.splice.length, Array.prototype.join.name, String.raw.length,"
     " JSON.stringify.length, Set.prototype.union.length, 'prototype' in Array.prototype.join].join()",
     "1,0,1,1,2,join,1,3,1,false"),
    ("String.raw({raw: ['x', 'y', 'z']}, 1, 2, 3) + '|' + String.raw({raw: 'abc'}, '-') + '|' + String.raw({raw: []})",
     "x1y2z|a-bc|"),
    ("JSON.stringify({a: 1, b: 2, c: 3}, ['a', 'c']) + JSON.stringify({1: 1, b: 2, c: 3}, [1, new String('b'), {}])",
     '{"a":1,"c":3}{"1":1,"b":2}'),
    ("JSON.stringify({a: [1]}, null, 1) + JSON.stringify([1], function (k, v) { return typeof v === 'number' ? v + 1 : v; })",
     '{\n "a": [\n  1\n ]\n}[2]'),
    ("[1, 2, 3].values().drop(1).toArray().join() + '|' + [1, 2, 3].values().includes(2) + '|' + [1, null, 3].values().join('-')",
     "2,3|true|1--3"),
    ("(function () { var closed = 0, it = {next: function () { return {value: 1, done: false}; },"
     " return: function () { closed++; return {}; }}; Iterator.prototype.includes.call(it, 1); return closed; })()", 1),
    ("[...new Set([1, 2]).union(new Set([3]))].join() + '|' + new Set([1, 2]).isSubsetOf(new Set([1, 2, 3]))"
     " + '|' + new Set([1, 2]).isSupersetOf(new Set([2])) + '|' + [...new Set([1, 2]).symmetricDifference(new Set([2, 3]))].join()",
     "1,2,3|true|true|1,3"),
    ("[...new Set([1, 2, 3]).intersection({size: 1, has: function (x) { return x === 2; },"
     " keys: function () { return [2].values(); }})].join()", "2"),
    ("[typeof Proxy, Proxy.prototype === undefined, Proxy.name, Proxy.length, new Proxy({a: 1}, {}).a,"
     " Proxy.revocable({b: 2}, {}).proxy.b].join()", "function,true,Proxy,2,1,2"),
    ("(function () { var a = []; a.length = 2 ** 25; try { a.join(); } catch (e) { return e.name + ': ' + e.message; } })()",
     "RangeError: join: over 2**24 elements"),
]


def test_the_natives_the_prelude_wraps_keep_their_semantics():
    from xml.sax.saxutils import quoteattr
    blocks = "".join(f'<onentry><log label="{i}" expr={quoteattr(e)}/></onentry>'
                     for i, (e, _) in enumerate(UNPOLLED_SEMANTICS))
    c = chart(f'<state id="a">{blocks}<transition event="error.execution">'
              '<log label="error" expr="_event.data.message"/></transition></state>')
    seen = dict(logs(run(c)[1]))
    assert "error" not in seen, seen["error"]
    for i, (e, want) in enumerate(UNPOLLED_SEMANTICS):
        assert seen.get(str(i)) == want, (e, seen.get(str(i)))


@pytest.mark.parametrize("expr", ["Proxy({}, {})", "[1].flatMap(5)", "new Set([1]).union([1])",
                                  "Set.prototype.union.call([], new Set())", "Iterator.prototype.drop.call(1, 1)",
                                  "String.raw()", "Array.prototype.concat.call(null)"])
def test_the_wrapped_natives_refuse_what_the_natives_refuse(expr):
    c = chart(f'<state id="a"><onentry><log label="v" expr="{expr}"/></onentry>{ERR_TO_LOG}</state>'
              '<state id="failed"/>')
    pos, effects = run(c)
    assert "failed" in pos.configuration and "TypeError" in logs(effects)[0][1], logs(effects)


# --------------------------------------------------------------------------- the caller's values
def test_a_failing_script_says_why_without_the_realms_tag():
    # the realm tags a failure "\x01e": stripped one character short, messages read "eRangeError: ..."
    c = chart('<state id="a"><onentry><script>throw new RangeError("boom");</script></onentry>'
              '<transition event="error.execution"><log label="error" expr="_event.data.message"/></transition>'
              '</state>')
    _, effects = run(c)
    assert [v for label, v in logs(effects) if label == "error"] == ["<script> failed: RangeError: boom"]
    with pytest.raises(sb.EvaluationError, match=r"^loading: RangeError: x$"):
        E.EcmaScriptContext._check("\x01eRangeError: x", "loading")


class _Opaque:
    def __str__(self) -> str:
        return "opaque"


@pytest.mark.parametrize(("field", "value", "seen"), [
    ("raw", b"x", "x"), ("sendid", {2, 1}, [1, 2]), ("origin", _Opaque(), "opaque"), ("invokeid", ("a", 1), ["a", 1]),
    ("origintype", 5, 5), ("type", b"external", "external"),
])
def test_event_fields_that_are_not_json_values_read_as_plain_ones(field, value, seen):
    # as event data always did; the python datamodel shows them as they are (a bare TypeError before)
    c = chart('<state id="a"><transition event="go"><assign location="v" expr="_event.' + field + '"/>'
              '<assign location="n" expr="_event.name + _event.data"/></transition></state>',
              '<data id="v"/><data id="n"/>')
    pos, _ = run(c, sb.Event("go", data="!", **{field: value}))
    v = pos.datamodel["v"]
    assert (sorted(v) if field == "sendid" else v) == seen and pos.datamodel["n"] == "go!"


def test_an_event_field_nested_too_deep_is_error_execution_where_it_is_read():
    deep: list = []
    for _ in range(2000):
        deep = [deep]
    c = chart(f'<state id="a"><transition event="go"><assign location="v" expr="_event.raw"/></transition>{ERR_TO_LOG}'
              '</state><state id="failed"/>', '<data id="v" expr="1"/>')
    pos, effects = run(c, sb.Event("go", raw=deep))
    assert "failed" in pos.configuration and pos.datamodel["v"] == 1
    assert "nests more than 256 levels" in logs(effects)[0][1]


@pytest.mark.parametrize("name", ["undefined", "NaN", "Infinity"])
def test_a_stored_variable_named_after_a_read_only_global_is_refused_at_load(name):
    import msgpack

    from statebound.position import read_header
    c = chart('<state id="a"><transition event="go"><assign location="x" expr="x + 1"/></transition></state>',
              '<data id="x" expr="1"/>')
    pos, _ = sb.Interpreter(c).start("s1")
    blob = pos.to_bytes()
    off = read_header(blob).payload_offset
    fields = list(msgpack.unpackb(blob[off:], raw=False))
    fields[3] = msgpack.packb({"x": 1, name: 0}, use_bin_type=True)  # the packed variables
    crafted = blob[:off] + msgpack.packb(fields, use_bin_type=True)
    # every later drive would fail on it (the name cannot be installed), so it never loads
    with pytest.raises(sb.CorruptPosition, match=f"'{name}' is a read-only global"):
        sb.Position.from_bytes(crafted, c)
    with pytest.raises(sb.SerializationError, match="read-only global"):
        sb.Interpreter(c).start("s2", data={name: 1})
    fields[3] = msgpack.packb({"x": 1, "eval": 0}, use_bin_type=True)  # a standard global: shadowed, fine
    ok = sb.Position.from_bytes(blob[:off] + msgpack.packb(fields, use_bin_type=True), c)
    assert dict(sb.Interpreter(c).drive(ok, "go")[0].datamodel) == {"x": 2, "eval": 0}
