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
cancel rows hold ``invokeid``, ``type``, ``src``, ``data``, ``content`` and ``state``. A
cancel row kept by a parent for a session it ended (:meth:`Outbox.cancel_ended`) also
holds that session's ``instance`` and the invocation's ``generation``.

Each outbox row's ordinal comes from the instance's ordinal counter, like a timer's. An
invoke row's ordinal is the invocation's **generation**: it is in the instance's timer
refs (send id ``sb.invoke.<invokeid>``) while the invocation may still deliver, and a
result is accepted only while that ref is there. Leaving the state drops the ref, so a
late result is discarded, with the reason written on the row. A chart may give a send of
its own that id too (nothing reserves it), so the host marks its ref (``TimerRef.name`` is
``"invoke"``, which a chart's send never sets), and an unmarked ref under that id (one
written before the mark existed) counts only if its row is an invoke row.

Every row is read again right before its processor or handler is called (one read): the
copy being fired was read earlier (claimed by a sweep, or queued for the hand-over), and
the row may have been cancelled, purged, parked, finished or turned into a cancel row since.
A row handed over by the thread that wrote it, with no processor or handler called in
between, is the one exception: the copy is as fresh as a read would be.

Failures: a processor or handler that raises is retried with the timer rows' backoff;
:class:`~statebound.DeliveryRejected` (or running out of attempts, or a result that
cannot be stored) parks the row as dead in the same commit that gives the chart
``error.communication`` (a send) or ``error.execution`` (an invoke).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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
from .store import (CANCEL, CLAIMED, DEAD, DONE, INVOKE, PENDING, SEND, SUSPENDED, WAITING, TimerCompletion,
                    TimerKey, TimerRef, TimerRow, pack_field)
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
    iid = _invoker(row)
    # (a cancel row a parent keeps for a session it ended names that session's invocation)
    token = invoke_token(iid, p["invokeid"], p.get("generation", row.ordinal))
    return InvokeRequest(token, iid, p["invokeid"], token, p["type"], p.get("src"),
                         p.get("data") or {}, p.get("content"), row.caller_context, row.attempts + 1)


def _invoker(row: TimerRow) -> str:
    """The instance whose invocation an invoke or cancel row is (see :meth:`Outbox.cancel_ended`)."""
    return str(row.event.get("instance", row.instance_id))


class Outbox:
    """The host's outbox: writes rows into a unit of work and fires them.

    Private to :class:`~statebound.Host`, which owns one; its units run, load and deliver
    through ``runner.py`` and the host's ``_drain``, as the host's own calls do.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        # per thread: the hand-over's queue, a count of calls out (``_calling``), and the
        # rows to hand over written by this thread, with that count when they were written
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
            self._written(row.key)
        return row

    def _written(self, key: TimerKey) -> None:
        """A row this thread hands over after its commit was written (see ``_stale``)."""
        loc = self._local
        if getattr(loc, "written", None) is None:
            loc.written = {}
        loc.written[key] = getattr(loc, "calls", 0)

    @contextmanager
    def _calling(self) -> Iterator[None]:
        """Around each call of a processor, handler or hook, which may call back into the
        host and change rows: copies written before it are read again (``_stale``)."""
        loc = self._local
        loc.calls = getattr(loc, "calls", 0) + 1
        try:
            yield
        finally:
            loc.calls += 1

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
        e.refs.append(TimerRef(ordinal, sid, INVOKE))   # the mark: see _generation

    def _generation(self, u: Unit, iid: str, e: Entry, invokeid: str) -> tuple[int, TimerRow | None] | None:
        """The live generation of handler invocation ``invokeid`` of ``iid``, with its row if
        it was read here (else ``None``), or ``None`` if no invocation of that id is live.

        Nothing reserves the send id an invocation's ref is kept under, so a chart's own
        ``<send id="sb.invoke.charge">`` may sit beside it. The host's ref is marked; an
        unmarked one (written before the mark) counts only if its row is an invoke row.
        """
        sid = invoke_send_id(invokeid)
        for ref in e.refs:
            if ref.send_id == sid:
                if ref.name == INVOKE:
                    return ref.ordinal, None
                key = (iid, ref.ordinal)
                row = u.puts.get(key) or self.host.store.get_timer(key)
                if row is None or row.kind == INVOKE:
                    return ref.ordinal, row
        return None

    def _invoke_row(self, u: Unit, key: TimerKey, row: TimerRow | None) -> TimerRow | None:
        """The row ``_generation`` named, read now unless it was read there."""
        return row or u.puts.get(key) or self.host.store.get_timer(key)

    @staticmethod
    def _live(e: Entry, invokeid: str, generation: int) -> bool:
        """Whether generation ``generation``, the ordinal of an invoke row of ``invokeid``,
        is still live: its ref leaves the position in the commit that cancels or answers it.
        (Ordinals name one row each, so a ref of that ordinal is that row's; no read.)"""
        sid = invoke_send_id(invokeid)
        return any(r.ordinal == generation and r.send_id == sid for r in e.refs)

    def cancel_invoke(self, u: Unit, iid: str, invokeid: str) -> bool:
        """The invoking state was exited. Returns ``False`` if ``invokeid`` is no handler's.

        The generation's ref is dropped (so any later result is discarded) and its row
        becomes a cancel row for the handler's cancel hook, or is finished as cancelled
        when the handler has none. A row written in this same unit is simply not written.
        """
        h = self.host
        e = u.entries[iid]
        live = self._generation(u, iid, e, invokeid)
        if live is None:
            return (iid, invokeid) in u.answered
        generation, row = live
        drop_ref(e, generation)
        key = (iid, generation)
        if key in u.puts:
            del u.puts[key]
            u.deliver.discard(key)
            return True
        row = self._invoke_row(u, key, row)
        if row is None or row.state in (DONE, DEAD):
            return True
        # The row was read outside the commit: a sweeper may be firing it. Rewritten only
        # in the state it was read in, so a release or completion meanwhile is not undone
        # (the unit runs again, from a fresh read).
        if u.expect is None:
            u.expect = {}
        u.expect[key] = (row.state,)
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
            self._written(key)
        return True

    def cancel_ended(self, u: Unit, iid: str, keeper: str) -> None:
        """Session ``iid`` is being deleted because its parent ``keeper`` (loaded in ``u``)
        left the state that invoked it, or was cancelled: its live handler invocations are
        cancelled as a state's exit cancels them.

        The session's rows go with it, so each cancel row is the keeper's, naming the
        session's invocation (its token and idempotency key are the ones ``start`` got).
        An invocation whose handler has no cancel hook needs no row.
        """
        h = self.host
        e = u.entries[iid]
        keep = u.entries[keeper]
        if e.position is None or keep.position is None:
            return
        for inv in e.position.invocations:
            live = self._generation(u, iid, e, inv.invokeid)
            if live is None or (iid, live[0]) in u.puts:
                continue   # not a handler's, or written in this unit: its start never ran
            generation, row = live
            row = self._invoke_row(u, (iid, generation), row)
            if row is None or row.state in (DONE, DEAD):
                continue
            handler = h.invokers.get(str(row.event.get("type")))
            if handler is not None and not callable(getattr(handler, "cancel", None)):
                continue
            ordinal = next_ordinal(keep)
            payload = {**row.event, "instance": iid, "generation": generation}
            cancel = self._row(u, keep, keeper, ordinal, h.clock.now_ms(), row.send_id, payload, {},
                               row.caller_context, CANCEL)
            u.puts[cancel.key] = replace(cancel, reason=f"session {iid!r}, which invoked {inv.invokeid!r}, was "
                                                        "ended by its parent before a result arrived")

    def forward(self, u: Unit, iid: str, invokeid: str, event: Event, ctx: Any,
                send_id: str | None = None) -> bool:
        """An event for a handler invocation (autoforward, or ``<send target="#_id">``):
        a send row for the handler's ``forward`` hook. ``False`` if ``invokeid`` is no handler's."""
        h = self.host
        e = u.entries[iid]
        live = self._generation(u, iid, e, invokeid)
        if live is None:
            return (iid, invokeid) in u.answered
        if event.invokeid == invokeid or _failed_forward(event, invokeid):
            # the invocation's own result or error, or the failure of a forward to it: never
            # echoed back to it (a forward that always fails would otherwise loop for ever)
            return True
        inv_row = self._invoke_row(u, (iid, live[0]), live[1])
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
        try:
            budget = h.max_deliveries
            while queue and budget > 0:
                budget -= 1
                row = queue.popleft()
                # (a copy: an earlier delivery may have purged, parked or cancelled its row
                # since, by calling back into the host; the fire reads the row again first)
                try:
                    self.host.fire(row)
                except Exception as exc:  # the row stays in the store; the sweeper retries it
                    log.warning("outbox row %s not delivered after commit: %s", row.key, exc)
        finally:
            self._local.queue = self._local.written = None

    # ------------------------------------------------------------------ firing
    def fire(self, row: TimerRow, node: str, lag: int) -> FireResult:
        """Fire one outbox row (any kind but ``timer``) from a copy claimed by ``node``, or
        written for the hand-over: checked against the stored row right before the call."""
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

    def _stale(self, row: TimerRow, node: str) -> tuple[str, str] | None:
        """Why the copy ``row`` must not be handed over, as ``(outcome, reason)``, or ``None``.

        One consistent read of the row, right before the outside world is called: a fire's
        completion is conditional, but the call comes before it, and cannot be taken back.
        The row must still be there (a ``<cancel>`` deletes it, a delete purges it, and a
        new instance of the same id never reuses its key), still of its kind (an exit turns
        a live invoke row into a cancel row in the commit that drops its generation's ref,
        so an invoke row still of kind ``invoke`` is a live generation), and still this
        node's to fire: pending (the hand-over's row, hidden by its lease, or a woken row
        on a store without ``claim_rows``) or claimed by ``node``.

        Not read: a row the hand-over got from a commit of this thread, with no processor,
        handler or hook called since it was written. Nothing of this host can have changed
        it, and another process can as well just after a read.
        """
        loc = self._local
        written = getattr(loc, "written", None)
        if written is not None and getattr(loc, "queue", None) is not None and \
                written.pop(row.key, None) == getattr(loc, "calls", 0):
            return None   # the hand-over of a row this thread wrote, nothing called since its commit
        cur = self.host.store.get_timer(row.key)
        if cur is None:
            return "skipped", f"row {row.key} is gone (cancelled, or its instance deleted) since it was read"
        if cur.kind != row.kind:
            return "skipped", f"row {row.key} is a {cur.kind} row now: its invocation was cancelled"
        if cur.state == SUSPENDED:
            # parked by the suspend with the instance's other rows: it fires after resume
            return "parked", f"instance {row.instance_id!r} is suspended"
        if cur.state == CLAIMED and cur.claimed_by != node:
            return "skipped", f"row {row.key} is claimed by {cur.claimed_by!r}"
        if cur.state not in (PENDING, CLAIMED):
            return "skipped", "completed elsewhere"
        return None

    def _park(self, row: TimerRow, node: str, lag: int) -> FireResult:
        """A delayed send due while its instance is suspended: parked in place, as a timer is
        (``firing.fire_step``), to go out after resume. Through the row's conditional
        completion, in a commit with the position, so it holds only while the suspend does."""
        h = self.host
        why = f"instance {row.instance_id!r} is suspended"

        def unit(u: Unit) -> bool:
            u.call = fire_call(row)
            e = load(h, u, row.instance_id)
            if e is None or not e.suspended:
                return False
            e.dirty = True   # the position write makes this conditional on the suspend
            return True
        try:
            held = run(h, unit, completion=lambda ok: parked(row.key, node, why) if ok else None)
        except AlreadyDone:
            return self._result(row.key, "skipped", "completed elsewhere", lag)
        if not held:   # resumed (or deleted) since the read: the next fire decides again
            return self._result(row.key, "skipped", f"instance {row.instance_id!r} was resumed or deleted "
                                                    "while the row was being parked", lag)
        return self._result(row.key, "parked", why, lag)

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
        stale = self._stale(row, node)
        if stale is not None:
            return self._result(row.key, *stale, lag)
        if p.get("delayed"):
            # a delayed send is cancelled with its session, as a delayed event would be, and
            # waits while its session is suspended, as a delayed event does
            rec = h.store.load(row.instance_id)
            if rec is not None and rec.status == SUSPENDED:
                return self._park(row, node, lag)
            if rec is None or rec.status != RUNNING:
                why = f"instance {row.instance_id!r} " + ("not found" if rec is None else f"is {rec.status}")
                return self._finish(row, node, "discarded", why, lag)
        try:
            with self._calling():
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
        stale = self._stale(row, node)
        if stale is not None:
            return self._result(row.key, *stale, lag)
        try:
            with self._calling():
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
                return e is not None and e.position is not None and self._live(e, invokeid, row.ordinal)
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
            stale = self._stale(row, node)
            if stale is not None:
                return self._result(row.key, *stale, lag)
            try:
                with self._calling():
                    hook(_request(row))
            except Exception as exc:  # best effort: one try, the failure kept on the row
                reason += f"; the cancel hook failed ({describe(exc)})"
                log.warning("invoke %r of %r: cancel hook failed: %s", row.event.get("invokeid"),
                            _invoker(row), describe(exc))
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
        """A delivery failed: back off and retry, or park the row dead and tell the chart.

        The failure of an invocation that is no longer live (its state was exited while
        ``start`` ran) is discarded, as a late result is: the chart is not told, and the row,
        by then a cancel row, is left to the cancel hook."""
        h = self.host
        attempts = row.attempts + 1
        text = describe(exc)
        dead = isinstance(exc, (DeliveryRejected, SerializationError)) or attempts >= h.max_attempts
        p = row.event
        iid = row.instance_id
        if not dead:
            if row.kind == INVOKE:
                # written over a cancel row, a release would put the hook off by a backoff,
                # and count start's failures against it
                cur = h.store.get_timer(row.key)
                if cur is None or cur.kind != INVOKE:
                    return self._discard_failure(row, text, "its state was exited", lag)
            release(h, row, node, text, attempts)   # which counts the failure in host.metrics
            return FireResult(row.key, "failed", text, lag)
        data = {"type": p["type"], "attempts": attempts, "error": type(exc).__name__}
        if row.kind == INVOKE:
            message = f"invoke {p['invokeid']!r} ({p['type']!r}) failed for good after {attempts} attempt(s): {text}"
            # as for any event the invocation causes, _event.invokeid names it
            error = Event("error.execution", {"message": message, "invokeid": p["invokeid"], **data}, "platform",
                          invokeid=p["invokeid"])
        else:
            message = f"send {row.send_id!r} to {p['type']!r} failed for good after {attempts} attempt(s): {text}"
            # no invokeid, even for a forward to an invocation: the event is the platform's,
            # not the invoked service's, so the invocation's <finalize> must not run on it
            error = Event("error.communication", {"message": message, "target": p.get("target"),
                                                  "event": p.get("event"), **data},
                          "platform", row.send_id)
        dead_row = TimerCompletion(row.key, None, None, node, DEAD, text)

        def unit(u: Unit) -> tuple[TimerCompletion | None, str | None]:
            u.call = fire_call(row)
            e = load(h, u, iid)
            if e is None or e.position is None:
                return dead_row, None
            if row.kind == INVOKE and not self._live(e, p["invokeid"], row.ordinal):
                why = "its state was exited"
                cur = u.puts.get(row.key) or h.store.get_timer(row.key)
                if cur is not None and cur.kind == INVOKE and cur.state not in (DONE, DEAD):
                    return TimerCompletion(row.key, "discarded", _failure_reason(row, text, why), node), why
                return None, why   # a cancel row is the cancel hook's to finish
            drop_ref(e, row.ordinal)
            if row.kind == INVOKE:
                u.answered.add((iid, p["invokeid"]))
            if e.position.status == RUNNING:
                u.queue.append((iid, error, row.caller_context))
                h._drain(u)
            return dead_row, None
        try:
            _, gone = run(h, unit, completion=lambda r: r[0])
        except AlreadyDone:
            return self._result(row.key, "skipped", "completed elsewhere", lag)
        if gone is not None:
            return self._discard_failure(row, text, gone, lag)
        h.metrics.add("dead")
        log.warning("outbox row %s parked as dead: %s", row.key, message)
        return self._result(row.key, "failed", text, lag)

    def _discard_failure(self, row: TimerRow, text: str, why: str, lag: int) -> FireResult:
        reason = _failure_reason(row, text, why)
        log.info("instance %r: %s", row.instance_id, reason)
        return self._result(row.key, "discarded", reason, lag)

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
            if node is not None and generation is not None and self._live(e, invokeid, generation):
                live: int | None = generation   # the fired invoke row's own generation: no read
            else:
                got = self._generation(u, iid, e, invokeid)
                live = None if got is None else got[0]
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


def _failure_reason(row: TimerRow, text: str, why: str) -> str:
    return (f"failure discarded: invoke {row.event['invokeid']!r} (generation {row.ordinal}) is no longer "
            f"active: {why} ({text})")


def _failed_forward(event: Event, invokeid: str) -> bool:
    """Whether ``event`` is the host's ``error.communication`` for a forward to ``invokeid``."""
    return (event.name == "error.communication" and event.type == "platform" and isinstance(event.data, dict)
            and event.data.get("target") == f"#_{invokeid}")


def _of_invocation(row: TimerRow, invokeid: str) -> bool:
    """Whether ``row`` is a generation of invoke ``invokeid`` of its own instance (its
    start, or its cancel; not a cancel row kept for a session the instance ended)."""
    return row.kind in (INVOKE, CANCEL) and row.event.get("invokeid") == invokeid and "instance" not in row.event


def _parse_token(token: str, instance_id: str, invokeid: str) -> int:
    prefix = f"{instance_id}:{invokeid}:"
    tail = token[len(prefix):] if isinstance(token, str) and token.startswith(prefix) else ""
    if not (tail.isascii() and tail.isdigit()) or len(tail) > 19 or int(tail) >= 1 << 63:
        # (isdigit alone takes "²", which int() refuses; no ordinal reaches 2**63, which SQLite
        # could not even look up)
        raise InvalidArgument(f"token {token!r} is not one of invoke {invokeid!r} of instance {instance_id!r}")
    return int(tail)
