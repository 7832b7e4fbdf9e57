"""Natives QuickJS runs without polling its interrupt handler, reached past the prelude's guards.

A native loop over a length or an iterator the chart controls never checks the time limit:
on a sparse array or an array-like of length 2**32 - 1 (or 2**53 - 1) one call runs for
minutes or hours past every cap. The prelude wraps each such native (``prelude.UNPOLLED``,
``String.raw``, ``JSON.stringify``'s replacer list, ``Iterator.prototype.drop/includes/join``
and the ``Set`` methods that take a set-like). These are the ways around a guard that reads a
length once and lets the native read it again: a getter or a ``valueOf`` answering small then
huge, a Proxy, a prototype, a spreadable non-array, a nested array, code that a native runs
half-way (a getter on an element, ``Symbol.isConcatSpreadable``, ``constructor``), and natives
that pull from an iterator.

Each group is one chart in a child process (``conftest.hostile``): a hang fails the test at the
harness's timeout instead of hanging the run. Every attack must either complete or end in
``error.execution``, well within the child's CPU limit.
"""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

import pytest

from .helpers import CATCH, scxml

HUGE = "9007199254740991"  # 2**53 - 1
#: a genuine sparse array of length 2**32 - 1 (no element: nothing to allocate)
SPARSE = "(function () { var s = []; s.length = 4294967295; return s; })()"

THIS_ONLY = ["join", "toLocaleString", "reverse", "copyWithin", "shift", "unshift", "slice", "splice", "sort",
             "fill", "toReversed", "toSorted", "toSpliced", "with"]

GROUPS = {
    # (a) a length getter: small for the guard, huge for the native
    "length getter": [f"Array.prototype.{m}.call({{ get length() {{ return g(); }} }}, 0, 0)" for m in THIS_ONLY]
                     + ["[].concat((function () { var o = { get length() { return g(); } };"
                        " o[Symbol.isConcatSpreadable] = true; return o; })()).length"],
    # the same through valueOf, an inherited getter, and a Proxy on the prototype chain
    "length conversions": [
        "Array.prototype.join.call({ length: { valueOf: g } })",
        "Array.prototype.reverse.call(Object.create({ get length() { return g(); } }))",
        "Array.prototype.sort.call(Object.create(new Proxy({}, { get: function (t, k) {"
        " return k === 'length' ? g() : undefined; } })))",
    ],
    # (b) concat spreads what the guard did not look at
    "concat": [
        f"(function () {{ var o = {{ length: {HUGE} - 1 }}; o[Symbol.isConcatSpreadable] = true;"
        " return [].concat(o).length; })()",
        f"(function () {{ var s = {SPARSE}, flip = 0; var o = []; Object.defineProperty(o, Symbol.isConcatSpreadable,"
        " { get: function () { if (flip++) s.length = 4294967295; return true; } }); s.length = 1;"
        " return [].concat(o, s).length; })()",
        # an element getter of `this` grows an argument the native has not reached yet
        "(function () { var b = [1], a = [1]; Object.defineProperty(a, 0, { get: function () {"
        " b.length = 4294967295; return 1; } }); return a.concat(b).length; })()",
        # a species getter of `this` grows an argument
        "(function () { var b = [1], a = [1]; Object.defineProperty(a, 'constructor', { get: function () {"
        " b.length = 4294967295; return Array; } }); return a.concat(b).length; })()",
        # many arguments, each under the cap
        "(function () { var s = []; s.length = 16777216; var args = []; for (var i = 0; i < 300; i++) args.push(s);"
        " return Array.prototype.concat.apply([], args).length; })()",
    ],
    # (c) a Proxy whose length trap answers 1, then huge
    "proxy": [f"(function () {{ var p = new Proxy([], {{ get: function (t, k) {{"
              f" return k === 'length' ? g() : t[k]; }} }}); return {call}; }})()"
              for call in ("p.reverse()", "p.join()", "Array.prototype.sort.call(p)", "[].concat(p).length",
                           "p.slice().length", "Array.prototype.fill.call(p, 0)", "[p].flat().length",
                           "Array.prototype.splice.call(p, 0, 0, 1)")]
             + ["(function () { var r = Proxy.revocable([], { get: function (t, k) {"
                " return k === 'length' ? g() : t[k]; } }); return r.proxy.copyWithin(0, 1); })()"],
    # nested arrays: flat and flatMap read each one's length half-way
    "flat": [f"[{SPARSE}].flat().length", f"[1].flatMap(function () {{ return {SPARSE}; }}).length",
             f"[[[{SPARSE}]]].flat(Infinity).length"],
    # natives that loop over an iterator whose next is native, or over an array-like
    "iterators and others": [
        f"String.raw({{ raw: {{ length: {HUGE} }} }})",
        f"JSON.stringify({{}}, {SPARSE})",
        f"{SPARSE}.values().drop(4294967294).next().done",
        f"{SPARSE}.values().includes(1)",
        f"{SPARSE}.values().join('')",
        f"Iterator.from({SPARSE}.values()).drop(4294967294).next().done",
    ] + [f"new Set([1, 2]).{m}({{ size: 1, has: function () {{ return false; }},"
         f" keys: function () {{ return {SPARSE}.values(); }} }})"
         for m in ("union", "intersection", "difference", "symmetricDifference", "isSupersetOf",
                   "isDisjointFrom")],
}


def _chart(attacks: list[str]) -> str:
    # each attack runs with a g() of its own, so every one meets a getter that answers 1 first
    wrap = "(function () { var n = 0; function g() { return n++ ? " + HUGE + " : 1; } return (%s); })()"
    blocks = "".join(f"<onentry><assign location='x' expr={quoteattr(wrap % a)}/>"
                     "<assign location='n' expr='n + 1'/></onentry>" for a in attacks)
    return scxml(f'<datamodel><data id="x" expr="0"/><data id="n" expr="0"/></datamodel>'
                 f'<state id="a">{blocks}{CATCH}</state>')


@pytest.mark.parametrize("group", list(GROUPS))
def test_an_unpolled_native_cannot_be_made_to_loop_past_the_caps(hostile, group):
    attacks = GROUPS[group]
    out = hostile({"main.scxml": _chart(attacks)}, ecma_limits={"time_ms": 300})
    out.assert_contained()
    assert out.error is None, out.error
    # every attack either completed or was an error.execution the chart saw
    assert out.raw["datamodel"]["n"] + len(out.messages) == len(attacks), (out.raw["datamodel"], out.messages)
    assert out.raw["cpu_s"] < 10, out.raw["cpu_s"]
