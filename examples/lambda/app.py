"""Shared set-up for the Lambda handlers: one Host per execution environment.

Built on first use (not at import) so a test can configure it first, and cached for the
life of the warm environment so charts are compiled once per cold start.

The charts are every revision in ``charts/`` (see ``chart_revisions.py``): new instances
start on the latest revision of a chart, live ones drain on their own.

Environment:
  TABLE_NAME        the DynamoDB table (created by template.yaml)
  CHARTS_DIR        where the charts live (default: charts/ beside this file)
  DUE_SHARDS        due-index shards; must match across all writers and sweepers (default 16)
  DONE_TTL_S        completed timer rows expire this many seconds after they fire, through
                    DynamoDB TTL on ``expires_at`` (default: kept; the template sets 7 days)
  HTTP_BASE         public base URL of the HTTP API, offered to charts as their Basic HTTP
                    location (optional)
  CONFIRMATIONS_QUEUE_URL
                    the SQS queue behind the charts' ``<send type="sqs">`` (the order
                    confirmation of charts/order/v3). Every function gets it: the one that
                    commits a send delivers it right after the commit, and the sweeper
                    retries what that could not deliver. Unset: no "sqs" processor, and such
                    a send is an error.execution in the chart (logged).
  WAKEUP_QUEUE_URL  the SQS queue of wake-ups (statebound.dynamodb.SQSWakeup): every commit
                    that arms a timer due within 15 minutes sends a delayed message there, and
                    wake.py fires the timer when it arrives (optional: without it, the
                    sweeper finds timers by reading the table)
"""

from __future__ import annotations

import os
from typing import Any

import statebound as sb
from statebound.aws import SQSProcessor

from chart_revisions import load_charts
from telemetry import ObservedHost, ObservedStore, chart_log

__all__ = ["build_host", "get_host", "configure", "load_charts", "processors", "flush_outbox_metrics",
           "own_events", "refuse_own_event", "OwnEvent"]

#: Event name prefixes the platform raises (``done.state.*``, ``done.invoke.*``, ``error.*``).
PLATFORM_PREFIXES = ("done.", "error.")
#: The first token of every platform event: a transition on ``error`` takes them all.
PLATFORM_TOKENS = frozenset(p.rstrip(".") for p in PLATFORM_PREFIXES)


class OwnEvent(ValueError):
    """A client tried to send an event the chart raises for itself."""


def own_events(charts: Any) -> frozenset[str]:
    """The events the charts raise for themselves: every ``<sb:timeout>`` event of every
    revision. A client that could post one would fire the timer early."""
    return frozenset(t.event for chart in charts for state in chart.states for t in state.timeouts)


def refuse_own_event(host: sb.Host, name: str) -> None:
    """:class:`OwnEvent` if no client may send ``name``: a timeout of a deployed chart
    revision, or a platform event (the charts would take it for the real thing).

    SCXML matches an event by its descriptor's tokens (``event="PaymentTimeout"`` takes
    ``PaymentTimeout.x`` too), so a name is refused when it *is or extends* an own event,
    token by token: ``PaymentTimeout``, ``PaymentTimeout.early``, ``error``, ``done.x``."""
    own = getattr(host, "own_events", None)
    if own is None:
        # A Host installed with configure() and not built here: every revision it holds
        # (an instance still on an older one keeps that one's timeouts)
        own = own_events([c for name in host.charts for c in host.revisions(name)])
    tokens = name.split(".")
    for n in range(1, len(tokens) + 1):
        if ".".join(tokens[:n]) in own:
            raise OwnEvent(f"event {name!r} is, or extends, a chart's own timeout; only its timer sends it")
    if tokens[0] in PLATFORM_TOKENS:
        raise OwnEvent(f"event {name!r} is a platform event; only the interpreter raises it")

_host: sb.Host | None = None


def build_host(*, client: Any = None, clock: Any = None, table_name: str | None = None,
               charts_dir: str | os.PathLike[str] | None = None, sqs_client: Any = None) -> sb.Host:
    """A Host over the DynamoDB table named by ``TABLE_NAME``, with the send processors,
    sending wake-ups to ``WAKEUP_QUEUE_URL`` when it is set."""
    table = table_name or os.environ["TABLE_NAME"]
    ttl = os.environ.get("DONE_TTL_S")
    store = ObservedStore(table, client=client if client is not None else _dynamodb(),
                          shards=int(os.environ.get("DUE_SHARDS", "16")),
                          done_ttl_s=int(ttl) if ttl else None)
    charts = load_charts(charts_dir)
    host = ObservedHost(charts, store=store, clock=clock or sb.SystemClock(),
                        http_base=os.environ.get("HTTP_BASE") or "http://statebound.invalid", on_log=chart_log,
                        processors=processors(sqs_client), wakeup=_wakeup(sqs_client))
    host.own_events = own_events(charts)   # every revision's, not only the latest's
    return host


#: The SQS calls a request makes after its commit (the outbox hand-over, the wake-ups) get
#: one short attempt: an HTTP function has 10 s in all (template.yaml), and what it fails
#: to hand over is not lost: the sweeper sends the row, and the fallback arms the timer.
HANDOVER_CONFIG = {"connect_timeout": 1, "read_timeout": 2, "retries": {"total_max_attempts": 1}}


#: DynamoDB from a function: an HTTP function has 10 s in all, so two short attempts (8 s at
#: worst) end in the handler's own 503 with a request id, not in Lambda's timeout and API
#: Gateway's bare 5xx. (The library's default is 16 s at worst: DYNAMODB_CALL.)
DYNAMODB_CONFIG = {"connect_timeout": 1, "read_timeout": 3, "retries": {"total_max_attempts": 2, "mode": "standard"}}


def _dynamodb() -> Any:
    import boto3
    from botocore.config import Config
    return boto3.client("dynamodb", config=Config(**DYNAMODB_CONFIG))


def _sqs(sqs_client: Any) -> Any:
    if sqs_client is not None:
        return sqs_client
    import boto3
    from botocore.config import Config
    return boto3.client("sqs", config=Config(**HANDOVER_CONFIG))


def processors(sqs_client: Any = None) -> dict[str, Any]:
    """The charts' send processors: ``"sqs"``, the confirmations queue, when it is configured."""
    url = os.environ.get("CONFIRMATIONS_QUEUE_URL")
    if not url:
        return {}
    return {"sqs": SQSProcessor(url, client=_sqs(sqs_client))}


def _wakeup(sqs_client: Any) -> Any:
    url = os.environ.get("WAKEUP_QUEUE_URL")
    if not url:
        return None
    from statebound.dynamodb import SQSWakeup
    return SQSWakeup(url, client=_sqs(sqs_client))


def get_host() -> sb.Host:
    """The environment's Host, built on first use."""
    global _host
    if _host is None:
        _host = build_host()
    return _host


def flush_outbox_metrics() -> None:
    """End of a request function's invocation: report the outbox rows it handed over, if any."""
    recorder = getattr(_host, "sweep_metrics", None)
    if recorder is not None:
        recorder.flush_outbox()


def configure(host: sb.Host | None) -> None:
    """Install a Host (tests do this with a moto client and a ManualClock); ``None`` resets."""
    global _host
    _host = host
