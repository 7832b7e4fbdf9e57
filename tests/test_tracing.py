"""OpenTelemetry spans for host calls, on the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import statebound as sb

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

ORDER = Path(__file__).resolve().parents[1] / "examples" / "order" / "order.scxml"


@pytest.fixture
def otel():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


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


def test_outbox_rows_carry_the_traceparent_and_their_delivery_links_back(otel):
    tracer, exporter = otel
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="notify" initial="s"
      datamodel="python"><state id="s"><transition event="go"><send type="app" event="hello"/></transition>
      </state></scxml>''')
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
