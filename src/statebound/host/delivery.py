"""Delivery inside a unit of work: drive queued events, and apply what each drive asks for.

:func:`drain` takes the unit's queue FIFO: each event is driven into the instance it is
addressed to, within the call's delivery and CPU budgets; what is left over is kept as
rows due now (:func:`spill`), so nothing is lost. :func:`apply` turns one drive's effects
into the unit's work: routed events onto the queue, delayed sends into timer rows, cancels
into row deletes, ``<invoke>``s into child sessions (``children.py``) or outbox rows
(``outbox.py``), ``done.invoke`` to the parent, logs to ``on_log``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..chart.trust import UNTRUSTED
from ..effects import (Autoforward, BudgetExhausted, Cancel, CancelInvoke, Done, Invoke, Log, Send,
                       SendDelayed)
from ..events import SCXML_PROCESSOR, Event
from ..interpreter.state import RUNNING
from . import history as history_mod
from .children import delete_instance, invoke
from .routing import child_instance_id, route, to_invoked
from .runner import load
from .store import INVOKE, PENDING, SUSPENDED, TimerRef, TimerRow
from .unit import Entry, Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["drain", "spill", "keep_as_row", "next_ordinal", "drop_ref", "apply"]

log = logging.getLogger("statebound")


def drain(h: Host, u: Unit) -> None:
    """Deliver the unit's queued events, FIFO, and everything they cause."""
    while u.queue:
        if u.deliveries >= h.max_deliveries or (u.budget is not None and u.budget.spent):
            spill(h, u)
            return
        iid, ev, ctx = u.queue.popleft()
        e = load(h, u, iid)
        if e is None or e.position is None or e.position.status != RUNNING:
            continue  # the spec drops events for sessions that are gone
        if e.suspended:   # routed here from another instance: it waits, parked, for resume
            keep_as_row(h, u, iid, e, ev, ctx, "sb.suspended", SUSPENDED)
            continue
        u.deliveries += 1
        if e.steps is not None:
            e.steps.append({"event": ev.to_dict()} if ctx is None else {"event": ev.to_dict(), "context": ctx})
        chart = e.position.chart
        interp = h._interpreters[chart.name, chart.identity]
        pos, effects = interp.drive_as(e.position, e.driver, ev, caller_context=ctx, budget=u.budget)
        if u.deliveries + u.starts > 1 and pos is e.position and _out_of_budget(effects):
            # Earlier drives of this call spent the budget: this event is not to blame,
            # so it waits (as a row due now) for a call with a budget of its own.
            if e.steps is not None:
                e.steps.pop()   # not delivered: the unit that delivers it from its row records it
            u.queue.appendleft((iid, ev, ctx))
            spill(h, u)
            return
        if pos is not e.position:
            e.position, e.dirty = pos, True
        apply(h, u, iid, effects, ctx)


def spill(h: Host, u: Unit) -> None:
    """Over the delivery budget: keep the rest as timer rows due now (durable, FIFO)."""
    while u.queue:
        iid, ev, ctx = u.queue.popleft()
        e = load(h, u, iid)
        if e is None or e.position is None:
            continue
        keep_as_row(h, u, iid, e, ev, ctx, "sb.spill", SUSPENDED if e.suspended else PENDING)


def keep_as_row(h: Host, u: Unit, iid: str, e: Entry, ev: Event, ctx: Any, prefix: str, state: str) -> None:
    """An event the instance cannot take now becomes its own row, due now (FIFO by ordinal)."""
    ordinal = next_ordinal(e)
    row = TimerRow(iid, ordinal, iid, h.clock.now_ms(), f"{prefix}.{ordinal}", ev.to_dict(),
                   caller_context=ctx, state=state)
    u.puts[row.key] = row
    e.refs.append(TimerRef(ordinal, row.send_id))


def next_ordinal(e: Entry) -> int:
    """Take the instance's next ordinal for a row the host writes (an outbox row, a spill)."""
    assert e.position is not None
    e.position = replace(e.position, ordinal=e.position.ordinal + 1)
    e.dirty = True
    if e.steps is not None:
        e.steps.append({"ordinal": 1})
    return e.position.ordinal


def drop_ref(e: Entry, ordinal: int) -> None:
    """Forget the instance's ref to its row ``ordinal`` (fired, answered or gone)."""
    before = len(e.refs)
    e.refs[:] = [r for r in e.refs if r.ordinal != ordinal]
    if len(e.refs) != before:
        e.dirty = True


def apply(h: Host, u: Unit, iid: str, effects: tuple[Any, ...], ctx: Any) -> None:
    """Turn the effects of one drive of ``iid`` into the unit's queue, rows and children."""
    if not effects:   # most drives of a batch: a history record reads no summary as an empty one
        return
    e = u.entries[iid]
    pos = e.position
    assert pos is not None
    if e.steps is not None:
        if e.effects is None:
            e.effects = {}
        history_mod.summarize(e.effects, effects)
    processors = h.processors
    if pos.chart.trust == UNTRUSTED:
        processors = {k: v for k, v in processors.items() if k in h.untrusted_may_use}
    for eff in effects:
        t = type(eff)
        if t is Send:
            if eff.type in processors:
                h._outbox.send(u, iid, eff, ctx)
                continue
            dest, ev = route(h, iid, pos, eff.target, eff)
            if dest is not None and to_invoked(eff) and \
                    h._outbox.forward(u, iid, eff.target[2:], ev, ctx, eff.send_id):
                continue  # <send target="#_id"> to a handler's invocation
            if dest is not None:
                u.queue.append((dest, ev, ctx))
        elif t is SendDelayed:
            if eff.type in processors:
                h._outbox.send(u, iid, eff, ctx)
                continue
            dest, ev = route(h, iid, pos, eff.target, eff)
            if dest is None:
                continue
            due = eff.at_ms if eff.at_ms is not None else h.clock.now_ms() + (eff.delay_ms or 0)
            row = TimerRow(iid, eff.ordinal, dest, due, eff.send_id, ev.to_dict(), eff.name,
                           {"macrostep": eff.macrostep, "microstep": eff.microstep, "round": eff.round,
                            "c_index": eff.c_index, "owner": eff.owner, "id_from_author": eff.id_from_author},
                           eff.caller_context)
            u.puts[row.key] = row
            e.refs.append(TimerRef(eff.ordinal, eff.send_id, eff.name))
        elif t is Cancel:
            keep = []
            for ref in e.refs:
                # a handler invocation's ref (marked, outbox.py) is the host's: a chart's
                # <cancel sendid="sb.invoke.x"> dropped it and purged the row, so the
                # invocation ended with no cancel hook and its answer was discarded. (A
                # timeout may be named "invoke" too; its send id is sb.timeout.*.)
                if ref.send_id == eff.send_id and not (ref.name == INVOKE and ref.send_id.startswith("sb.invoke.")):
                    key = (iid, ref.ordinal)
                    if u.puts.pop(key, None) is None:
                        u.deletes.append(key)
                else:
                    keep.append(ref)
            e.refs[:] = keep
        elif t is Invoke:
            if eff.type in h.invokers and (pos.chart.trust != UNTRUSTED or eff.type in h.untrusted_may_use):
                h._outbox.invoke(u, iid, eff, ctx)
            else:
                invoke(h, u, iid, pos, eff, ctx)
        elif t is CancelInvoke:
            if h._outbox.cancel_invoke(u, iid, eff.invokeid):
                continue
            cid = child_instance_id(iid, eff.invokeid)
            if load(h, u, cid) is not None:
                delete_instance(h, u, cid)
        elif t is Autoforward:
            if not h._outbox.forward(u, iid, eff.invokeid, eff.event, ctx):
                u.queue.append((child_instance_id(iid, eff.invokeid), eff.event, ctx))
        elif t is Done:
            if pos.parent is not None and pos.invokeid is not None:
                u.queue.append((pos.parent, Event(f"done.invoke.{pos.invokeid}", eff.donedata, "external",
                                                  None, f"#_scxml_{iid}", SCXML_PROCESSOR, pos.invokeid), ctx))
        elif t is Log:
            if h.on_log is not None:
                h.on_log(iid, eff.label, eff.value)
            else:
                # quoted: an instance id or a label may hold a newline, and must not forge a line
                log.info("[%r] %r: %r", iid, eff.label, eff.value)
        elif t is BudgetExhausted:
            if e.steps is not None:
                _abandoned(e.steps, eff.reason)
            h.metrics.add("budget_exhausted")
            log.warning("instance %r: event %r exhausted the %s budget after %d rounds; position unchanged",
                        iid, eff.event, eff.reason, eff.rounds)


def _abandoned(steps: list[dict[str, Any]], reason: str) -> None:
    """Mark the event step of a drive that ran out of budget: the drive left the position as
    it was, and replay, which has no such budget, must skip it rather than re-drive it."""
    for step in reversed(steps):
        if "event" in step:
            step["abandoned"] = reason
            return


def _out_of_budget(effects: tuple[Any, ...]) -> bool:
    return len(effects) == 1 and type(effects[0]) is BudgetExhausted and effects[0].reason != "rounds"
