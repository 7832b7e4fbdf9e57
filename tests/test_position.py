"""The position blob: exact round trips, identity, typed errors, migration and diff."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statebound as sb
from statebound import position as P
from statebound.position import ChartDiff, CodecUnavailable, MigrationError

FIXTURES = Path(__file__).parent / "fixtures"
CODECS = ("msgpack", "cbor")
NS = 'xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound"'

# ------------------------------------------------------------------ charts

SMALL = f"""<scxml {NS} name="small" initial="idle">
  <datamodel><data id="count" expr="0"/><data id="who" expr="'ann'"/></datamodel>
  <state id="idle"><transition event="go" target="work"/></state>
  <state id="work" initial="a">
    <state id="a"><transition event="next" target="b"><assign location="count" expr="count + 1"/></transition></state>
    <state id="b"><transition event="next" target="a"/></state>
    <transition event="stop" target="end"/>
  </state>
  <final id="end"/>
</scxml>"""

NESTED = f"""<scxml {NS} name="nested" initial="s1">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s1" initial="s11">
    <onentry><assign location="n" expr="n + 1"/></onentry>
    <state id="s11" initial="s111">
      <state id="s111"><transition event="a" target="s112"/></state>
      <state id="s112"><transition event="a" target="s12"/><transition event="b" target="s111"/></state>
    </state>
    <state id="s12"><transition event="b" target="s11"/><transition event="c" target="s2"/></state>
    <transition event="c" cond="n &gt; 3" target="done"/>
  </state>
  <state id="s2">
    <onentry><raise event="internal"/></onentry>
    <transition event="internal" type="internal" target="s21"/>
    <state id="s21"><transition event="a" target="s1"/><transition event="b" target="done"/></state>
  </state>
  <final id="done"/>
</scxml>"""

HISTORY = f"""<scxml {NS} name="history" initial="p">
  <parallel id="p">
    <history id="ph" type="shallow"><transition target="r1"/></history>
    <state id="r1" initial="r1a">
      <history id="r1h" type="deep"><transition target="r1a"/></history>
      <state id="r1a"><transition event="a" target="r1b"/></state>
      <state id="r1b" initial="r1b1">
        <state id="r1b1"><transition event="b" target="r1b2"/></state>
        <state id="r1b2"><transition event="b" target="r1b1"/></state>
      </state>
    </state>
    <state id="r2" initial="r2a">
      <history id="r2h" type="shallow"><transition target="r2a"/></history>
      <state id="r2a"><transition event="c" target="r2b"/></state>
      <state id="r2b"><transition event="c" target="r2a"/></state>
    </state>
    <transition event="out" target="away"/>
  </parallel>
  <state id="away">
    <transition event="deep" target="r1h"/>
    <transition event="shallow" target="r2h"/>
    <transition event="back" target="ph"/>
    <transition event="stop" target="fin"/>
  </state>
  <final id="fin"/>
</scxml>"""

DATA = f"""<scxml {NS} name="data" initial="collect">
  <datamodel>
    <data id="items" expr="[]"/>
    <data id="totals" expr="{{'count': 0, 'by': {{}}}}"/>
    <data id="blob" expr="b'\\x00\\x01'"/>
    <data id="ratio" expr="0.5"/>
  </datamodel>
  <state id="collect">
    <transition event="add">
      <script>items.append(_event.data); totals['count'] += 1</script>
      <assign location="totals['by'][str(len(items) % 3)]" expr="[len(items), None, True, -7, 1.25]"/>
    </transition>
    <transition event="bad"><assign location="missing.x" expr="1"/></transition>
    <transition event="close" cond="len(items) &gt; 2" target="closed"/>
    <transition event="error.execution"><assign location="ratio" expr="ratio * 3"/></transition>
  </state>
  <final id="closed"><donedata><param name="n" expr="len(items)"/></donedata></final>
</scxml>"""

TIMERS = f"""<scxml {NS} name="timers" initial="waiting">
  <datamodel><data id="pings" expr="0"/></datamodel>
  <state id="waiting">
    <sb:timeout name="idle" event="idle.timeout" after="30s"/>
    <sb:timeout name="hard" event="hard.timeout" afterexpr="'2m'"/>
    <onentry><send id="remind" event="remind" delay="5s"/></onentry>
    <transition event="ping"><assign location="pings" expr="pings + 1"/><send event="pong" delay="1s"/></transition>
    <transition event="idle.timeout"/>
    <transition event="hush"><cancel sendid="remind"/></transition>
    <transition event="remind" target="reminded"/>
    <transition event="hard.timeout" target="expired"/>
  </state>
  <state id="reminded">
    <sb:timeout event="again" after="1s"/>
    <transition event="again" target="waiting"/>
    <transition event="ping" target="waiting"/>
  </state>
  <final id="expired"/>
</scxml>"""

INVOKE = f"""<scxml {NS} name="invoker" initial="idle">
  <state id="idle"><transition event="call" target="calling"/></state>
  <state id="calling">
    <invoke id="worker" autoforward="true">
      <content>
        <scxml xmlns="http://www.w3.org/2005/07/scxml" initial="w"><state id="w"/></scxml>
      </content>
    </invoke>
    <invoke>
      <content>
        <scxml xmlns="http://www.w3.org/2005/07/scxml" initial="v"><state id="v"/></scxml>
      </content>
    </invoke>
    <transition event="done.invoke.worker" target="idle"/>
    <transition event="reply"><send event="ack" target="#_worker"/></transition>
    <transition event="hangup" target="idle"/>
  </state>
</scxml>"""

LATE = f"""<scxml {NS} name="late" initial="one" binding="late">
  <state id="one">
    <datamodel><data id="x" expr="1"/></datamodel>
    <transition event="next" target="two"/>
  </state>
  <state id="two">
    <datamodel><data id="y" expr="x + 1"/></datamodel>
    <transition event="next" target="one"><send event="up" target="#_parent"/></transition>
  </state>
</scxml>"""

SOURCES = {"nested": NESTED, "history": HISTORY, "data": DATA, "timers": TIMERS, "invoker": INVOKE,
           "late": LATE}
EVENTS = {
    "nested": ["a", "b", "c", "zzz"],
    "history": ["a", "b", "c", "out", "deep", "shallow", "back", "stop"],
    "data": [sb.Event("add", data={"sku": "x", "qty": 2}), sb.Event("add", data=[1, 2.5, None]), "bad", "close",
             sb.Event("add", data="plain")],
    "timers": ["ping", "idle.timeout", "hush", "remind", "again", "hard.timeout"],
    "invoker": ["call", "reply", "hangup", sb.Event("done.invoke.worker", invokeid="worker"),
                sb.Event("status", invokeid="worker", data={"ok": True}), "other"],
    "late": ["next", "other"],
}
_CHARTS: dict[str, sb.Chart] = {}


def chart(name: str) -> sb.Chart:
    """Compiled once per test session: identity and caches are per chart object."""
    if name not in _CHARTS:
        src = SMALL if name == "small" else SOURCES[name]
        _CHARTS[name] = sb.Chart.from_scxml(src, version="1")
    return _CHARTS[name]


def start(name: str, **kw):
    return sb.Interpreter(chart(name)).start(f"{name}-1", **kw)


def walk(name: str, events, **kw):
    """Every position a session passes through on ``events`` (stopping when it halts)."""
    it = sb.Interpreter(chart(name))
    if name == "late":  # an invoked child: parent and invokeid are part of the position
        kw = {"parent": "mom", "invokeid": "late.inv1", **kw}
    pos, _ = it.start(f"{name}-1", **kw)
    out = [pos]
    for ev in events:
        if not pos.running:
            break
        pos, _ = it.drive(pos, ev)
        out.append(pos)
    return out


def roundtrip(pos, codec):
    return sb.Position.from_bytes(pos.to_bytes(codec), pos.chart)


def small_pos():
    it = sb.Interpreter(chart("small"))
    pos, _ = it.start("order-1")
    for ev in ("go", "next"):
        pos, _ = it.drive(pos, ev)
    return pos


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_round_trip_is_exact(name, codec):
    for pos in walk(name, EVENTS[name] * 2):
        back = roundtrip(pos, codec)
        assert back == pos
        assert back.configuration == pos.configuration
        assert dict(back.datamodel) == dict(pos.datamodel)
        for f in sb.Position.PER_DRIVER_FIELDS:
            assert getattr(back, f) is None


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_field(codec):
    """A position with every optional field set (hand-made, on a chart that allows it)."""
    c = chart("timers")
    pos, _ = sb.Interpreter(c).start("child-7", parent="mom", invokeid="kid.inv3")
    waiting = c.index_of("waiting")
    pos = dataclasses.replace(pos, status="cancelled", macrostep=2**40, send_counter=3, ordinal=300,
                              invoke_counter=9, initialized=(0, waiting),
                              timeouts=(sb.interpreter.ArmedTimeout(waiting, "idle", 299, "custom-id", 1_700_000_000_000),
                                        sb.interpreter.ArmedTimeout(waiting, "hard", 300, "sb.timeout.waiting.hard")))
    back = roundtrip(pos, codec)
    assert back == pos
    assert back.parent == "mom" and back.invokeid == "kid.inv3" and back.status == "cancelled"


@pytest.mark.parametrize("codec", CODECS)
def test_per_driver_fields_are_not_stored(codec):
    pos = small_pos().restamp(routes=lambda sid: True, ioprocessors={"x": {}}, callbacks=object())
    back = roundtrip(pos, codec)
    assert back == pos
    assert (back.routes, back.ioprocessors, back.callbacks) == (None, None, None)
    assert pos.to_bytes(codec) == small_pos().to_bytes(codec)


def test_small_chart_blob_is_small():
    """5 states, 2 variables: the brief's budget is 300 bytes with msgpack."""
    c = chart("small")
    assert len(c.state_ids) == 5 and len(small_pos().datamodel) == 2
    sizes = {codec: len(small_pos().to_bytes(codec)) for codec in CODECS}
    assert sizes["msgpack"] <= 300, sizes
    assert sizes["msgpack"] <= 100, sizes  # what it actually is (77): catch regressions early


def test_layout_header():
    pos = small_pos()
    blob = pos.to_bytes()
    assert blob[:4] == b"SB\x00P" and blob[4] == 1 and blob[5:6] == b"m"
    assert blob[6:38].hex() == pos.chart.identity.removeprefix("sha256:")
    assert blob[38] == len("small") and blob[39:44] == b"small"
    assert blob[44:46] == b"\x021"  # version "1": length + 1, then the bytes
    fields = msgpack.unpackb(blob[46:])
    assert fields[0] == "order-1" and fields[1] == 0
    assert fields[2] == list(pos.states)
    assert fields[3] == pos.data  # msgpack embeds the datamodel bytes raw
    h = P.read_header(blob)
    assert (h.version, h.codec, h.identity, h.name, h.chart_version, h.payload_offset) == \
        (1, "msgpack", pos.chart.identity, "small", "1", 46)
    assert P.read_header(pos.to_bytes("cbor")).codec == "cbor"


def test_no_chart_version_and_unicode_name():
    c = sb.Chart.from_scxml(SMALL, name="épicerie-" + "x" * 200)
    pos, _ = sb.Interpreter(c).start("s")
    for codec in CODECS:
        blob = pos.to_bytes(codec)
        h = P.read_header(blob)
        assert h.chart_version is None and h.name == c.name
        assert sb.Position.from_bytes(blob, c) == pos
        assert sb.Position.from_bytes(bytearray(blob), c) == pos
        assert sb.Position.from_bytes(memoryview(blob), c) == pos


def test_unknown_codec_is_a_serialization_error():
    with pytest.raises(sb.SerializationError, match="unknown codec"):
        small_pos().to_bytes("json")


def test_cbor_missing_names_the_extra(monkeypatch):
    blob = small_pos().to_bytes("cbor")
    monkeypatch.setitem(sys.modules, "cbor2", None)  # makes `import cbor2` fail
    with pytest.raises(sb.SerializationError, match=r"statebound\[cbor\]"):
        small_pos().to_bytes("cbor")
    with pytest.raises(sb.PositionError, match=r"statebound\[cbor\]") as ei:
        sb.Position.from_bytes(blob, chart("small"))
    assert isinstance(ei.value, CodecUnavailable)
    # msgpack never needs cbor2
    assert roundtrip(small_pos(), "msgpack") == small_pos()


# ------------------------------------------------------------------ property: decoded drives alike

_event_lists = {name: st.lists(st.sampled_from(evs), max_size=12) for name, evs in EVENTS.items()}


@st.composite
def sessions(draw):
    name = draw(st.sampled_from(sorted(SOURCES)))
    return name, draw(_event_lists[name]), draw(st.lists(st.sampled_from(EVENTS[name]), min_size=1, max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from(CODECS))
def test_decoded_position_drives_identically(session, codec):
    name, events, probe = session
    it = sb.Interpreter(chart(name))
    for pos in walk(name, events):
        back = roundtrip(pos, codec)
        assert back == pos
        a, b = pos, back
        for ev in probe:
            if not a.running:
                assert not b.running
                break
            a, ea = it.drive(a, ev)
            b, eb = it.drive(b, ev)
            assert a == b
            assert ea == eb
            assert a.to_bytes(codec) == b.to_bytes(codec)


# ------------------------------------------------------------------ identity


def test_identity_ignores_whitespace_and_comments():
    noisy = SMALL.replace("<state id=\"idle\">", "<!-- the idle state -->\n\n   <state   id=\"idle\" >") \
                 .replace("\n", "\n\n    ")
    assert noisy != SMALL
    c2 = sb.Chart.from_scxml(noisy, version="1")
    assert c2.identity == chart("small").identity
    blob = small_pos().to_bytes()
    assert sb.Position.from_bytes(blob, c2) == small_pos()


def test_identity_changes_with_a_transition_target():
    changed = SMALL.replace('<transition event="next" target="a"/>', '<transition event="next" target="idle"/>')
    c2 = sb.Chart.from_scxml(changed, version="1")
    assert c2.identity != chart("small").identity
    with pytest.raises(sb.ChartIdentityMismatch):
        sb.Position.from_bytes(small_pos().to_bytes(), c2)


@pytest.mark.parametrize("codec", CODECS)
def test_wrong_chart_reports_both_triples(codec):
    other = chart("nested")
    with pytest.raises(sb.ChartIdentityMismatch) as ei:
        sb.Position.from_bytes(small_pos().to_bytes(codec), other)
    assert ei.value.expected == (other.identity, "nested", "1")
    assert ei.value.found == (chart("small").identity, "small", "1")
    assert "small" in str(ei.value) and "nested" in str(ei.value)


def test_name_and_version_labels_are_not_the_identity():
    """Relabelling a chart (same document) keeps its blobs loadable; identity is the rule."""
    c2 = sb.Chart.from_scxml(SMALL, name="renamed", version="2")
    assert sb.Position.from_bytes(small_pos().to_bytes(), c2) == small_pos()


# ------------------------------------------------------------------ typed errors


def _header_and_fields(pos):
    blob = pos.to_bytes()
    off = P.read_header(blob).payload_offset
    return blob[:off], msgpack.unpackb(blob[off:])


def _with_fields(pos, fields):
    head, _ = _header_and_fields(pos)
    return head + msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize("twin", [True, 1.0, "x"])
def test_a_configuration_checked_before_is_remembered_only_for_exact_ints(twin):
    """Decoding remembers the configurations it found legal on a chart; a hostile blob
    whose states only hash like a remembered one (True and 1.0 equal 1) is still refused,
    and so is a remembered configuration under the other status."""
    pos = sb.Interpreter(chart("small")).start("order-1")[0]
    sb.Position.from_bytes(pos.to_bytes(), chart("small"))     # remembered now
    _head, fields = _header_and_fields(pos)
    legal = list(fields[2])
    assert legal[0] == 1          # so True and 1.0 in its place hash like the remembered tuple
    fields[2] = [twin, *legal[1:]]
    with pytest.raises(sb.CorruptPosition):
        sb.Position.from_bytes(_with_fields(pos, fields), chart("small"))
    fields[2] = legal
    assert sb.Position.from_bytes(_with_fields(pos, fields), chart("small")) == pos
    fields[1] = 1   # done: a halted session may keep its configuration, so still legal
    assert sb.Position.from_bytes(_with_fields(pos, fields), chart("small")).status == "done"
    fields[1], fields[2] = 0, []   # running with no state: refused even after those
    with pytest.raises(sb.CorruptPosition):
        sb.Position.from_bytes(_with_fields(pos, fields), chart("small"))


@pytest.mark.parametrize("blob", [b"", b"SB", b"PK\x03\x04" + b"\x00" * 60, b'{"json": 1}', b"sb\x00P\x01m"])
def test_not_a_position(blob):
    with pytest.raises(sb.NotAPosition):
        sb.Position.from_bytes(blob, chart("small"))


@pytest.mark.parametrize("obj", [None, "SB\x00P", 42, ["SB"]])
def test_not_bytes_is_not_a_position(obj):
    with pytest.raises(sb.NotAPosition):
        sb.Position.from_bytes(obj, chart("small"))


def test_unsupported_format_version_checked_before_identity():
    blob = bytearray(small_pos().to_bytes())
    blob[4] = 9
    with pytest.raises(sb.UnsupportedFormatVersion) as ei:
        sb.Position.from_bytes(bytes(blob), chart("nested"))  # wrong chart too: version wins
    assert ei.value.version == 9 and ei.value.supported == (1,)
    blob[4] = 0
    with pytest.raises(sb.UnsupportedFormatVersion):
        sb.Position.from_bytes(bytes(blob), chart("small"))


def test_upgrade_chain_runs_old_versions(monkeypatch):
    """Simulate the day v2 exists: a v1 blob is read through ``_upgrade_v1``."""
    seen = []

    def _upgrade_v1(fields):
        seen.append(list(fields))
        return fields

    monkeypatch.setattr(P, "FORMAT_VERSION", 2)
    monkeypatch.setattr(P, "READABLE_VERSIONS", frozenset({1, 2}))
    monkeypatch.setitem(P._UPGRADERS, 1, _upgrade_v1)
    blob = b"SB\x00P\x01" + small_pos().to_bytes()[5:]
    assert sb.Position.from_bytes(blob, chart("small")) == small_pos()
    assert seen and seen[0][0] == "order-1"


def test_truncated_at_every_length_is_a_position_error():
    for codec in CODECS:
        blob = walk("timers", ["ping", "remind"])[-1].to_bytes(codec)
        for n in range(len(blob)):
            with pytest.raises(sb.PositionError) as ei:
                sb.Position.from_bytes(blob[:n], chart("timers"))
            assert type(ei.value) in (sb.NotAPosition, sb.CorruptPosition), n


def test_extra_bytes_are_corrupt():
    with pytest.raises(sb.CorruptPosition):
        sb.Position.from_bytes(small_pos().to_bytes() + b"\x00", chart("small"))


def test_unknown_codec_tag_is_corrupt():
    blob = bytearray(small_pos().to_bytes())
    blob[5] = ord("j")
    with pytest.raises(sb.CorruptPosition, match="codec"):
        sb.Position.from_bytes(bytes(blob), chart("small"))


def _corrupt(name, mutate, events=(), match=None):
    pos = walk(name, events)[-1]
    _, fields = _header_and_fields(pos)
    fields = fields + [None] * (len(P._V1_FIELDS) - len(fields))
    mutate(fields, pos.chart)
    with pytest.raises(sb.CorruptPosition, match=match):
        sb.Position.from_bytes(_with_fields(pos, fields), pos.chart)


def _idx(c, *ids):
    return [c.index_of(i) for i in ids]


@pytest.mark.parametrize("mutate,match", [
    (lambda f, c: f.__setitem__(0, 7), "session_id"),
    (lambda f, c: f.__setitem__(1, 5), "status"),
    (lambda f, c: f.__setitem__(1, "running"), "status"),
    (lambda f, c: f.__setitem__(2, "s1"), "array"),
    (lambda f, c: f.__setitem__(2, [99]), "out of range"),
    (lambda f, c: f.__setitem__(2, [0]), "out of range"),
    (lambda f, c: f.__setitem__(2, [-1]), "out of range"),
    (lambda f, c: f.__setitem__(2, [True]), "out of range"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s11", "s1", "s111")), "without its parent"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s1", "s1", "s11", "s111")), "document order"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s11", "s111")), "without its parent"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s1")), "0 active children"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s1", "s11", "s111", "s12")), "2 active children"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s1", "s11", "s111", "s112")), "2 active children"),
    (lambda f, c: f.__setitem__(2, _idx(c, "s1", "s11", "s111", "s2", "s21")), "exactly one top-level"),
    (lambda f, c: f.__setitem__(2, []), "exactly one top-level"),
    (lambda f, c: f.__setitem__(3, "not bytes"), "datamodel"),
    (lambda f, c: f.__setitem__(3, b"\x93\x01\x02\x03"), "datamodel"),
    (lambda f, c: f.__setitem__(3, b"\x81\x01\x02"), "datamodel"),
    (lambda f, c: f.__setitem__(3, b"\xc1"), "payload"),
    (lambda f, c: f.__setitem__(4, -1), "macrostep"),
    (lambda f, c: f.__setitem__(5, 1.5), "send_counter"),
    (lambda f, c: f.__setitem__(6, False), "ordinal"),
    (lambda f, c: f.__setitem__(8, 3), "history"),
    (lambda f, c: f.__setitem__(12, 1), "parent"),
    (lambda f, c: f.__setitem__(13, b"x"), "invokeid"),
    (lambda f, c: f.append(None), "fields"),
    (lambda f, c: f.__delitem__(slice(2, None)), "fields"),
])
def test_crafted_corrupt_fields(mutate, match):
    _corrupt("nested", mutate, match=match)


def test_parallel_without_all_regions():
    def m(f, c):
        f[2] = [s for s in f[2] if not (c.index_of("r2") <= s <= c.index_of("r2b"))]
    _corrupt("history", m, match="regions active")


@pytest.mark.parametrize("mutate,match", [
    (lambda f, c: f.__setitem__(8, [[c.index_of("r1"), [c.index_of("r1a")]]]), "not a history state"),
    (lambda f, c: f.__setitem__(8, [[99, []]]), "not a history state"),
    (lambda f, c: f.__setitem__(8, [[c.index_of("r1h")]]), "history entry"),
    (lambda f, c: f.__setitem__(8, [[c.index_of("r1h"), [c.index_of("r2a")]]]), "not a descendant"),
    (lambda f, c: f.__setitem__(8, [[c.index_of("r1h"), [c.index_of("r1b")]]]), "cannot record"),
    (lambda f, c: f.__setitem__(8, [[c.index_of("r2h"), [c.index_of("r2h")]]]), "cannot record"),
    (lambda f, c: f.__setitem__(8, [[c.index_of("ph"), [c.index_of("r1a")]]]), "cannot record"),
    (lambda f, c: f.__setitem__(8, [[c.index_of("r2h"), [c.index_of("r2a")]],
                                          [c.index_of("r1h"), [c.index_of("r1a")]]]), "out of order"),
])
def test_crafted_corrupt_history(mutate, match):
    _corrupt("history", mutate, events=["a", "out"], match=match)


@pytest.mark.parametrize("mutate,match", [
    (lambda f, c: f.__setitem__(10, [["worker", c.index_of("idle"), 0, True]]), "not active"),
    (lambda f, c: f.__setitem__(10, [["worker", c.index_of("calling"), 2, True]]), "no invoke #2"),
    (lambda f, c: f.__setitem__(10, [["worker", c.index_of("calling"), 0, 1]]), "autoforward"),
    (lambda f, c: f.__setitem__(10, [[1, c.index_of("calling"), 0, True]]), "invokeid"),
    (lambda f, c: f.__setitem__(10, [["worker", c.index_of("calling")]]), "invocation entry"),
])
def test_crafted_corrupt_invocations(mutate, match):
    _corrupt("invoker", mutate, events=["call"], match=match)


@pytest.mark.parametrize("mutate,match", [
    (lambda f, c: f.__setitem__(9, [[c.index_of("reminded"), "idle", 1]]), "not active"),
    (lambda f, c: f.__setitem__(9, [[c.index_of("waiting"), "nope", 1]]), "no timeout named"),
    (lambda f, c: f.__setitem__(9, [[c.index_of("waiting"), "idle", 10**6]]), "ordinal"),
    (lambda f, c: f.__setitem__(9, [[c.index_of("waiting"), "idle", 1, 5]]), "send_id"),
    (lambda f, c: f.__setitem__(9, [[c.index_of("waiting"), "idle", 1, None, "soon"]]), "at_ms"),
    (lambda f, c: f.__setitem__(9, [[c.index_of("waiting")]]), "timeout entry"),
])
def test_crafted_corrupt_timeouts(mutate, match):
    _corrupt("timers", mutate, match=match)


def test_crafted_corrupt_initialized():
    _corrupt("late", lambda f, c: f.__setitem__(11, [2, 1]), match="initialized")
    _corrupt("late", lambda f, c: f.__setitem__(11, [50]), match="initialized")


def test_halted_positions_round_trip_and_keep_their_configuration():
    pos = walk("nested", ["a", "a", "c", "b"])[-1]
    assert pos.status == "done" and "done" in pos.configuration
    for codec in CODECS:
        assert roundtrip(pos, codec) == pos
    # a halted configuration may be empty, but never two children of one compound
    assert roundtrip(dataclasses.replace(pos, status="cancelled", states=()), "msgpack").states == ()
    c = pos.chart
    bad = dataclasses.replace(pos, states=tuple(_idx(c, "s1", "s11", "s12")))
    with pytest.raises(sb.CorruptPosition, match="two active children"):
        roundtrip(bad, "msgpack")


def test_cbor_corrupt_datamodel():
    import cbor2
    pos = small_pos()
    blob = pos.to_bytes("cbor")
    off = P.read_header(blob).payload_offset
    fields = cbor2.loads(blob[off:])
    for bad in ([1, 2], {1: 2}, {"x": cbor2.CBORTag(4242, 1)}, {"x": {1, 2}}, "str"):
        fields[3] = bad
        with pytest.raises(sb.CorruptPosition, match="datamodel"):
            sb.Position.from_bytes(blob[:off] + cbor2.dumps(fields), pos.chart)


def test_huge_claimed_lengths_fail_fast():
    pos = small_pos()
    head, _ = _header_and_fields(pos)
    for payload in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\x91" * 100_000):
        with pytest.raises(sb.CorruptPosition):
            sb.Position.from_bytes(head + payload, pos.chart)
    chead = pos.to_bytes("cbor")[:len(head)]
    for payload in (b"\x9b\x00\x00\x00\x01\x00\x00\x00\x00", b"\x81" * 100_000, b"\xd8\x1c\x81\xd8\x1d\x00"):
        with pytest.raises(sb.CorruptPosition):
            sb.Position.from_bytes(chead + payload, pos.chart)
    # and in the header: a name length claiming 4 GB
    with pytest.raises(sb.CorruptPosition):
        sb.Position.from_bytes(head[:38] + b"\xff\xff\xff\xff\x0f", pos.chart)


# ------------------------------------------------------------------ the v1 fixture, forever


def test_v1_fixture_stays_readable():
    """Never regenerate this blob: it is what v1 writers produced. If it stops loading,
    the change broke every stored position (write an upgrader instead)."""
    c = sb.Chart.from_file(FIXTURES / "v1_order.scxml", version="1")
    blob = (FIXTURES / "v1_order.bin").read_bytes()
    pos = sb.Position.from_bytes(blob, c)
    assert pos.session_id == "order-42" and pos.status == "running"
    assert pos.configuration == {"active", "paying", "card"}
    assert dict(pos.datamodel) == {"amount": 125, "items": ["book", "pen"], "attempts": 1,
                                   "meta": {"currency": "EUR", "rush": True}}
    assert [t.name for t in pos.timeouts] == ["payment"]
    assert pos.history and pos.macrostep == 5
    pos2, effects = sb.Interpreter(c).drive(pos, sb.Event("paid", data={"ref": "r-1"}))
    assert pos2.configuration == {"active", "shipping"}
    assert pos2.datamodel["attempts"] == 1
    assert any(isinstance(e, sb.effects.Cancel) for e in effects)  # leaving 'paying' cancels its timeout
    for codec in CODECS:
        assert roundtrip(pos, codec) == pos
    cblob = (FIXTURES / "v1_order.cbor.bin").read_bytes()
    assert sb.Position.from_bytes(cblob, c) == pos


# ------------------------------------------------------------------ export / import / diff

ORDER_V1 = f"""<scxml {NS} name="order" initial="pending">
  <datamodel><data id="amount" expr="0"/></datamodel>
  <state id="pending"><transition event="pay" target="paying"/></state>
  <state id="paying" initial="card">
    <history id="payhist" type="shallow"><transition target="card"/></history>
    <state id="card"><transition event="switch" target="wire"/></state>
    <state id="wire"/>
    <transition event="paid" target="shipped"/>
  </state>
  <final id="shipped"/>
</scxml>"""

# v2: a review state added, "wire" renamed to "bank", pending now invokes nothing new.
ORDER_V2 = ORDER_V1.replace('<state id="wire"/>', '<state id="bank"/>').replace(
    'target="wire"', 'target="bank"').replace(
    '<final id="shipped"/>', '<state id="review"><transition event="ok" target="shipped"/></state>\n'
    '  <final id="shipped"/>').replace('<datamodel>', '<datamodel><data id="note" expr="None"/>')
ORDER_V2_ADDED = ORDER_V1.replace('<final id="shipped"/>',
                                  '<state id="review"/>\n  <final id="shipped"/>')


def _order(src, version):
    return sb.Chart.from_scxml(src, version=version)


def test_export_shape():
    c = _order(ORDER_V1, "1")
    it = sb.Interpreter(c)
    pos, _ = it.start("o-1", data={"amount": 5})
    pos, _ = it.drive(pos, "pay")
    exp = pos.export()
    assert exp == {
        "format": 1, "chart": {"name": "order", "version": "1", "identity": c.identity},
        "session_id": "o-1", "status": "running", "configuration": ["paying", "card"], "history": {},
        "datamodel": {"amount": 5},
        "counters": {"macrostep": 1, "send_counter": 0, "ordinal": 0, "invoke_counter": 0},
        "invocations": [], "timeouts": [], "parent": None, "invokeid": None, "initialized": [],
    }
    assert sb.Position.import_(exp, c) == pos


def test_import_across_an_added_state():
    old, new = _order(ORDER_V1, "1"), _order(ORDER_V2_ADDED, "2")
    assert sb.diff(old, new).kind == "compatible"
    it = sb.Interpreter(old)
    pos, _ = it.start("o-1")
    pos, _ = it.drive(pos, "pay")
    moved = sb.Position.import_(pos.export(), new)
    assert moved.configuration == {"paying", "card"}
    assert moved.chart is new
    with pytest.raises(sb.ChartIdentityMismatch):
        sb.Position.from_bytes(pos.to_bytes(), new)
    assert sb.Position.from_bytes(moved.to_bytes(), new) == moved
    moved2, _ = sb.Interpreter(new).drive(moved, "paid")
    assert moved2.status == "done"


def test_import_renamed_state_needs_mapping_and_lists_every_unknown_id():
    old, new = _order(ORDER_V1, "1"), _order(ORDER_V2, "2")
    it = sb.Interpreter(old)
    pos, _ = it.start("o-1")
    for ev in ("pay", "switch"):
        pos, _ = it.drive(pos, ev)
    exp = pos.export()
    exp["history"] = {"payhist": ["wire"]}
    exp["configuration"] += ["ghost"]
    with pytest.raises(MigrationError) as ei:
        sb.Position.import_(exp, new)
    assert isinstance(ei.value, sb.PositionError)
    assert ei.value.unknown_ids == ("wire", "ghost")  # all at once, in the order met
    assert "'wire'" in str(ei.value) and "'ghost'" in str(ei.value)

    exp = pos.export()
    moved = sb.Position.import_(P.remap(exp, {"wire": "bank"}), new)
    assert moved.configuration == {"paying", "bank"}
    assert P.import_(exp, new, mapping={"wire": "bank"}) == moved
    assert sb.Interpreter(new).drive(moved, "paid")[0].status == "done"


def test_import_checks_legality_on_the_new_chart():
    old = _order(ORDER_V1, "1")
    # v3 turns "card" into a compound state: an old position in "card" would have no child
    v3 = ORDER_V1.replace('<state id="card"><transition event="switch" target="wire"/></state>',
                          '<state id="card" initial="visa"><state id="visa"/><state id="amex"/>'
                          '<transition event="switch" target="wire"/></state>')
    new = _order(v3, "3")
    pos, _ = sb.Interpreter(old).start("o-1")
    pos, _ = sb.Interpreter(old).drive(pos, "pay")
    with pytest.raises(MigrationError, match="compound state 'card' has 0 active children"):
        sb.Position.import_(pos.export(), new)
    d = sb.diff(old, new)
    assert d.kind == "breaking" and any("changed kind" in r for r in d.reasons)


def test_import_rejects_malformed_exports():
    c = _order(ORDER_V1, "1")
    good = sb.Position.export(sb.Interpreter(c).start("o")[0])
    with pytest.raises(sb.UnsupportedFormatVersion):
        sb.Position.import_({**good, "format": 7}, c)
    for bad in ({**good, "status": "sleeping"}, {**good, "session_id": 3},
                {k: v for k, v in good.items() if k != "configuration"},
                {**good, "counters": {"ordinal": -2}}, {**good, "datamodel": {"s": {1, 2}}}, "nope"):
        with pytest.raises(MigrationError):
            sb.Position.import_(bad, c)


def test_diff_kinds():
    v1 = _order(ORDER_V1, "1")
    assert sb.diff(v1, _order(ORDER_V1.replace("\n", "\n\n"), "1b")) == ChartDiff("identical", ())
    added = sb.diff(v1, _order(ORDER_V2_ADDED, "2"))
    assert added.kind == "compatible" and added.migratable
    assert any("'review' is new" in r for r in added.reasons)

    renamed = _order(ORDER_V2, "2")
    broken = sb.diff(v1, renamed)
    assert broken.kind == "breaking" and not broken.migratable
    assert any("'wire' is gone" in r for r in broken.reasons)
    mapped = sb.diff(v1, renamed, mapping={"wire": "bank"})
    assert mapped.kind == "mapped"
    assert any("'wire' becomes 'bank'" in r for r in mapped.reasons)
    assert any("note" in r for r in mapped.reasons)  # new <data> is called out

    # a mapping that is not needed still yields "compatible"
    assert sb.diff(v1, _order(ORDER_V2_ADDED, "2"), mapping={}).kind == "compatible"
    # mapping to a missing state, or from a state that never existed
    assert sb.diff(v1, renamed, mapping={"wire": "nowhere"}).kind == "breaking"
    assert sb.diff(v1, renamed, mapping={"wire": "bank", "zzz": "bank"}).kind == "breaking"
    # moving a state under another parent is breaking
    moved = ORDER_V1.replace('<state id="wire"/>', '').replace(
        '<final id="shipped"/>', '<state id="wire"/><final id="shipped"/>')
    d = sb.diff(v1, _order(moved, "4"))
    assert d.kind == "breaking" and any("moved" in r for r in d.reasons)


def test_diff_flags_new_parallel_region():
    old = sb.Chart.from_scxml(HISTORY)
    new = sb.Chart.from_scxml(HISTORY.replace('<transition event="out" target="away"/>',
                                              '<state id="r3"/><transition event="out" target="away"/>'))
    d = sb.diff(old, new)
    assert d.kind == "breaking" and any("gained region" in r for r in d.reasons)


def test_history_deep_and_shallow_differ_in_diff():
    old = sb.Chart.from_scxml(HISTORY)
    new = sb.Chart.from_scxml(HISTORY.replace('id="r1h" type="deep"', 'id="r1h" type="shallow"'))
    assert sb.diff(old, new).kind == "breaking"


def test_public_names_have_docstrings():
    for name in P.__all__:
        obj = getattr(P, name)
        if callable(obj) and not isinstance(obj, type(P.CODECS)):
            assert obj.__doc__, name
    assert sb.diff is P.diff
