"""Logs and metrics the way Powertools for AWS Lambda users expect them.

**Logs.** One JSON object per line, from Powertools' ``Logger``: the Lambda context
(``function_request_id``, ``cold_start``, ...) plus, while a request or a timer is being
handled, ``instance_id``, ``chart``, ``revision``, ``event`` and ``correlation_id``. The
correlation id travels with the work: the HTTP handler takes it from the caller's
``X-Correlation-Id`` header (else API Gateway's request id) and passes it to the host as
the ``caller_context``, the host stores it on every timer the request schedules, and the
sweeper puts it back on the log lines of the fire, so one id finds a request and every
timer it led to. A chart's ``<log>`` is logged at INFO, so the function's log level
(``LogLevel`` in the template) decides whether it shows; an ``error.*`` the chart raised
is logged at WARNING. The ``statebound`` library logger is routed through the same
handler, so its warnings carry the same keys.

**Metrics.** The sweeper's, in CloudWatch Embedded Metric Format from Powertools'
``Metrics`` (printed to stdout, where CloudWatch Logs turns them into metrics without
a ``PutMetricData`` call): ``Fired``, ``Delivered`` (outbox sends handed to their
processor), ``Discarded``, ``Stale``, ``Failed``, ``Dead``, ``Conflicts`` and ``Sweeps`` as counts, and ``TimerLag``, one value per fired timer
(ms late), from which CloudWatch computes p50 and p99 across every sweeper; each flush
also carries its own ``lag_p50_ms``/``lag_p99_ms`` as properties for Logs Insights.
Namespace ``statebound``, dimension ``service`` (``statebound-sweeper``); the
template's alarms read exactly these names. The two request functions (``service``
``statebound-events`` and ``statebound-sqs-events``) hand outbox rows over right after
their commits; they report ``Delivered``, ``Failed`` and ``Dead`` for those, once per
invocation and only the counts that moved (``OutboxDeadAlarm`` reads their ``Dead``).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit

import statebound as sb
from statebound import jsonio
from statebound.dynamodb import DynamoStore
from statebound.host import FireResult, PositionRecord, TimerRow
from statebound.position import read_header

__all__ = ["logger", "metrics", "chart_log", "correlation_id_of", "scope", "ObservedHost", "ObservedStore",
           "SweepMetrics", "revision_of"]


class _Stdout(logging.Handler):
    """Writes to whatever ``sys.stdout`` is at the time (Lambda captures stdout)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
        except Exception:  # a logging failure must never fail the request
            self.handleError(record)


#: The functions' logger; the level comes from the function's log level (AWS_LAMBDA_LOG_LEVEL).
logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "statebound-lambda",
                logger_handler=_Stdout(),
                json_serializer=functools.partial(jsonio.dumps, default=str, separators=(",", ":")))
copy_config_to_registered_loggers(source_logger=logger, include={"statebound"})

#: The sweeper's metrics (EMF); namespace and service as the template's alarms expect.
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "statebound",
                  service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "statebound-sweeper")


def correlation_id_of(caller_context: Any) -> str | None:
    """The correlation id a host call carried (``{"correlation_id": ...}``), if any."""
    if isinstance(caller_context, dict):
        cid = caller_context.get("correlation_id")
        return cid if isinstance(cid, str) else None
    return None


def chart_log(instance_id: str, label: str | None, value: Any) -> None:
    """The host's ``on_log``: a chart's ``<log>`` at INFO, a raised ``error.*`` at WARNING."""
    fields = {"log_label": label, "log_value": value}
    if instance_id != logger.get_current_keys().get("instance_id"):
        fields["log_instance_id"] = instance_id  # an invoked child or a routed-to instance
    if label and label.startswith("error."):
        logger.warning(f"chart raised {label}", extra=fields)
    else:
        logger.info("chart log", extra=fields)


@contextmanager
def scope(**keys: Any) -> Iterator[None]:
    """Log keys for the work inside (``None`` values are left out).

    Scopes nest: an outbox row the host delivers inside a request is logged with the row's
    keys, and the request's own keys are back on its lines afterwards.
    """
    keys = {k: v for k, v in keys.items() if v is not None}
    current = logger.get_current_keys()
    shadowed = {k: current[k] for k in keys if k in current}
    try:
        with logger.append_context_keys(**keys):
            yield
    finally:
        if shadowed:   # append_context_keys removes its keys on exit; it does not restore them
            logger.append_keys(**shadowed)


def revision_of(record: PositionRecord) -> str | None:
    """The chart revision a stored position runs (its blob header's version label)."""
    try:
        return read_header(record.blob).chart_version
    except sb.PositionError:
        return None


class ObservedStore(DynamoStore):
    """A DynamoStore that names, on the log lines, the chart of the instance in focus.

    The host reads the position item anyway; noting its chart and revision here costs no
    request, where asking for them separately would cost one.
    """

    def load(self, instance_id: str) -> PositionRecord | None:
        """:meth:`DynamoStore.load`, then ``chart``/``revision`` on the logs if it is the focus."""
        record = super().load(instance_id)
        if record is not None and logger.get_current_keys().get("instance_id") == instance_id:
            logger.append_keys(chart=record.chart, revision=revision_of(record))
        return record


class SweepMetrics:
    """Counts what fires did, and flushes them as one EMF document per sweep.

    ``Dead`` and ``Conflicts`` are not in a fire's result: they are how far the host's own
    counters (``host.metrics``) moved since the last flush. Measured around each fire, they
    were counted twice when a fire's commit handed an outbox row over (a fire inside a fire),
    and took other threads' fires for this one's.
    """

    COUNTS = ("Fired", "Delivered", "Discarded", "Stale", "Failed", "Dead", "Conflicts")
    #: What a request function reports: the outbox rows it handed over right after its commits.
    OUTBOX = ("Delivered", "Failed", "Dead")
    #: The host counters behind the counts a fire's result does not carry.
    FROM_HOST = {"Dead": "dead", "Conflicts": "conflicts"}

    def __init__(self, host_counters: Any = None) -> None:
        self.counts: Counter[str] = Counter()
        self.lags: list[int] = []
        self.totals: Counter[str] = Counter()   # over the invocation, for its return value
        self.host_counters = host_counters
        self._seen = self._host_now()

    def _host_now(self) -> dict[str, int]:
        source = self.host_counters if self.host_counters is not None else {}
        return {name: int(source.get(key, 0)) for name, key in self.FROM_HOST.items()}

    def _take_host_counts(self) -> None:
        now = self._host_now()
        for name, value in now.items():
            self.counts[name] += value - self._seen[name]
        self._seen = now

    def record(self, result: FireResult) -> None:
        """Fold in one fire."""
        outcome = result.outcome.capitalize()
        if outcome in self.COUNTS:
            self.counts[outcome] += 1
        if result.outcome == "fired":
            self.lags.append(result.lag_ms)
            metrics.add_metric(name="TimerLag", unit=MetricUnit.Milliseconds, value=result.lag_ms)

    def flush(self, *, sweeps: int = 0) -> bool:
        """Emit what was recorded since the last flush (nothing if nothing happened)."""
        self._take_host_counts()
        if not (sum(self.counts.values()) or self.lags or sweeps):
            return False
        for name in self.COUNTS:
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=self.counts[name])
        if sweeps:
            metrics.add_metric(name="Sweeps", unit=MetricUnit.Count, value=sweeps)
        if self.lags:
            ordered = sorted(self.lags)
            metrics.add_metadata(key="lag_p50_ms", value=_percentile(ordered, 50))
            metrics.add_metadata(key="lag_p99_ms", value=_percentile(ordered, 99))
        metrics.flush_metrics()
        self.totals.update(self.counts)
        self.counts.clear()
        self.lags.clear()
        return True


    def flush_outbox(self) -> bool:
        """A request function's flush, at the end of an invocation: only the outbox counts
        that moved, so an API that sends nothing emits no metric (and costs none)."""
        self._take_host_counts()
        moved = {name: self.counts[name] for name in self.OUTBOX if self.counts[name]}
        self.counts.clear()
        self.lags.clear()
        if not moved:
            return False
        for name, value in moved.items():
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
        metrics.flush_metrics()
        return True


def _percentile(ordered: list[int], p: int) -> int:
    """Nearest-rank percentile of a sorted, non-empty list."""
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[rank - 1]


class ObservedHost(sb.Host):
    """A Host whose every fire is logged and counted with the timer's own context.

    ``fire`` is the host's public per-row verb (the sweeper's ``fire_due`` calls it for each
    row it claims), so wrapping it sees every fire however the rows were found.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sweep_metrics = SweepMetrics(self.metrics)

    def fire(self, row: TimerRow, *, node_id: str | None = None) -> FireResult:
        """:meth:`Host.fire`, inside a log scope naming the timer, then counted."""
        # a timer row carries its event as "name", an outbox send row as "event"
        event = row.event.get("name") or row.event.get("event") or row.event.get("invokeid")
        what = "timer" if row.kind == "timer" else f"outbox {row.kind}"
        outer = {k: v for k, v in logger.get_current_keys().items() if k in ("chart", "revision")}
        with scope(instance_id=row.target_id, event=event, timer=f"{row.instance_id}#{row.ordinal}",
                   correlation_id=correlation_id_of(row.caller_context)):
            result = super().fire(row, node_id=node_id)
            extra = {"outcome": result.outcome, "lag_ms": result.lag_ms, "reason": result.reason}
            if result.outcome == "failed":
                logger.warning(f"{what} delivery failed", extra=extra)
            else:
                logger.info(f"{what} {result.outcome}", extra=extra)
            logger.remove_keys(["chart", "revision"])
        if outer:   # fired inside a request (an outbox row right after its commit)
            logger.append_keys(**outer)
        self.sweep_metrics.record(result)
        return result
