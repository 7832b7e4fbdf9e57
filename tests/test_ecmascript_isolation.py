"""Isolation of the ecmascript datamodel's shared realm (issue 15, ADR 0024).

Every drive of a thread runs in the same QuickJS realm, wiped in between. A *writer*
session tries to leave something behind -- a global, a changed built-in, a closure, a
symbol, a job, a prototype -- with a secret in it; then a *reader* session of another chart
looks everywhere it can. Each test also checks the realm really was shared (or, for the
attacks that make a realm unusable, that it was replaced), so none passes by accident.
"""

from __future__ import annotations

import json
import threading

import pytest

import statebound as sb
from statebound.datamodel.base import datamodel_for

pytest.importorskip("quickjs", reason="the ecmascript extra is not installed")
from _ecma import chart

from statebound.datamodel import ecmascript as E
from statebound.datamodel.ecmascript import realm

SECRET = "S3CR3T-7f1c"


def esc(js: str) -> str:
    return js.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def logs(effects) -> dict:
    return {e.label: e.value for e in effects if type(e).__name__ == "Log"}


def writer(attacks: list[str], **limits) -> sb.Chart:
    """A chart whose first drive runs each attack (errors caught: the next one still runs)."""
    script = f"var secret = {json.dumps(SECRET)};\n" + "\n".join(f"try {{ {a} }} catch (e) {{}}" for a in attacks)
    return chart(f'<state id="a"><onentry><script>{esc(script)}</script><log label="ran" expr="1"/></onentry>'
                 '<transition event="error.execution" target="a"/></state>', **limits)


# What the reader checks; each must be true in a pristine realm.
PROBES = {
    "object_prototype": "({}).polluted === undefined && !('polluted' in {}) && Object.prototype.polluted === undefined",
    "globals": "['leak', 'leak2', 'leak3', 'leak4', 'leak5', 'leak6', 'hidden', 'secret', 'wm', 'fr']"
               ".every(function (k) { return !(k in globalThis); })",
    "symbol_global": "globalThis[Symbol.for('stash')] === undefined && Object.getOwnPropertySymbols(globalThis).length === 0",
    "push": "(function () { var a = []; a.push(1, 2); return a.length === 2 && [].push === Array.prototype.push; })()",
    "json": "JSON.stringify([1, {a: 2}]) === '[1,{\"a\":2}]' && JSON.stash === undefined",
    "math": "Math.max(1, 2) === 2 && Math.stash === undefined && Math.PI > 3.14",
    "function_constructor": "Function.prototype.constructor === Function && (function () {}).constructor('return 7')() === 7"
                            " && Function.stash === undefined",
    "promise": "typeof Promise.prototype.then === 'function' && Promise.prototype.then.stash === undefined",
    "weakmap": "new WeakMap().get(Object.prototype) === undefined && WeakMap.prototype.stash === undefined",
    "symbol_registry": "Symbol.for('stash').stash === undefined && Symbol.keyFor(Symbol.for('stash')) === 'stash'",
    "errors": "typeof new Error('x').stack === 'string' && new Error('x').stack.indexOf('S3CR3T') < 0"
              " && Error.prepareStackTrace === undefined && !globalThis.hasOwnProperty('stack')",
    "system": "_sessionid === 'reader' && _ioprocessors.stash === undefined && In.stash === undefined",
    "global_prototype": "Object.getPrototypeOf(Object.getPrototypeOf(globalThis)) === Object.prototype"
                        " && Object.getPrototypeOf(globalThis).stash === undefined && typeof Math === 'object'",
    "iterators": "Object.getPrototypeOf([][Symbol.iterator]()).stash === undefined"
                 " && Object.getPrototypeOf(function* () {}).stash === undefined",
    "wrapped_natives": "Proxy.stash === undefined && typeof Proxy.revocable === 'function'"
                       " && Proxy.revocable.stash === undefined && typeof Array.prototype.flat === 'function'"
                       " && [1].concat([2]).join() === '1,2' && String.raw.stash === undefined"
                       " && Iterator.prototype.drop.stash === undefined",
    # the whole reachable object graph, prototypes and accessors included: no secret anywhere
    "nowhere": """(function () {
        var seen = new Set(), found = false, todo = [globalThis];
        while (todo.length) {
          var o = todo.pop();
          if (o === null || (typeof o !== 'object' && typeof o !== 'function') || seen.has(o)) continue;
          seen.add(o);
          todo.push(Object.getPrototypeOf(o));
          Reflect.ownKeys(o).forEach(function (k) {
            if (String(k).indexOf('S3CR3T') >= 0) found = true;
            var d = Object.getOwnPropertyDescriptor(o, k);
            if (d.get) { todo.push(d.get); try { todo.push(d.get.call(o)); } catch (e) {} }
            if (d.set) todo.push(d.set);
            if ('value' in d) {
              if (typeof d.value === 'string' && d.value.indexOf('S3CR3T') >= 0) found = true;
              else todo.push(d.value);
            }
          });
        }
        return !found && seen.size > 300;
      })()""",
}
OWN_GLOBALS = {"_sessionid", "_name", "_ioprocessors", "_event", "In", "undefined", "NaN", "Infinity"}


def reader(**limits) -> sb.Chart:
    body = "".join(f'<log label="{k}" expr="{esc(v)}"/>' for k, v in PROBES.items())
    body += '<log label="own" expr="JSON.stringify(Reflect.ownKeys(globalThis).map(String))"/>'
    return chart(f'<state id="r"><onentry>{body}</onentry></state>', **limits)


def assert_pristine(effects) -> None:
    seen = logs(effects)
    bad = {k: seen.get(k) for k in PROBES if seen.get(k) is not True}
    assert not bad, bad
    assert set(json.loads(seen["own"])) == OWN_GLOBALS


def read() -> None:
    _, effects = sb.Interpreter(reader()).start("reader")
    assert_pristine(effects)


# --------------------------------------------------------------------------- what a drive may try
ATTACKS = {
    "globals": ["leak = secret;", "globalThis.leak2 = secret;", "var leak3 = secret;",
                "function leak4() { return secret; }",
                "Object.defineProperty(globalThis, 'hidden', { value: secret, writable: true, configurable: true });",
                "globalThis[Symbol.for('stash')] = secret;", "Error.captureStackTrace(globalThis);"],
    "object_prototype": ["Object.prototype.polluted = secret;", "({}).__proto__.polluted = secret;",
                         "Object.defineProperty(Object.prototype, 'polluted', { value: secret });",
                         "Object.prototype.__proto__ = { polluted: secret };"],
    "builtins": ["Array.prototype.push = function () { return secret; };",
                 "Object.defineProperty(Array.prototype, 'push', { value: function () { return secret; } });",
                 "JSON.stringify = function () { return secret; }; JSON.stash = secret;",
                 "Math.max = function () { return secret; }; Math.stash = secret;",
                 "Function.prototype.constructor = function () { return secret; }; Function.stash = secret;",
                 "Promise.prototype.then.stash = secret;", "Promise.prototype.then = null;",
                 "Object.getPrototypeOf([][Symbol.iterator]()).stash = secret;",
                 "Object.getPrototypeOf(function* () {}).stash = secret;",
                 "Object.getOwnPropertyDescriptor(Array.prototype, 'push').get.stash = secret;",
                 "Error.prepareStackTrace = function () { return secret; }; Error.stackTraceLimit = 0;"],
    "shadowed_builtins": ["var JSON = { stringify: function () { return secret; } };", "var Math = secret;",
                          "var Function = secret; var Array = secret; var globalThis = secret;"],
    "system_variables": ["_ioprocessors.stash = secret;", "In.stash = secret;",
                         "Object.getOwnPropertyDescriptor(globalThis, '_event').get.stash = secret;",
                         "Object.getPrototypeOf(globalThis).stash = secret;"],
    "symbols_and_weak_refs": ["Symbol.prototype.stash = secret;", "Symbol.for('stash').stash = secret;",
                              "var wm = new WeakMap(); wm.set(Object.prototype, secret); wm.set(Array, secret);",
                              "WeakMap.prototype.stash = secret;",
                              "var fr = new FinalizationRegistry(function () { globalThis.leak5 = secret; });"
                              " fr.register({}, 1); fr = null;"],
    "jobs": ["Promise.resolve().then(function () { globalThis.leak5 = secret; });",
             "queueMicrotask(function () { globalThis.leak5 = secret; });",
             "(async function () { await null; globalThis.leak5 = secret; })();"],
    "global_prototype": ["Object.setPrototypeOf(globalThis, { leak6: secret, Math: secret });"],
    # the prelude's wrappers of natives that never poll (and the Proxy constructor it records with)
    "wrapped_natives": ["Proxy.stash = secret;", "Proxy.revocable.stash = secret;", "Proxy.revocable = null;",
                        "Array.prototype.concat.stash = secret;", "Array.prototype.flat = null;",
                        "String.raw.stash = secret;", "JSON.stringify.stash = secret;",
                        "Set.prototype.union.stash = secret;", "Iterator.prototype.drop.stash = secret;",
                        "var leak = new Proxy({}, { get: function () { return secret; } });",
                        "var leak2 = Proxy.revocable([secret], {}).proxy; [].concat(leak2, [secret]);",
                        "[secret].values().drop(0).next(); new Set([secret]).union(new Set([secret]));"],
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_nothing_a_drive_does_reaches_the_next_session(name):
    read()  # the realm exists and is clean
    made = realm.realms_made()
    _, effects = sb.Interpreter(writer(ATTACKS[name])).start("writer")
    assert logs(effects)["ran"] == 1
    read()
    assert realm.realms_made() == made  # the reader ran in the very realm the writer used


def test_changing_a_builtin_fails_but_own_objects_can_override_what_they_inherit():
    c = chart('<state id="a"><onentry>'
              '<script>function P() {} P.prototype.toString = function () { return "p"; };'
              ' var o = {}; o.constructor = 5; o.hasOwnProperty = 6; var s = String(new P()) + o.constructor;'
              ' var k = Object.keys(o).join(); class A extends Array {} var n = new A().push(1, 2);</script>'
              '<log label="s" expr="s"/><log label="k" expr="k"/><log label="n" expr="n"/>'
              '<script>Array.prototype.push = function () {};</script></onentry>'
              '<transition event="error.execution" target="failed"><log label="err" expr="_event.data.message"/>'
              '</transition></state><state id="failed"/>')
    pos, effects = sb.Interpreter(c).start("s")
    seen = logs(effects)
    assert (seen["s"], seen["k"], seen["n"]) == ("p5", "constructor,hasOwnProperty", 2)
    assert "failed" in pos.configuration and "shared by every session" in seen["err"]


def test_an_expression_that_escapes_its_wrapper_is_refused():
    # closing the wrapper early could return a closure with state of its own, which the realm
    # would then share between sessions: such an expression does not compile
    stash = ("1\n);}), (function () { var stash = []; return function () { stash.push(_sessionid);"
             " return stash.join(); }; })(), (function(){return (1")
    c = chart(f'<state id="a"><onentry><log label="v" expr="{esc(stash)}"/></onentry>'
              '<transition event="error.execution" target="failed"><log label="err" expr="_event.data.message"/>'
              '</transition></state><state id="failed"/>')
    for session in ("one", "two"):
        pos, effects = sb.Interpreter(c).start(session)
        assert "failed" in pos.configuration and "does not compile" in logs(effects)["err"]


# --------------------------------------------------------------------------- drives that break a realm
POISON = {
    "undeletable_global": "Object.defineProperty(globalThis, 'leak', { value: secret, configurable: false });",
    "sealed_global_object": "leak = secret; Object.seal(globalThis);",
    "frozen_global_object": "leak = secret; Object.freeze(globalThis);",
    "non_extensible_global_object": "Object.preventExtensions(globalThis);",
}


@pytest.mark.parametrize("name", list(POISON))
def test_a_realm_that_cannot_be_wiped_is_replaced(name):
    read()
    made = realm.realms_made()
    sb.Interpreter(writer([POISON[name]])).start("writer")
    read()
    assert realm.realms_made() == made + 1


def test_an_interrupted_drive_leaves_nothing_behind():
    read()
    made = realm.realms_made()
    c = chart('<state id="a"><onentry><script>leak = "S3CR3T"; Object.prototype.x = 1; while (true) {}</script>'
              '</onentry><transition event="error.execution" target="failed"/></state><state id="failed"/>',
              time_ms=50)
    pos, _ = sb.Interpreter(c).start("writer")
    assert "failed" in pos.configuration
    read()
    assert realm.realms_made() == made + 1  # an interruption retires the realm


def test_running_out_of_memory_does_not_starve_the_next_session():
    hog = chart('<state id="a"><onentry><script>var keep = []; while (true) keep.push("x".repeat(1e4) + keep.length);'
                '</script></onentry><transition event="error.execution" target="failed">'
                '<log label="err" expr="_event.data.message"/></transition></state><state id="failed"/>',
                memory_bytes=8 * 1024 * 1024)
    pos, effects = sb.Interpreter(hog).start("hog")
    assert "failed" in pos.configuration and "memory" in logs(effects)["err"]
    small = chart('<state id="a"><onentry><log label="n" expr="\'y\'.repeat(700 * 1024).length"/></onentry></state>',
                  memory_bytes=1024 * 1024)
    _, effects = sb.Interpreter(small).start("small")
    assert logs(effects)["n"] == 700 * 1024


def test_garbage_a_drive_leaves_does_not_count_against_the_next():
    # cycles QuickJS collects only now and then: several MiB of them, under the writer's cap
    garbage = chart('<state id="a"><onentry><script>(function () { for (var i = 0; i &lt; 6e4; i++) {'
                    ' var o = { s: "x".repeat(64) + i }; o.self = o; } })(); done = true;</script>'
                    '<log label="done" expr="done"/></onentry></state>', memory_bytes=32 * 1024 * 1024)
    small = chart('<state id="a"><onentry><log label="n" expr="\'y\'.repeat(800 * 1024).length"/></onentry></state>',
                  memory_bytes=1024 * 1024)
    for i in range(3):
        _, effects = sb.Interpreter(garbage).start(f"g{i}")
        assert logs(effects) == {"done": True}
        _, effects = sb.Interpreter(small).start(f"s{i}")
        assert logs(effects) == {"n": 800 * 1024}


def test_the_memory_cap_holds_on_a_shared_realm():
    # (a drive may use its cap plus what is left of the realm's slack, realm.SLACK_BYTES)
    c = chart('<state id="a"><onentry><log label="n" expr="\'x\'.repeat(4 * 1024 * 1024).length"/></onentry>'
              '<transition event="error.execution" target="failed"/></state><state id="failed"/>',
              memory_bytes=2 * 1024 * 1024)
    assert realm.SLACK_BYTES <= 1024 * 1024
    for i in range(3):  # the same realm each time: the cap is per drive, not used up
        pos, _ = sb.Interpreter(c).start(f"s{i}")
        assert "failed" in pos.configuration
    E.set_limits(c, memory_bytes=8 * 1024 * 1024)
    pos, effects = sb.Interpreter(c).start("bigger")
    assert "failed" not in pos.configuration and logs(effects) == {"n": 4 * 1024 * 1024}


# --------------------------------------------------------------------------- sessions side by side
COUNTER = chart('<state id="a"><transition event="add" target="a">'
                '<assign location="total" expr="total + _event.data"/><log label="seen" expr="seen()"/>'
                '</transition></state>',
                '<data id="total" expr="0"/><data id="seen" expr="function () { return _sessionid + \':\' + total; }"/>')


def test_interleaved_sessions_see_only_their_own_values():
    it = sb.Interpreter(COUNTER)
    made = realm.realms_made()
    pos = {s: it.start(s)[0] for s in ("a", "b", "c")}
    expect = dict.fromkeys(pos, 0)
    for step in range(1, 31):
        s = "abc"[step % 3]
        pos[s], effects = it.drive(pos[s], sb.Event("add", data=step))
        expect[s] += step
        assert logs(effects) == {"seen": f"{s}:{expect[s]}"}
    assert {s: p.datamodel["total"] for s, p in pos.items()} == expect
    assert realm.realms_made() - made <= 1  # one realm served every drive


def test_a_context_still_open_keeps_its_realm_and_another_gets_its_own():
    dm = datamodel_for(COUNTER)
    expr = next(e for e in COUNTER.expressions if e.src == "total + _event.data")
    ioprocessors = {"scxml": {"location": "#_scxml_x"}}

    def open_(session, total):
        return dm.open({"total": total}, session, "c", ioprocessors, lambda _: True)

    a = open_("a", 100)
    a.set_event(sb.Event("add", data=1))
    assert a.evaluate(expr) == 101
    b = open_("b", 5)  # a is still open: b must not get (and wipe) a's realm
    b.set_event(sb.Event("add", data=2))
    assert b.evaluate(expr) == 7
    assert a.realm is not b.realm
    assert a.evaluate(expr) == 101 and a.variables() == {"total": 100}
    del a
    c = open_("c", 0)
    c.set_event(sb.Event("add", data=3))
    assert c.evaluate(expr) == 3 and c.variables() == {"total": 0}


def test_threads_each_use_their_own_realm():
    it = sb.Interpreter(COUNTER)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            pos = it.start(name)[0]
            for k in range(1, 41):
                pos, effects = it.drive(pos, sb.Event("add", data=k))
                assert logs(effects) == {"seen": f"{name}:{k * (k + 1) // 2}"}
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_compiled_expressions_count_as_part_of_the_realm():
    # 2,000 distinct expressions compile to more than the realm's slack: the realm keeps them
    # (and is not replaced as if they were garbage a drive left)
    body = "".join(f'<log label="v{i}" expr="n + {i}"/>' for i in range(2000))
    c = chart(f'<state id="a"><onentry>{body}</onentry><transition event="e" target="a"/></state>',
              '<data id="n" expr="1"/>')
    it = sb.Interpreter(c)
    pos, effects = it.start("many")
    assert logs(effects)["v1999"] == 2000
    made = realm.realms_made()
    for _ in range(2):
        pos, effects = it.drive(pos, "e")
        assert logs(effects)["v7"] == 8
    assert realm.realms_made() == made


def test_math_random_starts_afresh_after_a_drive_that_drew_from_it(monkeypatch):
    # with the same seed every time, two sessions draw the same numbers: the second does not
    # continue the stream the first one read (and so cannot be predicted from it)
    import types
    monkeypatch.setattr(realm, "os", types.SimpleNamespace(urandom=lambda n: bytes(range(7, 7 + n))))
    c = chart('<state id="a"><onentry><log label="r" expr="[Math.random(), Math.random(), Math.random()].join()"/>'
              '</onentry></state>')
    draws = [logs(sb.Interpreter(c).start(f"s{i}")[1])["r"] for i in range(3)]
    assert draws[1] == draws[2]  # (the first may continue a stream seeded before the patch)
    assert all(0 <= float(x) < 1 for x in draws[1].split(","))
    monkeypatch.undo()
    fresh = [logs(sb.Interpreter(c).start(f"t{i}")[1])["r"] for i in range(2)]
    assert fresh[0] != fresh[1] and draws[1] not in fresh


def test_more_contexts_open_at_once_than_the_pool_keeps():
    dm = datamodel_for(COUNTER)
    expr = next(e for e in COUNTER.expressions if e.src == "total + _event.data")
    contexts = []
    for i in range(realm.POOL_SIZE + 3):
        ctx = dm.open({"total": 1000 * i}, f"p{i}", "c", {}, lambda _: True)
        ctx.set_event(sb.Event("add", data=i))
        assert ctx.evaluate(expr) == 1001 * i
        contexts.append(ctx)
    assert len({id(c.realm) for c in contexts}) == len(contexts)  # each its own realm
    assert [c.variables() for c in contexts] == [{"total": 1000 * i} for i in range(len(contexts))]


def test_realms_of_two_threads_never_share_a_serial():
    # A chart's datamodel caches "compiled under key k in the realm with serial s", and every
    # thread's realm reads that cache: two realms with one serial would run each other's keys,
    # i.e. the wrong expression. Thread A builds a realm under a tracer that, before each
    # line of Realm.__init__, lets thread B build a whole realm (a thread switch there).
    import queue
    import sys

    requests: queue.Queue[threading.Event | None] = queue.Queue()
    serials: list[int] = []

    def other_thread() -> None:
        while (done := requests.get()) is not None:
            serials.append(realm.Realm().serial)
            done.set()

    init = realm.Realm.__init__.__code__

    def switch_here(frame, event, arg):
        if event == "line":
            done = threading.Event()
            requests.put(done)
            done.wait(0.5)  # B may wait for something A holds: then A goes on first
        return switch_here

    def tracer(frame, event, arg):
        return switch_here if frame.f_code is init else None

    b = threading.Thread(target=other_thread)
    b.start()
    sys.settrace(tracer)
    try:
        mine = realm.Realm().serial
    finally:
        sys.settrace(None)
        requests.put(None)
        b.join()
    assert len(serials) > 3  # B really ran between A's lines
    assert mine not in serials and len(set(serials)) == len(serials)
