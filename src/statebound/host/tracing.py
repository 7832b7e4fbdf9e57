"""OpenTelemetry spans for host calls (the ``otel`` extra): ``Host(tracer=...)``.

Imported only by a host given a tracer, so a host without one never imports OpenTelemetry.

* Every host call is a span: ``statebound.start``, ``statebound.send``, ``statebound.fire``
  (a timer), ``statebound.deliver`` (an outbox row), ``statebound.complete_invoke``,
  ``statebound.fail_invoke``, ``statebound.suspend``, ``statebound.resume`` and
  ``statebound.delete``, a child of whatever span is current. Attributes:
  ``statebound.instance``, ``statebound.chart``, ``statebound.revision`` (the chart
  identity), ``statebound.event``, ``statebound.invoke`` (the invokeid, for an invoke or
  cancel row, a forward to an invocation, and ``complete_invoke``/``fail_invoke``) and
  ``statebound.outcome`` (``ok``, a fire's outcome, or the error's class name, with the
  exception recorded and the status ERROR).
* The chart and revision are the instance's as the call's commit found it
  (:meth:`Tracing.note`; a refused call and a delete name none). A ``statebound.deliver``
  span names them when its fire loads the instance (an invoke row, a delayed send, a row
  parked dead), or when the row is handed over right after the commit that wrote it (that
  commit's, :meth:`Tracing.handed`: no read); an immediate send or a cancel row that a
  sweeper delivers names none. Only spans statebound opened are written to, never the
  caller's (``migrate`` has no span).
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
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..exceptions import PositionError
from ..position import read_header
from .store import DELETED, SEND, TIMER, PositionWrite, TimerRow

__all__ = ["Tracing", "TRACEPARENT"]

#: The W3C trace-context key a ``caller_context`` carries.
TRACEPARENT = "traceparent"
#: the attribute naming the invocation a span starts, ends or answers
_INVOKE = "statebound.invoke"
_PROPAGATOR = TraceContextTextMapPropagator()
#: set while a traced call runs its untraced body, so the body is not traced twice
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("statebound_traced", default=False)
#: the span statebound made current, with its instance: :meth:`Tracing.note` writes on it
#: only, so a call with no span of its own never writes on the caller's
_OPENED: contextvars.ContextVar[tuple[trace.Span, str] | None] = contextvars.ContextVar(
    "statebound_span", default=None)
log = logging.getLogger("statebound.tracing")


class Tracing:
    """Wraps host calls in spans (see the module docstring).

    :param tracer: an OpenTelemetry ``Tracer``, or ``True`` for
        ``opentelemetry.trace.get_tracer("statebound")``.
    """

    def __init__(self, tracer: Any) -> None:
        self.tracer = trace.get_tracer("statebound") if tracer is True else tracer
        # per thread: the chart and revision of the rows a landed commit hands over, by row
        # key, until the outermost hand-over ends (see handed and handing_over)
        self._local = threading.local()

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
    def note(instance_id: str, chart: str | None, revision: str | None) -> None:
        """Put the chart and revision instance ``instance_id`` ran on on the current span, if
        it is the span statebound opened for a call on that instance (a call without a span
        of its own, ``migrate`` say, leaves the caller's span alone)."""
        opened = _OPENED.get()
        if opened is None or opened[1] != instance_id:
            return
        span = opened[0]
        if span is trace.get_current_span() and span.is_recording():
            if chart:
                span.set_attribute("statebound.chart", chart)
            if revision:
                span.set_attribute("statebound.revision", revision)

    # ------------------------------------------------------------------ the hand-over
    def handed(self, rows: list[TimerRow], writes: tuple[PositionWrite, ...]) -> None:
        """A commit landed and will hand ``rows`` over: keep the chart and revision it wrote
        for each row's instance, for the row's ``statebound.deliver`` span (no read: the
        delivery itself never loads the instance)."""
        kept = getattr(self._local, "charts", None)
        if kept is None:
            kept = self._local.charts = {}
        for row in rows:
            for w in writes:
                if w.instance_id == row.target_id:
                    if w.blob is not None and w.status != DELETED:   # (a tombstone's blob has no header)
                        try:
                            kept[row.key] = (w.chart, read_header(w.blob).identity)
                        except PositionError:   # after the commit landed: the span goes without, the call on
                            pass
                    break

    @contextmanager
    def handing_over(self) -> Iterator[None]:
        """Around a hand-over: what :meth:`handed` kept is dropped when the outermost one
        ends (a hand-over within it only queues its rows for the outermost)."""
        loc = self._local
        loc.depth = getattr(loc, "depth", 0) + 1
        try:
            yield
        finally:
            loc.depth -= 1
            if not loc.depth:
                loc.charts = None

    # ------------------------------------------------------------------ spans
    def _start(self, op: str, instance_id: str, event: str | None,
               links: list[trace.Link] | None, more: dict[str, str] | None = None) -> trace.Span:
        """A started span (not current), or the invalid span when the SDK fails to start one."""
        attributes = {"statebound.instance": instance_id}
        if event is not None:
            attributes["statebound.event"] = event
        if more:
            attributes.update(more)
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
              links: list[trace.Link] | None = None, more: dict[str, str] | None = None) -> Iterator[trace.Span]:
        span = self._start(op, instance_id, event, links, more)
        opened = _OPENED.set((span, instance_id))
        try:
            with trace.use_span(span, end_on_exit=False):
                try:
                    yield span
                except BaseException as exc:
                    span.set_attribute("statebound.outcome", type(exc).__name__)
                    raise
        finally:
            _OPENED.reset(opened)
            self._finish(span)

    def call(self, op: str, instance_id: str, event: str | None, body: Callable[[Any], Any],
             caller_context: Any = None, *, invoke: str | None = None, fired: bool = False) -> Any:
        """Run ``body(caller_context)`` (the host call, untraced) inside its span; the caller
        context it gets carries the span's traceparent.

        :param invoke: the invokeid the call answers (``statebound.invoke``).
        :param fired: the call returns a ``FireResult``, whose outcome is the span's.
        """
        return self._traced(op, instance_id, event, None, lambda: body(self.carry(caller_context)),
                            _fire_outcome if fired else _ok, None if invoke is None else {_INVOKE: invoke})

    def _traced(self, op: str, instance_id: str, event: str | None, links: list[trace.Link] | None,
                run: Callable[[], Any], outcome: Callable[[Any], str], more: dict[str, str] | None = None) -> Any:
        """``run()``, the untraced body of one host call, inside its span; the span's outcome
        is ``outcome(result)``."""
        with self._span(op, instance_id, event, links, more) as span:
            token = _INSIDE.set(True)
            try:
                result = run()
            finally:
                _INSIDE.reset(token)
            span.set_attribute("statebound.outcome", outcome(result))
            return result

    def _row_span(self, row: TimerRow) -> tuple[str, str, str | None, list[trace.Link] | None,
                                                 dict[str, str] | None]:
        """``(op, instance, event, links, more attributes)`` of the span that fires ``row``:
        linked to the span that armed it."""
        armed = self.armed_by(row.caller_context)
        links = [trace.Link(armed)] if armed else None
        p = row.event if isinstance(row.event, dict) else {}
        if row.kind == TIMER:
            name = p.get("name")
            return "fire", row.target_id, name if isinstance(name, str) else None, links, None
        # a send row keeps its event under "event"; an invoke or cancel row has none, only
        # the invocation it starts or ends (as has a forward to one)
        more: dict[str, str] = {}
        invokeid = p.get("invokeid")
        if isinstance(invokeid, str):
            more[_INVOKE] = invokeid
        kept = getattr(self._local, "charts", None)
        chart = kept.pop(row.key, None) if kept else None
        if chart is not None:
            more["statebound.chart"], more["statebound.revision"] = chart
        event = p.get("event") if row.kind == SEND else None
        return "deliver", row.target_id, event if isinstance(event, str) else None, links, more or None

    # ------------------------------------------------------------------ spans of a batch
    def open(self, op: str, instance_id: str, event: str | None, caller_context: Any,
             links: list[trace.Link] | None = None, more: dict[str, str] | None = None) -> tuple[trace.Span, Any]:
        """Start the span of one batch item (not current, not ended) and return it with the
        item's caller context carrying its traceparent; :meth:`end` finishes it."""
        span = self._start(op, instance_id, event, links, more)
        with trace.use_span(span, end_on_exit=False):
            return span, self.carry(caller_context)

    def open_fire(self, row: TimerRow) -> tuple[trace.Span, TimerRow]:
        """:meth:`open` for a claimed row: linked to the span that armed it, as :meth:`fire`."""
        op, instance_id, event, links, more = self._row_span(row)
        span, ctx = self.open(op, instance_id, event, row.caller_context, links, more)
        return span, replace(row, caller_context=ctx)

    @staticmethod
    @contextmanager
    def within(span: trace.Span, instance_id: str, *, body: bool = False) -> Iterator[None]:
        """Run a batch item's work (on ``instance_id``) with its span current; ``body``: the
        work is one traced host call (``host.fire``), which must not open a span of its own."""
        token = _INSIDE.set(True) if body else None
        opened = _OPENED.set((span, instance_id))
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield
        finally:
            _OPENED.reset(opened)
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
        op, instance_id, event, links, more = self._row_span(row)
        return self._traced(op, instance_id, event, links,
                            lambda: body(replace(row, caller_context=self.carry(row.caller_context))),
                            _fire_outcome, more)


def _ok(_result: Any) -> str:
    return "ok"


def _fire_outcome(result: Any) -> str:
    return str(getattr(result, "outcome", "ok"))
