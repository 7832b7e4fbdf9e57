"""Lambda entry points for a DynamoDB deployment that fires timers by SQS wake-ups.

Two functions replace a sweeper running around the clock:

* the **wake-up function**, subscribed to the queue :class:`~statebound.dynamodb.SQSWakeup`
  writes to, calls :func:`handle_wakeup_event`: each message names rows by key, and the
  rows still pending are fired (a thread pool when the sweeper has ``workers > 1``),
  until ``margin_ms`` before the invocation's deadline;
* the **fallback function**, on a slow schedule (every few minutes), calls
  :func:`fallback_sweep`: it asks wake-ups for the rows that come within the wake-up
  horizon before its next run, which is how a timer due in hours or days gets its wake-up,
  and fires whatever is due and was missed (a lost wake-up, a writer without a wake-up
  backend), until ``margin_ms`` before the invocation's deadline.

Both check the deadline (:class:`Deadline`) before every row, not only between sweeps: a
fire can be slow (an outbox send waiting out its client timeout while SQS hangs), and a
batch of them would otherwise carry the invocation past its timeout, where Lambda kills
it mid-batch, with no metrics and no summary, and the next run starts the same batch.

Neither runs while nothing is due: the idle cost is the fallback's reads, one ``Query``
per shard per run (``docs/dynamodb.md``, "Capacity").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import InvalidArgument, StoreUnavailable
from ..host.clock import Clock
from ..host.sweeper import Sweeper
from ..host.wakeup import WakeupRequest, wakeups_for
from .sqs_wakeup import decode_wakeup

__all__ = ["handle_wakeup_event", "fallback_sweep", "wakeups_in_event", "Deadline"]

log = logging.getLogger("statebound")


class Deadline:
    """The point ``margin_ms`` before a Lambda invocation's end, as a sweep's ``stop``.

    Calling it answers "must the sweep start nothing more?" (``Sweeper.run_once(stop=...)``
    and ``Sweeper.handle_wakeups(stop=...)`` ask before every row). :meth:`check` asks the
    invocation itself (``remaining_ms``: ``context.get_remaining_time_in_millis``). Between
    two checks the time spent is followed on the monotonic clock and on ``clock`` (the
    host's), whichever has moved more, and the invocation is asked again only when that
    says the margin is reached. The invocation has the last word, and a sweep asks it
    about as often as it did when it checked only between sweeps. ``clock`` counts so
    that a simulated clock (``ManualClock``) moves a deadline as real time does. Once
    reached, a deadline stays reached.

    :param remaining_ms: the invocation's time left, in milliseconds.
    :param margin_ms: how long before the end to stop starting work: longer than one row
        can take (an outbox send's client timeout, plus a wake-up request if it fails).
    :param clock: the host's clock, if any.
    :ivar reached: the margin was reached (the invocation said so).
    :raises InvalidArgument: ``margin_ms`` not a whole number of 0 or more.
    """

    def __init__(self, remaining_ms: Callable[[], int], margin_ms: int = 5_000, *,
                 clock: Clock | None = None) -> None:
        if not isinstance(margin_ms, int) or isinstance(margin_ms, bool) or margin_ms < 0:
            raise InvalidArgument(f"margin_ms must be a whole number of milliseconds, 0 or more, not {margin_ms!r}")
        self.remaining_ms = remaining_ms
        self.margin_ms = margin_ms
        self.clock = clock
        self.reached = False
        # (ms left then, monotonic seconds then, clock ms then): one tuple, swapped whole,
        # so worker threads calling at once never see half of an update
        self._then: tuple[int, float, int] | None = None

    def check(self) -> bool:
        """Ask the invocation: true when ``margin_ms`` or less is left."""
        if self.reached:
            return True
        left = self.remaining_ms()
        if left <= self.margin_ms:
            self.reached = True
            return True
        self._then = (left, _monotonic(), self.clock.now_ms() if self.clock is not None else 0)
        return False

    def __call__(self) -> bool:
        """True once ``margin_ms`` or less is left (see the class doc)."""
        then = self._then
        if self.reached or then is None:
            return self.check()
        left, mono, at_ms = then
        spent = (_monotonic() - mono) * 1000
        if self.clock is not None:
            spent = max(spent, self.clock.now_ms() - at_ms)
        return left - spent <= self.margin_ms and self.check()


#: The monotonic clock a :class:`Deadline` follows (a name here, so a test can drive it).
_monotonic = time.monotonic


def wakeups_in_event(event: Mapping[str, Any]) -> tuple[list[WakeupRequest], list[str]]:
    """The wake-ups in an SQS event, and the ids of the messages they came from. A body
    that is not a statebound wake-up is logged and dropped: redelivering it cannot help."""
    messages = _messages(event)
    return [r for _, requests in messages for r in requests], [i for i, _ in messages]


def _messages(event: Mapping[str, Any]) -> list[tuple[str, list[WakeupRequest]]]:
    """Each statebound message's id and its wake-ups (see :func:`wakeups_in_event`)."""
    out: list[tuple[str, list[WakeupRequest]]] = []
    for record in event.get("Records") or []:
        message_id = str(record.get("messageId", ""))
        try:
            out.append((message_id, decode_wakeup(str(record.get("body", "")))))
        except ValueError as exc:
            log.error("dropping SQS message %s: %s", message_id, exc)
    return out


def handle_wakeup_event(event: Mapping[str, Any], sweeper: Sweeper, *,
                        remaining_ms: Callable[[], int] | None = None, margin_ms: int = 5_000) -> dict[str, Any]:
    """Fire the rows an SQS event's wake-ups name (the wake-up function's body).

    Returns a partial-batch response (enable ``ReportBatchItemFailures`` on the event source
    mapping): when the store is unavailable every message is reported failed, so SQS
    delivers it again; a message whose rows fired, or turned out done, is deleted.

    :param remaining_ms: the invocation's time left (``context.get_remaining_time_in_millis``):
        no row is read or fired with ``margin_ms`` or less left (:class:`Deadline`), and
        every message naming a row not reached is reported failed, so SQS delivers it
        again (after its visibility timeout; each time counts towards the queue's
        ``maxReceiveCount``, past which the fallback fires the row). Its rows that did fire
        cost one empty read then. ``None``: fire them all, however long it takes.
    :param margin_ms: see ``remaining_ms``.
    """
    messages = _messages(event)
    ids = [i for i, _ in messages]
    deadline = None if remaining_ms is None else Deadline(remaining_ms, margin_ms, clock=sweeper.host.clock)
    try:
        report = sweeper.handle_wakeups([r for _, requests in messages for r in requests], stop=deadline)
    except StoreUnavailable as exc:
        log.warning("wake-up batch of %d message(s) failed, SQS will redeliver: %s", len(ids), exc)
        return {"batchItemFailures": [{"itemIdentifier": i} for i in ids]}
    log.info("wake-ups: %d message(s), %d fired, %d discarded, %d stale, %d failed, %d empty, max lag %d ms",
             len(ids), report.fired, report.discarded, report.stale, report.failed, report.empty,
             report.max_lag_ms)
    if not report.unreached:
        return {"batchItemFailures": []}
    unreached = set(report.unreached)
    again = [i for i, requests in messages if any(r.key in unreached for r in requests)]
    log.warning("wake-ups: %d ms or less left, %d row(s) not reached; SQS will deliver their %d message(s) again",
                margin_ms, len(unreached), len(again))
    return {"batchItemFailures": [{"itemIdentifier": i} for i in again]}


def fallback_sweep(sweeper: Sweeper, *, period_ms: int, overlap_ms: int = 60_000,
                   remaining_ms: Callable[[], int] | None = None, margin_ms: int = 5_000) -> dict[str, int]:
    """The slow fallback (the scheduled function's body): arm wake-ups for the rows
    entering the wake-up horizon before the next run, then fire what is due.

    :param period_ms: how often the schedule runs this.
    :param overlap_ms: how much each run's look-ahead window overlaps the previous one's,
        so a schedule running a little late leaves no row unarmed (a row in the overlap
        may get two wake-ups: one empty read).
    :param remaining_ms: the invocation's time left (``context.get_remaining_time_in_millis``):
        no sweep, and no row within a sweep, starts with ``margin_ms`` or less left
        (:class:`Deadline`). ``None``: sweep until idle.
    :param margin_ms: see ``remaining_ms``.

    A row whose writer sent a wake-up at commit was due within the horizon then, so only
    rows due between ``now + horizon - period - overlap`` and ``now + horizon`` are armed
    here: each long timer once, short ones never again. Arming comes first and is bounded
    (one read per shard); firing a backlog (after an outage) is not, so it stops at the
    deadline and ``more`` says rows were left for the next run. Otherwise a run killed by
    its timeout behind a backlog would never arm the long timers at all. Rows the last
    sweep claimed and did not reach are given back, no attempt counted (see
    ``Sweeper.run_once``), for the next run. A wake-up backend
    that refuses (SQS down) is logged and counted in ``arm_failed``; the run still fires
    what is due.
    """
    out = dict.fromkeys(("fired", "discarded", "stale", "failed", "skipped", "max_lag_ms"), 0)
    armed = _arm_horizon(sweeper, period_ms, overlap_ms)
    out["armed"], out["arm_failed"] = max(armed, 0), max(-armed, 0)
    out["more"] = False
    deadline = None if remaining_ms is None else Deadline(remaining_ms, margin_ms, clock=sweeper.host.clock)
    for n in range(_MAX_SWEEPS):
        if deadline is not None and deadline.check():
            out["more"] = True   # (not known otherwise: the sweep that would say was not run)
            if n == 0 and remaining_ms is not None:
                # a margin at or above the time an invocation has: every run fires nothing
                log.warning("the fallback sweep had no time to sweep: %d ms left, margin %d ms; "
                            "lower margin_ms or raise the function's timeout", remaining_ms(), margin_ms)
            break
        report = sweeper.run_once(stop=deadline)
        for name in ("fired", "discarded", "stale", "failed", "skipped"):
            out[name] += getattr(report, name)
        out["max_lag_ms"] = max(out["max_lag_ms"], report.max_lag_ms)
        if report.more:
            out["more"] = True   # stopped within the sweep: its claimed rest goes to the next run
            break
        if report.total == 0:
            break
    return out


#: Sweeps one fallback run makes at most (as ``Sweeper.run_until_idle``).
_MAX_SWEEPS = 10_000


def _arm_horizon(sweeper: Sweeper, period_ms: int, overlap_ms: int) -> int:
    """Ask wake-ups for the rows entering the horizon before the next run; how many."""
    host = sweeper.host
    wakeup = host.wakeup
    pending_between = getattr(host.store, "pending_between", None)
    if wakeup is None or wakeup.horizon_ms is None or pending_between is None:
        return 0
    now = host.clock.now_ms()
    until = now + wakeup.horizon_ms
    rows = pending_between(until - period_ms - overlap_ms, until)
    requests = wakeups_for(((r.key, r.ready_at_ms) for r in rows), now, None)
    if requests:
        try:
            wakeup.request(requests, now)
        except Exception as exc:
            # The wake-ups are lost, not the rows: this run still fires what is due, and the
            # next run's window overlaps this one. Raising here would stop every run from
            # firing anything for as long as SQS refuses, when the fallback is most needed.
            log.warning("arming %d wake-up(s) failed, firing what is due anyway: %s", len(requests), exc)
            return -len(requests)
    return len(requests)
