"""The host's table of decoded positions (``host/decoded.py``): a load of the very bytes
this host wrote skips decoding; any other bytes are decoded and checked as before."""

from __future__ import annotations

import pytest

import statebound as sb
from statebound.exceptions import CorruptPosition
from statebound.host.decoded import DecodedPositions
from statebound.host.store import Commit, PositionWrite
from statebound.interpreter import Position

T0 = 1_700_000_000_000
COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
       name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><transition event="inc"><assign location="n" expr="n + 1"/></transition></state>
</scxml>"""


@pytest.fixture
def decodes(monkeypatch):
    """How many blobs were decoded (``Position.from_bytes`` calls)."""
    calls = []
    orig = Position.from_bytes.__func__

    def counting(cls, blob, chart):
        calls.append(blob)
        return orig(cls, blob, chart)
    monkeypatch.setattr(Position, "from_bytes", classmethod(counting))
    return calls


def _host(store, **kw):
    return sb.Host([sb.Chart.from_scxml(COUNTER)], store=store, clock=sb.ManualClock(T0), **kw)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_hot_instance_is_decoded_once(kind, tmp_path, decodes):
    store = sb.MemoryStore() if kind == "memory" else sb.SQLiteStore(tmp_path / "d.db")
    host = _host(store)
    host.start("counter", "c")
    for _ in range(5):
        host.send("c", "inc")
    host.send_many([("c", "inc")] * 3)
    assert host.get("c").datamodel["n"] == 8
    assert decodes == []          # every load found the bytes this host had just written
    fresh = _host(store)          # another host holds nothing: it decodes, once
    assert fresh.get("c").datamodel["n"] == 8 and fresh.get("c").datamodel["n"] == 8
    assert len(decodes) == 1


def test_bytes_written_by_another_host_are_decoded(tmp_path, decodes):
    store = sb.SQLiteStore(tmp_path / "d.db")
    a, b = _host(store), _host(store)
    a.start("counter", "c")
    a.send("c", "inc")
    b.send("c", "inc")            # b decodes a's bytes; a's kept position is now stale
    a.send("c", "inc")            # a must decode b's bytes, not reuse what it kept
    assert a.get("c").datamodel["n"] == b.get("c").datamodel["n"] == 3
    assert len(decodes) == 3      # b's load of a's write, a's load of b's, b's get of a's last


def test_a_damaged_blob_is_reported_though_the_host_kept_a_position(decodes):
    store = sb.MemoryStore()
    host = _host(store)
    host.start("counter", "c")
    host.send("c", "inc")
    rec = store.load("c")
    damaged = rec.blob[:-1] + bytes([rec.blob[-1] ^ 0xFF])
    store.commit(Commit(writes=(PositionWrite("c", rec.chart, rec.version, damaged, rec.status),)))
    with pytest.raises(CorruptPosition):
        host.send("c", "inc")
    with pytest.raises(CorruptPosition):
        host.get("c")


def test_a_cbor_host_decodes_every_load_and_still_counts_right(decodes):
    host = _host(sb.MemoryStore(), codec="cbor")
    host.start("counter", "c")
    for _ in range(3):
        host.send("c", "inc")
    assert host.get("c").datamodel["n"] == 3
    assert len(decodes) == 4      # each send's load and the get: a cbor write is never kept


def test_kept_positions_carry_no_per_driver_fields():
    host = _host(sb.MemoryStore())
    host.start("counter", "c")
    host.send("c", "inc")
    kept = host.get("c")
    assert (kept.routes, kept.ioprocessors, kept.invokers, kept.callbacks) == (None, None, None, None)


def test_the_table_keeps_the_most_recently_used_up_to_its_size():
    chart = sb.Chart.from_scxml(COUNTER)
    interp = sb.Interpreter(chart)
    table = DecodedPositions(size=2)
    kept = {}
    for iid in "abc":
        pos, _ = interp.start(iid)
        kept[iid] = (pos.to_bytes(), pos)
        table.put(iid, *kept[iid])
        if iid == "b":
            table.put("a", *kept["a"])    # a used again: b is now the oldest
    assert table.get("b", kept["b"][0], chart) is None
    assert table.get("a", kept["a"][0], chart) is kept["a"][1]
    assert table.get("c", kept["c"][0], chart) is kept["c"][1]
    assert table.get("c", kept["a"][0], chart) is None                 # other bytes
    assert table.get("c", kept["c"][0], sb.Chart.from_scxml(COUNTER)) is None   # another chart object


def test_a_call_that_writes_nothing_keeps_what_it_decoded(decodes):
    store = sb.MemoryStore()
    writer = _host(store)
    writer.start("counter", "c")
    writer.send("c", "inc", idempotency_key="k1")
    reader = _host(store)
    for _ in range(3):            # repeats of an applied key: nothing is written
        assert reader.send("c", "inc", idempotency_key="k1").datamodel["n"] == 1
    assert len(decodes) == 1      # the first repeat decoded; the others found it kept


def test_the_table_keeps_no_more_bytes_than_its_bound():
    chart = sb.Chart.from_scxml(COUNTER)
    interp = sb.Interpreter(chart)
    kept = {}
    for iid in "abcd":
        pos, _ = interp.start(iid)
        kept[iid] = (pos.to_bytes(), pos)
    one = len(kept["a"][0]) + len(kept["a"][1].data)
    table = DecodedPositions(size=100, max_bytes=2 * one)
    for iid in "abc":
        table.put(iid, *kept[iid])
    assert table.nbytes == 2 * one
    assert table.get("a", kept["a"][0], chart) is None and table.get("c", kept["c"][0], chart) is kept["c"][1]
    table.put("c", *kept["c"])                    # kept again: counted once
    assert table.nbytes == 2 * one
    tiny = DecodedPositions(size=100, max_bytes=one - 1)
    tiny.put("d", *kept["d"])                     # larger than the whole bound: not kept
    assert tiny.get("d", kept["d"][0], chart) is None and tiny.nbytes == 0
