"""Scheduled sweeper handler (EventBridge).

With wake-ups (WAKEUP_QUEUE_URL set, as the template does) timers are fired by wake.py
when their messages arrive, and this function is the **slow fallback**: each run, every
FALLBACK_MINUTES (5 in the template), sends wake-ups for the timers that come within the
queue's 15-minute reach before the next run, which is how a timer due in hours or days
gets its message, then fires whatever is due and was missed (a lost message, a writer
without wake-ups) until SWEEP_MARGIN_MS before its timeout, checked before every timer it
fires, so a batch of slow fires (SQS hanging under the outbox) cannot carry it past the
timeout; a backlog left over (``more`` in the log line) goes to the next run
(statebound.dynamodb.lambda_handlers.fallback_sweep).
It reads one due-index shard per Query and returns; nothing runs around the clock.

Without wake-ups, a once-a-minute schedule alone would fire timers up to a minute late.
Instead each invocation keeps sweeping -- sleeping only until the next due row or the
interval -- until its remaining time falls under a margin (checked before every timer too),
so timers fire within about a second of being due while the schedule merely keeps one
sweeper alive.

With SWEEP_LEASES=1, overlapping invocations split the due-index shards between them
with lease items (statebound.dynamodb.ShardLeases) instead of racing for the same rows;
without it they still never double-fire (each fire's completion is conditional), they
only waste some requests on lost races.

Every fire is logged with its timer's correlation id, and each sweep that did something
flushes one EMF document of metrics (see telemetry.py); the invocation ends with one more,
carrying ``Sweeps``, so a quiet sweeper still shows it is alive.

Environment: FALLBACK_MINUTES (the schedule's period in fallback mode, default 5),
SWEEP_INTERVAL_S (default 1.0), SWEEP_JITTER (fraction of the interval added
at random to each sleep, default 0.2), SWEEP_MARGIN_MS (default 5000),
SWEEP_BATCH (default 100), SWEEP_LEASES (default off), SWEEP_LEASE_MS (default 30000),
plus what app.py reads.
"""

from __future__ import annotations

import os
from typing import Any

import statebound as sb
from statebound.dynamodb.lambda_handlers import Deadline, fallback_sweep

from app import get_host
from telemetry import SweepMetrics, logger


@logger.inject_lambda_context(clear_state=True)
def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point for the schedule."""
    host = get_host()
    margin_ms = int(os.environ.get("SWEEP_MARGIN_MS", "5000"))
    sweeper = sb.Sweeper(host, interval_s=float(os.environ.get("SWEEP_INTERVAL_S", "1.0")),
                         jitter=float(os.environ.get("SWEEP_JITTER", "0.2")),
                         batch=int(os.environ.get("SWEEP_BATCH", "100")),
                         node_id=getattr(context, "aws_request_id", None))
    recorder: SweepMetrics = getattr(host, "sweep_metrics", None) or SweepMetrics(host.metrics)
    recorder.totals.clear()
    totals: dict[str, Any] = {"sweeps": 0, "fired": 0, "delivered": 0, "discarded": 0, "stale": 0, "failed": 0,
                              "skipped": 0, "max_lag_ms": 0, "more": False}
    leases = _leases(host, sweeper.node_id) if os.environ.get("SWEEP_LEASES", "") in ("1", "true") else None
    owned_before = getattr(host.store, "owned_shards", None)
    try:
        if leases is not None:
            leases.acquire()
            host.store.owned_shards = leases   # claim_due reads leases.held at every sweep
            totals["shards"] = len(leases.held)
        if host.wakeup is not None:
            result = fallback_sweep(sweeper, period_ms=int(os.environ.get("FALLBACK_MINUTES", "5")) * 60_000,
                                    remaining_ms=context.get_remaining_time_in_millis, margin_ms=margin_ms)
            totals.update(sweeps=1, armed=result["armed"], more=result["more"],
                          **{k: result[k] for k in ("fired", "discarded", "stale", "failed", "skipped", "max_lag_ms")})
        else:
            _sweep(host, sweeper, context, margin_ms, totals, leases, recorder)
    finally:
        if leases is not None:
            host.store.owned_shards = owned_before  # the environment's store outlives this invocation
            leases.release()
        recorder.flush(sweeps=max(totals["sweeps"], 1))
    totals["dead"] = recorder.totals["Dead"]
    totals["conflicts"] = recorder.totals["Conflicts"]
    logger.info("sweep finished", extra=totals)
    return totals


def _leases(host: sb.Host, node_id: str) -> Any:
    from statebound.dynamodb import ShardLeases
    store = host.store
    return ShardLeases(store.client, store.table_name, node_id, store.shards,  # type: ignore[attr-defined]
                       int(os.environ.get("SWEEP_LEASE_MS", "30000")), host.clock)


def _sweep(host: sb.Host, sweeper: sb.Sweeper, context: Any, margin_ms: int, totals: dict[str, Any],
           leases: Any, recorder: SweepMetrics) -> None:
    renew_every_ms = (leases.lease_ms // 3) if leases is not None else None
    renewed = host.clock.now_ms()
    # checked before each sweep and, within one, before every row: a sweep of slow fires
    # must end before the timeout, not when its batch is done
    deadline = Deadline(context.get_remaining_time_in_millis, margin_ms, clock=host.clock)
    while not deadline.check():
        if renew_every_ms is not None and host.clock.now_ms() - renewed >= renew_every_ms:
            leases.acquire()  # renew, and take shards a departed sweeper left
            renewed = host.clock.now_ms()
        report = sweeper.run_once(stop=deadline)
        recorder.flush()
        totals["sweeps"] += 1
        for k in ("fired", "delivered", "discarded", "stale", "failed", "skipped"):
            totals[k] += getattr(report, k)
        totals["max_lag_ms"] = max(totals["max_lag_ms"], report.max_lag_ms)
        if report.more:
            totals["more"] = True   # stopped within the sweep: the next invocation goes on
            break
        if report.total >= sweeper.batch:
            continue  # a full batch: more may be due right now
        budget_s = (context.get_remaining_time_in_millis() - margin_ms) / 1000
        if budget_s <= 0:
            break
        host.clock.sleep(min(sweeper.sleep_time(), budget_s))
