"""Execution history: one record per unit of work, in the same commit; replay re-drives it."""

from __future__ import annotations

from pathlib import Path

import pytest

import statebound as sb

ORDER = Path(__file__).resolve().parents[1] / "examples" / "order" / "order.scxml"


@pytest.fixture(params=["memory", "sqlite"])
def make(request, tmp_path):
    """Hosts on one store (each SQLite host with a connection of its own)."""
    shared = sb.MemoryStore()

    def make_host(**kw):
        store = shared if request.param == "memory" else sb.SQLiteStore(tmp_path / "h.db")
        return sb.Host([sb.Chart.from_file(ORDER)], store=store, clock=sb.ManualClock(now_ms=1_000), **kw)
    return make_host


def test_the_order_story_is_recorded_and_replays_byte_for_byte(make):
    host = make(history=True)
    chart = host.chart("order")
    host.start("order", "o1", {"amount": 25, "payment_timeout": "1h"}, caller_context={"traceparent": "00-aa"})
    host.clock.advance(5)
    host.send("o1", "StartPayment", {"card": "4242"}, idempotency_key="req-17")
    host.clock.advance(3_600_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    records = host.store.history("o1")
    assert [(r.version, r.kind, r.configuration, r.status) for r in records] == [
        (1, "start", ("Pending",), "running"), (2, "event", ("Started",), "running"),
        (3, "event", ("Cancelled",), "done")]
    start, pay, fire = records
    assert start.start == {"data": {"amount": 25, "payment_timeout": "1h"}, "parent": None, "invokeid": None}
    assert start.call == {"op": "start", "instance": "o1"} and start.caller_context == {"traceparent": "00-aa"}
    assert start.at_ms == 1_000 and start.chart == "order" and start.revision == chart.identity
    assert pay.call == {"op": "send", "instance": "o1", "idempotency_key": "req-17"} and pay.at_ms == 1_005
    assert [s["event"]["name"] for s in pay.steps] == ["StartPayment"]
    assert pay.steps[0]["event"]["data"] == {"card": "4242"}
    assert [(a["name"], a["event"]) for a in pay.effects["armed"]] == [("PaymentTimeout", "PaymentTimeout")]
    assert fire.call == {"op": "fire", "instance": "o1", "timer": ["o1", 1]}
    assert fire.effects["logs"] == 1 and fire.effects["done"] is True
    assert [s["event"]["name"] for s in fire.steps] == ["PaymentTimeout"]
    report = host.replay("o1")
    assert report.identical and report.records == 3 and report.size == len(host.store.load("o1").blob)
    # a repeated key is no new unit of work: no record
    host2 = make(history=True)
    assert [r.version for r in host2.store.history("o1")] == [1, 2, 3]


def test_no_history_unless_asked_and_replay_says_why_it_cannot(make):
    host = make()
    host.start("order", "o1")
    assert host.history is None and host.store.history("o1") == []
    report = host.replay("o1")
    assert not report.identical and "no start record" in report.reason
    recorder = make(history=True)
    recorder.start("order", "o2")
    host.send("o2", "StartPayment")                                  # a host that records nothing wrote v2
    recorder.send("o2", "Complete")
    report = recorder.replay("o2")
    assert not report.identical and "do not cover every commit" in report.reason
    assert recorder.replay("ghost").reason == "the instance does not exist"


def test_retention_keeps_the_last_n_and_a_ttl_expires_the_rest(make):
    host = make(history=2)
    host.start("order", "o1")
    host.send("o1", "StartPayment")
    host.send("o1", "Complete")
    assert [r.version for r in host.store.history("o1")] == [2, 3]
    assert "no start record" in host.replay("o1").reason             # retention dropped the start
    ttl = make(history_ttl_s=60)
    assert ttl.history.keep is None and ttl.history.ttl_s == 60
    ttl.start("order", "o2")
    [r] = ttl.store.history("o2")
    assert r.expires_at_ms == r.at_ms + 60_000
    with pytest.raises(ValueError):
        make(history=0)
    with pytest.raises(ValueError):
        make(history_ttl_s=0)


def test_suspend_resume_and_migration_are_recorded_and_replayed(make):
    host = make(history=True)
    host.start("order", "o1", {"payment_timeout": "1s"})
    host.send("o1", "StartPayment")
    host.suspend("o1")
    host.resume("o1")
    v2 = sb.Chart.from_scxml(ORDER.read_text().replace('id="Started"', 'id="Paying"')
                             .replace('target="Started"', 'target="Paying"'), name="order")
    assert host.migrate("o1", v2, mapping={"Started": "Paying"}).outcome == "moved"
    host.clock.advance(1_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    kinds = [(r.kind, r.status, r.configuration) for r in host.store.history("o1")]
    assert kinds == [("start", "running", ("Pending",)), ("event", "running", ("Started",)),
                     ("suspend", "suspended", ("Started",)), ("resume", "running", ("Started",)),
                     ("migrate", "running", ("Paying",)), ("event", "done", ("Cancelled",))]
    assert host.store.history("o1")[4].start == {"from": sb.Chart.from_file(ORDER).identity,
                                                 "mapping": {"Started": "Paying"}}
    assert host.replay("o1").identical


def test_events_routed_between_instances_and_host_ordinals_replay(make):
    ping = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="ping" initial="s"
      datamodel="python"><state id="s"><transition event="ping"><send event="pong" target="#_scxml_b"/>
      </transition></state></scxml>''')
    pong = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="pong" initial="s"
      datamodel="python"><datamodel><data id="n" expr="0"/></datamodel><state id="s">
      <transition event="pong"><assign location="n" expr="n + 1"/></transition></state></scxml>''')
    host = make(history=True)
    host.register(ping)
    host.register(pong)
    host.start("pong", "b")
    host.start("ping", "a")
    host.send("a", "ping")
    host.suspend("b")
    host.send("a", "ping")                                           # kept as b's own row: an ordinal
    host.resume("b")
    host.fire_due()
    [rec] = [r for r in host.store.history("b") if r.call.get("op") == "send"][-1:]
    assert rec.kind == "write" and rec.steps == ({"ordinal": 1},)
    assert host.store.history("b")[1].call == {"op": "send", "instance": "a"}   # b was written by a's call
    assert host.get("b").datamodel["n"] == 2
    assert host.replay("a").identical and host.replay("b").identical


class SimulatedCrash(BaseException):
    """Not an Exception: nothing in the host may catch it, as nothing catches a power cut."""


def _arm(store, n, where):
    real = store._execute
    seen = {"i": 0, "sql": None}

    def execute(sql, params=()):
        i = seen["i"]
        seen["i"] += 1
        if i == n and where == "before":
            seen["sql"] = sql
            raise SimulatedCrash
        out = real(sql, params)
        if i == n and where == "after":
            seen["sql"] = sql
            raise SimulatedCrash
        return out
    store._execute = execute
    return seen


def test_a_crash_mid_commit_leaves_no_record_of_the_uncommitted_event(tmp_path):
    """SQLite, a crash before and after every statement of the send's unit of work: either
    the event and its record are both there, or neither is; retrying leaves exactly one."""
    chart = sb.Chart.from_file(ORDER)
    counted = sb.SQLiteStore(tmp_path / "count.db")
    host = sb.Host([chart], store=counted, history=True)
    host.start("order", "o1")
    statements = {"n": 0}
    real = counted._execute

    def counting(sql, params=()):
        statements["n"] += 1
        return real(sql, params)
    counted._execute = counting
    host.send("o1", "StartPayment")
    assert statements["n"] >= 5                     # BEGIN, position, history insert and prunes, COMMIT
    kinds = set()
    for n in range(statements["n"]):
        for where in ("before", "after"):
            path = tmp_path / f"crash-{n}-{where}.db"
            store = sb.SQLiteStore(path)
            host = sb.Host([chart], store=store, history=True)
            host.start("order", "o1")
            seen = _arm(store, n, where)
            with pytest.raises(SimulatedCrash):
                host.send("o1", "StartPayment", idempotency_key="pay-1")
            kinds.add(seen["sql"].split()[0].upper())
            store.close()
            store = sb.SQLiteStore(path)                             # the restart
            host = sb.Host([chart], store=store, history=True)
            committed = host.get("o1").configuration == {"Started"}
            assert [r.version for r in store.history("o1")] == ([1, 2] if committed else [1]), (n, where)
            host.send("o1", "StartPayment", idempotency_key="pay-1")  # the caller retries
            records = store.history("o1")
            assert [(r.version, r.kind) for r in records] == [(1, "start"), (2, "event")], (n, where)
            assert host.replay("o1").identical
            store.close()
    assert {"BEGIN", "INSERT", "COMMIT"} <= kinds


PAY = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="pay" initial="Idle">
  <datamodel><data id="receipt" expr="None"/></datamodel>
  <state id="Idle"><transition event="Pay" target="Charging"/></state>
  <state id="Charging">
    <invoke type="payment" id="charge"><finalize><assign location="receipt" expr="_event.data"/></finalize></invoke>
    <transition event="done.invoke.charge" target="Paid"/>
  </state>
  <state id="Paid"/>
</scxml>"""


@pytest.mark.parametrize("answer", ["at once", "later"])
def test_a_commit_made_by_the_outbox_names_its_call(tmp_path, answer):
    """An invoke handler's result, delivered when its row fired or through complete_invoke,
    used to be recorded with an empty ``call``: the record said an event happened, not which
    host call made it (docs/operations.md)."""
    from statebound.host.processors import Pending

    class Gateway:
        def start(self, request):
            self.token = request.token
            return {"charge": "ch_1"} if answer == "at once" else Pending("queued")
    gateway = Gateway()
    host = sb.Host([sb.Chart.from_scxml(PAY)], store=sb.SQLiteStore(tmp_path / "o.db"),
                   clock=sb.ManualClock(now_ms=1_000), invokers={"payment": gateway}, history=True)
    host.start("pay", "p1")
    host.send("p1", "Pay")
    if answer == "later":
        host.complete_invoke("p1", "charge", {"charge": "ch_1"}, token=gateway.token)
    records = host.store.history("p1")
    assert host.get("p1").configuration == {"Paid"}
    last = records[-1]
    assert [s["event"]["name"] for s in last.steps if "event" in s] == ["done.invoke.charge"]
    if answer == "at once":
        assert last.call == {"op": "fire", "instance": "p1", "timer": ["p1", int(gateway.token.rsplit(":", 1)[1])]}
    else:
        assert last.call == {"op": "complete_invoke", "instance": "p1", "invoke": "charge"}
    assert all(r.call.get("op") for r in records)
    assert host.replay("p1").identical
