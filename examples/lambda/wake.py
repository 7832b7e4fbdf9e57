"""Wake-up handler (SQS event source on the wake-up queue).

Every commit that arms a timer due within 15 minutes sends a message to the queue, delayed
until the timer is due (statebound.dynamodb.SQSWakeup). This function receives it, reads
each named timer row by its key, and fires the ones still pending: a timer fires within a
second of being due, and nothing runs while nothing is due. A message whose rows fired,
were cancelled or are not due yet (asked for again) is deleted; when the table is
unavailable the batch is reported failed and SQS delivers it again (the event source
mapping has ReportBatchItemFailures on). It fires until WAKE_MARGIN_MS before its timeout,
checked before every timer: the messages whose timers it did not reach are reported
failed too, and SQS delivers them again.

Environment: WAKE_WORKERS (fires in flight at once, default 1: telemetry.py's per-fire
log scope is process-wide, so several threads would mix their keys), WAKE_MARGIN_MS
(default 5000: longer than one fire can take, an outbox send waiting out its SQS client's
timeouts, app.py's HANDOVER_CONFIG, plus a wake-up request), plus what app.py reads.
"""

from __future__ import annotations

import os
from typing import Any

import statebound as sb
from statebound.dynamodb.lambda_handlers import handle_wakeup_event

from app import get_host
from telemetry import SweepMetrics, logger


@logger.inject_lambda_context(clear_state=True)
def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point for the queue."""
    host = get_host()
    sweeper = sb.Sweeper(host, node_id=getattr(context, "aws_request_id", None),
                         workers=int(os.environ.get("WAKE_WORKERS", "1")))
    recorder: SweepMetrics = getattr(host, "sweep_metrics", None) or SweepMetrics(host.metrics)
    try:
        return handle_wakeup_event(event, sweeper, remaining_ms=context.get_remaining_time_in_millis,
                                   margin_ms=int(os.environ.get("WAKE_MARGIN_MS", "5000")))
    finally:
        sweeper.close()
        recorder.flush()
