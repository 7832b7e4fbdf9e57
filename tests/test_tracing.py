"""OpenTelemetry spans for host calls, on the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import statebound as sb

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

ORDER = Path(__file__).resolve().parents[1] / "examples" / "order" / "order.scxml"


def by_name(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_timer_fire_links_to_the_span_that_armed_it(otel, tmp_path, store):
    tracer, exporter = otel
    chart = sb.Chart.from_file(ORDER)
    st = sb.MemoryStore() if store == "memory" else sb.SQLiteStore(tmp_path / "t.db")
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([chart], store=st, clock=clock, tracer=tracer)
    host.start("order", "o1", {"payment_timeout": "3d"})
    with tracer.start_as_current_span("http POST /orders/o1/pay") as request:
        host.send("o1", "StartPayment", caller_context={"user": "ann"})
    [send] = by_name(exporter, "statebound.send")
    assert send.parent.span_id == request.get_span_context().span_id          # a child of the caller's span
    assert dict(send.attributes) == {"statebound.instance": "o1", "statebound.event": "StartPayment",
                                     "statebound.chart": "order", "statebound.revision": chart.identity,
                                     "statebound.outcome": "ok"}
    [row] = host.pending_timers("o1")                                          # the traceparent is in the row
    c = send.context
    assert row.caller_context == {"user": "ann",
                                  "traceparent": f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"}
    exporter.clear()
    clock.advance(3 * 86_400_000)                                              # three days later...
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    [fire] = by_name(exporter, "statebound.fire")
    assert [(link.context.trace_id, link.context.span_id) for link in fire.links] == [
        (send.context.trace_id, send.context.span_id)]                         # ...linked to the arming span
    assert fire.parent is None and fire.context.trace_id != send.context.trace_id
    assert dict(fire.attributes) == {"statebound.instance": "o1", "statebound.event": "PaymentTimeout",
                                     "statebound.chart": "order", "statebound.revision": chart.identity,
                                     "statebound.outcome": "fired"}
    assert [s.name for s in exporter.get_finished_spans()] == ["statebound.fire"]


#: a chart whose "go" sends to the host's "app" processor (an outbox row)
NOTIFY = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="notify" initial="s" datamodel="python">
  <state id="s"><transition event="go"><send type="app" event="hello"/></transition></state>
</scxml>'''


def test_outbox_rows_carry_the_traceparent_and_their_delivery_links_back(otel):
    tracer, exporter = otel
    chart = sb.Chart.from_scxml(NOTIFY)
    seen = []
    host = sb.Host([chart], tracer=tracer, processors={"app": lambda delivery: seen.append(delivery)},
                   deliver_after_commit=False)
    host.start("notify", "n1")
    host.send("n1", "go")
    [send] = by_name(exporter, "statebound.send")
    assert [r.outcome for r in host.fire_due()] == ["delivered"]
    [deliver] = by_name(exporter, "statebound.deliver")
    assert [link.context.span_id for link in deliver.links] == [send.context.span_id]
    assert deliver.attributes["statebound.outcome"] == "delivered"
    [delivery] = seen
    assert delivery.caller_context["traceparent"].split("-")[2] == f"{deliver.context.span_id:016x}"


def test_errors_are_recorded_on_the_span_and_every_call_is_one(otel):
    tracer, exporter = otel
    host = sb.Host([sb.Chart.from_file(ORDER)], tracer=tracer)
    with pytest.raises(sb.InstanceNotFound):
        host.send("ghost", "x")
    [span] = by_name(exporter, "statebound.send")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["statebound.outcome"] == "InstanceNotFound"
    assert [e.name for e in span.events] == ["exception"]
    host.start("order", "o1", caller_context="not a dict")                     # carried as is, no trace
    assert host.get("o1").status == "running"
    host.suspend("o1")
    host.resume("o1")
    host.delete("o1")
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["statebound.send", "statebound.start", "statebound.suspend", "statebound.resume",
                     "statebound.delete"]
    assert all(s.attributes["statebound.instance"] == "o1" for s in exporter.get_finished_spans()[1:])


def test_a_host_without_a_tracer_never_imports_opentelemetry():
    code = ("import sys, statebound as sb\n"
            f"host = sb.Host([sb.Chart.from_file({str(ORDER)!r})])\n"
            "host.start('order', 'o1'); host.send('o1', 'StartPayment'); host.fire_due()\n"
            "assert not any(m.startswith('opentelemetry') for m in sys.modules), 'imported'\n"
            "print('clean')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


COUNTER = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="counter" initial="s" datamodel="python">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <onentry><send event="tick" delay="1s"/></onentry>
    <transition event="tick"><assign location="n" expr="n + 1"/></transition>
    <transition event="bump"><assign location="n" expr="n + 10"/></transition>
  </state>
</scxml>'''


@pytest.mark.parametrize("what", ["send_many", "fire_due"])
def test_an_item_that_loses_a_race_in_its_group_keeps_its_one_span(otel, tmp_path, what):
    tracer, exporter = otel
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([sb.Chart.from_scxml(COUNTER)], store=sb.SQLiteStore(tmp_path / "t.db"), clock=clock,
                   tracer=tracer)
    other = sb.Host([sb.Chart.from_scxml(COUNTER)], store=host.store, clock=clock)   # untraced
    for i in range(3):
        host.start("counter", f"c{i}")
    clock.advance(1000)
    exporter.clear()
    orig = host.store.commit_many
    raced = []

    def commit_many(commits):
        if not raced:
            raced.append(other.send("c1", "bump"))     # another process writes c1 first
        return orig(commits)
    host.store.commit_many = commit_many
    if what == "send_many":
        results = host.send_many([(f"c{i}", "bump") for i in range(3)])
        assert all(r.ok for r in results) and results[1].position.datamodel["n"] == 20
        op, outcome = "statebound.send", "ok"
    else:
        assert [r.outcome for r in host.fire_due()] == ["fired"] * 3
        assert host.get("c1").datamodel["n"] == 11
        op, outcome = "statebound.fire", "fired"
    assert host.metrics["conflicts"] == 1                 # c1 ran again, alone
    spans = [s for s in exporter.get_finished_spans() if s.name == op]
    assert sorted(s.attributes["statebound.instance"] for s in spans) == ["c0", "c1", "c2"]   # one each
    assert all(s.attributes["statebound.outcome"] == outcome for s in spans)
    assert all(s.attributes["statebound.chart"] == "counter" for s in spans)
    assert [s.name for s in exporter.get_finished_spans() if s.name.startswith("statebound.")] == [op] * 3


def test_outbox_rows_of_a_traced_batch_link_to_their_own_item(otel):
    tracer, exporter = otel
    chart = sb.Chart.from_scxml(NOTIFY)
    seen = []
    host = sb.Host([chart], tracer=tracer, processors={"app": lambda delivery: seen.append(delivery)})
    for i in range(3):
        host.start("notify", f"n{i}")
    exporter.clear()
    with tracer.start_as_current_span("batch job") as job:
        assert all(r.ok for r in host.send_many([(f"n{i}", "go") for i in range(3)]))
    sends = {s.attributes["statebound.instance"]: s for s in by_name(exporter, "statebound.send")}
    delivers = {s.attributes["statebound.instance"]: s for s in by_name(exporter, "statebound.deliver")}
    assert sorted(sends) == sorted(delivers) == ["n0", "n1", "n2"]
    for iid, deliver in delivers.items():
        assert [link.context.span_id for link in deliver.links] == [sends[iid].context.span_id]
        assert deliver.parent.span_id == job.get_span_context().span_id
    assert sorted(d.caller_context["traceparent"].split("-")[2] for d in seen) == sorted(
        f"{s.context.span_id:016x}" for s in delivers.values())
    assert host.metrics["group_commits"] == 1


class Faulty(SpanProcessor):
    """A span processor that raises in ``on_start`` or ``on_end`` (of the spans it is told
    to), as a broken exporter wired in synchronously would."""

    def __init__(self, when: str) -> None:
        self.when = when
        self.raised = 0

    def _maybe(self, when: str) -> None:
        if self.when == when:
            self.raised += 1
            raise RuntimeError(f"exporter down ({when})")

    def on_start(self, span, parent_context=None):
        self._maybe("start")

    def on_end(self, span):
        self._maybe("end")



@pytest.mark.parametrize("when", ["start", "end"])
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_span_processor_that_raises_never_changes_a_calls_outcome(tmp_path, caplog, when, store):
    # before: an on_end that raised made host.send raise after its commit had landed (the
    # caller would retry an applied event), and an on_start that raised stopped the call
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    faulty = Faulty(when)
    provider.add_span_processor(SimpleSpanProcessor(exporter))    # first: the SDK stops at a processor
    provider.add_span_processor(faulty)                             # that raises
    clock = sb.ManualClock(now_ms=0)
    st = sb.MemoryStore() if store == "memory" else sb.SQLiteStore(tmp_path / "t.db")
    host = sb.Host([sb.Chart.from_scxml(COUNTER)], store=st, clock=clock, tracer=provider.get_tracer("t"))
    caplog.set_level("WARNING", logger="statebound.tracing")

    assert host.start("counter", "c0").configuration == {"s"}
    [armed] = host.pending_timers("c0")
    assert armed.caller_context is None if when == "start" else "traceparent" in armed.caller_context
    assert host.send("c0", "bump").datamodel["n"] == 10
    with pytest.raises(sb.InstanceNotFound):                         # the call's own error still escapes
        host.send("ghost", "bump")
    results = host.send_many([("c0", "bump"), ("ghost", "bump"), ("c0", "bump")])
    assert [r.ok for r in results] == [True, False, True]
    assert isinstance(results[1].error, sb.InstanceNotFound)
    clock.advance(1000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("c0").datamodel["n"] == 31                      # every applied event, exactly once
    assert host.metrics["commits"] + host.metrics["group_commits"] >= 3

    assert faulty.raised >= 6
    warned = [r for r in caplog.records if r.name == "statebound.tracing"]
    assert len(warned) == faulty.raised and all(r.exc_info for r in warned)
    assert all(("untraced" if when == "start" else "outcome stands") in r.getMessage() for r in warned)
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("statebound.")]
    if when == "start":                                              # the calls ran without spans
        assert spans == []
    else:                                                            # the other processors still exported
        assert [s.name for s in spans].count("statebound.send") == 5
        assert [s.attributes["statebound.outcome"] for s in spans if s.name == "statebound.fire"] == ["fired"]
