"""Telemetry faults found in s7: spans of complete_invoke/fail_invoke, what deliver spans
carry, sweep reports of hand-overs, metrics of skipped timers, pooled sweeps' span parents,
send_many's spans when commit_many breaks, and the CLI's event column for outbox rows."""

from __future__ import annotations

import json

import pytest

import statebound as sb
from statebound.cli import main as cli
from statebound.host.processors import Pending

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.trace import StatusCode


def by_name(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def traceparent_of(span) -> str:
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


#: "inv" enters a state whose invocation answers later; its answer arms a timer
INVOKING = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="inv" initial="s" datamodel="python">
  <state id="s"><transition event="inv" target="i"/></state>
  <state id="i"><invoke type="slow" id="job"/>
    <transition event="done.invoke.job" target="s"><send event="tick" delay="1s"/></transition>
    <transition event="error.execution" target="s"><send event="tock" delay="1s"/></transition>
  </state>
</scxml>'''


class Slow:
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def start(self, request):
        self.tokens.append(request.token)
        return Pending("later")


@pytest.mark.parametrize("call", ["complete_invoke", "fail_invoke"])
def test_an_invoke_answer_is_a_span_of_its_own_whose_traceparent_travels_on(otel, call):
    # before: no span; the chart and revision were written on the caller's span, and the
    # timer the answer armed carried no traceparent
    tracer, exporter = otel
    chart = sb.Chart.from_scxml(INVOKING)
    slow = Slow()
    host = sb.Host([chart], clock=sb.ManualClock(now_ms=0), tracer=tracer, invokers={"slow": slow})
    host.start("inv", "a")
    host.send("a", "inv")
    exporter.clear()
    with tracer.start_as_current_span("POST /callback") as request:
        if call == "complete_invoke":
            result = host.complete_invoke("a", "job", {"ok": 1}, token=slow.tokens[-1], caller_context={"u": "bob"})
            event = "done.invoke.job"
        else:
            result = host.fail_invoke("a", "job", "declined", token=slow.tokens[-1], caller_context={"u": "bob"})
            event = "error.execution"
    assert result.outcome == "fired"
    [span] = by_name(exporter, f"statebound.{call}")
    assert span.parent.span_id == request.get_span_context().span_id
    assert dict(span.attributes) == {"statebound.instance": "a", "statebound.event": event,
                                     "statebound.invoke": "job", "statebound.chart": "inv",
                                     "statebound.revision": chart.identity, "statebound.outcome": "fired"}
    [caller] = by_name(exporter, "POST /callback")
    assert dict(caller.attributes) == {}                              # the caller's span is left alone
    [timer] = host.pending_timers("a")
    assert timer.caller_context == {"u": "bob", "traceparent": traceparent_of(span)}


def test_an_invoke_answer_that_is_refused_still_ends_its_span_with_the_error(otel):
    tracer, exporter = otel
    host = sb.Host([sb.Chart.from_scxml(INVOKING)], tracer=tracer, invokers={"slow": Slow()})
    with pytest.raises(sb.InstanceNotFound):
        host.complete_invoke("ghost", "job", None)
    [span] = by_name(exporter, "statebound.complete_invoke")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["statebound.outcome"] == "InstanceNotFound"


#: "go" sends to the "app" processor; "inv" invokes a "slow" handler
NOTIFY = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="notify" initial="s" datamodel="python">
  <state id="s">
    <transition event="go"><send type="app" event="hello"/></transition>
    <transition event="inv" target="i"/>
  </state>
  <state id="i"><invoke type="slow" id="job"/></state>
</scxml>'''


def test_a_deliver_span_names_its_event_and_the_chart_its_commit_wrote(otel):
    # before: statebound.event was read from the wrong key ("name"), and the chart and
    # revision were missing, the delivery never loading the instance
    tracer, exporter = otel
    chart = sb.Chart.from_scxml(NOTIFY)
    host = sb.Host([chart], tracer=tracer, processors={"app": lambda delivery: None}, invokers={"slow": Slow()})
    for i in range(3):
        host.start("notify", f"n{i}")
    exporter.clear()
    host.send("n0", "go")                                          # handed over after a single send
    assert all(r.ok for r in host.send_many([("n1", "go"), ("n2", "go")]))   # and after a group commit
    host.send("n0", "inv")                                         # an invoke row: no event, an invocation
    delivers = by_name(exporter, "statebound.deliver")
    assert len(delivers) == 4
    for span in delivers[:3]:
        assert {k: v for k, v in span.attributes.items() if k != "statebound.instance"} == {
            "statebound.event": "hello", "statebound.chart": "notify", "statebound.revision": chart.identity,
            "statebound.outcome": "delivered"}
    assert sorted(s.attributes["statebound.instance"] for s in delivers[:3]) == ["n0", "n1", "n2"]
    invoke = delivers[3]
    assert "statebound.event" not in invoke.attributes
    assert invoke.attributes["statebound.invoke"] == "job"
    assert invoke.attributes["statebound.chart"] == "notify"
    assert invoke.attributes["statebound.outcome"] == "waiting"


def test_a_send_a_sweeper_delivers_names_its_event(otel):
    tracer, exporter = otel
    host = sb.Host([sb.Chart.from_scxml(NOTIFY)], tracer=tracer, processors={"app": lambda delivery: None},
                   deliver_after_commit=False)
    host.start("notify", "n0")
    host.send("n0", "go")
    exporter.clear()
    assert [r.outcome for r in host.fire_due()] == ["delivered"]
    [span] = by_name(exporter, "statebound.deliver")
    assert span.attributes["statebound.event"] == "hello"


#: a timer whose transition sends to the "mail" processor
REMIND = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="remind" initial="s" datamodel="python">
  <state id="s">
    <transition event="arm"><send event="t" delay="1s"/></transition>
    <transition event="t"><send type="mail" event="reminder"/></transition>
  </state>
</scxml>'''


@pytest.mark.parametrize("how", ["run_once", "stop", "workers", "wakeups", "until_idle"])
def test_a_sweep_counts_the_sends_its_fires_hand_over(how):
    # before: the report (and sweeper.metrics, and so `statebound sweep`) counted 0 delivered
    from statebound.host import MemoryWakeup
    sent = []
    clock = sb.ManualClock(now_ms=0)
    wakeup = MemoryWakeup() if how == "wakeups" else None
    host = sb.Host([sb.Chart.from_scxml(REMIND)], clock=clock, processors={"mail": sent.append}, wakeup=wakeup)
    for i in range(5):
        host.start("remind", f"r{i}")
        host.send(f"r{i}", "arm")
    clock.advance(1000)
    sweeper = sb.Sweeper(host, workers=2 if how == "workers" else 1, wakeups=wakeup)
    try:
        if how == "stop":
            report = sweeper.run_once(stop=lambda: False)
        elif how == "until_idle":
            report = sweeper.run_until_idle()
        else:
            report = sweeper.run_once()
    finally:
        sweeper.close()
    assert len(sent) == 5
    assert (report.fired, report.delivered, report.total) == (5, 5, 10)
    assert (sweeper.metrics.fired, sweeper.metrics.delivered) == (5, 5)
    assert (host.metrics["fired"], host.metrics["delivered"]) == (5, 5)


def test_a_send_the_sweep_claims_is_counted_once():
    # a send whose hand-over failed is the sweep's own row later: one delivery, one count
    calls = []

    def flaky(delivery):
        calls.append(delivery)
        if len(calls) == 1:
            raise RuntimeError("down")
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([sb.Chart.from_scxml(NOTIFY)], clock=clock, processors={"app": flaky}, backoff_ms=10)
    host.start("notify", "n0")
    host.send("n0", "go")                                          # the hand-over fails: released
    clock.advance(1000)
    sweeper = sb.Sweeper(host)
    report = sweeper.run_once()
    assert len(calls) == 2
    assert (report.delivered, report.total) == (1, 1)
    assert sweeper.metrics.delivered == 1


#: a timer and a delayed send to the "mail" processor, both due in a second
BOTH = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="both" initial="s" datamodel="python">
  <state id="s">
    <transition event="arm"><send event="t" delay="1s"/></transition>
    <transition event="t"/>
  </state>
</scxml>'''


def test_a_timer_completed_elsewhere_counts_as_skipped():
    # before: host.metrics counted the skipped outbox row, never the skipped timer
    clock = sb.ManualClock(now_ms=0)
    store = sb.MemoryStore()
    a = sb.Host([sb.Chart.from_scxml(BOTH)], store=store, clock=clock)
    b = sb.Host([sb.Chart.from_scxml(BOTH)], store=store, clock=clock)
    a.start("both", "x")
    a.send("x", "arm")
    clock.advance(1000)
    [row] = store.claim_due(clock.now_ms(), 10, "A", 1000)        # A claims, then stalls past its lease
    clock.advance(2000)
    assert [r.outcome for r in b.fire_due(node_id="B")] == ["fired"]
    assert a.fire(row, node_id="A").outcome == "skipped"
    assert a.metrics.get("skipped") == 1


#: two instances whose "a" arms a timer
CHAIN = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="chain" initial="s" datamodel="python">
  <state id="s">
    <transition event="a"><send event="b" delay="1s"/></transition>
    <transition event="b"/>
  </state>
</scxml>'''


def test_a_pooled_sweep_keeps_its_fires_children_of_the_callers_span(otel):
    # before: with workers > 1 the fire spans had no parent (the pool's threads had no context)
    tracer, exporter = otel
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([sb.Chart.from_scxml(CHAIN)], clock=clock, tracer=tracer)
    for iid in ("x", "y", "z"):
        host.start("chain", iid)
        host.send(iid, "a")
    clock.advance(1000)
    exporter.clear()
    sweeper = sb.Sweeper(host, workers=2)
    try:
        with tracer.start_as_current_span("sweep job") as job:
            assert sweeper.run_once().fired == 3
    finally:
        sweeper.close()
    fires = by_name(exporter, "statebound.fire")
    assert len(fires) == 3
    assert all(s.parent is not None and s.parent.span_id == job.get_span_context().span_id for s in fires)
    assert all(s.attributes["statebound.chart"] == "chain" for s in fires)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_send_many_ends_its_spans_when_commit_many_raises_a_driver_error(otel, tmp_path, store):
    # before: the error propagated and both item spans were never ended
    tracer, exporter = otel
    st = sb.MemoryStore() if store == "memory" else sb.SQLiteStore(tmp_path / "t.db")
    host = sb.Host([sb.Chart.from_scxml(CHAIN)], store=st, tracer=tracer)
    host.start("chain", "c0")
    host.start("chain", "c1")
    exporter.clear()

    def broken(commits):
        raise RuntimeError("driver bug")
    st.commit_many = broken
    with pytest.raises(RuntimeError, match="driver bug"):
        host.send_many([("c0", "a"), ("c1", "a")])
    spans = by_name(exporter, "statebound.send")
    assert sorted(s.attributes["statebound.instance"] for s in spans) == ["c0", "c1"]
    assert all(s.status.status_code == StatusCode.ERROR for s in spans)
    assert all(s.attributes["statebound.outcome"] == "RuntimeError" for s in spans)


def test_cli_timers_shows_the_event_of_outbox_rows(tmp_path, capsys, monkeypatch):
    # before: "event" was null for every outbox row (read from the timer's key, "name")
    monkeypatch.delenv("STATEBOUND_STORE", raising=False)
    monkeypatch.delenv("STATEBOUND_DB", raising=False)
    path = tmp_path / "cli.db"
    host = sb.Host([sb.Chart.from_scxml(NOTIFY)], store=sb.SQLiteStore(path),
                   processors={"app": lambda delivery: None}, invokers={"slow": Slow()}, deliver_after_commit=False)
    host.start("notify", "n0")
    host.send("n0", "go")                                          # a send row, left to the sweeper
    host.send("n0", "inv")                                         # an invoke row
    host.store.close()
    assert cli(["--store", str(path), "--json", "timers", "n0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["kind"], r["event"]) for r in rows) == [("invoke", "job"), ("send", "hello")]
    assert all(set(r) >= {"instance", "ordinal", "name", "event", "send_id", "kind", "state"} for r in rows)
