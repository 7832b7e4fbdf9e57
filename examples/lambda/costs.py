"""Measure what the example costs, and price it: ``python costs.py [--update-readme]``.

Runs the order chart through the handlers on moto (in process, no AWS account), counts
every DynamoDB request with botocore hooks on the functions' client (and the SQS requests
the outbox and the wake-ups make), and works out the
capacity units each request is billed from the items it reads and writes, in the table
and in the due index (writes: 1 unit per KB per item, twice that inside a transaction,
plus the index entries that appear, change or disappear; reads: 1 unit per 4 KB strongly
consistent, half that eventually consistent). It then prices the units and requests with
the list prices in ``PRICES``, and prints the cost table of the README (``--update-readme``
rewrites it there; ``tests/aws_lambda/test_costs.py`` fails when the two differ).

Both ways of firing timers are measured: the template's, where each commit arming a timer
sends an SQS wake-up (``WAKEUP_QUEUE_URL``), ``wake.py`` fires it and ``sweeper.py`` is a
fallback every ``FALLBACK_MINUTES``; and polling, where ``sweeper.py`` sweeps around the
clock. moto's SQS delays run on the wall clock, so the wake-ups are sent to moto (and
counted) and their bodies, recorded as they are sent, are handed to ``wake.py`` as the
event source mapping would, one per invocation, when the manual clock reaches their time.

Needs the test extra (moto). The numbers are the example's as committed: re-run it when
the chart, the store or the sweeper changes.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
TABLE = "statebound-costs"
START_MS = 1_796_108_400_000
FIRES = 100                # timers fired in the measured sweep
MINUTES_PER_MONTH = 730 * 60
SHARDS = 16                # the template's DueShards
FALLBACK_MINUTES = 5       # the template's FallbackMinutes

#: On-demand list prices, us-east-1, as published by AWS in 2025 (USD).
PRICES = {
    "dynamodb_wru": 0.625 / 1e6,      # per write request unit (on-demand, since Nov 2024)
    "dynamodb_rru": 0.125 / 1e6,      # per read request unit
    "http_api_request": 1.00 / 1e6,   # API Gateway HTTP API, first 300 million a month
    "lambda_request": 0.20 / 1e6,     # per invocation
    "sqs_request": 0.40 / 1e6,        # standard queue, per 64 KB request
    "sqs_fifo_request": 0.50 / 1e6,   # FIFO queue, per 64 KB request
    "custom_metric_month": 0.30,      # CloudWatch, per metric (first 10,000)
}
_INDEXES = {"due-index": ("gsi_pk", "gsi_due"), "dead-index": ("dead_pk", "dead_sk")}
_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


@dataclass
class Usage:
    """Requests and capacity units consumed."""

    requests: Counter[str] = field(default_factory=Counter)
    wru: float = 0.0
    rru: float = 0.0

    def minus(self, other: Usage) -> Usage:
        """What this used beyond ``other``."""
        return Usage(self.requests - other.requests, self.wru - other.wru, self.rru - other.rru)

    def per(self, n: float) -> Usage:
        """An n-th of this."""
        return Usage(Counter({k: v / n for k, v in self.requests.items()}), self.wru / n, self.rru / n)

    @property
    def dynamodb_usd(self) -> float:
        """What the capacity units cost."""
        return self.wru * PRICES["dynamodb_wru"] + self.rru * PRICES["dynamodb_rru"]


def _size(item: dict[str, Any] | None) -> int:
    from statebound.dynamodb._codec import item_size   # the store's own size rule
    return item_size(item) if item else 0


class Meter:
    """Counts a client's DynamoDB requests and their capacity units (see the module doc)."""

    def __init__(self, client: Any, raw: Any) -> None:
        self.client = client
        self.raw = raw   # a second client on the same moto backend, unhooked, to read items
        self.usage = Usage()
        self._pending: list[tuple[str, dict[str, Any], dict[Any, Any] | None]] = []

    def _items(self, keys: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any] | None]:
        out = {}
        for key in keys:
            item = self.raw.get_item(TableName=TABLE, Key=key, ConsistentRead=True).get("Item")
            out[(key["pk"]["S"], key["sk"]["S"])] = item
        return out

    @staticmethod
    def _written_keys(op: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        def key(d: dict[str, Any]) -> dict[str, Any]:
            return {"pk": d["pk"], "sk": d["sk"]}
        if op == "PutItem":
            return [key(params["Item"])]
        if op in ("UpdateItem", "DeleteItem"):
            return [key(params["Key"])]
        if op == "TransactWriteItems":
            out = []
            for action in params["TransactItems"]:
                (kind, body), = action.items()
                if kind == "Put":
                    out.append(key(body["Item"]))
                elif kind in ("Update", "Delete"):
                    out.append(key(body["Key"]))
            return out
        out = []
        for requests in params["RequestItems"].values():   # BatchWriteItem
            for r in requests:
                out.append(key(r["PutRequest"]["Item"]) if "PutRequest" in r else key(r["DeleteRequest"]["Key"]))
        return out

    def _before(self, model: Any, params: dict[str, Any], **kwargs: Any) -> None:
        before = self._items(self._written_keys(model.name, params)) if model.name in _WRITES else None
        self._pending.append((model.name, dict(params), before))

    def _after(self, model: Any, parsed: dict[str, Any], **kwargs: Any) -> None:
        op, params, before = self._pending.pop()
        self.usage.requests[op] += 1
        if before is not None:
            after = self._items([{"pk": {"S": pk}, "sk": {"S": sk}} for pk, sk in before])
            self._bill_writes(op, before, after)
        elif op == "GetItem":
            self.usage.rru += self._read_units([parsed.get("Item")], params.get("ConsistentRead", False))
        elif op in ("Query", "Scan"):
            self.usage.rru += self._read_units(parsed.get("Items", []), params.get("ConsistentRead", False))
        elif op == "BatchGetItem":
            for items in parsed.get("Responses", {}).values():
                self.usage.rru += sum(self._read_units([i], True) for i in items)

    @staticmethod
    def _read_units(items: list[Any], consistent: bool) -> float:
        units = max(1, math.ceil(sum(_size(i) for i in items) / 4096))
        return units if consistent else units / 2

    def _bill_writes(self, op: str, before: dict[Any, Any], after: dict[Any, Any]) -> None:
        factor = 2 if op == "TransactWriteItems" else 1
        for key in before:
            old, new = before[key], after[key]
            # billed on the larger of the two images, even when nothing changed (a rewrite)
            self.usage.wru += factor * max(1, math.ceil(max(_size(old), _size(new)) / 1024))
            for attrs in _INDEXES.values():
                was = old is not None and all(a in old for a in attrs)
                now = new is not None and all(a in new for a in attrs)
                if old == new or not (was or now):
                    continue
                moved = was and now and any(old[a] != new[a] for a in attrs)  # type: ignore[index]
                writes = (2 if moved else 1) if (was and now) else 1
                entry = max(_size(old) if was else 0, _size(new) if now else 0) + 100
                self.usage.wru += writes * math.ceil(entry / 1024)

    @contextmanager
    def measure(self) -> Iterator[Usage]:
        """Usage of the requests made inside the block."""
        start = Usage(Counter(self.usage.requests), self.usage.wru, self.usage.rru)
        result = Usage()
        events = self.client.meta.events
        # before-parameter-build sees the API parameters (before-call sees the HTTP request)
        events.register("before-parameter-build.dynamodb", self._before)
        events.register("after-call.dynamodb", self._after)
        try:
            yield result
        finally:
            events.unregister("before-parameter-build.dynamodb", self._before)
            events.unregister("after-call.dynamodb", self._after)
            spent = self.usage.minus(start)
            result.requests, result.wru, result.rru = spent.requests, spent.wru, spent.rru


class _ClockContext:
    """A Lambda context whose remaining time follows the (manual) clock."""

    function_name = "statebound-costs"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:statebound-costs"
    aws_request_id = "costs-sweeper"

    def __init__(self, clock: Any, timeout_ms: int) -> None:
        self.clock = clock
        self.deadline = clock.now_ms() + timeout_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.deadline - self.clock.now_ms()


def _http(method: str, path: str, body: str | None, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"version": "2.0", "rawPath": path, "headers": {"content-type": "application/json", **(headers or {})},
            "requestContext": {"requestId": "costs", "http": {"method": method, "path": path}},
            "pathParameters": {"id": path.split("/")[2]}, "body": body, "isBase64Encoded": False}


@dataclass
class Measurements:
    """Usage per operation of the example."""

    event_plain: Usage
    event_arming: Usage
    event_completing: Usage
    start: Usage
    fire_arming: Usage
    fire_plain: Usage
    idle_minute: Usage
    event_repeated: Usage = field(default_factory=Usage)
    sqs_event: Usage = field(default_factory=Usage)
    sqs_redelivered: Usage = field(default_factory=Usage)
    confirmations_sent: float = 0.0    # SQS SendMessage calls per completing event
    wake: WakeMeasurements | None = None


@dataclass
class WakeMeasurements:
    """Usage of the wake-up mode (the template's): DynamoDB usage, and SQS requests and
    wake-function invocations counted per operation."""

    shards: int
    fallback_minutes: int
    event_arming: Usage                   # the arming event, wake-up sent after its commit
    arming_sends: float                   # SendMessageBatch per arming event
    fallback_idle: Usage                  # one fallback run, nothing due and nothing to arm
    fire_arming: Usage = field(default_factory=Usage)   # a woken fire arming GraceExpired (1 day out)
    fire_plain: Usage = field(default_factory=Usage)    # a woken fire arming nothing
    messages_per_fire: float = 0.0        # wake-up messages (one invocation each) per fire
    long_arming: Usage = field(default_factory=Usage)   # the fallback arming one far-out timer
    long_sends: float = 0.0               # SendMessageBatch per far-out timer the fallback arms


def measure(idle_seconds: int = 60, fires: int = FIRES, *, shards: int = SHARDS,
            fallback_minutes: int = FALLBACK_MINUTES) -> Measurements:
    """Run the scenarios on moto and measure them.

    :param idle_seconds: how long to run the idle polling sweeper (0: skip it).
    :param fires: timers per measured sweep, and per measured batch of wake-ups (0: skip the fires).
    :param shards: due-index shards (``DUE_SHARDS``).
    :param fallback_minutes: the fallback's period in wake-up mode (``FALLBACK_MINUTES``).
    """
    import boto3
    import moto

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "TABLE_NAME": TABLE, "SWEEP_LEASES": "1",
                        "SWEEP_JITTER": "0", "SWEEP_INTERVAL_S": "1.0", "SWEEP_MARGIN_MS": "5000",
                        "POWERTOOLS_METRICS_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "ERROR",
                        "DUE_SHARDS": str(shards), "FALLBACK_MINUTES": str(fallback_minutes)}.items():
        os.environ[name] = value
    for name in ("DONE_TTL_S", "WAKEUP_QUEUE_URL"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(HERE))
    import statebound as sb
    from statebound.dynamodb import DynamoStore

    with moto.mock_aws(), tempfile.TemporaryDirectory() as tmp, redirect_stdout(io.StringIO()):
        client = boto3.client("dynamodb", region_name="us-east-1")
        raw = boto3.client("dynamodb", region_name="us-east-1")
        DynamoStore.create_table(TABLE, client=client)
        sqs = boto3.client("sqs", region_name="us-east-1")
        os.environ["CONFIRMATIONS_QUEUE_URL"] = sqs.create_queue(
            QueueName="confirmations.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        os.environ["DEAD_LETTER_QUEUE_URL"] = sqs.create_queue(QueueName="events-dead-letters")["QueueUrl"]
        events_queue = sqs.create_queue(QueueName="events")["QueueUrl"]
        import app
        import handler
        import sqs_events
        import sweeper
        charts = Path(tmp) / "charts"
        shutil.copytree(HERE / "charts", charts)
        clock = sb.ManualClock(now_ms=START_MS)
        host = app.build_host(client=client, clock=clock, charts_dir=charts)
        app.configure(host)
        meter = Meter(client, raw)
        sends: list[str] = []
        host.processors["sqs"].client.meta.events.register(
            "before-call.sqs", lambda model, **kw: sends.append(model.name))

        def call(method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None) -> None:
            status = handler.handle(_http(method, path, body, headers), _ClockContext(clock, 10_000))["statusCode"]
            assert status < 300, (method, path, status)

        def sqs_batch(bodies: list[str]) -> dict[str, Any]:
            """Send to the events queue, receive as the event source mapping does: the Lambda event."""
            for body in bodies:
                sqs.send_message(QueueUrl=events_queue, MessageBody=body)
            got = sqs.receive_message(QueueUrl=events_queue, MaxNumberOfMessages=10)["Messages"]
            return {"Records": [{"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                                 "body": m["Body"], "messageAttributes": {}, "eventSource": "aws:sqs"}
                                for m in got]}

        def sweep(seconds: int) -> None:
            # SWEEP_MARGIN_MS is 5000: 1 ms above it buys exactly one sweep
            sweeper.handle({}, _ClockContext(clock, seconds * 1000 + 5_001))

        sweep(2)  # the first sweep of a new table bootstraps the cursors: not a steady-state cost
        with meter.measure() as start:
            call("POST", "/instances/o-0", '{"chart": "order", "data": {"payment_timeout": "1h"}}')
        with meter.measure() as arming:
            call("POST", "/instances/o-0/events", '{"event": "StartPayment", "data": {"card": "4242"}}')
        with meter.measure() as completing:
            call("POST", "/instances/o-0/events", '{"event": "Complete"}')   # cancels it, sends the confirmation
        confirmations = float(sends.count("SendMessage"))
        call("POST", "/instances/o-1", '{"chart": "order"}')
        with meter.measure() as plain:
            call("POST", "/instances/o-1/events", '{"event": "Cancel"}', {"idempotency-key": "cancel-o-1"})
        with meter.measure() as repeated:
            call("POST", "/instances/o-1/events", '{"event": "Cancel"}', {"idempotency-key": "cancel-o-1"})

        # the SQS events function, a batch of ten events for ten instances, then SQS delivering it again
        for i in range(10):
            call("POST", f"/instances/q-{i}", '{"chart": "order"}')
        event = sqs_batch([f'{{"instance_id": "q-{i}", "event": "Cancel"}}' for i in range(10)])
        with meter.measure() as sqs_event:
            assert sqs_events.handle(event, _ClockContext(clock, 30_000))["batchItemFailures"] == []
        with meter.measure() as sqs_again:
            assert sqs_events.handle(event, _ClockContext(clock, 30_000))["batchItemFailures"] == []

        fires_arming = fires_plain = Usage()
        if fires:
            for i in range(fires):
                call("POST", f"/instances/f-{i}", '{"chart": "order", "data": {"payment_timeout": "1m"}}')
                call("POST", f"/instances/f-{i}/events", '{"event": "StartPayment"}')
            # A fire's cost is what one short invocation costs with the timers due, less what
            # the same invocation costs with nothing due (leases, cursors, empty queries).
            with meter.measure() as idle_one:
                sweep(0)
            clock.advance(60_000)
            with meter.measure() as due:
                sweep(0)   # v2's PaymentTimeout: each fire arms GraceExpired
            fires_arming = due.minus(idle_one).per(fires)
            with meter.measure() as idle_two:
                sweep(0)
            clock.advance(24 * 3600_000)
            with meter.measure() as due:
                sweep(0)   # GraceExpired: fires that arm nothing
            fires_plain = due.minus(idle_two).per(fires)
        idle_minute = Usage()
        if idle_seconds:
            with meter.measure() as idle_minute:
                sweep(idle_seconds)
            idle_minute = idle_minute.per(idle_seconds / 60)
        wake = _measure_wake(app, handler, sweeper, client, meter, sqs, charts, clock, fires, shards,
                             fallback_minutes)
        app.configure(None)
    return Measurements(plain, arming, completing, start, fires_arming, fires_plain, idle_minute,
                        repeated, sqs_event.per(10), sqs_again.per(10), confirmations, wake)


def _measure_wake(app: Any, handler: Any, sweeper: Any, client: Any, meter: Meter, sqs: Any, charts: Path,
                  clock: Any, fires: int, shards: int, fallback_minutes: int) -> WakeMeasurements:
    """The wake-up mode, on a host built as the template builds it (``WAKEUP_QUEUE_URL`` set)."""
    import wake

    if fires >= min(60 * fallback_minutes, 600):
        raise SystemExit("--fires must be under 600 and 60 x --fallback-minutes: the measured timers, a second "
                         "apart, must all be armed before the first is due, and enter one fallback run's window")
    queue = sqs.create_queue(QueueName="wakeups")["QueueUrl"]
    os.environ.pop("SWEEP_LEASES", None)   # the template's fallback runs alone (reserved concurrency 1)
    os.environ["WAKEUP_QUEUE_URL"] = queue
    try:
        host = app.build_host(client=client, clock=clock, charts_dir=charts, sqs_client=sqs)
    finally:
        del os.environ["WAKEUP_QUEUE_URL"]
    app.configure(host)
    sent: list[tuple[int, str]] = []     # (visible at, body) of each wake-up, as sent
    batches: list[int] = []              # SendMessageBatch requests that reached moto

    def record(params: dict[str, Any], **kw: Any) -> None:
        if params.get("QueueUrl") == queue:
            sent.extend((clock.now_ms() + e["DelaySeconds"] * 1000, e["MessageBody"]) for e in params["Entries"])

    events = host.wakeup.client.meta.events   # type: ignore[union-attr]
    events.register("before-parameter-build.sqs.SendMessageBatch", record)
    events.register("after-call.sqs.SendMessageBatch", lambda **kw: batches.append(1))

    def call(method: str, path: str, body: str) -> None:
        status = handler.handle(_http(method, path, body), _ClockContext(clock, 10_000))["statusCode"]
        assert status < 300, (method, path, status)

    def fallback() -> Usage:
        with meter.measure() as used:
            result = sweeper.handle({}, _ClockContext(clock, 60_000))
        assert result["failed"] == 0, result
        return used

    def deliver() -> tuple[Usage, int]:
        """Hand each recorded wake-up to wake.py when it becomes visible. Timers due in
        different seconds arrive alone (the mapping has no batching window): one message
        per invocation."""
        messages = sorted(sent)
        sent.clear()
        with meter.measure() as used:
            for n, (visible, body) in enumerate(messages):
                clock.set(max(clock.now_ms(), visible))
                event = {"Records": [{"messageId": f"w-{n}", "body": body, "eventSource": "aws:sqs"}]}
                assert wake.handle(event, _ClockContext(clock, 30_000)) == {"batchItemFailures": []}
        return used, len(messages)

    call("POST", "/instances/w-0", '{"chart": "order", "data": {"payment_timeout": "1m"}}')
    with meter.measure() as arming:
        call("POST", "/instances/w-0/events", '{"event": "StartPayment"}')
    arming_sends = float(len(batches))
    deliver()   # fires it; its next timer is a day out
    # The fallback runs in a warm environment, as a 5-minute schedule mostly does; its period
    # is longer than the store's fallback_ms, so every run reads every shard anyway.
    fallback()
    clock.advance(fallback_minutes * 60_000)
    idle = fallback()
    if sent:
        raise SystemExit(f"the idle fallback sent {len(sent)} wake-ups")
    out = WakeMeasurements(shards, fallback_minutes, arming, arming_sends, idle)
    if not fires:
        return out
    clock.advance(fallback_minutes * 60_000)
    first = clock.now_ms()
    for i in range(fires):   # requests a second apart: timers due in different seconds
        call("POST", f"/instances/wf-{i}", '{"chart": "order", "data": {"payment_timeout": "10m"}}')
        call("POST", f"/instances/wf-{i}/events", '{"event": "StartPayment"}')
        clock.advance(1_000)
    fired = host.metrics.get("fired", 0)
    used, messages = deliver()   # each fire arms GraceExpired, a day out: no wake-up for it yet
    if host.metrics.get("fired", 0) - fired != fires:
        raise SystemExit(f"wake-ups fired {host.metrics.get('fired', 0) - fired} of {fires} timers")
    out.fire_arming = used.per(fires)
    out.messages_per_fire = messages / fires
    # A day later the fallback arms the GraceExpired timers as they come within the queue's
    # 15 minutes, and their wake-ups fire them. The run that arms them, less an idle run,
    # is what a long timer adds to the fallback.
    last_grace = first + 600_000 + (fires - 1) * 1_000 + 24 * 3600_000
    clock.set(last_grace - 15 * 60_000 - fallback_minutes * 60_000)
    fallback()   # the run before: they are beyond its window
    clock.advance(fallback_minutes * 60_000)
    sends = len(batches)
    with_rows = fallback()
    armed = sum(len(json.loads(body)["rows"]) for _, body in sent)
    if armed != fires or len(sent) != fires:
        raise SystemExit(f"the fallback armed {armed} of {fires} long timers, in {len(sent)} messages")
    out.long_sends = (len(batches) - sends) / fires
    out.long_arming = with_rows.minus(idle).per(fires)
    fired = host.metrics.get("fired", 0)
    used, _ = deliver()
    if host.metrics.get("fired", 0) - fired != fires:
        raise SystemExit(f"wake-ups fired {host.metrics.get('fired', 0) - fired} of {fires} long timers")
    out.fire_plain = used.per(fires)
    return out


def _usd(x: float) -> str:
    """Dollars, to the cent, or to a tenth of a cent under ten cents."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def _requests(u: Usage, digits: int = 2) -> str:
    parts = []
    for op, n in sorted(u.requests.items(), key=lambda kv: (-kv[1], kv[0])):
        if n < 0.005:
            continue
        parts.append(op if abs(n - 1) < 0.005 else f"{n:.{digits}f} {op}")
    return ", ".join(parts)


#: SQS and Lambda requests per event over the events queue, with full batches of ten: the
#: producer's SendMessage, a tenth of the poller's ReceiveMessage and DeleteMessageBatch,
#: and a tenth of an invocation. A redelivery is the receive, the delete and the invocation.
SQS_EVENT = {"sqs": 1.2, "lambda": 0.1}
SQS_REDELIVERY = {"sqs": 0.2, "lambda": 0.1}
#: SQS requests per wake-up message delivered to the wake function: the poller's
#: ReceiveMessage and DeleteMessageBatch (its empty long polls are the idle cost, not counted).
SQS_WAKE_DELIVERY = 2


def render(m: Measurements) -> str:
    """The README's cost table."""
    http = PRICES["http_api_request"] + PRICES["lambda_request"]

    def over_sqs(n: dict[str, float]) -> float:
        return n["sqs"] * PRICES["sqs_request"] + n["lambda"] * PRICES["lambda_request"]
    confirm = m.confirmations_sent * PRICES["sqs_fifo_request"]
    rows = [("start an instance", m.start, http, None), ("event, no timer change", m.event_plain, http, None),
            ("event arming a timer", m.event_arming, http, None),
            ("event completing an order: cancels its timer, sends the confirmation (outbox)",
             m.event_completing, http + confirm, None),
            ("repeated event (same `Idempotency-Key`)", m.event_repeated, http, None),
            ("event over SQS (`SqsEventsFunction`)", m.sqs_event, over_sqs(SQS_EVENT), None),
            ("SQS delivering an applied event again", m.sqs_redelivered, over_sqs(SQS_REDELIVERY), None),
            ("polling: timer fire (arms nothing)", m.fire_plain, 0.0, None),
            ("polling: timer fire that arms the next timer", m.fire_arming, 0.0, None)]
    if m.fire_plain.requests:
        # the arming event's extra over a plain one, plus the fire: what a timer adds
        timer = m.event_arming.minus(m.event_plain)
        timer = Usage(Counter(), timer.wru + m.fire_plain.wru, timer.rru + m.fire_plain.rru)
        rows.append(("polling: **a timer**, armed by an event and fired", timer, 0.0,
                     "the arming event's TransactWriteItems in place of a PutItem, and the fire"))
    w = m.wake
    if w is not None:
        send = PRICES["sqs_request"]
        arm_wake = w.arming_sends * send
        delivery = w.messages_per_fire * (SQS_WAKE_DELIVERY * send + PRICES["lambda_request"])
        rows.append(("wake-ups: event arming a timer, and its wake-up", w.event_arming,
                     http + arm_wake, None))
        if w.fire_plain.requests:
            rows.append(("wake-ups: timer fire (`WakeFunction`, arms nothing)", w.fire_plain, delivery, None))
            rows.append(("wake-ups: timer fire that arms the next timer", w.fire_arming, delivery, None))
            rows.append(("wake-ups: a timer due beyond 15 minutes gets its wake-up from the fallback", w.long_arming,
                         w.long_sends * send, None if w.long_arming.requests else
                         "none of its own: the fallback's shard reads return it"))
            extra = w.event_arming.minus(m.event_plain)
            timer = Usage(Counter(), extra.wru + w.fire_plain.wru, extra.rru + w.fire_plain.rru)
            rows.append(("wake-ups: **a timer**, armed by an event and fired", timer, arm_wake + delivery,
                         "as above, plus its wake-up and the fire by wake-up"))
    lines = ["| per million | DynamoDB requests, each | WRU each | RRU each | DynamoDB | other requests | total |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, u, other, what in rows:
        if not (u.requests or what):
            continue   # not measured this time
        lines.append(f"| {name} | {what or _requests(u)} | {u.wru:.2f} | {u.rru:.2f} | ${u.dynamodb_usd * 1e6:.2f} "
                     f"| ${other * 1e6:.2f} | ${(u.dynamodb_usd + other) * 1e6:.2f} |")
    lines += ["", "Other requests: an HTTP row is one API Gateway request and one Lambda invocation; "
                  f"completing an order adds {m.confirmations_sent:g} SQS FIFO SendMessage (the confirmation); "
                  f"an event over SQS is {SQS_EVENT['sqs']:g} SQS requests and {SQS_EVENT['lambda']:g} "
                  "invocations (the producer's SendMessage, and a tenth of the poller's ReceiveMessage, "
                  "DeleteMessageBatch and invocation, with full batches of ten), a redelivery "
                  f"{SQS_REDELIVERY['sqs']:g} and {SQS_REDELIVERY['lambda']:g}."]
    if w is not None:
        lines += ["", "Wake-ups (the template's mode): an event arming a timer due within 15 minutes also sends "
                      f"{w.arming_sends:g} SQS SendMessageBatch (the wake-up)."]
        if w.fire_plain.requests:
            lines[-1] += (f" A fire by wake-up is {w.messages_per_fire:g} message, each {SQS_WAKE_DELIVERY:g} "
                          "SQS requests (the poller's ReceiveMessage and DeleteMessageBatch) and one invocation: "
                          "timers due in different seconds arrive alone (under load, batches of up to ten divide "
                          "that share). The fallback sends the wake-ups of timers due further out, "
                          f"{w.long_sends:g} SendMessageBatch each (ten messages a request). Polling rows "
                          "(no `WAKEUP_QUEUE_URL`) have no other requests: the sweeper runs around the clock.")
    from telemetry import SweepMetrics   # costs.py runs beside the functions' modules
    emf = len(SweepMetrics.COUNTS) + 2   # the counts, Sweeps and TimerLag
    emf_usd = emf * PRICES["custom_metric_month"]
    if w is not None:
        runs = MINUTES_PER_MONTH / w.fallback_minutes
        f = w.fallback_idle
        lines += ["", f"**Idle, with wake-ups** (the template), nothing runs but the fallback: every "
                      f"{w.fallback_minutes} minutes (`FALLBACK_MINUTES`), {runs:,.0f} runs a month, each "
                      f"{sum(f.requests.values()):g} requests ({_requests(f, 0)}) and {f.rru:g} RRU over "
                      f"{w.shards} shards: **${_usd(f.dynamodb_usd * runs)} a month** in DynamoDB, "
                      f"${runs * PRICES['lambda_request']:.4f} in invocations. "
                      f"Its EMF metrics are {emf} custom metrics, ${emf_usd:.2f} a month."]
    idle = m.idle_minute
    if not idle.requests:
        return "\n".join(lines)
    monthly = idle.dynamodb_usd * MINUTES_PER_MONTH
    lines += ["", f"**Idle, polling** (no `WAKEUP_QUEUE_URL`), the sweeper costs **${monthly:.2f} a month** "
                  f"in DynamoDB: {sum(idle.requests.values()):.0f} requests a minute ({_requests(idle, 0)}), "
                  f"{idle.wru:.1f} WRU and {idle.rru:.1f} RRU, at one sweep a second "
                  f"(`SWEEP_INTERVAL_S=1`, `SWEEP_LEASES=1`, {w.shards if w else SHARDS} shards), plus a function "
                  f"running around the clock. Its EMF metrics are {emf} custom metrics, ${emf_usd:.2f} a month."]
    return "\n".join(lines)


_BLOCK = re.compile(r"(<!-- costs:begin -->\n)(?:.*?\n)?(<!-- costs:end -->)", re.S)


def readme_table() -> str:
    """The table as the README has it."""
    found = _BLOCK.search(README.read_text())
    if not found:
        raise SystemExit("README.md has no <!-- costs:begin --> ... <!-- costs:end --> block")
    return README.read_text()[found.end(1):found.start(2)].rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    p = argparse.ArgumentParser(prog="costs.py", description=__doc__.splitlines()[0])
    p.add_argument("--update-readme", action="store_true", help="rewrite the table in README.md")
    p.add_argument("--idle-seconds", type=int, default=60, help="run the idle sweeper this long (0: skip)")
    p.add_argument("--fires", type=int, default=FIRES, help="timers per measured sweep (0: skip the fires)")
    p.add_argument("--shards", type=int, default=SHARDS, help="due-index shards (DUE_SHARDS)")
    p.add_argument("--fallback-minutes", type=int, default=FALLBACK_MINUTES,
                   help="the fallback's period with wake-ups (FALLBACK_MINUTES)")
    args = p.parse_args(argv)
    if args.update_readme and (args.idle_seconds != 60 or args.fires != FIRES or args.shards != SHARDS
                               or args.fallback_minutes != FALLBACK_MINUTES):
        p.error("--update-readme measures the template's settings: leave the other options alone")
    if args.shards < 1 or args.fallback_minutes < 1:
        p.error("--shards and --fallback-minutes must be at least 1")
    table = render(measure(args.idle_seconds, args.fires, shards=args.shards,
                           fallback_minutes=args.fallback_minutes))
    print(table)
    if args.update_readme:
        readme_table()
        README.write_text(_BLOCK.sub(lambda mo: mo.group(1) + table + "\n" + mo.group(2), README.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
