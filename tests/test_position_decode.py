"""The decode hot path: what ``from_bytes`` checks on every cold decode, and the shape of what it builds."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

import statebound as sb
from statebound import position as P
from statebound.interpreter.state import make_position

NS = 'xmlns="http://www.w3.org/2005/07/scxml"'


def _chart(datamodel: str) -> sb.Chart:
    return sb.Chart.from_scxml(f"""<scxml {NS} name="memo" datamodel="{datamodel}" initial="a">
      <datamodel><data id="x" expr="1"/></datamodel>
      <state id="a"><transition event="go" target="b"/></state><state id="b"/></scxml>""")


def _blob(chart: sb.Chart, values) -> bytes:
    """A blob of a fresh session on ``chart`` holding datamodel ``values`` (however hostile)."""
    pos, _ = sb.Interpreter(chart).start("s-1")
    forged = make_position(chart, pos.session_id, pos.status, pos.states, pos.history,
                           msgpack.packb(values, use_bin_type=True, datetime=False), pos.macrostep,
                           pos.send_counter, pos.ordinal, pos.invoke_counter, pos.invocations, pos.initialized,
                           pos.parent, pos.invokeid, pos.timeouts)
    return forged.to_bytes()


@pytest.fixture
def checks(monkeypatch):
    """Every datamodel check ``from_bytes`` runs, by the values it checked."""
    seen: list = []
    real = P._check_vars

    def counting(values, chart):
        seen.append(values)
        return real(values, chart)
    monkeypatch.setattr(P, "_check_vars", counting)
    return seen


def test_every_cold_decode_checks_its_datamodel(checks):
    # No memo of datamodel bytes: sessions rarely share identical values, so a memo would
    # pay off only in benchmarks; a damaged or forged datamodel is refused every time.
    py = _chart("python")
    blob = _blob(py, {"x": 1})
    first = sb.Position.from_bytes(blob, py)
    again = sb.Position.from_bytes(blob, py)
    assert again == first and checks == [{"x": 1}, {"x": 1}]


def test_bytes_legal_on_one_datamodel_are_refused_on_another():
    values = {"x": b"raw bytes"}   # a python value no ecmascript datamodel holds
    py, js = _chart("python"), _chart("ecmascript")
    assert sb.Position.from_bytes(_blob(py, values), py).datamodel["x"] == b"raw bytes"
    for _ in range(2):
        with pytest.raises(sb.CorruptPosition, match="does not fit"):
            sb.Position.from_bytes(_blob(js, values), js)
    with pytest.raises(sb.CorruptPosition):
        sb.Position.from_bytes(_blob(py, {"_event": 1}), py)


@pytest.mark.parametrize("codec", ["msgpack", "cbor"])
def test_a_decoded_position_holds_tuples_and_hashes_like_the_original(codec):
    chart = sb.Chart.from_scxml(f"""<scxml {NS} name="h" initial="p">
      <state id="p" initial="p1"><history id="ph" type="deep"><transition target="p1"/></history>
        <state id="p1"><transition event="a" target="p2"/></state><state id="p2"/>
        <transition event="out" target="q"/></state>
      <state id="q"><transition event="back" target="ph"/></state></scxml>""")
    it = sb.Interpreter(chart)
    pos, _ = it.start("h-1")
    for ev in ("a", "out"):
        pos, _ = it.drive(pos, ev)
    assert pos.history
    back = sb.Position.from_bytes(pos.to_bytes(codec), chart)
    assert back == pos and hash(back) == hash(pos)
    assert type(back.states) is tuple and type(back.history) is tuple
    assert all(type(h) is tuple and type(h[1]) is tuple for h in back.history)
    assert type(back.initialized) is tuple and type(back.timeouts) is tuple and type(back.invocations) is tuple


def test_restamp_is_replace_and_keeps_a_position_that_already_carries_the_values():
    pos, _ = sb.Interpreter(_chart("python")).start("s-1")
    routes, iop = (lambda sid: True), {"x": {}}
    stamped = pos.restamp(routes=routes, ioprocessors=iop, invokers=frozenset({"t"}))
    assert stamped == dataclasses.replace(pos, routes=routes, ioprocessors=iop, invokers=frozenset({"t"}))
    assert (stamped.routes, stamped.ioprocessors, stamped.callbacks) == (routes, iop, None)
    assert pos.routes is None and pos.ioprocessors is None                  # the original is untouched
    assert stamped.restamp(routes=routes, ioprocessors=iop, invokers=stamped.invokers) is stamped
    bare = stamped.restamp()
    assert bare is not stamped and bare == pos and bare.routes is None and bare.invokers is None
    assert bare.restamp() is bare


def test_a_failed_encode_leaves_nothing_behind_for_the_next():
    pos, _ = sb.Interpreter(_chart("python")).start("s-1")
    good = pos.to_bytes()
    for bad in (dataclasses.replace(pos, data=object()), dataclasses.replace(pos, session_id="\udc80")):
        with pytest.raises(sb.SerializationError, match="cannot be encoded"):
            bad.to_bytes()
        assert pos.to_bytes() == good
    head = P.read_header(good).payload_offset
    assert msgpack.unpackb(good[head:], use_list=True) == ["s-1", 0, list(pos.states), pos.data]


@pytest.mark.parametrize("codec", ["msgpack", "cbor"])
def test_trailing_defaults_are_left_out_up_to_the_last_field_set(codec):
    pos, _ = sb.Interpreter(_chart("python")).start("s-1")
    pos = dataclasses.replace(pos, data=b"")
    head = P.read_header(pos.to_bytes(codec)).payload_offset
    load = msgpack.unpackb if codec == "msgpack" else __import__("cbor2").loads
    sizes = {}
    for field, value in [(None, None), ("macrostep", 1), ("send_counter", 1), ("ordinal", 1),
                         ("invoke_counter", 1), ("initialized", (0,)), ("parent", "mom"), ("invokeid", "k.1")]:
        p = dataclasses.replace(pos, **{field: value}) if field else pos
        fields = load(p.to_bytes(codec)[head:])
        sizes[field] = len(fields)
        assert sb.Position.from_bytes(p.to_bytes(codec), p.chart) == p
    assert sizes == {None: 3, "macrostep": 5, "send_counter": 6, "ordinal": 7, "invoke_counter": 8,
                     "initialized": 12, "parent": 13, "invokeid": 14}


def test_the_cached_header_path_decodes_what_the_checked_path_does():
    py = _chart("python")
    pos, _ = sb.Interpreter(py).start("s-1")
    blob = pos.to_bytes()
    assert py._caches.get(P._MSGPACK_HEADER_KEY) == blob[:P.read_header(blob).payload_offset]
    for form in (blob, bytearray(blob), memoryview(blob)):
        assert sb.Position.from_bytes(form, py) == pos
    other = _chart("python")      # the same source: the same identity, its own caches
    assert other._caches.get(P._MSGPACK_HEADER_KEY) is None
    assert sb.Position.from_bytes(blob, other) == pos
    with pytest.raises(sb.CorruptPosition):                  # the header matches, the payload does not
        sb.Position.from_bytes(blob + b"\xc1", py)


def test_a_cbor_blob_with_bytes_after_its_payload_is_corrupt():
    """cbor2.loads read the first item and ignored the rest: a cbor blob with trailing
    bytes loaded, where the msgpack one was refused (docs/persistence.md: extra bytes)."""
    pytest.importorskip("cbor2")
    chart = sb.Chart.from_scxml('<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"><state id="a"/></scxml>')
    pos, _ = sb.Interpreter(chart).start("s")
    blob = pos.to_bytes("cbor")
    assert sb.Position.from_bytes(blob, chart).configuration == {"a"}
    for tail in (b"\x00", b"\xff", b"\x01\x02"):
        with pytest.raises(sb.CorruptPosition, match="extra byte"):
            sb.Position.from_bytes(blob + tail, chart)
