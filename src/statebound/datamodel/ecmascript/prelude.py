"""The JavaScript side of the sandbox: the prelude each shared realm evaluates once.

The prelude's completion value is the dispatcher the Python side calls (``call(op, ...)``).
Evaluating it also *locks the realm down*: every object reachable from the global object
(and the intrinsics only reachable through a sample: generator, iterator and async
prototypes, ``In``, the DOM's prototypes) is frozen, and the writable data properties of
prototypes become accessor pairs, so that an assignment such as ``Foo.prototype.toString = f``
still makes an own property instead of silently failing (the "override mistake" of frozen
realms). The standard globals move to ``STD``, a frozen object between the global object and
``Object.prototype``; the global object keeps as its own only the system variables and
``undefined``/``NaN``/``Infinity``. After that, a session can only change the properties it
adds to the global object and the prelude's per-drive state, which ``reset`` wipes before
every drive (see ``docs/adr/0024-one-frozen-quickjs-realm-per-thread.md``).

Nothing the prelude defines is reachable from chart code except the system variables, ``In()``
and the wrappers of the natives that QuickJS runs without polling its time limit (see
:data:`UNPOLLED`) and of ``Proxy`` (which records every proxy it makes, so that the wrappers
can tell one apart), and those are frozen too.
"""

from __future__ import annotations

__all__ = ["PRELUDE", "UNPOLLED"]

#: The ``Array.prototype`` methods whose native loops over ``length`` never poll QuickJS's
#: interrupt handler (the others do): on a sparse array or an array-like of length 2**32-1 one
#: call would run for minutes past every time limit. The prelude wraps each so that the native
#: loops over at most 2**24 elements (far more than any array that fits in the heap) and over a
#: length nothing can change once checked; ``concat``, ``flat`` and ``flatMap``, which read
#: lengths half-way through, are rewritten around that. (``toString`` only calls ``join``.)
#: The same holds for the other natives that loop without polling: ``String.raw``, the
#: replacer list of ``JSON.stringify``, and the natives that step an iterator (every
#: ``Iterator.prototype`` method, ``Iterator.from``/``concat``/``zip``/``zipKeyed``, the ``Set``
#: methods that take a set-like), which call a native ``next`` natively: unpolled, and with no
#: stack check (a chain of helpers recursed off the C stack).
UNPOLLED = ("join toLocaleString reverse copyWithin shift unshift slice splice sort fill toReversed toSorted "
            "toSpliced with concat flat flatMap")

_PRELUDE = r"""
(function () {
"use strict";
var g = globalThis, O = Object, R = Reflect, apply = R.apply, defProp = O.defineProperty, names = O.getOwnPropertyNames,
  ownKeys = R.ownKeys, getDesc = O.getOwnPropertyDescriptor, getProto = O.getPrototypeOf, freeze = O.freeze,
  create = O.create, hasOwn = O.hasOwn, isExtensible = O.isExtensible, setProto = R.setPrototypeOf,
  isArray = Array.isArray, isView = ArrayBuffer.isView, parse = JSON.parse, stringify = JSON.stringify,
  geval = g.eval, Str = String, slice = String.prototype.slice, split = String.prototype.split,
  test = RegExp.prototype.test, fnText = Function.prototype.toString, TypeErr = TypeError, Err = Error,
  SyntaxErr = SyntaxError, MARK = "\u0000sb:", UNSAFE = /[\u0000\ud800-\udfff]/, special = false, i;
var ERRORS = [Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError, g.InternalError,
  g.AggregateError, g.SuppressedError, g.DOMException];
// ---- natives that never poll the interrupt handler (see UNPOLLED): a native loop over a length
// or an iterator the chart controls runs past every time limit. Each is wrapped so that the
// native loops over at most 2**24 elements, over a length read once and that nothing can change
// before the native reads it (a genuine Array's, or a fresh copy's made by a JS loop, which
// QuickJS polls), or pulls from an iterator through a JS function (a call, which it polls).
var AP = Array.prototype, Arr = Array, RangeErr = RangeError, CAP = 16777216, MAXLEN = 9007199254740991,
  SPREAD = Symbol.isConcatSpreadable, SPECIES = Symbol.species, same = O.is, construct = R.construct,
  defineProp = R.defineProperty, NativeProxy = Proxy, proxies = new WeakSet(),
  isProxy = WeakSet.prototype.has.bind(proxies), addProxy = WeakSet.prototype.add.bind(proxies),
  nSlice = AP.slice, nConcat = AP.concat, ITER = g.Iterator, IP = ITER.prototype, SYMIT = Symbol.iterator,
  isProtoOf = O.prototype.isPrototypeOf, SP = Set.prototype, setHas = SP.has,
  UNPOLLED = "%UNPOLLED%".split(" "), MUTATES = create(null);
// shift, unshift and splice also set length; the others only move elements
MUTATES.reverse = MUTATES.copyWithin = MUTATES.fill = MUTATES.sort = 1; MUTATES.shift = MUTATES.unshift = MUTATES.splice = 2;
// Every Proxy is recorded as it is made (these are the only two ways a chart can make one): a
// trap runs chart code on every read, so a Proxy's length is never taken for granted.
function tracked(p) { addProxy(p); return p; }
var proxyRevocable = NativeProxy.revocable;
defProp(NativeProxy, "revocable", { writable: true, enumerable: false, configurable: true,
  value: { revocable(t, h) { var r = proxyRevocable(t, h); addProxy(r.proxy); return r; } }.revocable });
g.Proxy = tracked(new NativeProxy(NativeProxy, freeze({ construct: function (t, args) { return tracked(construct(t, args)); } })));
function tooLong(k) { return new RangeErr(k + ": over 2**24 elements"); }
function isObj(v) { return v !== null && (typeof v === "object" || typeof v === "function"); }
function toObject(v) { if (v === null || v === undefined) throw new TypeErr("cannot convert " + v + " to object"); return O(v); }
function toLength(v) { v = +v; return v !== v || v <= 0 ? 0 : v >= MAXLEN ? MAXLEN : v - v % 1; }
function toInteger(v) { v = +v; return v !== v ? 0 : v === 1 / 0 || v === -1 / 0 ? v : v - v % 1; }
function withLength(w, n) { defProp(w, "length", { value: n }); return w; }
// Whether reading o.length runs no chart code, so that the native reads what the guard read: a
// genuine Array, or a primitive data property reached through no Proxy and no getter.
function stable(o) {
  if (isArray(o)) return !isProxy(o);
  for (var p = o, n = 0; p !== null; p = getProto(p)) {
    if (isProxy(p) || ++n > 64) return false;
    var d = getDesc(p, "length");
    if (d !== undefined) return hasOwn(d, "value") && !isObj(d.value);
  }
  return true;
}
// A genuine Array whose lookups of constructor and Symbol.isConcatSpreadable reach only the
// frozen prototypes: a native can read it without running chart code (its elements aside).
function plainArray(o) { return isArray(o) && !isProxy(o) && getProto(o) === AP && !hasOwn(o, "constructor") && !hasOwn(o, SPREAD); }
// o's first len elements in a fresh Array, holes kept, by a loop QuickJS polls
function copyOf(o, len) {
  var c = [];
  for (var j = 0; j < len; j++) if (j in o) c[j] = o[j];
  c.length = len;
  return c;
}
// The native on a copy of o (its length read once), and for a method that changes its array,
// the changes written back to o. (An Array it returns is a plain one: the copy has no species.)
function viaCopy(k, f, o, args) {
  var len = toLength(o.length), j, had, has;
  if (len > CAP) throw tooLong(k);
  var c = copyOf(o, len), m = MUTATES[k];
  if (m === undefined) return apply(f, c, args);
  var before = apply(nSlice, c, []), r = apply(f, c, args), n = c.length;
  for (j = 0; j < n || j < len; j++) {
    had = j in before; has = j in c;
    if (has) { if (!had || !same(before[j], c[j])) o[j] = c[j]; } else if (had) delete o[j];
  }
  if (m === 2) o.length = n;
  return r === c ? o : r;
}
function guard(k) {
  var f = AP[k];
  return withLength({ [k]() {
    var o = this;
    if (isArray(o) && !isProxy(o)) { if (o.length > CAP) throw tooLong(k); }  // (the common case, first)
    else if (isObj(o)) {
      if (!stable(o)) return viaCopy(k, f, o, arguments);
      if (toLength(o.length) > CAP) throw tooLong(k);
    } else if (typeof o === "string" && o.length > CAP) throw tooLong(k);
    return apply(f, o, arguments);
  } }[k], f.length);
}
// The spec's ArraySpeciesCreate(o, 0), or null for a plain new Array.
function speciesCreate(o) {
  if (!isArray(o) || (!isProxy(o) && getProto(o) === AP && !hasOwn(o, "constructor"))) return null;
  var C = o.constructor;
  if (isObj(C)) { C = C[SPECIES]; if (C === null) C = undefined; }
  return C === undefined || C === Arr ? null : construct(C, [0]);
}
function createData(A, k, v) {
  if (!defineProp(A, k, { value: v, writable: true, enumerable: true, configurable: true })) throw new TypeErr("cannot define property " + k);
}
// What concat copies of e: a fresh Array of its elements when it spreads, else [e]; room: how
// many elements the call may still copy.
function spreadOf(e, room) {
  var n, s;
  if (isObj(e)) {
    if (plainArray(e)) { n = e.length; if (n > room) throw tooLong("concat"); return apply(nSlice, e, []); }
    s = e[SPREAD];
    if (s !== undefined ? s : isArray(e)) { n = toLength(e.length); if (n > room) throw tooLong("concat"); return copyOf(e, n); }
  }
  if (room < 1) throw tooLong("concat");
  return [e];
}
// concat reads each argument's length after running chart code (getters of the elements before
// it, of Symbol.isConcatSpreadable, of constructor): every argument is copied first, and the
// native joins fresh Arrays only, behind `this` when that is a plain Array.
var concatW = { concat(item) {
  var self = this, A = null, pieces = [], total = 0, plain = plainArray(self), j, p, r;
  if (!plain) { self = toObject(self); A = speciesCreate(self); p = pieces[0] = spreadOf(self, CAP); total = p.length; }
  for (j = 0; j < arguments.length; j++) { p = pieces[pieces.length] = spreadOf(arguments[j], CAP - total); total += p.length; }
  if (plain && plainArray(self)) {  // (the arguments may have run chart code: `this` is checked last)
    if (total + self.length > CAP) throw tooLong("concat");
    return apply(nConcat, self, pieces);
  }
  if (plain) {  // a getter of an argument changed `this`: it is copied like one, last
    A = speciesCreate(self); p = spreadOf(self, CAP - total);
    r = apply(nConcat, p, pieces);
  } else r = apply(nConcat, pieces[0], apply(nSlice, pieces, [1]));
  if (A === null) return r;
  for (j = 0; j < r.length; j++) if (j in r) createData(A, j, r[j]);
  A.length = r.length;
  return A;
} }.concat;
// flat and flatMap read each nested array's length half-way: they are the spec's steps in JS.
function flatten(out, plainOut, src, len, at, depth, fn, self) {
  for (var j = 0; j < len; j++) {
    if (!(j in src)) continue;
    var e = src[j];
    if (fn !== undefined) e = apply(fn, self, [e, j, src]);
    if (depth > 0 && isArray(e)) { at = flatten(out, plainOut, e, toLength(e.length), at, depth - 1); continue; }
    if (at >= MAXLEN) throw new TypeErr("the array is too long");
    if (plainOut) out[at] = e; else createData(out, at, e);
    at++;
  }
  return at;
}
var flatW = { flat() {
  var o = toObject(this), len = toLength(o.length), d = arguments[0], A;
  d = d === undefined ? 1 : toInteger(d);
  A = speciesCreate(o);
  var out = A === null ? [] : A;
  flatten(out, A === null, o, len, 0, d < 0 ? 0 : d);
  return out;
} }.flat;
var flatMapW = { flatMap(fn) {
  var o = toObject(this), len = toLength(o.length), A;
  if (typeof fn !== "function") throw new TypeErr("flatMap: " + typeof fn + " is not a function");
  A = speciesCreate(o);
  var out = A === null ? [] : A;
  flatten(out, A === null, o, len, 0, 1, fn, arguments[1]);
  return out;
} }.flatMap;
for (i = 0; i < UNPOLLED.length; i++) {
  var k = UNPOLLED[i];
  if (typeof AP[k] === "function") defProp(AP, k, { writable: true, configurable: true, value: k === "concat" ?
    withLength(concatW, 1) : k === "flat" ? withLength(flatW, 0) : k === "flatMap" ? flatMapW : guard(k) });
}
// String.raw and the replacer list of JSON.stringify loop over an array-like's length.
defProp(String, "raw", { writable: true, configurable: true, value: { raw(template) {
  var r = toObject(toObject(template).raw), len = toLength(r.length), s = "";
  for (var j = 0; j < len; j++) {
    s += `${r[j]}`;
    if (j + 1 < len && j + 1 < arguments.length) s += `${arguments[j + 1]}`;
  }
  return s;
} }.raw });
defProp(JSON, "stringify", { writable: true, configurable: true, value: { stringify(value, replacer, space) {
  if (isObj(replacer) && typeof replacer !== "function" && isArray(replacer)) {
    var len = toLength(replacer.length), keep = [], v;
    for (var j = 0; j < len; j++) { v = replacer[j]; if (typeof v === "string" || typeof v === "number" || isObj(v)) keep[keep.length] = v; }
    replacer = keep;
  }
  return stringify(value, replacer, space);
} }.stringify });
// Iterators stepped through functions of ours. A native that steps an iterator calls its next
// natively, without polling the time limit (an Array's iterator over a sparse array, under
// drop(2**53)) and without checking the stack: a helper's next calls its underlying
// iterator's, so a chain of 200,000 take(1)s recursed natively off the end of the C stack and
// killed the process (SIGSEGV). Every native that steps an iterator a chart gives it steps a
// stepper instead, whose next and return are JS: each step of the chain is then a JS call,
// which QuickJS polls and checks against the stack limit (a RangeError, error.execution).
// proto: a stepper for a native that reads Symbol.iterator (null: one it must not find there)
function stepper(it, proto) {
  if (!isObj(it)) throw new TypeErr("not an object");
  var next = it.next, w = create(proto === undefined ? IP : proto);
  defProp(w, "next", { value: function () { return apply(next, it, []); } });
  defProp(w, "return", { value: function () {
    var m = it.return;
    return m === undefined || m === null ? { value: undefined, done: true } : apply(m, it, []);
  } });
  return w;
}
// The spec's GetIteratorFlattenable(v): v's iterator, or v itself when it has no Symbol.iterator.
function flattenable(v, strings, k) {
  if (!isObj(v) && !(strings && typeof v === "string")) throw new TypeErr(k + ": not an object");
  var m = v[SYMIT], it;
  if (m === undefined || m === null) it = v;
  else if (typeof m !== "function") throw new TypeErr(k + ": Symbol.iterator is not a function");
  else it = apply(m, v, []);
  if (!isObj(it)) throw new TypeErr(k + ": the iterator is not an object");
  return it;
}
// IteratorClose after an error: the error wins over anything return does.
function closeAfter(it, x) {
  try { var m = it.return; if (m !== undefined && m !== null) apply(m, it, []); } catch (y) {}
  throw x;
}
function wrapHelper(k) {
  var f = IP[k];
  if (k === "flatMap") defProp(IP, k, { writable: true, configurable: true, value: withLength({ flatMap(mapper) {
    // the iterators the mapper gives are stepped natively too
    var m = typeof mapper !== "function" ? mapper : function (v, n) {
      return stepper(flattenable(apply(mapper, undefined, [v, n]), false, "flatMap"));
    };
    return apply(f, stepper(this), [m]);
  } }.flatMap, f.length) });
  else defProp(IP, k, { writable: true, configurable: true,
    value: withLength({ [k]() { return apply(f, stepper(this), arguments); } }[k], f.length) });
}
var IPK = names(IP);
for (i = 0; i < IPK.length; i++) {
  var dIP = getDesc(IP, IPK[i]);
  if (IPK[i] !== "constructor" && hasOwn(dIP, "value") && typeof dIP.value === "function") wrapHelper(IPK[i]);
}
// Iterator.from, concat, zip and zipKeyed: each iterator they get is a stepper.
if (typeof ITER.from === "function") {
  var itFrom = ITER.from;
  defProp(ITER, "from", { writable: true, configurable: true, value: withLength({ from(o) {
    var it = flattenable(o, true, "Iterator.from");
    // one that inherits from Iterator.prototype comes back as it is, anything else wrapped
    return apply(isProtoOf, IP, [it]) ? it : apply(itFrom, ITER, [stepper(it, null)]);
  } }.from, itFrom.length) });
}
if (typeof ITER.concat === "function") {
  var itConcat = ITER.concat;
  defProp(ITER, "concat", { writable: true, configurable: true, value: withLength({ concat() {
    var w = [], j;
    for (j = 0; j < arguments.length; j++) w[j] = opener(arguments[j]);
    return apply(itConcat, ITER, w);
  } }.concat, itConcat.length) });
}
// what concat opens in place of item: item's iterator, as a stepper, when concat gets to it
function opener(item) {
  if (!isObj(item)) throw new TypeErr("Iterator.concat: not an object");
  var m = item[SYMIT], o = create(null);
  if (typeof m !== "function") throw new TypeErr("Iterator.concat: not iterable");
  o[SYMIT] = function () {
    var it = apply(m, item, []);
    if (!isObj(it)) throw new TypeErr("Iterator.concat: the iterator is not an object");
    return stepper(it);
  };
  return o;
}
if (typeof ITER.zip === "function") {
  var itZip = ITER.zip;
  defProp(ITER, "zip", { writable: true, configurable: true, value: withLength({ zip(iterables, options) {
    return apply(itZip, ITER, [isObj(iterables) ? zipInput(iterables) : iterables, options]);
  } }.zip, itZip.length) });
}
// iterables, read as zip reads it and when zip reads it, giving steppers of the iterators
function zipInput(iterables) {
  var o = create(null);
  o[SYMIT] = function () {
    var m = iterables[SYMIT], it, next, w = create(null);
    if (typeof m !== "function") throw new TypeErr("Iterator.zip: not iterable");
    it = apply(m, iterables, []);
    if (!isObj(it)) throw new TypeErr("Iterator.zip: the iterator is not an object");
    next = it.next;
    w.next = function () {
      var r = apply(next, it, []), s;
      if (!isObj(r)) throw new TypeErr("Iterator.zip: the iterator result is not an object");
      if (r.done) return { value: undefined, done: true };
      try { s = stepper(flattenable(r.value, false, "Iterator.zip")); } catch (x) { closeAfter(it, x); }
      return { value: s, done: false };
    };
    w.return = function () {
      var m2 = it.return;
      return m2 === undefined || m2 === null ? { value: undefined, done: true } : apply(m2, it, []);
    };
    return w;
  };
  return o;
}
if (typeof ITER.zipKeyed === "function") {
  var itZipKeyed = ITER.zipKeyed;
  defProp(ITER, "zipKeyed", { writable: true, configurable: true, value: withLength({ zipKeyed(iterables, options) {
    if (!isObj(iterables)) return apply(itZipKeyed, ITER, [iterables, options]);  // (the native says why not)
    // a view of iterables whose values are steppers, read as and when zipKeyed reads them (its
    // target is a blank object: iterables' own may be frozen, and a Proxy of it could not lie)
    return apply(itZipKeyed, ITER, [new NativeProxy(create(null), {
      ownKeys: function () { return ownKeys(iterables); },
      getOwnPropertyDescriptor: function (t, k) { var d = getDesc(iterables, k); if (d !== undefined) d.configurable = true; return d; },
      get: function (t, k) {
        var v = iterables[k];
        return v === undefined ? v : stepper(flattenable(v, false, "Iterator.zipKeyed"));
      }
    }), options]);
  } }.zipKeyed, itZipKeyed.length) });
}
// What the Set methods read of a set-like, read once; its has and keys called through ours.
function setLike(o) {
  if (!isObj(o)) return o;  // (the native says why not)
  var rec = create(null), size = o.size, has, keys;
  rec.size = +size;
  has = o.has; keys = o.keys;
  rec.has = typeof has === "function" ? function (v) { return apply(has, o, [v]); } : has;
  rec.keys = typeof keys === "function" ? function () { var it = apply(keys, o, []); return isObj(it) ? stepper(it) : it; } : keys;
  return rec;
}
function wrapSet(k) {
  var f = SP[k];
  if (typeof f === "function") defProp(SP, k, { writable: true, configurable: true, value: withLength({ [k](other) {
    apply(setHas, this, [undefined]);  // the native's first check: `this` is a Set
    return apply(f, this, [setLike(other)]);
  } }[k], f.length) });
}
["union", "intersection", "difference", "symmetricDifference", "isSubsetOf", "isSupersetOf", "isDisjointFrom"].forEach(wrapSet);
function Refusal(msg) { this.msg = msg; }
function mirror(open) {   // the brackets that close "open", innermost first
  var out = "";
  for (var j = open.length - 1; j >= 0; j--) out += open[j] === "(" ? ")" : "]";
  return out;
}
// QuickJS reports a failed allocation while parsing (a regexp's, notably) as a SyntaxError:
// it is the drive's heap, not the source, and says nothing about the next drive
function transient(x) { var m = prop(x, "message"); return m === "out of memory" || m === "stack overflow"; }
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
function deepFreeze(o) {
  if (o !== null && typeof o === "object") { var ks = names(o); for (var j = 0; j < ks.length; j++) deepFreeze(o[ks[j]]); freeze(o); }
  return o;
}
// ---- the drive's state: everything below is wiped by reset()
var ev, evText = null, evMode, evSpecial, active = null, sid, chartName, iop, iopText = null, code = create(null), last,
  lastData = false, lastWhy = "";
// _event is built when first read (most charts never read it): a: JSON [name, type, sendid,
// origin, origintype, invokeid, raw, data], mode: how data arrives, sp: JSON with markers
function setEvent(a, mode, sp) { ev = undefined; evText = a; evMode = mode; evSpecial = sp; }
function getEvent() {
  if (evText !== null) {
    var fl = evSpecial ? parse(evText, reviver) : parse(evText), n = [];
    evText = null;
    for (var q = 0; q < 7; q++) n[q] = fl[q] === null ? undefined : fl[q];
    ev = freeze({ name: n[0], type: n[1], sendid: n[2], origin: n[3], origintype: n[4], invokeid: n[5],
      data: evMode === "none" ? undefined : evMode === "xml" ? dom.build(fl[7]) : fl[7], raw: n[6] });
  }
  return ev;
}
var SYSTEM = create(null);
SYSTEM._event = SYSTEM._sessionid = SYSTEM._name = SYSTEM._ioprocessors = SYSTEM.In = SYSTEM._x = true;
function In(id) {
  if (active === null) throw new Err("In() cannot be reached from here");
  return hasOwn(active, Str(id));
}
function ro(k, getter) {
  defProp(g, k, { get: getter, enumerable: false, configurable: false,
    set: { set(v) { throw new TypeErr("cannot assign to " + k + ": it is a read-only system variable"); } }.set });
}
ro("_sessionid", function () { return sid; });
ro("_name", function () { return chartName; });
ro("_ioprocessors", function () { return iop; });
ro("_event", function () { return getEvent(); });
ro("In", function () { return In; });
var dom = (%DOM%)(create, defProp, hasOwn);
// Math.random, reseeded from the host's entropy before any drive that follows one that drew
// from it: QuickJS's own generator would be one stream through every session of the realm,
// and a session that read it could predict the numbers the next one draws. (xoshiro128**)
var rs = [0, 0, 0, 1], drew = true, imul = Math.imul, parseHex = parseInt;
function rotl(x, k) { return (x << k) | (x >>> (32 - k)); }
function next32() {
  var r = imul(rotl(imul(rs[1], 5), 7), 9) >>> 0, t = rs[1] << 9;
  rs[2] ^= rs[0]; rs[3] ^= rs[1]; rs[1] ^= rs[2]; rs[0] ^= rs[3]; rs[2] ^= t; rs[3] = rotl(rs[3], 11);
  return r;
}
function seed(hex) {
  for (var j = 0; j < 4; j++) rs[j] = parseHex(apply(slice, hex, [8 * j, 8 * j + 8]), 16) | 0;
  if (!(rs[0] | rs[1] | rs[2] | rs[3])) rs[3] = 1;
  drew = false;
}
defProp(Math, "random", { writable: true, enumerable: false, configurable: true, value: { random() {
  drew = true;
  return ((next32() >>> 5) * 67108864 + (next32() >>> 6)) / 9007199254740992;
} }.random });
// performance.now() and performance.timeOrigin are a clock of the realm's own, and the realm is
// shared: they tell a drive how long the thread has been up and, drive after drive, how much
// time other sessions took. Date is the one clock a chart gets (docs/datamodels.md).
R.deleteProperty(g, "performance");
// ---- lockdown: freeze every shared object, once
var OWN = create(null), OWN_COUNT = 0, STD = create(getProto(g));
["_sessionid", "_name", "_ioprocessors", "_event", "In", "undefined", "NaN", "Infinity"].forEach(function (k) {
  OWN[k] = true; OWN_COUNT++; });
function lockdown() {
  var seen = new Map(), order = [], protos = new Set(), j, k, d;
  function visit(o) {
    if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) return;
    seen.set(o, true);
    order[order.length] = o;
    var p = getProto(o);
    if (p !== null) { protos.add(p); visit(p); }
    var ks = ownKeys(o);
    for (var n = 0; n < ks.length; n++) {
      var e = getDesc(o, ks[n]);
      if (hasOwn(e, "value")) visit(e.value); else { visit(e.get); visit(e.set); }
    }
  }
  // Error.prepareStackTrace and Error.stackTraceLimit are accessors over the context's own
  // state, which freezing Error would not stop: make them plain constants first.
  var E = ["prepareStackTrace", "stackTraceLimit"];
  for (j = 0; j < E.length; j++) {
    d = getDesc(Error, E[j]);
    if (d && d.configurable) defProp(Error, E[j], { value: d.get ? apply(d.get, Error, []) : d.value, writable: false,
      enumerable: false, configurable: false });
  }
  // intrinsics no global property leads to
  var samples = [function* () {}, async function () {}, async function* () {}, async () => {}, () => {}, dom.protos, Refusal, In];
  var makers = [function () { return (function* () {})(); }, function () { return (async function* () {})(); },
    function () { return [][Symbol.iterator](); }, function () { return new Map()[Symbol.iterator](); },
    function () { return new Set()[Symbol.iterator](); }, function () { return ""[Symbol.iterator](); },
    function () { return /a/g[Symbol.matchAll](""); }, function () { return [].values().map(function (x) { return x; }); },
    function () { return g.Iterator.from({ next: function () {} }); }, function () { return g.Iterator.concat([]); },
    function () { return (function () { "use strict"; return arguments; })(); },
    function () { return (function () { return arguments; })(); }, function () { return Promise.resolve(); },
    function () { return new g.DisposableStack(); }, function () { return new g.AsyncDisposableStack(); }];
  for (j = 0; j < makers.length; j++) { try { samples[samples.length] = makers[j](); } catch (x) {} }
  var gk = ownKeys(g);
  for (j = 0; j < gk.length; j++) { d = getDesc(g, gk[j]); if (hasOwn(d, "value")) visit(d.value); else { visit(d.get); visit(d.set); } }
  for (j = 0; j < samples.length; j++) visit(samples[j]);
  for (j = 0; j < order.length; j++) {
    d = typeof order[j] === "function" ? getDesc(order[j], "prototype") : undefined;
    if (d && hasOwn(d, "value") && d.value !== null && typeof d.value === "object") protos.add(d.value);
  }
  var errorProtos = new Set();
  for (j = 0; j < ERRORS.length; j++) if (ERRORS[j]) errorProtos.add(ERRORS[j].prototype);
  for (j = 0; j < order.length; j++) {
    var o = order[j];
    if (o === g) continue;
    // (error prototypes stay plain data: describe() reads their name without running code)
    if (protos.has(o) && !errorProtos.has(o)) tame(o);
    freeze(o);
  }
  // The standard globals move to STD, a frozen object between the global object and
  // Object.prototype: name lookup finds them there, and the global object's own properties
  // are then only what a drive added (a chart can shadow a built-in with var or <data>,
  // never change it). The system variables and undefined/NaN/Infinity stay: a var must
  // not shadow them.
  for (j = 0; j < gk.length; j++) {
    k = gk[j];
    d = getDesc(g, k);
    if (typeof k === "string" && OWN[k] === true) {
      if (d.configurable || d.enumerable) { d.configurable = d.enumerable = false; defProp(g, k, d); }
      continue;
    }
    if (hasOwn(d, "value")) d.writable = false;
    d.configurable = d.enumerable = false;
    defProp(STD, k, d);
    delete g[k];
  }
  freeze(STD);
  setProto(g, STD);
}
function tame(o) {
  var ks = ownKeys(o);
  for (var n = 0; n < ks.length; n++) {
    var d = getDesc(o, ks[n]);
    if (hasOwn(d, "value") && d.writable && d.configurable)
      defProp(o, ks[n], { get: getter(d.value), set: setter(o, ks[n]), enumerable: d.enumerable, configurable: false });
  }
}
function getter(v) { return freeze(getDesc({ get v() { return v; } }, "v").get); }
function setter(home, k) {
  return freeze(getDesc({ set v(x) {
    if (this === home) throw new TypeErr(Str(k) + " is shared by every session and cannot be changed");
    if (this !== null && (typeof this === "object" || typeof this === "function"))
      R.defineProperty(this, k, { value: x, writable: true, enumerable: true, configurable: true });
  } }, "v").set);
}
lockdown();
function isBase(k) { return typeof k === "string" && OWN[k] === true; }
// The user globals the last dump listed: reset deletes them before it allocates anything.
var lastNames = [];
// Wipe what the last drive left: every own property of the global object but OWN. One that
// cannot be deleted (or a global object made non-extensible) cannot be wiped: the realm is
// then replaced, never reused. The realm runs this under a tight memory limit: what the last
// drive left is freed before anything is allocated, so running out of memory here means
// garbage (see realm.py).
function reset() {
  var j, ks = lastNames;
  ev = last = undefined; evText = null; active = null; sid = chartName = undefined; lastData = false; lastWhy = "";
  lastNames = [];
  for (j = 0; j < ks.length; j++) delete g[ks[j]];
  code = create(null);
  if (getProto(g) !== STD && !setProto(g, STD)) return "the global object's prototype was changed";
  if (!isExtensible(g)) return "the global object was made non-extensible";
  ks = ownKeys(g);
  if (ks.length !== OWN_COUNT) for (j = 0; j < ks.length; j++) if (!isBase(ks[j])) delete g[ks[j]];
  return drew ? "r" : "";  // "r": begin must bring a new seed for Math.random
}
function setActive(ids) {
  active = null;
  if (typeof ids === "string") {
    active = create(null);
    if (ids !== "") { var p = apply(split, ids, ["\u001f"]); for (var j = 0; j < p.length; j++) active[p[j]] = true; }
  }
}
function put(k, v) {
  if (SYSTEM[k]) throw new Refusal(k + " is a system variable");
  var d = getDesc(g, k);
  if (d && !d.configurable) {
    if (!d.writable) throw new Refusal(k + " is a read-only global");
    g[k] = v;
  } else defProp(g, k, { value: v, writable: true, enumerable: true, configurable: true });
}
function install(text, sp) {
  var o = sp ? parse(text, reviver) : parse(text), ks = names(o);
  for (var j = 0; j < ks.length; j++) put(ks[j], o[ks[j]]);
}
function userNames() { var ks = names(g), r = []; for (var j = 0; j < ks.length; j++) if (OWN[ks[j]] !== true) r[r.length] = ks[j]; return r; }
// "j{...}" or "J{...}" (J: markers to revive), then "\u0003[[name, why], ...]" for refused variables
function dump() { var ks = userNames(); lastNames = ks; return dumpNames(ks); }
function dumpNames(ks) {
  var s = "{", sp = false, bad = [];
  for (var j = 0; j < ks.length; j++) {
    var k = ks[j], v = g[k], t = typeof v, text;
    if (t === "function" && code[k] === v) continue;
    if (t === "number" && v - v === 0) text = "" + v;  // (what stringify makes of it, with no replacer call)
    else if (t === "boolean" || v === null) text = "" + v;
    else {
      try { text = encode(v); } catch (e) { bad[bad.length] = [k, e.msg]; continue; }
      sp = sp || special;
    }
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
  if (mode === "raw") return payload;
  if (mode === "xml") return dom.build(parse(payload));
  return sp ? parse(payload, reviver) : parse(payload);
}
// Compiled expressions are shared by every drive of the realm, so each must be exactly the
// function its wrapper spells: an expression that closes the wrapper early (and could return
// a closure with state of its own) is refused.
var T = { expr: [], cond: [], set: [] }, scripts = [],
  W = { expr: ["(function(){return (", "\n);})"], cond: ["(function(){return !!(", "\n);})"],
        set: ["(function(__sb_value__){(", "\n)=__sb_value__;})"] };
function compile(kind, src, open) {
  // First inside brackets no chart can know ("open", random, from the host, and its mirror):
  // a source that is not one balanced expression must close them to get out, in the order
  // they were opened, and fails to parse instead. Only then is it compiled in its wrapper,
  // which a source that closed it ("1)}), x = 7, (function(){(1") ran as a program: any
  // wrapper a chart knows it can close. Twice, innermost "(" then "[": a source that closes
  // one bracket and opens another ("1), (x = 7), (1") fails one of the two, so that it never
  // compiles in one process and not in another.
  geval("(function(){return " + open + "(" + src + "\n)" + mirror(open) + ";})");
  geval("(function(){return " + open + "[" + src + "\n]" + mirror(open) + ";})");
  var text = W[kind][0] + src + W[kind][1], f = geval(text);
  if (typeof f !== "function" || apply(fnText, f, []) !== apply(slice, text, [1, text.length - 1]))
    throw new Refusal("it is not one expression");
  freeze(f.prototype);
  return freeze(f);
}
// Strings go back to Python flat: the binding cannot convert QuickJS rope strings.
return function (op, a, b, c, d, e, f, h, k, m) {
  var r = dispatch(op, a, b, c, d, e, f, h, k, m);
  return typeof r === "string" && r !== "" ? apply(slice, r, [0]) : r;
};
function dispatch(op, a, b, c, d, e, f, h, k, m) {
  switch (op) {
  case "eval":
    setActive(b);
    try { return out(T.expr[a]()); } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "cond":
    setActive(b);
    try { return T.cond[a](); } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "compile":  // a: key, b: kind, c: source, d: brackets -> "", or "s" + why when the source alone is at
                   // fault, "t" + why when the drive is (memory it used up, the stack): only "s" is remembered
    try { T[b][a] = compile(b, c, d); return ""; }
    catch (x) { return (x instanceof Refusal || (x instanceof SyntaxErr && !transient(x)) ? "s" : "t") + describe(x); }
  case "text":     // a: key, b: In() ids -> the value converted as ECMAScript's ToString does (Symbols throw)
    setActive(b);
    try { return out(`${T.expr[a]()}`); } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "assign":   // a: key, b: root, c: mode, d: payload, e: special, f: In() ids
    try {
      if (!hasOwn(g, b)) return "\u0001e" + b + " is not declared";
      var v = value(c, d, e);
      setActive(f);
      T.set[a](v);
      return "";
    } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "dump":
    try { return dump(); } catch (x) { return "\u0001e" + describe(x); }
  case "reset":
    try { return reset(); } catch (x) { return "the realm could not be reset: " + describe(x); }
  case "begin":    // a: session id, b: chart name, c: ioprocessors JSON, d: variables JSON or null, e: special,
                   // f, h, k: the event (as for "event"), m: 32 hex digits to seed Math.random, or null
    sid = a; chartName = b;
    setEvent(f, h, k);
    if (m !== null) seed(m);
    try {
      if (c !== iopText) { iop = deepFreeze(parse(c)); iopText = c; }
      if (d !== null) install(d, e);
      return "";
    } catch (x) { return "\u0001e" + describe(x); }
  case "declare":  // a: name, b: mode, c: payload, d: special, e: the value may be top-level code
    try {
      if (b === "last" && !lastData && e && typeof last === "function") { put(a, last); code[a] = last; }
      else put(a, value(b, c, d));
      return "";
    } catch (x) { return "\u0001e" + describe(x); }
  case "isdecl":
    return !SYSTEM[a] && hasOwn(g, a);
  case "script":   // a: key, b: source (the first time), c: In() ids
    if (b !== null) scripts[a] = b;
    setActive(c);
    try { geval(scripts[a]); return ""; } catch (x) { return "\u0001e" + describe(x); } finally { active = null; }
  case "code":     // every function-valued variable now is the chart's top-level code
    var ks = userNames();
    for (var j = 0; j < ks.length; j++) { var dd = getDesc(g, ks[j]); if (dd && typeof dd.value === "function") code[ks[j]] = dd.value; }
    return "";
  case "names":    // the user variables as JSON, for dumping them one by one (see variables())
    var nm = lastNames = userNames(), s1 = "[";  // no stringify(array): a chart can give arrays a toJSON
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
    for (var k = 0; k < us.length; k++) if (!hasOwn(code, us[k])) { try { delete g[us[k]]; } catch (x) {} }
    return "";
  case "event":    // a: JSON [name, type, sendid, origin, origintype, invokeid, raw, data], b: data mode, c: special
    setEvent(a, b, c);
    return "";
  case "install":
    try { install(a, b); return ""; } catch (x) { return "\u0001e" + describe(x); }
  }
  return "\u0001eunknown operation";
}
})()
"""

#: A small read-only XML DOM: ``{build(tree), protos}`` (the prototypes, for the lockdown).
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
return { protos: [Node, Elem, Text, Doc], build: function (tree) {
  var d = create(Doc);
  d.documentElement = elem(tree, null);
  d.childNodes = [d.documentElement];
  return d;
} };
})
"""


def _compact(src: str) -> str:
    """Drop comment lines and indentation (the prelude is parsed once per realm, but stays small)."""
    return "\n".join(ln.strip() for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("//"))


#: The prelude, ready to evaluate.
PRELUDE = _compact(_PRELUDE).replace("%UNPOLLED%", UNPOLLED).replace("%DOM%", _compact(_DOM))
