"""Lambda entry points for a DynamoDB deployment that fires timers by SQS wake-ups.

Two functions replace a sweeper running around the clock:

* the **wake-up function**, subscribed to the queue :class:`~statebound.dynamodb.SQSWakeup`
  writes to, calls :func:`handle_wakeup_event`: each message names rows by key, and the
  rows still pending are fired (a thread pool when the sweeper has ``workers > 1``);
* the **fallback function**, on a slow schedule (every few minutes), calls
  :func:`fallback_sweep`: it asks wake-ups for the rows that come within the wake-up
  horizon before its next run, which is how a timer due in hours or days gets its wake-up,
  and fires whatever is due and was missed (a lost wake-up, a writer without a wake-up
  backend), until the invocation's deadline.

Neither runs while nothing is due: the idle cost is the fallback's reads, one ``Query``
per shard per run (``docs/dynamodb.md``, "Capacity").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import StoreUnavailable
from ..host.sweeper import Sweeper
from ..host.wakeup import WakeupRequest, wakeups_for
from .sqs_wakeup import decode_wakeup

__all__ = ["handle_wakeup_event", "fallback_sweep", "wakeups_in_event"]

log = logging.getLogger("statebound")


def wakeups_in_event(event: Mapping[str, Any]) -> tuple[list[WakeupRequest], list[str]]:
    """The wake-ups in an SQS event, and the ids of the messages they came from. A body
    that is not a statebound wake-up is logged and dropped: redelivering it cannot help."""
    requests: list[WakeupRequest] = []
    ids: list[str] = []
    for record in event.get("Records") or []:
        message_id = str(record.get("messageId", ""))
        try:
            requests += decode_wakeup(str(record.get("body", "")))
        except ValueError as exc:
            log.error("dropping SQS message %s: %s", message_id, exc)
            continue
        ids.append(message_id)
    return requests, ids


def handle_wakeup_event(event: Mapping[str, Any], sweeper: Sweeper) -> dict[str, Any]:
    """Fire the rows an SQS event's wake-ups name (the wake-up function's body).

    Returns a partial-batch response (enable ``ReportBatchItemFailures`` on the event source
    mapping): when the store is unavailable every message is reported failed, so SQS
    delivers it again; a message whose rows fired, or turned out done, is deleted.
    """
    requests, ids = wakeups_in_event(event)
    try:
        report = sweeper.handle_wakeups(requests)
    except StoreUnavailable as exc:
        log.warning("wake-up batch of %d message(s) failed, SQS will redeliver: %s", len(ids), exc)
        return {"batchItemFailures": [{"itemIdentifier": i} for i in ids]}
    log.info("wake-ups: %d message(s), %d fired, %d discarded, %d stale, %d failed, %d empty, max lag %d ms",
             len(ids), report.fired, report.discarded, report.stale, report.failed, report.empty,
             report.max_lag_ms)
    return {"batchItemFailures": []}


def fallback_sweep(sweeper: Sweeper, *, period_ms: int, overlap_ms: int = 60_000,
                   remaining_ms: Callable[[], int] | None = None, margin_ms: int = 5_000) -> dict[str, int]:
    """The slow fallback (the scheduled function's body): arm wake-ups for the rows
    entering the wake-up horizon before the next run, then fire what is due.

    :param period_ms: how often the schedule runs this.
    :param overlap_ms: how much each run's look-ahead window overlaps the previous one's,
        so a schedule running a little late leaves no row unarmed (a row in the overlap
        may get two wake-ups: one empty read).
    :param remaining_ms: the invocation's time left (``context.get_remaining_time_in_millis``):
        no sweep starts with ``margin_ms`` or less left. ``None``: sweep until idle.
    :param margin_ms: see ``remaining_ms``.

    A row whose writer sent a wake-up at commit was due within the horizon then, so only
    rows due between ``now + horizon - period - overlap`` and ``now + horizon`` are armed
    here: each long timer once, short ones never again. Arming comes first and is bounded
    (one read per shard); firing a backlog (after an outage) is not, so it stops at the
    deadline and ``more`` says rows were left for the next run. Otherwise a run killed by
    its timeout behind a backlog would never arm the long timers at all. A wake-up backend
    that refuses (SQS down) is logged and counted in ``arm_failed``; the run still fires
    what is due.
    """
    out = dict.fromkeys(("fired", "discarded", "stale", "failed", "skipped", "max_lag_ms"), 0)
    armed = _arm_horizon(sweeper, period_ms, overlap_ms)
    out["armed"], out["arm_failed"] = max(armed, 0), max(-armed, 0)
    out["more"] = False
    for _ in range(_MAX_SWEEPS):
        if remaining_ms is not None and remaining_ms() <= margin_ms:
            out["more"] = True
            break
        report = sweeper.run_once()
        for name in ("fired", "discarded", "stale", "failed", "skipped"):
            out[name] += getattr(report, name)
        out["max_lag_ms"] = max(out["max_lag_ms"], report.max_lag_ms)
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
