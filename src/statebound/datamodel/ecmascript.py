"""The ``ecmascript`` datamodel (W3C SCXML §B.2), run in a QuickJS sandbox.

Install it with the extra: ``pip install 'statebound[ecmascript]'`` (the ``quickjs-ng``
binding of the maintained QuickJS fork). A chart opts in with ``datamodel="ecmascript"``.

What a chart sees
-----------------
* Every ``<data>`` is a global variable; ``expr``/``cond``/``*expr`` are ECMAScript
  expressions, ``location`` an assignment target and ``<script>`` a program run in the
  global scope (sloppy mode, ``var`` and function declarations become globals).
* ``_event`` (``name type sendid origin origintype invokeid data``; blank fields are
  ``undefined``), ``_sessionid``, ``_name``, ``_ioprocessors`` and ``In(stateId)``.
  They are read-only: assigning to one raises ``error.execution``.
* Inline content that is JSON arrives as the JSON value; XML content becomes a small
  read-only DOM (``getElementsByTagName``, ``getAttribute``, ``childNodes``,
  ``textContent`` ...), stored as its XML text.

Sandbox
-------
Each drive gets a fresh QuickJS runtime with a memory cap, a CPU-time cap per
evaluation and a stack cap (:class:`Limits`, :func:`set_limits`), and spends the drive's
:class:`~statebound.datamodel.budget.Budget`: the time limit of each call into JS is what is
left of it when that is less than the cap. The runtime has no
module loader, no ``std``/``os`` modules and no Python callbacks: an expression can
reach nothing but the variables of its own session. An infinite loop is interrupted
when the time cap expires and an allocation over the memory cap fails; both become
``error.execution`` events. Exceptions are always described by native code (the error
constructors are frozen), so a hostile ``toString`` cannot hang the host.

Persistence
-----------
Between drives the variables are stored as JSON-compatible values: objects are stored as
``JSON.stringify`` would store them (their own enumerable properties; ``undefined`` is
``null``), ``NaN`` and ``±Infinity`` are kept. Values that cannot be stored are refused:
functions, symbols, BigInts, ``Map``, ``Set``, typed arrays, ``RegExp``, ``Error``,
promises, cycles. ``<assign>`` and ``<data>`` refuse them at once (``error.execution``);
a value smuggled in by a ``<script>`` (a looping ``toJSON``, getter or Proxy included) is
put back by the commit as it was before the drive, with ``error.execution``.

Functions are code, not data. The functions the chart defines at its top level -- in the
root ``<script>``, or as a root ``<data expr="function ...">`` -- are not stored: on every
load, after the stored variables are installed, the top-level ``<script>`` runs again and
the function ``<data>`` are evaluated again, then the stored variables are installed once
more (so stored data always wins). Any other function reaching a variable is refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import quickjs

from ..chart.model import Assign, Chart, Expr, Foreach, If, Script
from ..chart.xml import parse_xml
from ..exceptions import EvaluationError, SerializationError
from .base import SYSTEM_VARIABLES
from .budget import Budget

__all__ = ["EcmaScriptDatamodel", "EcmaScriptContext", "Limits", "DEFAULT_LIMITS", "set_limits",
           "get_limits", "set_default_limits", "BINDING"]

#: The PyPI distribution that provides the ``quickjs`` module used here.
BINDING = "quickjs-ng"


@dataclass(frozen=True)
class Limits:
    """Resource caps of the ECMAScript sandbox.

    :ivar memory_bytes: the QuickJS heap cap of one drive (all variables included).
    :ivar time_ms: CPU time one evaluation (expression, condition, ``<script>``, the
        commit's serialization) may take before it is interrupted.
    :ivar stack_bytes: the JS stack cap (deep recursion raises a ``RangeError``).
    """

    memory_bytes: int = 64 * 1024 * 1024
    time_ms: int = 1000
    stack_bytes: int = 512 * 1024

    def __post_init__(self) -> None:
        if self.memory_bytes < 1024 * 1024:
            raise ValueError("memory_bytes must be at least 1 MiB")
        if self.time_ms < 1:
            raise ValueError("time_ms must be at least 1")
        if self.stack_bytes < 64 * 1024:
            raise ValueError("stack_bytes must be at least 64 KiB")


#: The limits of charts that were given none.
DEFAULT_LIMITS = Limits()
_LIMITS_KEY = "ecmascript.limits"


def set_default_limits(limits: Limits) -> None:
    """Change the limits of every chart that has none of its own."""
    global DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise TypeError("set_default_limits takes a Limits")
    DEFAULT_LIMITS = limits


def set_limits(chart: Chart, limits: Limits | None = None, *, memory_bytes: int | None = None,
               time_ms: int | None = None, stack_bytes: int | None = None) -> Limits:
    """Set the sandbox limits of ``chart`` (and of the sub-charts it invokes).

    ``set_limits(chart, Limits(...))`` or ``set_limits(chart, time_ms=50)`` (the other
    fields keep their current value). Takes effect from the next drive; returns the limits.
    """
    base = limits if limits is not None else get_limits(chart)
    changes = {k: v for k, v in (("memory_bytes", memory_bytes), ("time_ms", time_ms),
                                 ("stack_bytes", stack_bytes)) if v is not None}
    new = replace(base, **changes) if changes else base
    stack = [chart]
    while stack:
        c = stack.pop()
        c._caches[_LIMITS_KEY] = new
        stack.extend(getattr(c, "subcharts", ()) or ())
    return new


def get_limits(chart: Chart) -> Limits:
    """The limits in force for ``chart``."""
    return chart._caches.get(_LIMITS_KEY) or DEFAULT_LIMITS


# QuickJS's native array methods below walk ``length`` without polling the interrupt handler
# (the others do): on a sparse array or array-like of length 2**32-1, one call would run for
# minutes past every time limit. The prelude makes them refuse more than 2**24 elements, far
# more than any array that fits in the heap.
_UNPOLLED = ("join toString toLocaleString reverse copyWithin shift unshift slice splice concat sort flat flatMap "
             "fill toReversed toSorted toSpliced with")

# --------------------------------------------------------------------------- the JS side
# Evaluated once per runtime; its completion value is the dispatcher the Python side calls.
# Nothing it defines is reachable from chart code except the system variables and In().
_PRELUDE = r"""
(function () {
"use strict";
var g = globalThis, O = Object, apply = Reflect.apply, defProp = O.defineProperty, names = O.getOwnPropertyNames,
  getDesc = O.getOwnPropertyDescriptor, getProto = O.getPrototypeOf, freeze = O.freeze, create = O.create,
  hasOwn = O.hasOwn, isArray = Array.isArray, isView = ArrayBuffer.isView, parse = JSON.parse,
  stringify = JSON.stringify, geval = g.eval, Str = String, slice = String.prototype.slice,
  split = String.prototype.split, test = RegExp.prototype.test, TypeErr = TypeError, Err = Error,
  MARK = "\u0000sb:", UNSAFE = /[\u0000\ud800-\udfff]/, special = false, i;
// exceptions are described by native code only
var errs = [Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError, g.InternalError,
  g.AggregateError, g.SuppressedError];
for (i = 0; i < errs.length; i++) if (errs[i]) { freeze(errs[i].prototype); freeze(errs[i]); }
// array methods that never poll the interrupt handler: at most 2**24 elements (see _UNPOLLED)
var AP = Array.prototype, RangeErr = RangeError, UNPOLLED = "%UNPOLLED%".split(" ");
function huge(o) { return o !== null && (typeof o === "object" || typeof o === "function") && +o.length > 16777216; }
function guard(k, f) {
  defProp(AP, k, { writable: true, configurable: true, value: function () {
    for (var j = -1; j < arguments.length; j++)
      if (j < 0 ? huge(this) : isArray(arguments[j]) && huge(arguments[j])) throw new RangeErr(k + ": over 2**24 elements");
    return apply(f, this, arguments); } });
}
for (i = 0; i < UNPOLLED.length; i++) if (typeof AP[UNPOLLED[i]] === "function") guard(UNPOLLED[i], AP[UNPOLLED[i]]);
function Refusal(msg) { this.msg = msg; }
function prop(o, k) {
  for (var n = 0; o !== null && n < 64; o = getProto(o), n++) { var d = getDesc(o, k); if (d) return d.value; }
}
function describe(e) {
  try {
    if (e instanceof Refusal) return e.msg;
    if (e === null) return "null was thrown (or memory ran out)";
    var t = typeof e;
    if (t !== "object" && t !== "function") return Str(e);
    var n = prop(e, "name"), m = prop(e, "message");
    n = typeof n === "string" ? n : "Error";
    return typeof m === "string" && m !== "" ? n + ": " + m : n;
  } catch (x) { return "an exception that cannot be described"; }
}
var OPAQUE = ["Map", "Set", "WeakMap", "WeakSet", "WeakRef", "FinalizationRegistry", "Promise", "ArrayBuffer",
  "SharedArrayBuffer", "RegExp", "Error"], CTORS = [];
for (i = 0; i < OPAQUE.length; i++) CTORS[i] = g[OPAQUE[i]];
function kindOf(t) { return t === "function" ? "a function" : t === "symbol" ? "a symbol" : "a BigInt"; }
function at(k) { return k === "" ? "" : " (at key " + stringify(Str(k)) + ")"; }
function marked(v) { return v.length >= 4 && apply(slice, v, [0, 4]) === MARK; }
function replacer(k, v) {
  var t = typeof v;
  if (t === "number") {
    if (v - v === 0) return v;
    special = true;
    return MARK + Str(v);
  }
  if (t === "string") { if (marked(v)) { special = true; return MARK + "s" + v; } return v; }
  if (t === "object") {
    if (v !== null && !isArray(v)) {
      if (isView(v)) throw new Refusal("a typed array" + at(k));
      for (var j = 0; j < CTORS.length; j++)
        if (CTORS[j] && v instanceof CTORS[j]) throw new Refusal("a " + OPAQUE[j] + at(k));
    }
    return v;
  }
  if (t === "undefined" || t === "boolean") return v;
  throw new Refusal(kindOf(t) + at(k));
}
function encode(v) {
  special = false;
  try { var s = stringify(v, replacer); } catch (e) { throw e instanceof Refusal ? e : new Refusal(describe(e)); }
  return s === undefined ? "null" : s;
}
function reviver(k, v) {
  if (typeof v === "string" && marked(v)) {
    var r = apply(slice, v, [4]);
    return r === "NaN" ? NaN : r === "Infinity" ? 1 / 0 : r === "-Infinity" ? -1 / 0 : apply(slice, r, [1]);
  }
  return v;
}
var ev, active = null, dom = null, SYSTEM = create(null), base = create(null), declared = create(null),
  code = create(null), last, lastData = false, lastWhy = "";
SYSTEM._event = SYSTEM._sessionid = SYSTEM._name = SYSTEM._ioprocessors = SYSTEM.In = SYSTEM._x = true;
function deepFreeze(o) {
  if (o !== null && typeof o === "object") { var ks = names(o); for (var j = 0; j < ks.length; j++) deepFreeze(o[ks[j]]); freeze(o); }
  return o;
}
function ro(k, v, getter) {
  defProp(g, k, { get: getter || function () { return v; }, enumerable: false, configurable: false,
    set: function () { throw new TypeErr("cannot assign to " + k + ": it is a read-only system variable"); } });
}
function In(id) {
  if (active === null) throw new Err("In() cannot be reached from here");
  return hasOwn(active, Str(id));
}
function setActive(ids) {
  active = null;
  if (typeof ids === "string") {
    active = create(null);
    if (ids !== "") { var p = apply(split, ids, ["\u001f"]); for (var j = 0; j < p.length; j++) active[p[j]] = true; }
  }
}
function isUser(k) { return !SYSTEM[k] && (!hasOwn(base, k) || hasOwn(declared, k)); }
function put(k, v) {
  if (SYSTEM[k]) throw new Refusal(k + " is a system variable");
  var d = getDesc(g, k);
  if (d && !d.configurable) {
    if (!d.writable) throw new Refusal(k + " is a read-only global");
    g[k] = v;
  } else defProp(g, k, { value: v, writable: true, enumerable: true, configurable: true });
  declared[k] = true;
}
function install(text, sp) {
  var o = sp ? parse(text, reviver) : parse(text), ks = names(o);
  for (var j = 0; j < ks.length; j++) put(ks[j], o[ks[j]]);
}
function userNames() { var ks = names(g), r = []; for (var j = 0; j < ks.length; j++) if (isUser(ks[j])) r[r.length] = ks[j]; return r; }
// "j{...}" or "J{...}" (J: markers to revive), then "\u0003[[name, why], ...]" for refused variables
function dump() {
  var ks = userNames(), s = "{", sp = false, bad = [];
  for (var j = 0; j < ks.length; j++) {
    var k = ks[j], v = g[k], text;
    if (typeof v === "function" && code[k] === v) continue;
    try { text = encode(v); } catch (e) { bad[bad.length] = [k, e.msg]; continue; }
    sp = sp || special;
    s += (s === "{" ? "" : ",") + stringify(k) + ":" + text;
  }
  return (sp ? "J" : "j") + s + "}" + (bad.length ? "\u0003" + stringify(bad) : "");
}
function out(v) {
  var t = typeof v;
  if (t === "string") return v === "" || (v[0] !== "\u0001" && !apply(test, UNSAFE, [v])) ? v : "\u0001j" + stringify(v);
  if (t === "number" || t === "boolean" || t === "undefined" || v === null) return v;
  last = v;
  lastData = false;
  if (t === "object") {
    try { var s = encode(v); lastData = true; return (special ? "\u0001J" : "\u0001j") + s; }
    catch (e) { lastWhy = describe(e); return "\u0001r" + lastWhy; }
  }
  lastWhy = kindOf(t);
  var text = "";
  try { text = Str(v); } catch (e) {}
  return "\u0001r" + lastWhy + "\u0002" + (text.length > 200 ? apply(slice, text, [0, 200]) + "..." : text);
}
function value(mode, payload, sp) {
  if (mode === "last") { if (!lastData) throw new Refusal(lastWhy + " cannot be stored in the datamodel"); return last; }
  if (mode === "undef") return undefined;
  if (mode === "xml") return dom(parse(payload));
  return sp ? parse(payload, reviver) : parse(payload);
}
var T = { expr: [], cond: [], set: [] }, scripts = [],
  W = { expr: ["(function(){return (", "\n);})"], cond: ["(function(){return !!(", "\n);})"],
        set: ["(function(__sb_value__){(", "\n)=__sb_value__;})"] };
// Strings go back to Python flat: the binding cannot convert QuickJS rope strings.
return function (op, a, b, c, d, e, f) {
  var r = dispatch(op, a, b, c, d, e, f);
  return typeof r === "string" ? apply(slice, r, [0]) : r;
};
function dispatch(op, a, b, c, d, e, f) {
  switch (op) {
  case "eval":
    setActive(b);
    try { return out(T.expr[a]()); } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "cond":
    setActive(b);
    try { return T.cond[a](); } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "compile":
    try { T[b][a] = geval(W[b][0] + c + W[b][1]); return ""; } catch (x) { return describe(x); }
  case "assign":   // a: id, b: root, c: mode, d: payload, e: special, f: In() ids
    try {
      if (!hasOwn(g, b)) return "\u0001e" + b + " is not declared";
      var v = value(c, d, e);
      setActive(f);
      T.set[a](v);
      if (hasOwn(base, b)) declared[b] = true;
      return "";
    } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "declare":  // a: name, b: mode, c: payload, d: special, e: the value may be top-level code
    try {
      if (b === "last" && !lastData && e && typeof last === "function") { put(a, last); code[a] = last; }
      else put(a, value(b, c, d));
      return "";
    } catch (x) { return "\u0001e" + describe(x); }
  case "isdecl":
    return !SYSTEM[a] && hasOwn(g, a);
  case "script":   // a: id, b: source (the first time), c: In() ids
    if (b !== null) scripts[a] = b;
    setActive(c);
    try { geval(scripts[a]); return ""; } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "code":     // every function-valued variable now is the chart's top-level code
    var ks = userNames();
    for (var j = 0; j < ks.length; j++) { var dd = getDesc(g, ks[j]); if (dd && typeof dd.value === "function") code[ks[j]] = dd.value; }
    return "";
  case "names":    // the user variables as JSON, for dumping them one by one (see variables())
    var nm = userNames(), s1 = "[";  // no stringify(array): a chart can give arrays a toJSON
    for (var q1 = 0; q1 < nm.length; q1++) s1 += (q1 ? "," : "") + stringify(Str(nm[q1]));
    return s1 + "]";
  case "dumpone":  // a: name -> "j"/"J" + JSON, "-" for top-level code, "\u0003" + why it cannot be stored
    try {
      var v1 = g[a];
      if (typeof v1 === "function" && code[a] === v1) return "-";
      var t1 = encode(v1);
      return (special ? "J" : "j") + t1;
    } catch (x) { return "\u0003" + describe(x); }
  case "drop":     // forget what re-running the top-level code left, except its functions
    var us = userNames();
    for (var k = 0; k < us.length; k++) if (!hasOwn(code, us[k])) { try { delete g[us[k]]; } catch (x) {} delete declared[us[k]]; }
    return "";
  case "event":    // a: JSON [name, type, sendid, origin, origintype, invokeid, raw, data], b: data mode, c: special
    ev = undefined;
    if (a === null) return "";
    try {
      var fl = c ? parse(a, reviver) : parse(a), n = [];
      for (var q = 0; q < 7; q++) n[q] = fl[q] === null ? undefined : fl[q];
      ev = freeze({ name: n[0], type: n[1], sendid: n[2], origin: n[3], origintype: n[4], invokeid: n[5],
        data: b === "none" ? undefined : b === "xml" ? dom(fl[7]) : fl[7], raw: n[6] });
      return "";
    } catch (x) { return "\u0001e" + describe(x); }
  case "install":
    try { install(a, b); return ""; } catch (x) { return "\u0001e" + describe(x); }
  case "dump":
    try { return dump(); } catch (x) { return "\u0001e" + describe(x); }
  case "dom":      // a: the DOM builder's source
    try { dom = geval(a)(create, defProp, hasOwn); return ""; } catch (x) { return "\u0001e" + describe(x); }
  case "init":     // a: JSON [sessionid, name, ioprocessors]
    var s0 = parse(a);
    ro("_sessionid", s0[0]); ro("_name", s0[1]); ro("_ioprocessors", deepFreeze(s0[2]));
    ro("_event", 0, function () { return ev; }); ro("In", In);
    var bn = names(g);
    for (var m = 0; m < bn.length; m++) base[bn[m]] = true;
    return "";
  }
  return "\u0001eunknown operation";
}
})()
"""

#: A small read-only XML DOM, loaded into a runtime only when XML content is used.
_DOM = r"""
(function (create, defProp, hasOwn) {
"use strict";
function esc(s, attr) {
  var o = "";
  for (var i = 0; i < s.length; i++) {
    var c = s[i];
    o += c === "&" ? "&amp;" : c === "<" ? "&lt;" : c === ">" ? "&gt;" : attr && c === '"' ? "&quot;" : c;
  }
  return o;
}
function walk(n, name, found) {
  for (var i = 0; i < n.childNodes.length; i++) {
    var c = n.childNodes[i];
    if (c.nodeType === 1) { if (name === "*" || c.nodeName === name) found[found.length] = c; walk(c, name, found); }
  }
  return found;
}
var Node = {
  get firstChild() { return this.childNodes.length ? this.childNodes[0] : null; },
  get lastChild() { return this.childNodes.length ? this.childNodes[this.childNodes.length - 1] : null; },
  hasChildNodes: function () { return this.childNodes.length > 0; },
  getElementsByTagName: function (name) { return walk(this, name, []); },
  toString: function () { return this.toJSON(); }
};
var Elem = create(Node, {
  nodeType: { value: 1 },
  children: { get: function () { return walk({ childNodes: this.childNodes }, "*", []).filter(function (c) { return c.parentNode === this; }, this); } },
  textContent: { get: function () { var s = ""; for (var i = 0; i < this.childNodes.length; i++) s += this.childNodes[i].textContent; return s; } },
  getAttribute: { value: function (n) { return hasOwn(this.attrs, n) ? this.attrs[n] : null; } },
  hasAttribute: { value: function (n) { return hasOwn(this.attrs, n); } },
  toJSON: { value: function () {
    var s = "<" + this.nodeName, i;
    if (this.namespaceURI && (!this.parentNode || this.parentNode.namespaceURI !== this.namespaceURI))
      s += ' xmlns="' + esc(this.namespaceURI, true) + '"';
    for (i = 0; i < this.attributes.length; i++) s += " " + this.attributes[i].name + '="' + esc(this.attributes[i].value, true) + '"';
    if (!this.childNodes.length) return s + "/>";
    s += ">";
    for (i = 0; i < this.childNodes.length; i++) s += this.childNodes[i].toJSON();
    return s + "</" + this.nodeName + ">";
  } }
});
var Text = create(Node, {
  nodeType: { value: 3 }, nodeName: { value: "#text" },
  textContent: { get: function () { return this.data; } },
  toJSON: { value: function () { return esc(this.data, false); } }
});
var Doc = create(Node, {
  nodeType: { value: 9 }, nodeName: { value: "#document" },
  textContent: { get: function () { return null; } },
  getElementsByTagName: { value: function (name) {
    var r = this.documentElement, rest = walk(r, name, []);
    return name === "*" || r.nodeName === name ? [r].concat(rest) : rest;
  } },
  toJSON: { value: function () { return this.documentElement.toJSON(); } }
});
function elem(t, parent) {
  var el = create(Elem), attrs = create(null), list = [], i;
  for (i = 0; i < t[2].length; i++) { attrs[t[2][i][0]] = t[2][i][1]; list[list.length] = { name: t[2][i][0], value: t[2][i][1] }; }
  el.nodeName = el.tagName = el.localName = t[0];
  el.namespaceURI = t[1] || null;
  defProp(el, "attrs", { value: attrs });
  defProp(el, "parentNode", { value: parent, writable: true });
  el.attributes = list;
  el.childNodes = [];
  for (i = 3; i < t.length; i++) {
    var c;
    if (typeof t[i] === "string") {
      c = create(Text); c.data = c.nodeValue = t[i]; c.childNodes = [];
      defProp(c, "parentNode", { value: el, writable: true });
    } else c = elem(t[i], el);
    el.childNodes[el.childNodes.length] = c;
  }
  return el;
}
return function (tree) {
  var d = create(Doc);
  d.documentElement = elem(tree, null);
  d.childNodes = [d.documentElement];
  return d;
};
})
"""



def _compact(src: str) -> str:
    """Drop comment lines and indentation: QuickJS parses every byte of the prelude on every drive."""
    return "\n".join(ln.strip() for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("//"))


_PRELUDE = _compact(_PRELUDE).replace("%UNPOLLED%", _UNPOLLED)
_DOM = _compact(_DOM)

# --------------------------------------------------------------------------- Python side

_MARK = "\x00sb:"
_NOTHING = object()
_ROOT = re.compile(r"^\s*\(*\s*([A-Za-z_$][\w$]*)")
_IN_WORD = re.compile(r"\bIn\b")
_IN_LITERAL = re.compile(r"\bIn\s*\(\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\)")
_DEFINES_FUNCTION = re.compile(r"\bfunction\b|=>|\bclass\b")
_FUNCTION_LITERAL = re.compile(r"^\s*(?:async\s+)?(?:function\b|[A-Za-z_$][\w$]*\s*=>|\([^()]*\)\s*=>)")
_LONG_INT = re.compile(r"\d{16}")
_SAFE_INT = 2 ** 53


class _Failed:
    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class JSValue:
    """A JS value with no stored form (a function, a symbol, a Map...), as an expression returned it.

    It can be assigned (by the ``<assign>`` that evaluated it) but not sent, stored or logged as data.
    """

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.text = text

    def __repr__(self) -> str:
        return f"<JS {self.kind}{': ' + self.text if self.text else ''}>"

    __str__ = __repr__


class _DataJSValue(str):
    """The same, for a ``<data expr>``: the interpreter checks it is storable before declaring it."""

    kind = "value"


def _strip(src: str) -> str:
    s = src.strip()
    while s.endswith(";"):
        s = s[:-1].rstrip()
    return s


def _int_or_float(s: str) -> Any:
    v = int(s)
    return v if -_SAFE_INT <= v <= _SAFE_INT else float(v)


def _loads(text: str, special: bool) -> Any:
    v = json.loads(text, parse_int=_int_or_float) if _LONG_INT.search(text) else json.loads(text)
    return _decode_specials(v) if special else v


def _decode_specials(v: Any) -> Any:
    if type(v) is str:
        if v.startswith(_MARK):
            r = v[len(_MARK):]
            if r == "NaN":
                return math.nan
            if r == "Infinity":
                return math.inf
            if r == "-Infinity":
                return -math.inf
            if r.startswith("s"):
                return r[1:]
        return v
    if type(v) is list:
        return [_decode_specials(x) for x in v]
    if type(v) is dict:
        return {k: _decode_specials(x) for k, x in v.items()}
    return v


def _encode_specials(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return _MARK + ("NaN" if v != v else "Infinity" if v > 0 else "-Infinity")
    if isinstance(v, str):
        return _MARK + "s" + v if v.startswith(_MARK) else v
    if isinstance(v, (list, tuple)):
        return [_encode_specials(x) for x in v]
    if isinstance(v, dict):
        return {k: _encode_specials(x) for k, x in v.items()}
    return v


def _json_default(obj: Any) -> Any:
    from .base import EventView
    if isinstance(obj, EventView):
        return obj.as_dict()
    raise TypeError(f"a {type(obj).__name__} is not a JSON value")


def _dumps(value: Any) -> tuple[str, bool]:
    """JSON text for a Python value, and whether it needs the JS reviver. Raises TypeError/ValueError."""
    try:
        text = json.dumps(value, allow_nan=False, default=_json_default)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
        return json.dumps(_encode_specials(value), default=_json_default), True
    if "\\u0000sb:" in text:
        return json.dumps(_encode_specials(value), default=_json_default), True
    return text, False


def _xml_tree(value: Any) -> list[Any] | None:
    """``[tag, ns, [[attr, value]...], children...]`` when ``value`` is an XML element's text."""
    if type(value) is not str:
        return None
    s = value.strip()
    if len(s) < 3 or s[0] != "<" or s[-1] != ">" or s.startswith(("<!", "<?xml-stylesheet")):
        return None
    try:
        el = parse_xml(s)
    except Exception:
        return None
    return _tree(el)


def _tree(el: Any) -> list[Any]:
    attrs = [[k.split("}", 1)[1] if k.startswith("{") else k, v] for k, v in el.attrib.items()]
    t: list[Any] = [el.tag, el.ns, attrs]
    if el.text:
        t.append(el.text)
    for i, c in enumerate(el.children):
        t.append(_tree(c))
        tail = el.tails[i] if i < len(el.tails) else ""
        if tail:
            t.append(tail)
    return t


def _walk_actions(block: Any) -> Any:
    for a in block or ():
        yield a
        if isinstance(a, If):
            for _, acts in a.branches:
                yield from _walk_actions(acts)
        elif isinstance(a, Foreach):
            yield from _walk_actions(a.actions)


class EcmaScriptDatamodel:
    """The ecmascript datamodel prepared for one chart: what can be known before any drive."""

    name = "ecmascript"

    def __init__(self, chart: Chart) -> None:
        self.chart = chart
        exprs = chart.expressions
        n = len(exprs)
        self.failed: dict[tuple[str, int], str] = {}
        self.roots: list[str | None] = [None] * n
        self.state_ids = tuple(s.id for s in chart.states[1:])
        self.top_children = tuple(chart.states[c].id for c in chart.states[0].children)
        # In(): which state ids an expression needs to know about (None: it does not use In)
        full = any(_IN_WORD.search(e.src) and (e.kind == "script" or _DEFINES_FUNCTION.search(e.src))
                   for e in exprs)
        self.in_ids: list[Any] = [None] * n
        for e in exprs:
            if e.kind == "location":
                m = _ROOT.match(e.src)
                self.roots[e.id] = m.group(1) if m else None
            if not _IN_WORD.search(e.src):
                continue
            lits = [a or b for a, b in _IN_LITERAL.findall(e.src)]
            if len(lits) != len(_IN_WORD.findall(e.src)):
                self.in_ids[e.id] = True
            else:
                self.in_ids[e.id] = tuple(dict.fromkeys(lits))
        if full:  # a function may call In(): every evaluation needs the configuration
            self.in_ids = [True] * n
        self.full_in = full
        self.top_scripts = tuple(a.code for a in chart.script if isinstance(a, Script))
        self.top_script_ids = frozenset(e.id for e in self.top_scripts)
        root = chart.states[0]
        #: root <data expr="function..."> (code re-created on load)
        self.function_data = tuple((d.id, d.expr) for d in root.data
                                   if d.expr is not None and _FUNCTION_LITERAL.match(d.expr.src))
        self.function_data_ids = frozenset(i for i, _ in self.function_data)
        self.data_expr_ids = frozenset(d.expr.id for s in chart.states for d in s.data if d.expr is not None)
        self.has_top_code = bool(self.top_scripts or self.function_data)
        # XML content: <data> bodies/src and inline <assign> content that are XML documents
        self.xml_data: dict[str, str] = {}
        for s in chart.states:
            for d in s.data:
                if d.expr is None and d.has_value and _xml_tree(d.value) is not None:
                    self.xml_data[d.id] = d.value
        self.xml_assign: dict[int, str] = {}
        blocks: list[Any] = [chart.script]
        for s in chart.states:
            blocks.extend(s.onentry)
            blocks.extend(s.onexit)
            blocks.extend(t.content for t in s.transitions)
            if s.initial is not None:
                blocks.append(s.initial.content)
            blocks.extend(i.finalize for i in s.invokes)
        for b in blocks:
            for a in _walk_actions(b):
                if isinstance(a, Assign) and a.expr is None and _xml_tree(a.value) is not None:
                    self.xml_assign[a.location.id] = a.value

    @property
    def limits(self) -> Limits:
        """The limits in force for this chart (see :func:`set_limits`)."""
        return get_limits(self.chart)

    def open(self, variables: dict[str, Any], session_id: str, name: str,
             ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
             budget: Budget | None = None) -> EcmaScriptContext:
        """Open a drive's context. The JS runtime is created on first use."""
        return EcmaScriptContext(self, variables, session_id, name, ioprocessors, in_state, budget)


class EcmaScriptContext:
    """One drive's QuickJS runtime. See :class:`statebound.datamodel.base.Context`."""

    __slots__ = (
        "bad_names",
        "broken",
        "budget",
        "call",
        "compiled",
        "dm",
        "dom_loaded",
        "dump_cache",
        "in_state",
        "ioprocessors",
        "js",
        "last",
        "limits",
        "name",
        "pending_event",
        "scripts_sent",
        "session_id",
        "short",
        "started",
        "vars",
    )

    def __init__(self, dm: EcmaScriptDatamodel, variables: dict[str, Any], session_id: str, name: str,
                 ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
                 budget: Budget | None = None) -> None:
        self.dm = dm
        self.budget = budget
        self.short = False  # the runtime's time limit is below the cap (the budget is nearly spent)
        # After a dump failed as a whole: the names that failed on their own, and why. They are
        # not read again this drive (a looping getter costs a whole time slice per read).
        self.bad_names: dict[str, str] | None = None
        self.vars = variables
        self.session_id = session_id
        self.name = name
        self.ioprocessors = ioprocessors
        self.in_state = in_state
        self.js: Any = None
        self.call: Any = None
        self.compiled: set[tuple[str, int]] = set()
        self.scripts_sent: set[int] = set()
        self.pending_event: Any = _NOTHING
        self.last: Any = _NOTHING
        self.dump_cache: dict[str, Any] | None = None
        self.limits = dm.limits
        self.broken: str | None = None
        # A running position always has a child of the root active; the seed of start() has none.
        # (Checked now: once the drive runs, the configuration can be empty mid-transition.)
        self.started = dm.has_top_code and any(in_state(s) for s in dm.top_children)
        self.dom_loaded = False

    # ------------------------------------------------------------------ the runtime
    def _runtime(self) -> Any:
        if self.call is None:
            if self.broken is not None:
                raise EvaluationError(self.broken)
            try:
                self._materialize()
            except EvaluationError as exc:
                # nothing was changed: the stored variables stay as they are
                self.call = self.js = None
                self.broken = str(exc)
                raise
        self.dump_cache = None
        if self.pending_event is not _NOTHING:
            ev, self.pending_event = self.pending_event, _NOTHING
            self._send_event(ev)
        return self.call

    def _invoke(self, *args: Any) -> Any:
        return self._call(self.call, *args)

    def _call(self, fn: Any, *args: Any) -> Any:
        """Call into JS on the drive's budget (issue 10: the time cap alone was per evaluation).

        The QuickJS time limit is set to what is left of the drive's CPU budget when that is
        less than the per-evaluation cap; an interruption is then the budget's, and ends the
        drive (``BudgetSpent``) instead of becoming ``error.execution``.
        """
        budget = self.budget
        if budget is not None:
            left = budget.remaining_s()  # raises BudgetSpent when nothing is left
            cap = self.limits.time_ms / 1000.0
            if left is not None and left < cap:
                self.js.set_time_limit(max(left, 0.001))
                self.short = True
            elif self.short:  # back to the cap after a short limit (set when the runtime started)
                self.js.set_time_limit(cap)
                self.short = False
        try:
            return fn(*args)
        except Exception as exc:  # JSException, StackOverflow, conversion errors
            if budget is not None:
                budget.check()
            raise EvaluationError(self._binding_error(exc)) from None

    def _binding_error(self, exc: Exception) -> str:
        msg = str(exc).split("\n", 1)[0]
        if "interrupted" in msg:
            return f"evaluation exceeded the time limit ({self.limits.time_ms} ms of CPU)"
        if "out of memory" in msg or isinstance(exc, MemoryError):
            return f"evaluation exceeded the memory limit ({self.limits.memory_bytes} bytes)"
        if isinstance(exc, getattr(quickjs, "StackOverflow", ())) or "stack" in msg.lower():
            return "evaluation exceeded the stack limit"
        return f"{type(exc).__name__}: {msg}"

    def _materialize(self) -> None:
        lim = self.limits
        js = quickjs.Context()
        heap = lim.memory_bytes
        if self.budget is not None and self.budget.memory_bytes is not None:
            heap = min(heap, self.budget.memory_bytes)
        js.set_memory_limit(heap)
        js.set_max_stack_size(lim.stack_bytes)
        js.set_time_limit(lim.time_ms / 1000.0)
        self.js = js
        try:
            self.call = js.eval(_PRELUDE)
        except Exception as exc:
            raise EvaluationError(f"the ECMAScript sandbox could not start: {self._binding_error(exc)}") from None
        iop, _ = _dumps([self.session_id, self.name, dict(self.ioprocessors or {})])
        self._check(self._invoke("init", iop), "the ECMAScript sandbox could not start")
        dm = self.dm
        if self.vars:
            text, special = _dumps(self.vars)
        else:
            text, special = "{}", False
        if self.vars:
            self._check(self._invoke("install", text, special), "the stored variables could not be loaded")
        if self.started:
            # Functions are code: re-create the chart's top-level ones, stored data wins.
            ids = self._ids(True) if dm.full_in else None
            for e in dm.top_scripts:
                self.scripts_sent.add(e.id)
                self._invoke("script", e.id, e.src, ids)
            for name, e in dm.function_data:
                try:
                    self.evaluate(e)
                    self._invoke("declare", name, "last", None, False, True)
                except EvaluationError:
                    pass
            self._invoke("code")
            self._invoke("drop")
            if self.vars:
                self._check(self._invoke("install", text, special), "the stored variables could not be loaded")

    @staticmethod
    def _check(r: Any, what: str) -> None:
        if r:
            raise EvaluationError(f"{what}: {r[1:] if isinstance(r, str) and r[:1] == chr(1) else r}")

    def _ids(self, need: Any) -> str | None:
        if need is None:
            return None
        in_state = self.in_state
        if need is True:
            return "\x1f".join(s for s in self.dm.state_ids if in_state(s))
        return "\x1f".join(s for s in need if in_state(s))

    def _compile(self, expr: Expr, kind: str) -> None:
        key = (kind, expr.id)
        if key in self.compiled:
            return
        dm = self.dm
        bad = dm.failed.get(key)
        if bad is None:
            r = self._invoke("compile", expr.id, kind, _strip(expr.src))
            if not r:
                self.compiled.add(key)
                return
            bad = dm.failed[key] = f"{expr.src!r} does not compile: {r}"
        raise EvaluationError(bad)

    def _load_dom(self) -> None:
        if not self.dom_loaded:
            self._check(self._invoke("dom", _DOM), "the XML DOM could not be loaded")
            self.dom_loaded = True

    # ------------------------------------------------------------------ values out of JS
    def _result(self, r: Any, expr: Expr) -> Any:
        t = type(r)
        if t is str and self.budget is not None:
            self.budget.charge(len(r))  # values outlive the heap that made them (effects, events)
        if t is str:
            if r[:1] != "\x01":
                self.last = _NOTHING
                return r
            tag, body = r[1:2], r[2:]
            if tag == "e":
                self.last = _NOTHING
                raise EvaluationError(f"{expr.src!r}: {body}")
            if tag in ("j", "J"):
                try:
                    v = _loads(body, tag == "J")
                except (ValueError, RecursionError) as exc:
                    raise EvaluationError(f"{expr.src!r}: the value cannot be read: {exc}") from None
                self.last = v if isinstance(v, (dict, list)) else _NOTHING
                return v
            kind, _, text = body.partition("\x02")
            v = _DataJSValue(text or kind) if expr.id in self.dm.data_expr_ids else JSValue(kind, text)
            self.last = v
            return v
        self.last = _NOTHING
        if t is float and r.is_integer() and -_SAFE_INT <= r <= _SAFE_INT:
            return int(r)
        return r

    # ------------------------------------------------------------------ values into JS
    def _payload(self, value: Any, xml_source: str | None) -> tuple[str, Any, bool]:
        if value is self.last and value is not _NOTHING:
            return "last", None, False
        if isinstance(value, (JSValue, _DataJSValue)):
            raise EvaluationError(f"{value} cannot be stored in the datamodel")
        if xml_source is not None and type(value) is str and value == xml_source:
            tree = _xml_tree(value)
            self._load_dom()
            return "xml", json.dumps(tree), False
        try:
            text, special = _dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise EvaluationError(f"the value cannot be stored in the datamodel: {exc}") from None
        return "json", text, special

    # ------------------------------------------------------------------ the Context protocol
    def evaluate(self, expr: Expr) -> Any:
        """Evaluate an expression (a location is read as a value)."""
        self._runtime()
        self._compile(expr, "expr")
        return self._result(self._invoke("eval", expr.id, self._ids(self.dm.in_ids[expr.id])), expr)

    def cond(self, expr: Expr) -> bool:
        """Evaluate a condition with ECMAScript's ToBoolean."""
        self._runtime()
        self._compile(expr, "cond")
        r = self._invoke("cond", expr.id, self._ids(self.dm.in_ids[expr.id]))
        if r is True or r is False:
            return r
        raise EvaluationError(f"{expr.src!r}: {r[2:] if isinstance(r, str) else r}")

    def valid_location(self, location: Expr) -> bool:
        """Whether the location compiles as an assignment target rooted at a variable name."""
        if self.dm.roots[location.id] is None:
            return False
        self._runtime()
        try:
            self._compile(location, "set")
        except EvaluationError:
            return False
        return True

    def is_declared(self, location: Expr) -> bool:
        """Whether the location's root variable exists."""
        root = self.dm.roots[location.id]
        if root is None or root in SYSTEM_VARIABLES:
            return False
        self._runtime()
        return bool(self._invoke("isdecl", root))

    def assign(self, location: Expr, value: Any) -> None:
        """Assign, refusing system variables, undeclared roots and values with no stored form."""
        root = self.dm.roots[location.id]
        if root is None:
            raise EvaluationError(f"cannot assign to {location.src!r}: it is not a location")
        if root in SYSTEM_VARIABLES:
            raise EvaluationError(f"cannot assign to {location.src!r}: {root} is a read-only system variable")
        self._runtime()
        self._compile(location, "set")
        mode, payload, special = self._payload(value, self.dm.xml_assign.get(location.id))
        r = self._invoke("assign", location.id, root, mode, payload, special,
                         self._ids(self.dm.in_ids[location.id]))
        self.last = _NOTHING
        if r:
            raise EvaluationError(f"cannot assign to {location.src!r}: {r[1:]}")

    def declare(self, name: str, value: Any) -> None:
        """Create (or overwrite) a global variable (``<data>``, foreach item/index)."""
        if name in SYSTEM_VARIABLES:
            raise EvaluationError(f"cannot declare {name!r}: it is a system variable")
        self._runtime()
        if value is None:
            mode, payload, special = "undef", None, False
        else:
            mode, payload, special = self._payload_for_declare(name, value)
        may_be_code = name in self.dm.function_data_ids
        r = self._invoke("declare", name, mode, payload, special, may_be_code)
        self.last = _NOTHING
        if r:
            raise EvaluationError(f"<data id={name!r}>: {r[1:]}")
        if self.bad_names:
            self.bad_names.pop(name, None)  # a plain value now: read it again

    def _payload_for_declare(self, name: str, value: Any) -> tuple[str, Any, bool]:
        if value is self.last and value is not _NOTHING:
            return "last", None, False
        return self._payload(value, self.dm.xml_data.get(name))

    def execute(self, script: Expr) -> None:
        """Run a ``<script>`` as a global program."""
        self._runtime()
        src = None
        if script.id not in self.scripts_sent:
            src = script.src
            self.scripts_sent.add(script.id)
        r = self._invoke("script", script.id, src, self._ids(True if self.dm.full_in else None))
        self.last = _NOTHING
        if script.id in self.dm.top_script_ids:
            self._invoke("code")
        if r:
            raise EvaluationError(f"<script> failed: {r[1:]}")

    def set_event(self, event: Any) -> None:
        """Bind ``_event`` (sent to the runtime only when something reads it)."""
        self.pending_event = event
        self.dump_cache = None

    def _send_event(self, event: Any) -> None:
        if event is None:
            self._invoke("event", None, None, False)
            return
        data = event.data
        fields = [event.name, event.type, event.sendid or None, event.origin or None, event.origintype or None,
                  event.invokeid or None, event.raw or None]
        mode = "none" if data is None else "json"
        tree = _xml_tree(data) if type(data) is str else None
        if tree is not None:
            mode, data = "xml", tree
            self._load_dom()
        try:
            text, special = _dumps(fields + [data])
        except (TypeError, ValueError, RecursionError):
            text, special = _dumps(fields + [_plain(data)])
        r = self._invoke("event", text, mode, special)
        if r:
            raise EvaluationError(f"_event could not be built: {r[1:]}")

    def variables(self) -> dict[str, Any]:
        """The variables as plain JSON-compatible values.

        A variable with no stored form comes back as an :class:`Unstorable` placeholder,
        which the commit refuses (the interpreter restores it and raises ``error.execution``).
        """
        if self.call is None:
            return self.vars
        if self.dump_cache is not None:
            return self.dump_cache
        try:
            if self.bad_names is not None:
                raise SerializationError("the dump failed before in this drive")
            r = self._call(self.call, "dump")
            if self.budget is not None and isinstance(r, str):
                self.budget.hold(self.session_id, len(r))  # held by the host call until it commits
            out, bad = self._parse_dump(r)
        except (EvaluationError, SerializationError):
            # The dump failed as a whole: a getter, toJSON or Proxy trap that loops (interrupted,
            # which no JS catch survives), or memory ran out. Dump the variables one at a time,
            # so only the culprits are refused (issue 10: this used to escape to the host).
            out, bad = self._dump_each()
        for k in SYSTEM_VARIABLES:
            out.pop(k, None)
        for name, why in bad:
            # The interpreter's commit refuses the placeholder: it restores the variable to its
            # value before the drive and raises error.execution with this text.
            out[name] = _unstorable(f"{why} in variable {name!r} (the ecmascript datamodel stores "
                                    "JSON-like values only; functions are code)")
        self.dump_cache = out
        return out

    @staticmethod
    def _parse_dump(r: Any) -> tuple[dict[str, Any], list[Any]]:
        if not isinstance(r, str) or r[:1] not in ("j", "J"):
            raise SerializationError(f"the ECMAScript datamodel cannot be stored: {str(r)[:200]}")
        text, _, refused = r[1:].partition("\x03")
        try:
            out = _loads(text, r[0] == "J")
            bad = json.loads(refused) if refused else []
        except (ValueError, RecursionError) as exc:
            raise SerializationError(f"the ECMAScript datamodel cannot be stored: {exc}") from None
        if type(out) is not dict or type(bad) is not list:
            raise SerializationError("the ECMAScript datamodel cannot be stored: not an object")
        return out, bad

    def _dump_each(self) -> tuple[dict[str, Any], list[Any]]:
        """``(stored values, [(name, why refused)])``, one JS call per variable."""
        try:
            names = json.loads(self._call(self.call, "names"))
        except (EvaluationError, ValueError, TypeError) as exc:  # not even the names: keep what was stored
            return {}, [(k, f"the datamodel could not be read back ({exc})") for k in self.vars]
        out: dict[str, Any] = {}
        bad: list[Any] = []
        known = self.bad_names = self.bad_names if self.bad_names is not None else {}
        for name in names if type(names) is list else ():
            if type(name) is not str:
                continue
            if name in known:
                bad.append((name, known[name]))
                continue
            try:
                r = self._call(self.call, "dumpone", name)
                if r == "-":
                    continue
                if not isinstance(r, str) or r[:1] not in ("j", "J"):
                    raise EvaluationError(r[1:] if isinstance(r, str) else repr(r))
                out[name] = _loads(r[1:], r[0] == "J")
            except (EvaluationError, ValueError, RecursionError) as exc:
                if "time limit" in str(exc):
                    known[name] = str(exc)
                bad.append((name, str(exc)))
        return out, bad


class Unstorable:
    """Stands for a variable whose value has no stored form, in what :meth:`variables` returns.

    Packing it fails (that is the point): the interpreter then puts the variable back as it
    was before the drive and raises ``error.execution``. Each reason is its own subclass,
    named after the reason, because the packer's message names the type.
    """

    __slots__ = ()


_UNSTORABLE: dict[str, type] = {}


def _unstorable(reason: str) -> Unstorable:
    cls = _UNSTORABLE.get(reason)
    if cls is None:
        if len(_UNSTORABLE) > 256:
            _UNSTORABLE.clear()
        cls = _UNSTORABLE[reason] = type(reason, (Unstorable,), {"__slots__": ()})
    return cls()


def _plain(v: Any) -> Any:
    """A JSON-able stand-in for event data that is not plain (bytes, sets...)."""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)
