"""Scheduled sweeper handler (EventBridge, every minute).

A once-a-minute schedule alone would fire timers up to a minute late. Instead each
invocation keeps sweeping -- sleeping only until the next due row or the interval -- until
its remaining time falls under a margin, so timers fire within about a second of being due
while the schedule merely keeps one sweeper alive.

Environment: SWEEP_INTERVAL_S (default 1.0), SWEEP_MARGIN_MS (default 5000),
SWEEP_BATCH (default 100), plus what app.py reads.
"""

from __future__ import annotations

import os
from typing import Any

import statebound as sb

from app import get_host


def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point for the schedule."""
    host = get_host()
    margin_ms = int(os.environ.get("SWEEP_MARGIN_MS", "5000"))
    sweeper = sb.Sweeper(host, interval_s=float(os.environ.get("SWEEP_INTERVAL_S", "1.0")),
                         batch=int(os.environ.get("SWEEP_BATCH", "100")),
                         node_id=getattr(context, "aws_request_id", None))
    totals = {"sweeps": 0, "fired": 0, "discarded": 0, "stale": 0, "failed": 0, "skipped": 0, "max_lag_ms": 0}
    while context.get_remaining_time_in_millis() > margin_ms:
        report = sweeper.run_once()
        totals["sweeps"] += 1
        for k in ("fired", "discarded", "stale", "failed", "skipped"):
            totals[k] += getattr(report, k)
        totals["max_lag_ms"] = max(totals["max_lag_ms"], report.max_lag_ms)
        if report.total >= sweeper.batch:
            continue  # a full batch: more may be due right now
        budget_s = (context.get_remaining_time_in_millis() - margin_ms) / 1000
        if budget_s <= 0:
            break
        host.clock.sleep(min(sweeper.sleep_time(), budget_s))
    return totals
