"""Firing a claimed timer row: the unit that delivers it, its completion, and a failed delivery.

A fire is one unit of work (``runner.py``): check that the row is still live (its target
and scheduling instance exist and run, a named timeout was not re-armed, the instance is
not suspended), deliver its event, and complete the row in the **same** commit, which
fails if someone else completed it first, so a row fires once. A delivery that raises
releases the row with exponential backoff, or parks it as dead after ``max_attempts``.
Outbox rows are fired by ``outbox.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..events import Event
from ..exceptions import ConflictError, StoreError, StoreUnavailable, describe
from ..interpreter.state import RUNNING
from .delivery import drop_ref
from .runner import load, wake
from .store import CANCEL, DEAD, INVOKE, SUSPENDED, TimerCompletion, TimerKey, TimerRef, TimerRow
from .unit import FireResult, Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["fire_step", "fire_call", "fire_completion", "parked", "fire_failed", "release", "count",
           "redrive_refusal"]

log = logging.getLogger("statebound")


def fire_step(h: Host, row: TimerRow, u: Unit) -> tuple[str, str | None]:
    """The unit of work that fires a timer row in ``u`` (``runner.py``): returns
    ``(outcome, reason)`` for the row's completion. Outbox rows go to ``outbox.py``."""
    u.protected = row.key
    u.call = fire_call(row)
    sched = load(h, u, row.instance_id)
    target = sched if row.target_id == row.instance_id else load(h, u, row.target_id)
    outcome, reason = "fired", None
    if sched is not None:
        drop_ref(sched, row.ordinal)
    if target is None or target.position is None:
        outcome, reason = "discarded", f"instance {row.target_id!r} not found"
    elif target.position.status != RUNNING:
        outcome, reason = "discarded", f"instance {row.target_id!r} is {target.position.status}"
    elif sched is None or sched.position is None:
        outcome, reason = "discarded", f"scheduling instance {row.instance_id!r} not found"
    elif sched.position.status != RUNNING and row.target_id != row.instance_id:
        outcome, reason = "discarded", f"scheduling instance {row.instance_id!r} is {sched.position.status}"
    elif row.name is not None and not any(
            t.name == row.name and t.ordinal == row.ordinal for t in sched.position.timeouts):
        outcome, reason = "stale", f"timeout {row.name!r} was re-armed or cancelled since ordinal {row.ordinal}"
    elif sched.suspended:
        # Claimed before the suspend parked it: park it now, in place, name and all. Through
        # the row's completion (fire_completion), which the store applies only while the row
        # is still this sweeper's claim: written from this copy, a row another sweeper had
        # fired meanwhile came back as suspended, and fired again after resume.
        sched.refs.append(TimerRef(row.ordinal, row.send_id, row.name))
        sched.dirty = True   # the position write makes this conditional on the suspend
        outcome, reason = "parked", f"instance {row.instance_id!r} is suspended"
    else:
        u.queue.append((row.target_id, Event.from_dict(row.event), row.caller_context))
        h._drain(u)
    return outcome, reason


def fire_call(row: TimerRow) -> dict[str, Any]:
    """A history record's ``call`` for a commit that fires ``row`` (a timer or an outbox row)."""
    return {"op": "fire", "instance": row.target_id, "timer": [row.instance_id, row.ordinal],
            "caller_context": row.caller_context}


def parked(row_key: TimerKey, node: str | None, reason: str) -> TimerCompletion:
    """The completion that parks a claimed row for a suspended instance: applied only while the
    row is still claimable, so a stale copy never brings back a row fired meanwhile."""
    return TimerCompletion(row_key, None, reason, node, SUSPENDED)


def fire_completion(row: TimerRow, node: str, result: tuple[str, str | None]) -> TimerCompletion:
    """How a fire's commit finishes its row: done with its outcome, or, parked for a
    suspended instance, back to ``suspended`` (both only while the row is still claimable)."""
    if result[0] == "parked":
        return parked(row.key, node, result[1] or "")
    return TimerCompletion(row.key, result[0], result[1], node)


def fire_failed(h: Host, row: TimerRow, node: str, exc: Exception, lag: int) -> FireResult:
    """A timer's delivery failed: release the row with backoff, or park it as dead.

    A store that was unavailable, or other writers that won every retry, are not the
    delivery's fault: the row is given back after one backoff period with no attempt
    counted. Counted, one lock held past the busy timeout cost every row of a group an
    attempt, and five such moments parked them all as dead."""
    text = describe(exc)
    if isinstance(exc, (StoreUnavailable, ConflictError)):
        release(h, row, node, text, row.attempts, counted=False)
    else:
        release(h, row, node, text, row.attempts + 1)
    return FireResult(row.key, "failed", text.partition(": ")[2], lag)


def release(h: Host, row: TimerRow, node: str, error: str, attempts: int, *, counted: bool = True) -> None:
    """A failed delivery: back off exponentially, or park the row after ``max_attempts``.
    Not ``counted`` (the store, not the delivery, failed): one ``backoff_ms``, no attempt."""
    dead = counted and attempts >= h.max_attempts
    delay = h.backoff_ms * (2 ** (attempts - 1)) if counted else h.backoff_ms
    retry_at = h.clock.now_ms() + delay
    try:
        h.store.release(row.key, node, error=error, next_attempt_at_ms=retry_at, dead=dead, attempt=counted)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        # This row cannot record its failure (the store refuses the write): the sweep goes
        # on with the other rows, and this one is claimed again when its lease runs out.
        log.error("row %s delivery failed (attempt %d) and the failure could not be recorded: %s; "
                  "it is retried when its claim's lease runs out", row.key, attempts, exc)
        count(h, "failed")
        return
    if not dead:
        wake(h, [(row.key, max(retry_at, row.due_at_ms))])
    count(h, "failed")
    if dead:
        count(h, "dead")
    if not counted:
        log.warning("row %s not fired, the store was busy (%s); retried in %d ms, no attempt counted",
                    row.key, error, h.backoff_ms)
        return
    log.warning("row %s delivery failed (attempt %d%s): %s", row.key, attempts,
                ", parked as dead" if dead else "", error)


def redrive_refusal(store: Any, key: TimerKey) -> str | None:
    """Why the dead row ``key`` must not be revived, or ``None`` (also when it is no dead row:
    ``retry_timer`` then answers that it found none).

    * A dead invoke row whose invocation was ended: the chart was told (``error.execution``)
      and forgot the row's generation, so a revived row would run ``start`` again and
      discard the answer. Entering the invoking state again invokes afresh. One parked dead
      without telling the chart (a row the sweep could not read, ADR 0027) still has its
      generation in the position, and may be revived.
    * A dead cancel row: its invocation is over, and the cancel hook is best effort, one try.
    * A row of a suspended instance: revived, it would be delivered while suspended (a
      suspended instance's rows are parked). Resume it first.
    """
    row = store.get_timer(key)
    if row is None or row.state != DEAD:
        return None
    rec = store.load(row.instance_id)
    if row.kind == CANCEL:
        return (f"row {key} is a dead cancel row: its invocation is over, and its cancel hook is best effort "
                "(one try)")
    if row.kind == INVOKE and (rec is None or not any(r.ordinal == row.ordinal for r in rec.timers)):
        return (f"row {key} is a dead invoke row: its invocation was ended with error.execution and "
                "cannot take an answer; enter the invoking state again to invoke afresh")
    if rec is not None and rec.status == SUSPENDED:
        return f"instance {row.instance_id!r} is suspended: resume it, then revive its row {key}"
    return None


def count(h: Host, outcome: str) -> None:
    """Count one row outcome in ``host.metrics``."""
    h.metrics.add(outcome)
