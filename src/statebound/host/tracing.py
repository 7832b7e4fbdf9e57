"""OpenTelemetry spans for host calls (the ``otel`` extra): ``Host(tracer=...)``.

Imported only by a host given a tracer, so a host without one never imports OpenTelemetry.

* Every host call is a span: ``statebound.start``, ``statebound.send``, ``statebound.fire``
  (a timer), ``statebound.deliver`` (an outbox row), ``statebound.suspend``,
  ``statebound.resume`` and ``statebound.delete``, a child of whatever span is current.
  Attributes: ``statebound.instance``, ``statebound.chart``, ``statebound.revision`` (the
  chart identity), ``statebound.event`` and ``statebound.outcome`` (``ok``, a fire's
  outcome, or the error's class name, with the exception recorded and the status ERROR).
* The span's W3C ``traceparent`` travels in the call's ``caller_context``: ``None`` becomes
  ``{"traceparent": ...}`` and a dict gains the key (any other value is left as it is, and
  carries no trace). The interpreter copies the caller context into every effect, so timer
  and outbox rows armed by the call carry it, and a processor sees it in its ``Delivery``.
* Firing a row days later starts a span **linked** to the span that armed it (a link, not
  a parent: it is another trace, usually), whose own traceparent then travels on.
* Group commit keeps every item's span: ``send_many`` and ``fire_many`` open one per item
  when its unit runs (a child of the span current at the batch call, or linked like a single
  fire), run the unit inside it, and end it when the item's outcome is known, after its
  group's commit; the span covers the wait for that commit too.
* Telemetry never changes a call's result. A span processor or exporter that raises while a
  span starts or ends is logged (``statebound.tracing``, a warning with the traceback) and
  the call goes on, untraced if its span could not start: by the time a span ends, the
  call's commit has landed, and an error raised then would tell the caller it had not.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .store import TIMER, TimerRow

__all__ = ["Tracing", "TRACEPARENT"]

#: The W3C trace-context key a ``caller_context`` carries.
TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator()
#: set while a traced call runs its untraced body, so the body is not traced twice
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("statebound_traced", default=False)
log = logging.getLogger("statebound.tracing")


class Tracing:
    """Wraps host calls in spans (see the module docstring).

    :param tracer: an OpenTelemetry ``Tracer``, or ``True`` for
        ``opentelemetry.trace.get_tracer("statebound")``.
    """

    def __init__(self, tracer: Any) -> None:
        self.tracer = trace.get_tracer("statebound") if tracer is True else tracer

    # ------------------------------------------------------------------ context
    @staticmethod
    def carry(ctx: Any) -> Any:
        """``ctx`` with the current span's traceparent in it (see the module docstring)."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        parent = carrier.get(TRACEPARENT)
        if parent is None:
            return ctx
        if ctx is None:
            return {TRACEPARENT: parent}
        if isinstance(ctx, dict):
            return {**ctx, TRACEPARENT: parent}
        return ctx

    @staticmethod
    def armed_by(ctx: Any) -> trace.SpanContext | None:
        """The span context a row's caller context names, if it names a valid one."""
        if not isinstance(ctx, dict) or not isinstance(ctx.get(TRACEPARENT), str):
            return None
        sc = trace.get_current_span(_PROPAGATOR.extract({TRACEPARENT: ctx[TRACEPARENT]})).get_span_context()
        return sc if sc.is_valid else None

    @staticmethod
    def inside() -> bool:
        """Whether the running call is the body of a traced call (consumes the mark)."""
        if _INSIDE.get():
            _INSIDE.set(False)
            return True
        return False

    @staticmethod
    def note(chart: str | None, revision: str | None) -> None:
        """Put the chart and revision a call ran on on the current span."""
        span = trace.get_current_span()
        if span.is_recording():
            if chart:
                span.set_attribute("statebound.chart", chart)
            if revision:
                span.set_attribute("statebound.revision", revision)

    # ------------------------------------------------------------------ spans
    def _start(self, op: str, instance_id: str, event: str | None,
               links: list[trace.Link] | None) -> trace.Span:
        """A started span (not current), or the invalid span when the SDK fails to start one."""
        attributes = {"statebound.instance": instance_id}
        if event is not None:
            attributes["statebound.event"] = event
        try:
            return self.tracer.start_span(f"statebound.{op}", kind=trace.SpanKind.INTERNAL,
                                          attributes=attributes, links=links or None)
        except Exception:  # a span processor's on_start, or the sampler
            log.warning("starting span statebound.%s failed; the call runs untraced", op, exc_info=True)
            return trace.INVALID_SPAN

    @staticmethod
    def _finish(span: trace.Span) -> None:
        # on_end runs the processors (and a simple processor's exporter) right here, after the
        # call's commit landed: what they raise is theirs to report, not the call's
        try:
            span.end()
        except Exception:
            log.warning("ending span %s failed; the call's outcome stands", getattr(span, "name", "?"),
                        exc_info=True)

    @contextmanager
    def _span(self, op: str, instance_id: str, event: str | None,
              links: list[trace.Link] | None = None) -> Iterator[trace.Span]:
        span = self._start(op, instance_id, event, links)
        try:
            with trace.use_span(span, end_on_exit=False):
                try:
                    yield span
                except BaseException as exc:
                    span.set_attribute("statebound.outcome", type(exc).__name__)
                    raise
        finally:
            self._finish(span)

    def call(self, op: str, instance_id: str, event: str | None, body: Callable[[Any], Any],
             caller_context: Any = None) -> Any:
        """Run ``body(caller_context)`` (the host call, untraced) inside its span; the caller
        context it gets carries the span's traceparent."""
        return self._traced(op, instance_id, event, None, lambda: body(self.carry(caller_context)), _ok)

    def _traced(self, op: str, instance_id: str, event: str | None, links: list[trace.Link] | None,
                run: Callable[[], Any], outcome: Callable[[Any], str]) -> Any:
        """``run()``, the untraced body of one host call, inside its span; the span's outcome
        is ``outcome(result)``."""
        with self._span(op, instance_id, event, links) as span:
            token = _INSIDE.set(True)
            try:
                result = run()
            finally:
                _INSIDE.reset(token)
            span.set_attribute("statebound.outcome", outcome(result))
            return result

    @classmethod
    def _row_span(cls, row: TimerRow) -> tuple[str, str, str | None, list[trace.Link] | None]:
        """``(op, instance, event, links)`` of the span that fires ``row``: linked to the span
        that armed it."""
        armed = cls.armed_by(row.caller_context)
        event = row.event.get("name") if isinstance(row.event, dict) else None
        return "fire" if row.kind == TIMER else "deliver", row.target_id, event, [trace.Link(armed)] if armed else None

    # ------------------------------------------------------------------ spans of a batch
    def open(self, op: str, instance_id: str, event: str | None, caller_context: Any,
             links: list[trace.Link] | None = None) -> tuple[trace.Span, Any]:
        """Start the span of one batch item (not current, not ended) and return it with the
        item's caller context carrying its traceparent; :meth:`end` finishes it."""
        span = self._start(op, instance_id, event, links)
        with trace.use_span(span, end_on_exit=False):
            return span, self.carry(caller_context)

    def open_fire(self, row: TimerRow) -> tuple[trace.Span, TimerRow]:
        """:meth:`open` for a claimed row: linked to the span that armed it, as :meth:`fire`."""
        op, instance_id, event, links = self._row_span(row)
        span, ctx = self.open(op, instance_id, event, row.caller_context, links)
        return span, replace(row, caller_context=ctx)

    @staticmethod
    @contextmanager
    def within(span: trace.Span, *, body: bool = False) -> Iterator[None]:
        """Run a batch item's work with its span current; ``body``: the work is one traced
        host call (``host.fire``), which must not open a span of its own."""
        token = _INSIDE.set(True) if body else None
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield
        finally:
            if token is not None:
                _INSIDE.reset(token)

    @classmethod
    def end(cls, span: trace.Span, outcome: str, error: BaseException | None = None) -> None:
        """Finish a batch item's span with its outcome (``ok``, a fire's) or its error."""
        if error is not None:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            outcome = type(error).__name__
        span.set_attribute("statebound.outcome", outcome)
        cls._finish(span)

    def fire(self, row: TimerRow, body: Callable[[TimerRow], Any]) -> Any:
        """Fire ``row`` through ``body`` inside a span linked to the span that armed it."""
        return self._traced(*self._row_span(row), lambda: body(replace(row, caller_context=self.carry(row.caller_context))),
                            _fire_outcome)


def _ok(_result: Any) -> str:
    return "ok"


def _fire_outcome(result: Any) -> str:
    return str(getattr(result, "outcome", "ok"))
