"""Replay re-drives each record as the host that wrote it drove it, and skips what it gave up on.

A drive's result depends on what its host offered it (I/O processors, the Basic HTTP
location, invoke types) and, for an event that ran out of budget, on that budget: replay
used the replaying host's settings, so the command line (no handlers, msgpack, default
limits) reported an app's instance as diverged, and an abandoned event recorded as delivered
diverged even on the host that ran it. Also the ``statebound history`` timeline's labels.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

import statebound as sb
from statebound.cli import main

ORDER = Path(__file__).resolve().parents[1] / "examples" / "order" / "order.scxml"

SPIN = """<scxml xmlns="http://www.w3.org/2005/07/scxml" name="spin" initial="s" datamodel="python">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="spin" cond="n &lt; LIMIT" target="s"><assign location="n" expr="n + 1"/><raise event="spin"/>
    </transition>
    <transition event="go"><send event="spin"/></transition>
    <transition event="arm"><send event="spin" delay="1s"/></transition>
  </state>
</scxml>"""


def spin(limit: int) -> sb.Chart:
    return sb.Chart.from_scxml(SPIN.replace("LIMIT", str(limit)))


class Gateway:
    def start(self, request):
        return {"charge": "ch_1"}


def app_host(store, **kw):
    """The README's order app: a payment handler and a receipts processor."""
    return sb.Host([sb.Chart.from_file(ORDER)], store=store, history=True, invokers={"payment": Gateway()},
                   processors={"receipts": lambda delivery: None}, **kw)


@pytest.fixture
def cpu(monkeypatch):
    """A CPU clock that moves one millisecond at every read: a budget runs out after as many
    reads, however fast the machine. ``cpu.stop()`` puts the real clock back."""
    ticks = itertools.count()
    monkeypatch.setattr("statebound.datamodel.budget._clock", lambda: next(ticks) / 1000)

    class Clock:
        stop = staticmethod(monkeypatch.undo)
    return Clock()


# ----------------------------------------------------------------------------- what the host offered


def test_the_command_line_replays_an_instance_an_app_host_drove_with_its_handlers(tmp_path, capsys):
    db = tmp_path / "w.db"
    store = f"sqlite:///{db}"
    assert main(["--store", store, "--history", "100", "start", str(ORDER), "o1", "--data", '{"amount": 10}']) == 0
    app = app_host(sb.SQLiteStore(db))
    app.send("o1", "StartPayment", {"card": "4242"})
    assert app.get("o1").configuration == {"Done"}
    start, pay = app.store.history("o1")[:2]
    assert start.steps[0] == {"world": {"http": "http://statebound.invalid/instances/o1/events"}}  # the CLI's
    assert pay.steps[0]["world"] == {"http": "http://statebound.invalid/instances/o1/events",
                                     "io": ["receipts"], "inv": ["payment"]}
    capsys.readouterr()
    assert main(["--store", store, "replay", "o1"]) == 0, capsys.readouterr()
    assert "byte-identical" in capsys.readouterr().out
    assert sb.Host([sb.Chart.from_file(ORDER)], store=sb.SQLiteStore(db)).replay("o1").identical


def test_replay_offers_the_basic_http_location_the_instance_was_offered():
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="cb" initial="s"
      datamodel="python"><datamodel><data id="at_start" expr="_ioprocessors['basichttp']['location']"/>
      <data id="callback" expr="None"/></datamodel>
      <state id="s"><transition event="go" target="t">
        <assign location="callback" expr="_ioprocessors['basichttp']['location']"/></transition></state>
      <state id="t"/></scxml>''')
    store = sb.MemoryStore()
    app = sb.Host([chart], store=store, history=True, http_base="https://api.example.com")
    app.start("cb", "i1")
    app.send("i1", "go")
    assert app.get("i1").datamodel["callback"] == "https://api.example.com/instances/i1/events"
    for other in ({}, {"http_base": "https://elsewhere.example"}, {"http_base": None}):
        assert sb.Host([chart], store=store, **other).replay("i1").identical, other


def test_replay_compares_in_the_codec_the_position_was_stored_in():
    pytest.importorskip("cbor2")
    store = sb.MemoryStore()
    app = sb.Host([sb.Chart.from_file(ORDER)], store=store, history=True, codec="cbor")
    app.start("order", "o1", {"amount": 1})
    app.send("o1", "Cancel")
    report = sb.Host([sb.Chart.from_file(ORDER)], store=store).replay("o1")    # a msgpack host
    assert report.identical and report.size == len(store.load("o1").blob)


def test_replay_is_not_bound_by_the_replaying_hosts_max_rounds():
    """A drive that settled in 12,000 microsteps on its host replays on a host whose
    max_rounds is the default 10,000."""
    chart = spin(12_000)
    store = sb.MemoryStore()
    app = sb.Host([chart], store=store, history=True, max_rounds=20_000, max_cpu_ms=None)
    app.start("spin", "a")
    app.send("a", "spin")
    assert app.get("a").datamodel["n"] == 12_000
    assert sb.Host([chart], store=store).replay("a").identical


def test_records_that_name_no_host_settings_replay_as_before_and_a_divergence_says_so():
    """Records written before the host's offer was recorded: replayed with the replaying
    host's, identical on a host set up alike, and otherwise the reason names the settings."""
    store = sb.MemoryStore()
    app = app_host(store)
    app.start("order", "o1", {"amount": 10})
    app.send("o1", "StartPayment", {"card": "4242"})
    kept = store._history["o1"]
    for v, r in kept.items():   # as an older statebound wrote them
        steps = tuple({k: x for k, x in s.items() if k != "world"} for s in r.steps if set(s) != {"world"})
        kept[v] = dataclasses.replace(r, steps=steps)
    assert app.replay("o1").identical
    report = sb.Host([sb.Chart.from_file(ORDER)], store=store).replay("o1")
    assert not report.identical
    assert "name no host settings" in report.reason and "invoke handlers none" in report.reason


def test_a_divergence_names_the_part_of_the_position_that_differs():
    a = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="a" initial="s"
      datamodel="python"><datamodel><data id="err" expr="False"/></datamodel><state id="s">
      <transition event="go"><send event="hi" target="#_scxml_b"/></transition>
      <transition event="error.communication"><assign location="err" expr="True"/></transition>
      </state></scxml>''')
    b = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="b" initial="s"
      datamodel="python"><state id="s"/></scxml>''')
    host = sb.Host([a, b], history=True)
    host.start("b", "b")
    host.start("a", "a")
    host.send("a", "go")
    host.delete("b")                   # the one part of a run that depends on the world as it is now
    report = host.replay("a")
    assert not report.identical and "datamodel err" in report.reason and "same configuration" in report.reason


# ----------------------------------------------------------------------------- events given up on


def test_an_event_out_of_max_rounds_is_recorded_abandoned_and_replay_skips_it():
    chart = spin(3_000)
    store = sb.MemoryStore()
    clock = sb.ManualClock(now_ms=0)
    app = sb.Host([chart], store=store, clock=clock, history=True, max_rounds=100)
    app.start("spin", "a")
    app.send("a", "spin", idempotency_key="k1")      # the key is written: a record
    app.start("spin", "b")
    app.send("b", "arm")
    clock.advance(1_000)
    assert [r.outcome for r in app.fire_due()] == ["fired"]
    for iid in ("a", "b"):
        assert app.get(iid).datamodel["n"] == 0
        last = store.history(iid)[-1]
        assert [(s["event"]["name"], s.get("abandoned")) for s in last.steps] == [("spin", "rounds")]
        assert sb.Host([chart], store=store).replay(iid).identical     # max_rounds 10,000: it would settle
        assert app.replay(iid).identical


def test_an_event_out_of_cpu_is_recorded_abandoned_and_replay_skips_it(tmp_path, cpu, capsys):
    chart = spin(2_000)
    db = tmp_path / "cpu.db"
    clock = sb.ManualClock(now_ms=0)
    app = sb.Host([chart], store=sb.SQLiteStore(db), clock=clock, history=True, max_cpu_ms=20)
    app.start("spin", "a")
    app.send("a", "spin", idempotency_key="k1")
    app.start("spin", "b")
    app.send("b", "arm")
    clock.advance(1_000)
    assert [r.outcome for r in app.fire_due()] == ["fired"]
    off = sb.Host([chart], clock=clock, max_cpu_ms=20)   # without history the drive is abandoned as ever
    off.start("spin", "c")
    off.send("c", "spin")
    cpu.stop()
    assert app.metrics["budget_exhausted"] == 2 and off.get("c").datamodel["n"] == 0
    for iid in ("a", "b"):
        assert app.get(iid).datamodel["n"] == 0
        assert [s.get("abandoned") for s in app.store.history(iid)[-1].steps] == ["cpu"]
        assert app.replay(iid).identical
        assert sb.Host([chart], store=app.store).replay(iid).identical
    capsys.readouterr()
    assert main(["--store", f"sqlite:///{db}", "history", "a"]) == 0
    assert "send spin (abandoned: cpu)" in capsys.readouterr().out


def test_an_event_spilled_for_lack_of_budget_is_recorded_once_by_the_call_that_delivers_it(cpu):
    """The second drive of a call, out of the budget the first spent, waits as a row: it was
    recorded in the first call too, so replay drove it twice."""
    chart = spin(2_000)
    store = sb.MemoryStore()
    app = sb.Host([chart], store=store, clock=sb.ManualClock(now_ms=0), history=True, max_cpu_ms=20)
    app.start("spin", "a")
    app.send("a", "go")                              # go sends spin to itself, in the same call
    assert [r.outcome for r in app.fire_due()] == ["fired"]    # the spilled row: spin, on its own budget
    cpu.stop()
    records = store.history("a")
    assert [[(s["event"]["name"], s.get("abandoned")) if "event" in s else s for s in r.steps]
            for r in records[1:]] == [[("go", None), {"ordinal": 1}], [("spin", "cpu")]]
    assert app.replay("a").identical


def test_a_replay_that_runs_out_of_its_own_budget_says_so(monkeypatch):
    chart = spin(2_000)
    app = sb.Host([chart], history=True)
    app.start("spin", "a")
    app.send("a", "spin")
    assert app.get("a").datamodel["n"] == 2_000
    ticks = itertools.count()
    monkeypatch.setattr("statebound.datamodel.budget._clock", lambda: next(ticks))   # a second per read
    report = app.replay("a")
    assert not report.identical and report.diverged_at == 2
    assert "ran out of its cpu budget, though the host that ran it settled it" in report.reason


# ----------------------------------------------------------------------------- the timeline


def test_the_timeline_names_the_processor_a_send_went_to(tmp_path, capsys):
    db = tmp_path / "t.db"
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="ob" initial="s"
      datamodel="python"><state id="s"><transition event="go" target="t">
      <send type="mail" event="Receipt"/><send type="mail" event="Copy" target="ops@example.com"/>
      <send event="Self"/></transition></state><state id="t"/></scxml>''')
    host = sb.Host([chart], store=sb.SQLiteStore(db), processors={"mail": lambda delivery: None}, history=True)
    host.start("ob", "b1")
    host.send("b1", "go")
    capsys.readouterr()
    assert main(["--store", f"sqlite:///{db}", "history", "b1"]) == 0
    assert "sent Receipt->mail, Copy->mail:ops@example.com, Self->self" in capsys.readouterr().out


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_history_refuses_a_limit_below_one(tmp_path, capsys, limit):
    db = tmp_path / "l.db"
    host = sb.Host([sb.Chart.from_file(ORDER)], store=sb.SQLiteStore(db), history=True)
    host.start("order", "o1")
    capsys.readouterr()
    assert main(["--store", f"sqlite:///{db}", "history", "o1", "--limit", limit]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err
