"""What every examples/lambda test needs: API Gateway events, a Lambda context, the
handler modules over a moto table (in-process ``mock_aws``), and a request counter.

``tests/aws_lambda/conftest.py`` turns :func:`lambda_env` into the ``lam`` fixture; a test
module elsewhere does the same in two lines.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")
pytest.importorskip("aws_lambda_powertools")

LAMBDA_DIR = Path(__file__).resolve().parents[2] / "examples" / "lambda"
TABLE = "statebound-example"
START_MS = 1_796_108_400_000
# Reloaded for every test. telemetry is not: like a Lambda environment, a process sets up
# its Powertools logger once (a second Logger for the same service would find it configured).
MODULES = ("chart_revisions", "app", "handler", "sweeper", "sqs_events", "wake", "revisions", "redrive")


def http_event(method: str, path: str, body: object = None, *, content_type: str = "application/json",
               raw_body: str | None = None, headers: dict[str, str] | None = None,
               instance_id: str | None = None, request_id: str = "req-1") -> dict[str, Any]:
    """A faithful API Gateway HTTP API (payload 2.0) event.

    ``instance_id`` is the decoded ``{id}`` path parameter, for ids a path cannot spell plainly.
    """
    parts = [p for p in path.split("/") if p]
    route = "/instances/{id}" + ("/events" if len(parts) == 3 else "")
    if instance_id is not None and len(parts) >= 2:
        try:   # the path as a client would send it: the id percent-encoded
            path = "/".join(["", parts[0], quote(instance_id, safe=""), *parts[2:]])
        except UnicodeEncodeError:
            pass   # a lone surrogate has no UTF-8 form; keep the placeholder
    return {
        "version": "2.0",
        "routeKey": f"{method} {route}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": content_type, "host": "abc123.execute-api.eu-west-1.amazonaws.com",
                    "user-agent": "curl/8.5.0", **(headers or {})},
        "requestContext": {
            "accountId": "123456789012", "apiId": "abc123", "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1",
                     "userAgent": "curl/8.5.0"},
            "requestId": request_id, "routeKey": f"{method} {route}", "stage": "$default",
            "time": "01/Dec/2026:07:00:00 +0000", "timeEpoch": START_MS,
        },
        "pathParameters": {"id": instance_id if instance_id is not None else parts[1]} if len(parts) >= 2 else {},
        "body": raw_body if raw_body is not None else (None if body is None else json.dumps(body)),
        "isBase64Encoded": False,
    }


class LambdaContext:
    """A Lambda context whose remaining time runs down by a fixed step per call."""

    function_name = "statebound-example"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:statebound-example"

    def __init__(self, remaining_ms: int = 10_000, step_ms: int = 2_000, request_id: str = "lambda-req-1") -> None:
        self.remaining = remaining_ms
        self.step = step_ms
        self.aws_request_id = request_id

    def get_remaining_time_in_millis(self) -> int:
        self.remaining -= self.step
        return self.remaining


class ClockContext:
    """A Lambda context whose deadline is ``timeout_ms`` after now on a ManualClock, so the
    time left is what the test's clock says, never the wall's."""

    function_name = "statebound-example"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:statebound-example"

    def __init__(self, clock: Any, timeout_ms: int, request_id: str = "deadline-1") -> None:
        self.clock, self.deadline = clock, clock.now_ms() + timeout_ms
        self.aws_request_id = request_id

    def get_remaining_time_in_millis(self) -> int:
        return int(self.deadline - self.clock.now_ms())


class Lam:
    """The example's modules and the moto objects behind them."""

    app: Any
    handler: Any
    sweeper: Any
    sqs_events: Any
    telemetry: Any
    clock: Any
    client: Any
    host: Any
    sqs: Any                 # an SQS client on the same moto backend
    confirmations: str       # the queue URLs the template defines
    events_queue: str
    dead_letters: str

    def call(self, method: str, path: str, body: object = None, **kw: Any) -> tuple[int, dict[str, Any]]:
        """One HTTP request through the handler: ``(status, parsed body)``."""
        resp = self.handler.handle(http_event(method, path, body, **kw), LambdaContext())
        return resp["statusCode"], json.loads(resp["body"])

    def received(self, url: str) -> list[dict[str, Any]]:
        """Every message now in a queue, as its consumer would read it (and delete it)."""
        out: list[dict[str, Any]] = []
        while batch := self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600,
                                                MessageAttributeNames=["All"]).get("Messages", []):
            for m in batch:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            out += batch
        return out

    def sweep(self, remaining_ms: int = 10_000, step_ms: int = 2_000) -> dict[str, Any]:
        """One sweeper invocation."""
        return self.sweeper.handle({"source": "aws.events"}, LambdaContext(remaining_ms, step_ms, "sweeper-req-1"))

    def rebuild(self, charts_dir: Path | str | None = None) -> Any:
        """A new deployment: a fresh Host (as after a cold start) over the same table."""
        self.host = self.app.build_host(client=self.client, clock=self.clock, charts_dir=charts_dir)
        self.app.configure(self.host)
        return self.host


def deployment(path: Path, *revisions: str) -> Path:
    """A charts/ directory as a deployment shipping only these revisions of the order chart."""
    (path / "order").mkdir(parents=True)
    for revision in revisions:
        shutil.copy2(LAMBDA_DIR / "charts" / "order" / f"{revision}.scxml", path / "order")
    return path


def _fresh_modules() -> None:
    for name in MODULES:
        sys.modules.pop(name, None)


def lambda_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lam]:
    """Imported handler/sweeper modules over a moto table, with a ManualClock host."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "POWERTOOLS_SERVICE_NAME", "DONE_TTL_S", "SWEEP_LEASES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("TABLE_NAME", TABLE)
    monkeypatch.syspath_prepend(str(LAMBDA_DIR))
    import statebound as sb
    from statebound.dynamodb import DynamoStore
    with moto.mock_aws():
        client = boto3.client("dynamodb", region_name="eu-west-1")
        DynamoStore.create_table(TABLE, client=client)
        env = Lam()
        env.sqs = boto3.client("sqs", region_name="eu-west-1")
        _queues(env, monkeypatch)
        _fresh_modules()
        env.telemetry = importlib.import_module("telemetry")
        env.app = importlib.import_module("app")
        env.handler = importlib.import_module("handler")
        env.sweeper = importlib.import_module("sweeper")
        env.sqs_events = importlib.import_module("sqs_events")
        env.clock = sb.ManualClock(now_ms=START_MS)
        env.client = client
        env.rebuild()
        yield env
        env.app.configure(None)
    _fresh_modules()


def _queues(env: Lam, monkeypatch: pytest.MonkeyPatch) -> None:
    """The template's queues: confirmations (FIFO), and the events queue with its dead letters."""
    sqs = env.sqs
    env.dead_letters = sqs.create_queue(QueueName="events-dead-letters")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=env.dead_letters, AttributeNames=["QueueArn"])
    env.events_queue = sqs.create_queue(QueueName="events", Attributes={
        "VisibilityTimeout": "180", "RedrivePolicy": json.dumps({
            "deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"], "maxReceiveCount": 5})})["QueueUrl"]
    env.confirmations = sqs.create_queue(QueueName="confirmations.fifo",
                                         Attributes={"FifoQueue": "true"})["QueueUrl"]
    monkeypatch.setenv("CONFIRMATIONS_QUEUE_URL", env.confirmations)
    monkeypatch.setenv("DEAD_LETTER_QUEUE_URL", env.dead_letters)


@contextmanager
def count_requests(client: Any) -> Iterator[list[str]]:
    """Every DynamoDB operation the client sends inside the block, in order (botocore hooks)."""
    calls: list[str] = []

    def count(event_name: str, **kwargs: Any) -> None:
        calls.append(event_name.split(".")[-1])

    client.meta.events.register("before-call.dynamodb", count)
    try:
        yield calls
    finally:
        client.meta.events.unregister("before-call.dynamodb", count)


def log_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among captured stdout lines (Powertools logs and EMF documents)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
