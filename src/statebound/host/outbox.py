"""The outbox: ``<send>``s to send processors and ``<invoke>``s of invoke handlers.

A drive never talks to the outside world. When it asks for a send to a registered
processor, or enters a state whose ``<invoke>`` names a registered handler, the host
writes an **outbox row** into the same table as its timer rows, in the same commit as
the position (so the request exists exactly when the state change does). Then it hands
the row over itself, right after that commit, and the sweeper does so for any row the
host could not (a crash, a failure, a delayed send). Delivery is therefore at least
once, with an idempotency key that never changes across attempts.

Rows and what firing them does (``TimerRow.kind``):

========  ========================================  ===========================================
kind      written when                              fired by
========  ========================================  ===========================================
send      ``<send type="NAME">``, autoforward or    ``processor.deliver(Delivery)``, or an
          ``<send target="#_id">`` to a handler     invoke handler's ``forward(Delivery)``
invoke    a state with ``<invoke type="NAME">``     ``handler.start(InvokeRequest)``; the
          is entered                                result is ``done.invoke.<id>``
cancel    that state is exited before a result      ``handler.cancel(InvokeRequest)``, best
          arrived                                   effort (one try)
========  ========================================  ===========================================

Row payloads (``TimerRow.event``): a send row holds ``event``, ``target``, ``type``,
``data``, ``delayed`` and, for a forward to an invocation, ``invokeid``; invoke and
cancel rows hold ``invokeid``, ``type``, ``src``, ``data``, ``content`` and ``state``.

Each outbox row's ordinal comes from the instance's ordinal counter, like a timer's. An
invoke row's ordinal is the invocation's **generation**: it is in the instance's timer
refs (send id ``sb.invoke.<invokeid>``) while the invocation may still deliver, and a
result is accepted only while that ref is there. Leaving the state drops the ref, so a
late result is discarded, with the reason written on the row.

Failures: a processor or handler that raises is retried with the timer rows' backoff;
:class:`~statebound.DeliveryRejected` (or running out of attempts, or a result that
cannot be stored) parks the row as dead in the same commit that gives the chart
``error.communication`` (a send) or ``error.execution`` (an invoke).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..effects import Invoke
from ..events import BASICHTTP_PROCESSOR, Event
from ..exceptions import (DeliveryRejected, InstanceNotFound, InstanceSuspended, InvalidArgument, SerializationError,
                          describe)
from ..interpreter.state import RUNNING
from .delivery import drop_ref, next_ordinal
from .firing import count, fire_call, parked, release
from .processors import Delivery, InvokeRequest, Pending
from .store import (CANCEL, DEAD, DONE, INVOKE, PENDING, SEND, WAITING, TimerCompletion, TimerKey, TimerRef,
                    TimerRow, pack_field)
from .runner import load, run
from .unit import AlreadyDone, Entry, FireResult, Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["Outbox", "invoke_send_id", "check_processors", "check_invokers", "RESERVED_TYPES"]

log = logging.getLogger("statebound")

#: Type names a processor or handler may not take: the SCXML and Basic HTTP processors.
RESERVED_TYPES = frozenset({"scxml", "basichttp", BASICHTTP_PROCESSOR, "http://www.w3.org/TR/scxml/",
                            "http://www.w3.org/TR/scxml", "http://www.w3.org/TR/scxml/#SCXMLEventProcessor",
                            "http://www.w3.org/TR/scxml/#SCXMLEventProcessor/"})


def invoke_send_id(invokeid: str) -> str:
    """The send id under which an invocation's generation sits in the instance's timer refs."""
    return f"sb.invoke.{invokeid}"


def invoke_token(instance_id: str, invokeid: str, generation: int) -> str:
    """The request's token and idempotency key: stable across retries of one invocation."""
    return f"{instance_id}:{invokeid}:{generation}"


def _check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a {kind} type name must be a non-empty string, not {name!r}")
    if name in RESERVED_TYPES:
        raise InvalidArgument(f"{name!r} is the SCXML or Basic HTTP processor; a {kind} needs another type name")
    return name


def check_processors(processors: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate ``Host(processors=...)``: names, and objects with ``deliver`` or callables."""
    out = {}
    for name, proc in (processors or {}).items():
        _check_name("send processor", name)
        if not callable(getattr(proc, "deliver", None)) and not callable(proc):
            raise InvalidArgument(f"send processor {name!r} must have a deliver(delivery) method or be callable")
        out[name] = proc
    return out


def check_invokers(invokers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate ``Host(invokers=...)``: names, and objects with a ``start`` method."""
    out = {}
    for name, handler in (invokers or {}).items():
        _check_name("invoke handler", name)
        if not callable(getattr(handler, "start", None)):
            raise InvalidArgument(f"invoke handler {name!r} must have a start(request) method")
        out[name] = handler
    return out


def _delivery(row: TimerRow) -> Delivery:
    p = row.event
    return Delivery(f"{row.instance_id}:{row.ordinal}", row.instance_id, row.ordinal, row.send_id, p["type"],
                    p.get("target"), p.get("event"), p.get("data"), row.caller_context, row.attempts + 1)


def _request(row: TimerRow) -> InvokeRequest:
    p = row.event
    token = invoke_token(row.instance_id, p["invokeid"], row.ordinal)
    return InvokeRequest(token, row.instance_id, p["invokeid"], token, p["type"], p.get("src"),
                         p.get("data") or {}, p.get("content"), row.caller_context, row.attempts + 1)


class Outbox:
    """The host's outbox: writes rows into a unit of work and fires them.

    Private to :class:`~statebound.Host`, which owns one; its units run, load and deliver
    through ``runner.py`` and the host's ``_drain``, as the host's own calls do.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self._local = threading.local()

    # ------------------------------------------------------------------ writing rows
    def _row(self, u: Unit, e: Entry, iid: str, ordinal: int, due: int, send_id: str, payload: dict[str, Any],
             dedup: dict[str, Any], ctx: Any, kind: str) -> TimerRow:
        h = self.host
        now = h.clock.now_ms()
        inline = h.deliver_after_commit and due <= now
        # A row the host hands over itself is hidden from sweepers for one lease, so the
        # two do not race for it; if this process dies first, a sweeper takes it after that.
        row = TimerRow(iid, ordinal, iid, due, send_id, payload, None, dedup, ctx, PENDING,
                       next_attempt_at_ms=now + h.outbox_lease_ms if inline else None, kind=kind)
        u.puts[row.key] = row
        if inline:
            u.deliver.add(row.key)
        return row

    def send(self, u: Unit, iid: str, eff: Any, ctx: Any) -> None:
        """A ``Send``/``SendDelayed`` of a processor type becomes a send row."""
        h = self.host
        e = u.entries[iid]
        delayed = hasattr(eff, "delay_ms")
        if delayed:
            ordinal = eff.ordinal
            due = eff.at_ms if eff.at_ms is not None else h.clock.now_ms() + (eff.delay_ms or 0)
        else:
            ordinal, due = next_ordinal(e), h.clock.now_ms()
        payload = {"event": eff.event or None, "target": eff.target, "type": eff.type, "data": eff.data,
                   "delayed": delayed}
        dedup = {"macrostep": eff.macrostep, "microstep": eff.microstep, "round": eff.round,
                 "c_index": eff.c_index, "owner": eff.owner, "id_from_author": eff.id_from_author}
        self._row(u, e, iid, ordinal, due, eff.send_id, payload, dedup, eff.caller_context, SEND)
        if delayed:  # only a delayed send can still be cancelled, by its send id
            e.refs.append(TimerRef(ordinal, eff.send_id))

    def invoke(self, u: Unit, iid: str, eff: Invoke, ctx: Any) -> None:
        """Entering a state with a handler ``<invoke>``: an invoke row, its ordinal the generation."""
        h = self.host
        e = u.entries[iid]
        ordinal = next_ordinal(e)
        payload = {"invokeid": eff.invokeid, "type": eff.type, "src": eff.src, "data": eff.data,
                   "content": eff.content, "state": eff.state}
        dedup = {"macrostep": eff.macrostep, "microstep": eff.microstep, "round": eff.round,
                 "c_index": eff.c_index, "owner": eff.state, "id_from_author": False}
        sid = invoke_send_id(eff.invokeid)
        self._row(u, e, iid, ordinal, h.clock.now_ms(), sid, payload, dedup, ctx, INVOKE)
        e.refs.append(TimerRef(ordinal, sid))

    def _generation(self, e: Entry, invokeid: str) -> int | None:
        sid = invoke_send_id(invokeid)
        return next((r.ordinal for r in e.refs if r.send_id == sid), None)

    def cancel_invoke(self, u: Unit, iid: str, invokeid: str) -> bool:
        """The invoking state was exited. Returns ``False`` if ``invokeid`` is no handler's.

        The generation's ref is dropped (so any later result is discarded) and its row
        becomes a cancel row for the handler's cancel hook, or is finished as cancelled
        when the handler has none. A row written in this same unit is simply not written.
        """
        h = self.host
        e = u.entries[iid]
        generation = self._generation(e, invokeid)
        if generation is None:
            return (iid, invokeid) in u.answered
        drop_ref(e, generation)
        key = (iid, generation)
        if key in u.puts:
            del u.puts[key]
            u.deliver.discard(key)
            return True
        row = h.store.get_timer(key)
        if row is None or row.state in (DONE, DEAD):
            return True
        now = h.clock.now_ms()
        reason = f"the state that invoked {invokeid!r} was exited before a result arrived"
        handler = h.invokers.get(str(row.event.get("type")))
        if handler is not None and not callable(getattr(handler, "cancel", None)):
            u.puts[key] = replace(row, state=DONE, outcome="cancelled", reason=reason, claimed_by=None,
                                  claim_expires_ms=None)
            return True
        inline = h.deliver_after_commit
        u.puts[key] = replace(row, kind=CANCEL, state=PENDING, due_at_ms=now, attempts=0, last_error=None,
                              next_attempt_at_ms=now + h.outbox_lease_ms if inline else None,
                              claimed_by=None, claim_expires_ms=None, reason=reason)
        if inline:
            u.deliver.add(key)
        return True

    def forward(self, u: Unit, iid: str, invokeid: str, event: Event, ctx: Any,
                send_id: str | None = None) -> bool:
        """An event for a handler invocation (autoforward, or ``<send target="#_id">``):
        a send row for the handler's ``forward`` hook. ``False`` if ``invokeid`` is no handler's."""
        h = self.host
        e = u.entries[iid]
        generation = self._generation(e, invokeid)
        if generation is None:
            return (iid, invokeid) in u.answered
        if event.invokeid == invokeid:
            return True  # the invocation's own result or error: never echoed back to it
        key = (iid, generation)
        inv_row = u.puts.get(key) or h.store.get_timer(key)
        typ = inv_row.event.get("type") if inv_row is not None else None
        if typ is None:
            return True
        handler = h.invokers.get(typ)
        if handler is not None and not callable(getattr(handler, "forward", None)):
            log.debug("instance %r: invoke handler %r has no forward(); event %r not forwarded",
                      iid, typ, event.name)
            return True
        ordinal = next_ordinal(e)
        payload = {"event": event.name, "target": f"#_{invokeid}", "type": typ, "data": event.data,
                   "delayed": False, "invokeid": invokeid}
        self._row(u, e, iid, ordinal, h.clock.now_ms(), send_id or f"sb.forward.{invokeid}.{ordinal}", payload,
                  {}, ctx, SEND)
        return True

    # ------------------------------------------------------------------ after the commit
    def after_commit(self, rows: list[TimerRow]) -> None:
        """Hand over the rows a commit just wrote, then the ones those deliveries cause.

        Deliveries nested in a delivery (a result that sends a receipt) join the queue of
        the outermost call instead of recursing. A failure is the row's business (it is
        released for the sweeper); it never fails the host call that committed.
        """
        queue: deque[TimerRow] | None = getattr(self._local, "queue", None)
        if queue is not None:
            queue.extend(rows)
            return
        queue = self._local.queue = deque(rows)
        h = self.host
        seen, verify = h._purged, False
        try:
            budget = h.max_deliveries
            while queue and budget > 0:
                budget -= 1
                row = queue.popleft()
                if h._purged != seen:
                    # a delivery deleted or suspended an instance (a processor calling back
                    # into the host): the rows still queued may be purged or parked since, and
                    # must not be handed over from their copies. Read each again from now on.
                    seen, verify = h._purged, True
                if verify and not self._still_pending(row):
                    continue
                try:
                    self.host.fire(row)
                except Exception as exc:  # the row stays in the store; the sweeper retries it
                    log.warning("outbox row %s not delivered after commit: %s", row.key, exc)
        finally:
            self._local.queue = None

    def _still_pending(self, row: TimerRow) -> bool:
        try:
            now = self.host.store.get_timer(row.key)
        except Exception as exc:  # the sweeper hands it over when its lease runs out
            log.warning("outbox row %s not delivered after commit: %s", row.key, exc)
            return False
        return now is not None and now.state == PENDING

    # ------------------------------------------------------------------ firing
    def fire(self, row: TimerRow, node: str, lag: int) -> FireResult:
        """Fire one outbox row (any kind but ``timer``)."""
        if row.kind == SEND:
            return self._fire_send(row, node, lag)
        if row.kind == INVOKE:
            return self._fire_invoke(row, node, lag)
        if row.kind == CANCEL:
            return self._fire_cancel(row, node, lag)
        return self._result(row.key, "skipped", f"unknown row kind {row.kind!r}", lag)

    def _result(self, key: TimerKey | None, outcome: str, reason: str | None = None, lag: int = 0) -> FireResult:
        count(self.host, outcome)
        return FireResult(key, outcome, reason, lag)

    def _fire_send(self, row: TimerRow, node: str, lag: int) -> FireResult:
        h = self.host
        p = row.event
        via = p.get("invokeid")
        if via is not None:
            target = getattr(h.invokers.get(p["type"]), "forward", None)
        else:
            proc = h.processors.get(p["type"])
            target = getattr(proc, "deliver", proc)
        if target is None:
            return self._result(row.key, "skipped", f"this host has no {'invoke handler' if via else 'send processor'} "
                                                    f"{p['type']!r}", lag)
        if p.get("delayed"):
            # a delayed send is cancelled with its session, as a delayed event would be
            rec = h.store.load(row.instance_id)
            if rec is None or rec.status != RUNNING:
                why = f"instance {row.instance_id!r} " + ("not found" if rec is None else f"is {rec.status}")
                return self._finish(row, node, "discarded", why, lag)
        try:
            target(_delivery(row))
        except Exception as exc:
            return self._failed(row, node, exc, lag)
        return self._finish(row, node, "delivered", None, lag)

    def _fire_invoke(self, row: TimerRow, node: str, lag: int) -> FireResult:
        h = self.host
        p = row.event
        handler = h.invokers.get(p["type"])
        if handler is None:
            return self._result(row.key, "skipped", f"this host has no invoke handler {p['type']!r}", lag)
        invokeid = p["invokeid"]
        try:
            result = handler.start(_request(row))
            if not isinstance(result, Pending):
                pack_field(result, f"the result of invoke {invokeid!r}")
        except Exception as exc:
            return self._failed(row, node, exc, lag)
        if isinstance(result, Pending):
            def waiting(u: Unit) -> bool:
                u.call = fire_call(row)
                e = load(h, u, row.instance_id)
                # The state was exited while start ran (start may take seconds): the row is a
                # cancel row now, and must stay one for the cancel hook, which never ran when
                # it was written WAITING. What is left is the moment between this read and the
                # commit; making the commit conditional on the position would close it, at the
                # price of a version bump per answer, which a redelivered answer would repeat.
                return e is not None and e.position is not None and self._generation(e, invokeid) == row.ordinal
            try:
                live = run(h, waiting, completion=lambda ok: (
                    TimerCompletion(row.key, None, result.note, node, WAITING) if ok else None))
            except AlreadyDone:
                return self._result(row.key, "skipped", "a result arrived before the handler's answer", lag)
            if not live:
                return self._result(row.key, "skipped", "the invoking state was exited while start ran", lag)
            return self._result(row.key, "waiting", result.note, lag)
        done = Event(f"done.invoke.{invokeid}", result, "external", invokeid=invokeid)
        return self._deliver_result(row.instance_id, invokeid, row.ordinal, done, row.caller_context, node, lag)

    def _fire_cancel(self, row: TimerRow, node: str, lag: int) -> FireResult:
        h = self.host
        typ = str(row.event.get("type"))
        handler = h.invokers.get(typ)
        if handler is None:
            return self._result(row.key, "skipped", f"this host has no invoke handler {typ!r}", lag)
        reason = row.reason or "the invoking state was exited"
        hook = getattr(handler, "cancel", None)
        if callable(hook):
            try:
                hook(_request(row))
            except Exception as exc:  # best effort: one try, the failure kept on the row
                reason += f"; the cancel hook failed ({describe(exc)})"
                log.warning("invoke %r of %r: cancel hook failed: %s", row.event.get("invokeid"),
                            row.instance_id, describe(exc))
        return self._finish(row, node, "cancelled", reason, lag, leave_refs=True)

    # ------------------------------------------------------------------ completing
    def _finish(self, row: TimerRow, node: str, outcome: str, reason: str | None, lag: int,
                leave_refs: bool = False) -> FireResult:
        """Complete the row; a delayed send or an invoke also leaves the instance's refs."""
        h = self.host
        has_ref = not leave_refs and (row.kind == INVOKE or row.event.get("delayed"))

        def unit(u: Unit) -> None:
            u.call = fire_call(row)
            if has_ref:
                e = load(h, u, row.instance_id)
                if e is not None:
                    drop_ref(e, row.ordinal)
        try:
            run(h, unit, completion=lambda _: TimerCompletion(row.key, outcome, reason, node))
        except AlreadyDone:
            return self._result(row.key, "skipped", "completed elsewhere", lag)
        return self._result(row.key, outcome, reason, lag)

    def _failed(self, row: TimerRow, node: str, exc: Exception, lag: int) -> FireResult:
        """A delivery failed: back off and retry, or park the row dead and tell the chart."""
        h = self.host
        attempts = row.attempts + 1
        text = describe(exc)
        dead = isinstance(exc, (DeliveryRejected, SerializationError)) or attempts >= h.max_attempts
        if not dead:
            release(h, row, node, text, attempts)   # which counts the failure in host.metrics
            return FireResult(row.key, "failed", text, lag)
        p = row.event
        iid = row.instance_id
        data = {"type": p["type"], "attempts": attempts, "error": type(exc).__name__}
        if row.kind == INVOKE:
            message = f"invoke {p['invokeid']!r} ({p['type']!r}) failed for good after {attempts} attempt(s): {text}"
            # as for any event the invocation causes, _event.invokeid names it
            error = Event("error.execution", {"message": message, "invokeid": p["invokeid"], **data}, "platform",
                          invokeid=p["invokeid"])
        else:
            message = f"send {row.send_id!r} to {p['type']!r} failed for good after {attempts} attempt(s): {text}"
            error = Event("error.communication", {"message": message, "target": p.get("target"),
                                                  "event": p.get("event"), **data},
                          "platform", row.send_id, invokeid=p.get("invokeid"))

        def unit(u: Unit) -> None:
            u.call = fire_call(row)
            e = load(h, u, iid)
            if e is None or e.position is None:
                return
            drop_ref(e, row.ordinal)
            if row.kind == INVOKE:
                u.answered.add((iid, p["invokeid"]))
            if e.position.status == RUNNING:
                u.queue.append((iid, error, row.caller_context))
                h._drain(u)
        try:
            run(h, unit, completion=lambda _: TimerCompletion(row.key, None, None, node, DEAD, text))
        except AlreadyDone:
            return self._result(row.key, "skipped", "completed elsewhere", lag)
        h.metrics.add("dead")
        log.warning("outbox row %s parked as dead: %s", row.key, message)
        return self._result(row.key, "failed", text, lag)

    def _deliver_result(self, iid: str, invokeid: str, generation: int | None, event: Event, ctx: Any,
                        node: str | None, lag: int) -> FireResult:
        """Deliver an invocation's result if its generation is still live, in one commit
        with the row's completion; otherwise discard it and say why on the row.

        ``generation`` ``None`` means "whichever is live" (``complete_invoke`` without a token).
        """
        h = self.host
        found: list[TimerKey | None] = [None]

        def unit(u: Unit) -> tuple[str, str | None, TimerCompletion | None]:
            if node is None:   # complete_invoke or fail_invoke, called by the application
                op = "complete_invoke" if event.name.startswith("done.invoke.") else "fail_invoke"
                u.call = {"op": op, "instance": iid, "invoke": invokeid, "caller_context": ctx}
            else:              # the handler's start answered at once, in the row's fire
                u.call = {"op": "fire", "instance": iid, "timer": [iid, generation], "caller_context": ctx}
            e = load(h, u, iid)
            if e is None or e.position is None:
                if node is None:  # complete_invoke/fail_invoke: the caller named no instance
                    raise InstanceNotFound(iid)
                return "discarded", f"result discarded: instance {iid!r} not found", None
            if e.suspended:
                # Parked as a plain event, the result would be delivered after resume with no
                # generation check, into whatever invocation was live by then.
                if node is None:
                    raise InstanceSuspended(iid)   # the caller retries after resume, as for send
                assert generation is not None      # a fired invoke row names its own generation
                # The invoke row waits, parked, and fires again after resume: the handler (which
                # dedups on the key) answers again, and the generation is checked then. Parked
                # as a timer row is: by its conditional completion, never from a stale copy.
                e.dirty = True   # the position write makes this conditional on the suspend
                why = f"instance {iid!r} is suspended"
                return "parked", why, parked((iid, generation), node, why)
            live = self._generation(e, invokeid)
            gen = live if generation is None else generation
            key = found[0] = None if gen is None else (iid, gen)
            pos = e.position
            if gen is not None and key is not None and live == gen and pos.status == RUNNING and \
                    any(i.invokeid == invokeid for i in pos.invocations):
                drop_ref(e, gen)
                u.answered.add((iid, invokeid))
                u.queue.append((iid, event, ctx))
                h._drain(u)
                return "fired", None, TimerCompletion(key, "fired", None, node)
            if pos.status != RUNNING:
                why = f"instance {iid!r} is {pos.status}"
            elif live is not None:
                why = f"invoke {invokeid!r} was started again (generation {live}) since generation {gen}"
            elif gen is not None:
                why = f"invoke {invokeid!r} (generation {gen}) is no longer active: its state was exited"
            else:
                why = (f"instance {iid!r} has no active invoke {invokeid!r} (its state was exited, or it "
                       "already finished); pass the request's token to record this on its row")
            reason = f"result discarded: {why}"
            row = None if key is None else (u.puts.get(key) or h.store.get_timer(key))
            if row is not None and not _of_invocation(row, invokeid):
                # a token naming another row (a timer, another invoke): never touch that row
                row = found[0] = None
            if row is None or key is None:
                return "discarded", reason, None
            if row.kind == CANCEL and row.state != DONE:
                return "discarded", reason, None   # the row is the cancel hook's to finish
            if row.state != DONE:
                return "discarded", reason, TimerCompletion(key, "discarded", reason, node)
            if row.outcome == "cancelled":
                # the cancel hook already ran; the late result is still written down on the row
                u.puts[key] = replace(row, outcome="discarded", reason=f"{reason} (after: {row.reason})")
            return "discarded", reason, None
        try:
            outcome, reason, _ = run(h, unit, completion=lambda r: r[2])
        except AlreadyDone:
            return self._result(found[0], "discarded", "result discarded: the invocation had already finished", lag)
        if outcome == "discarded":
            log.info("instance %r: result of invoke %r discarded: %s", iid, invokeid, reason)
        return self._result(found[0], outcome, reason, lag)

    def finish_invoke(self, instance_id: str, invokeid: str, token: str | None, event: Event,
                      ctx: Any) -> FireResult:
        """``complete_invoke``/``fail_invoke``: deliver ``event`` if the invocation is live."""
        generation = None if token is None else _parse_token(token, instance_id, invokeid)
        return self._deliver_result(instance_id, invokeid, generation, event, ctx, None, 0)


def _of_invocation(row: TimerRow, invokeid: str) -> bool:
    """Whether ``row`` is a generation of invoke ``invokeid`` (its start, or its cancel)."""
    return row.kind in (INVOKE, CANCEL) and row.event.get("invokeid") == invokeid


def _parse_token(token: str, instance_id: str, invokeid: str) -> int:
    prefix = f"{instance_id}:{invokeid}:"
    tail = token[len(prefix):] if isinstance(token, str) and token.startswith(prefix) else ""
    if not (tail.isascii() and tail.isdigit()) or len(tail) > 19 or int(tail) >= 1 << 63:
        # (isdigit alone takes "²", which int() refuses; no ordinal reaches 2**63, which SQLite
        # could not even look up)
        raise InvalidArgument(f"token {token!r} is not one of invoke {invokeid!r} of instance {instance_id!r}")
    return int(tail)
