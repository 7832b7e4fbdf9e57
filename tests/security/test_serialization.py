"""Hostile values left in an ECMAScript variable: the commit refuses them, the drive commits.

Issue 10: a ``toJSON``, getter or Proxy trap that loops (or throws) made ``Host.start`` and
``Host.send`` raise ``SerializationError``. A loop inside ``JSON.stringify`` is interrupted
by the time limit, which no JS ``catch`` survives, so the whole dump failed. Now the dump
falls back to one variable at a time: the culprit is put back as it was before the drive,
the chart gets ``error.execution``, and everything else the drive did is committed.
"""

from __future__ import annotations

import msgpack
import pytest

import statebound as sb

from xml.sax.saxutils import escape

from .helpers import CATCH, scxml

HOSTILE = {
    "looping toJSON": "x = { toJSON: function () { while (true) {} } };",
    "throwing toJSON": "x = { toJSON: function () { throw new Error('no'); } };",
    "looping getter": "Object.defineProperty(globalThis, 'x', { get: function () { while (true) {} }, "
                      "enumerable: true, configurable: true });",
    "looping getter, not configurable": "Object.defineProperty(globalThis, 'x', { get: function () "
                                        "{ while (true) {} }, enumerable: true, configurable: false });",
    "getter on a nested object": "x = {}; Object.defineProperty(x, 'deep', { get: function () { while (true) {} }, "
                                 "enumerable: true });",
    "proxy with a looping ownKeys": "x = new Proxy({}, { ownKeys: function () { while (true) {} } });",
    "proxy with a throwing get": "x = new Proxy({a: 1}, { get: function () { throw 1; } });",
    "revoked proxy": "var r = Proxy.revocable({}, {}); x = r.proxy; r.revoke();",
    "toJSON returning itself, deeply": "x = { toJSON: function () { var o = {}; var c = o; "
                                       "for (var i = 0; i < 1e6; i++) { c.a = {}; c = c.a; } return o; } };",
    "a shared object exploding the JSON": "var o = 'x'.repeat(1000); for (var i = 0; i < 40; i++) o = [o, o]; x = o;",
    "a name with a lone surrogate": "globalThis['\\ud800'] = 1; x = 5;",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_value_is_refused_and_the_drive_commits(hostile, name):
    chart = scxml(f"""<datamodel><data id="x" expr="'before'"/><data id="other" expr="0"/></datamodel>
      <state id="a">{CATCH}
        <transition event="go" target="b"><assign location="other" expr="1"/><script>{escape(HOSTILE[name])}</script>
        </transition></state><state id="b">{CATCH}</state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)], ecma_limits={"time_ms": 200})
    out.assert_contained()
    assert out.error is None, out.error
    dm = out.raw["datamodel"]
    if name == "a name with a lone surrogate":  # the unstorable name is dropped, the rest commits
        assert out.raw["configuration"] == ["b"] and dm["x"] == 5 and dm["other"] == 1, out.raw
        return
    assert out.raw["configuration"] == ["b"] and dm["other"] == 1, out.raw
    assert dm["x"] == "before", dm
    assert out.messages and all("restored" in m or "x" in m for m in out.messages), out.messages


def test_a_polluted_prototype_still_commits(hostile):
    # every object becomes unstorable, the value put back included: the commit keeps the values
    # from before the drive and stores the rest
    chart = scxml(f"""<datamodel><data id="o" expr="({{k: 1}})"/><data id="n" expr="0"/></datamodel>
      <state id="a">{CATCH}<transition event="go" target="b"><assign location="n" expr="7"/>
        <script>Object.prototype.toJSON = function () {{ throw new Error('poisoned'); }};</script>
      </transition></state><state id="b"/>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)], ecma_limits={"time_ms": 200})
    out.assert_contained()
    assert out.error is None and out.raw["datamodel"] == {"o": {"k": 1}, "n": 7}, out.raw


def test_a_frozen_global_object_still_commits(hostile):
    chart = scxml(f"""<datamodel><data id="x" expr="1"/></datamodel>
      <state id="a">{CATCH}<transition event="go" target="b">
        <script>x = function () {{}}; Object.freeze(globalThis);</script>
      </transition></state><state id="b"/>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)], ecma_limits={"time_ms": 200})
    out.assert_contained()
    assert out.error is None and out.raw["datamodel"] == {"x": 1}, out.raw


# --------------------------------------------------------------------------- blobs

def _blob(chart: sb.Chart, values) -> bytes:
    it = sb.Interpreter(chart)
    pos, _ = it.start()
    from statebound.interpreter.state import make_position
    forged = make_position(chart, pos.session_id, pos.status, pos.states, pos.history,
                           msgpack.packb(values, use_bin_type=True, datetime=False), pos.macrostep,
                           pos.send_counter, pos.ordinal, pos.invoke_counter, pos.invocations, pos.initialized,
                           pos.parent, pos.invokeid, pos.timeouts)
    return forged.to_bytes()


ECMA = scxml('<datamodel><data id="x" expr="1"/></datamodel><state id="a"><transition event="go">'
             '<assign location="x" expr="x + 1"/></transition></state>')


@pytest.mark.parametrize("value", [b"raw bytes", msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 0),
                                   {"nested": [1, {"deep": b"b"}]}, {1: "int key"}],
                         ids=["bin", "ext", "timestamp", "nested bin", "int key"])
def test_from_bytes_refuses_values_the_ecmascript_datamodel_cannot_hold(value):
    chart = sb.Chart.from_scxml(ECMA)
    with pytest.raises(sb.CorruptPosition, match="does not fit"):
        sb.Position.from_bytes(_blob(chart, {"x": value}), chart)


def test_from_bytes_refuses_what_no_datamodel_holds():
    py = sb.Chart.from_scxml(ECMA.replace('datamodel="ecmascript"', 'datamodel="python"').replace("x + 1", "x"))
    for bad in ({"x": msgpack.ExtType(1, b"")}, {"x": msgpack.Timestamp(0, 0)}, {"_event": 1}, {"__x": 1}):
        with pytest.raises(sb.CorruptPosition):
            sb.Position.from_bytes(_blob(py, bad), py)
    ok = sb.Position.from_bytes(_blob(py, {"x": b"bytes", "y": {1: [None, 2.5]}}), py)
    assert ok.datamodel["x"] == b"bytes"
    null = sb.Chart.from_scxml(scxml('<state id="a"/>', datamodel="null"))
    with pytest.raises(sb.CorruptPosition, match="no variables"):
        sb.Position.from_bytes(_blob(null, {"x": 1}), null)


def test_a_blob_that_loads_drives():
    chart = sb.Chart.from_scxml(ECMA)
    pos = sb.Position.from_bytes(_blob(chart, {"x": 41}), chart)
    assert sb.Interpreter(chart).drive(pos, "go")[0].datamodel["x"] == 42


def test_start_data_that_does_not_fit_is_refused_before_the_start():
    chart = sb.Chart.from_scxml(ECMA)
    with pytest.raises(sb.SerializationError, match="does not fit the ecmascript datamodel"):
        sb.Interpreter(chart).start(data={"x": b"bytes"})


def test_an_unwritable_looping_getter_costs_two_time_slices_not_the_budget(hostile):
    # with the default 1 s per evaluation: the whole dump, then the variable alone; after that
    # it is not read again in this drive, so the drive commits well within its 5 s
    script = escape(HOSTILE["looping getter, not configurable"])
    chart = scxml(f"""<datamodel><data id="x" expr="'before'"/><data id="other" expr="0"/></datamodel>
      <state id="a">{CATCH}<transition event="go" target="b"><assign location="other" expr="1"/>
        <script>{script}</script></transition></state><state id="b">{CATCH}</state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)])
    out.assert_contained()
    assert out.raw["metrics"]["budget_exhausted"] == 0
    assert out.raw["datamodel"] == {"x": "before", "other": 1} and out.messages


def test_start_data_for_a_null_chart_is_refused_not_an_internal_error():
    null = sb.Chart.from_scxml(scxml('<state id="a"/>', datamodel="null"))
    with pytest.raises(sb.SerializationError, match="null datamodel has no variables"):
        sb.Interpreter(null).start(data={"x": 1})


def _refield(blob: bytes, chart: sb.Chart, edit) -> bytes:
    """The blob with its cbor payload's fields rewritten by ``edit`` (a forger's tool)."""
    cbor2 = pytest.importorskip("cbor2")
    from statebound import position as P
    off = P.read_header(blob).payload_offset
    fields = cbor2.loads(blob[off:])
    fields += [None] * (14 - len(fields))
    edit(fields)
    return blob[:off] + cbor2.dumps(fields)


@pytest.mark.parametrize("value", [10 ** 5000, 2 ** 64 + 1, 2 ** 63], ids=["bignum", "past uint64", "past int64"])
@pytest.mark.parametrize("field", [4, 5, 6, 7], ids=["macrostep", "send_counter", "ordinal", "invoke_counter"])
def test_from_bytes_refuses_counters_no_store_can_write_back(field, value):
    # 10**5000 loaded, and the next drive raised a bare ValueError printing send ids
    # (int-to-str digit cap) or a SerializationError writing the position back
    chart = sb.Chart.from_scxml(ECMA)
    blob = sb.Interpreter(chart).start()[0].to_bytes("cbor")
    forged = _refield(blob, chart, lambda f: f.__setitem__(field, value))
    with pytest.raises(sb.CorruptPosition, match="64-bit integer"):
        sb.Position.from_bytes(forged, chart)
    ok = _refield(blob, chart, lambda f: f.__setitem__(field, 2 ** 63 - 1))
    assert sb.Position.from_bytes(ok, chart).to_bytes()  # the largest allowed loads and writes back


def test_from_bytes_refuses_a_timeout_due_past_64_bits():
    chart = sb.Chart.from_scxml(scxml('<state id="a"><sb:timeout name="t" after="1s" event="late"/></state>',
                                      attrs='xmlns:sb="urn:statebound"'))
    pos = sb.Interpreter(chart).start()[0]
    assert pos.timeouts, "the chart arms a timeout"
    blob = pos.to_bytes("cbor")

    def due(at):
        def edit(f):
            f[9] = [list(t) + [None] * (5 - len(t)) for t in f[9]]
            f[9][0][4] = at
        return edit
    for at in (10 ** 30, -(2 ** 63) - 1):
        with pytest.raises(sb.CorruptPosition, match="at_ms must be a 64-bit integer"):
            sb.Position.from_bytes(_refield(blob, chart, due(at)), chart)
    assert sb.Position.from_bytes(_refield(blob, chart, due(2 ** 62)), chart).timeouts[0].at_ms == 2 ** 62


def _nesting_chart(depth: int) -> str:
    return scxml(f"""<datamodel><data id="x" expr="'before'"/><data id="y" expr="0"/></datamodel>
      <state id="a">{CATCH}
        <transition event="go"><assign location="y" expr="1"/>
          <script>x = (function () {{ var v = []; for (var i = 1; i &lt; {depth}; i++) v = [v]; return v; }})();
          </script></transition>
        <transition event="more"><assign location="y" expr="y + 1"/></transition></state>""")


def test_a_value_nested_past_the_cap_is_refused_so_no_deeper_caller_fails_to_load_it(hostile):
    # 900 levels stored from a shallow stack; every later drive from a caller 150 frames deeper
    # raised a bare RecursionError turning the variables into JSON for QuickJS: the session was
    # poisoned for good. Now the drive that made it gets error.execution, the rest commits.
    out = hostile({"main.scxml": _nesting_chart(900)}, events=[("go", None), ("more", None)], stacks=[0, 600])
    out.assert_error_execution("nest more than 256 levels")
    assert out.raw["datamodel"] == {"x": "before", "y": 2}


def test_a_value_nested_to_the_cap_loads_from_a_deep_caller(hostile):
    out = hostile({"main.scxml": _nesting_chart(256)}, events=[("go", None), ("more", None)], stacks=[0, 600])
    out.assert_contained()
    assert out.error is None and not out.messages, out.raw
    x, depth = out.raw["datamodel"]["x"], 0
    while isinstance(x, list):
        x, depth = (x[0] if x else None), depth + 1
    assert depth == 256 and out.raw["datamodel"]["y"] == 2


def test_from_bytes_and_start_data_refuse_ecmascript_values_nested_past_the_cap():
    chart = sb.Chart.from_scxml(ECMA)
    deep = [1]
    for _ in range(256):
        deep = [deep]
    with pytest.raises(sb.CorruptPosition, match="nest more than 256 levels"):
        sb.Position.from_bytes(_blob(chart, {"x": deep}), chart)
    with pytest.raises(sb.SerializationError, match="nest more than 256 levels"):
        sb.Interpreter(chart).start(data={"x": deep})
    assert sb.Position.from_bytes(_blob(chart, {"x": deep[0]}), chart).datamodel["x"] == deep[0]


def test_event_data_nested_past_the_cap_is_error_execution_wherever_it_comes_from(hostile):
    # the chart's own <send>, and a host caller deep in its stack: reading _event turned the
    # data into JSON for QuickJS, which took as much Python stack as the data was deep
    deep = 1
    for _ in range(600):
        deep = [deep]
    chart = scxml(f"""<datamodel><data id="y" expr="0"/></datamodel><state id="a">{CATCH}
      <transition event="go"><send event="echo"><content expr="(function () {{ var v = [];
        for (var i = 0; i &lt; 600; i++) v = [v]; return v; }})()"/></send></transition>
      <transition event="echo outside"><assign location="y" expr="y + 1"/><log label="kind" expr="typeof _event.data"/>
      </transition></state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None), ("outside", deep)], stacks=[0, 600])
    out.assert_error_execution("data of event 'echo' nests more than 256", "data of event 'outside' nests more")
    assert out.raw["datamodel"] == {"y": 0}


SURROGATE_SENDS = {
    "a delayed event name": '<send eventexpr="\'\\ud800\'" delay="1s"/>',
    "an event name": '<send eventexpr="\'a\\ud800\'"/>',
    "delayed data": '<send event="e" delay="1s"><content expr="\'\\udfff\'"/></send>',
}


@pytest.mark.parametrize("name", list(SURROGATE_SENDS))
def test_a_send_no_store_can_hold_is_error_execution_at_the_send(hostile, name):
    chart = scxml(f"""<datamodel><data id="n" expr="0"/></datamodel><state id="a">{CATCH}
      <transition event="go"><assign location="n" expr="1"/>{SURROGATE_SENDS[name]}</transition></state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)])
    out.assert_error_execution("text a store can hold")
    assert out.raw["datamodel"] == {"n": 1}


@pytest.mark.parametrize("name", list(SURROGATE_SENDS))
def test_a_send_no_store_can_hold_leaves_a_sqlite_host_working(tmp_path, name):
    # SQLite writes a timer row as UTF-8: the host call raised SerializationError there, on every
    # attempt, so the transition could never be taken
    chart = sb.Chart.from_scxml(scxml(f"""<datamodel><data id="n" expr="0"/></datamodel><state id="a">{CATCH}
      <transition event="go"><assign location="n" expr="n + 1"/>{SURROGATE_SENDS[name]}</transition></state>"""),
                                trust="untrusted", name="s")
    logs = []
    host = sb.Host([chart], store=sb.SQLiteStore(str(tmp_path / "s.db")), clock=sb.ManualClock(now_ms=0),
                   on_log=lambda iid, label, value: logs.append((label, value)))
    host.start(chart, "i")
    host.send("i", "go")
    assert host.get("i").datamodel["n"] == 1 and host.next_due() is None
    assert any("text a store can hold" in str(v) for label, v in logs if label == "error"), logs


HISTORY = scxml("""<state id="p" initial="x">
    <history id="h" type="shallow"><transition target="x"/></history>
    <history id="hd" type="deep"><transition target="x"/></history>
    <state id="x"><transition event="next" target="y"/></state>
    <parallel id="y"><history id="hp" type="shallow"><transition target="r1"/></history>
      <state id="r1" initial="a1"><state id="a1"><transition event="next" target="b1"/></state><state id="b1"/></state>
      <state id="r2"><state id="a2"/></state></parallel>
    <transition event="out" target="q"/></state>
  <state id="q"><transition event="back" target="h"/><transition event="deep" target="hd"/>
    <transition event="par" target="hp"/></state>""")


def test_from_bytes_refuses_a_history_no_legal_exit_records():
    # {p: [x, y]} loaded, and restoring it drove the session into x and y at once: a position
    # the host committed, and that from_bytes then refused on every later load
    chart = sb.Chart.from_scxml(HISTORY)
    it = sb.Interpreter(chart)
    pos = it.drive(it.start()[0], "out")[0]
    idx = {s.id: s.index for s in chart.states}
    blob = pos.to_bytes("cbor")
    forgeries = {"two siblings, shallow": [[idx["h"], [idx["x"], idx["y"]]]],
                 "two siblings, deep": [[idx["hd"], [idx["x"], idx["a1"], idx["a2"]]]],
                 "a region missing, deep": [[idx["hd"], [idx["a1"]]]],
                 "twice the same": [[idx["h"], [idx["x"], idx["x"]]]],
                 "nothing": [[idx["h"], []]],
                 "one region of a parallel": [[idx["hp"], [idx["r1"]]]]}
    for name, hist in forgeries.items():
        forged = _refield(blob, chart, lambda f, h=hist: f.__setitem__(8, h))
        with pytest.raises(sb.CorruptPosition, match="cannot have been in"):
            sb.Position.from_bytes(forged, chart)
            pytest.fail(f"{name}: loaded")


def test_every_history_a_drive_records_loads_again():
    chart = sb.Chart.from_scxml(HISTORY)
    it = sb.Interpreter(chart)
    pos = it.start()[0]
    seen = set()
    for event in ["out", "back", "next", "next", "out", "deep", "out", "par", "out", "back", "out", "deep"]:
        pos = it.drive(pos, event)[0]
        again = sb.Position.from_bytes(pos.to_bytes(), chart)
        assert again.history == pos.history and again.configuration == pos.configuration
        seen.update(h for h, _ in pos.history)
    assert {chart.states[h].id for h in seen} == {"h", "hd", "hp"}


def test_from_bytes_refuses_an_invocation_or_timeout_recorded_twice():
    # they loaded, and leaving the state cancelled the child (or the timer) once per copy:
    # a CancelInvoke for an id the host never started
    chart = sb.Chart.from_scxml(scxml("""<state id="a"><sb:timeout name="t" after="5s" event="late"/>
      <invoke id="kid" type="scxml"><content><scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
        datamodel="ecmascript"><state id="s"/></scxml></content></invoke>
      <transition event="go" target="b"/></state><state id="b"/>""", attrs='xmlns:sb="urn:statebound"'))
    blob = sb.Interpreter(chart).start()[0].to_bytes("cbor")
    for field, twice, why in [(10, lambda inv: inv * 2, "recorded twice"),
                              (10, lambda inv: inv + [["other", *inv[0][1:]]], "recorded twice"),
                              (9, lambda t: t * 2, "armed twice")]:
        forged = _refield(blob, chart, lambda f, k=field, g=twice: f.__setitem__(k, g(f[k])))
        with pytest.raises(sb.CorruptPosition, match=why):
            sb.Position.from_bytes(forged, chart)
    assert sb.Position.from_bytes(blob, chart).invocations


def test_params_that_do_not_fit_the_child_are_error_execution_in_the_parent(hostile):
    # the child's start refused its data with a SerializationError, which escaped the host call:
    # the parent's transition could never be taken
    child = ('<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="ecmascript">'
             '<datamodel><data id="p" expr="0"/></datamodel><state id="s"/></scxml>')
    chart = scxml(f"""<datamodel><data id="n" expr="0"/></datamodel>
      <state id="a">{CATCH}<transition event="go" target="b"><assign location="n" expr="1"/></transition></state>
      <state id="b">{CATCH}<invoke type="scxml"><param name="p" expr="(function () {{ var v = [];
        for (var i = 0; i &lt; 300; i++) v = [v]; return v; }})()"/><content>{child}</content></invoke></state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)])
    out.assert_error_execution("start data does not fit the ecmascript datamodel: values nest more than 256")
    assert out.raw["configuration"] == ["b"] and out.raw["datamodel"] == {"n": 1}
