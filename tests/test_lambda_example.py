"""examples/lambda on moto (in-process ``mock_aws``): the handlers as API Gateway calls them.

Proves the order story end to end through ``handler.handle`` and ``sweeper.handle`` with
realistic HTTP API v2 payloads, the timer firing after a ``ManualClock`` is advanced,
cancel (Complete before the timeout), delete, a too-large item, an unknown instance,
and the DynamoDB call count per external event (one GetItem + one TransactWriteItems).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

LAMBDA_DIR = Path(__file__).resolve().parents[1] / "examples" / "lambda"
TABLE = "statebound-example"


def _http(method: str, path: str, body: object = None, *, content_type: str = "application/json",
          raw_body: str | None = None) -> dict:
    """A minimal but faithful API Gateway HTTP API (payload 2.0) event."""
    parts = [p for p in path.split("/") if p]
    route = "/instances/{id}" + ("/events" if len(parts) == 3 else "")
    return {
        "version": "2.0",
        "routeKey": f"{method} {route}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": content_type, "host": "abc123.execute-api.eu-west-1.amazonaws.com",
                    "user-agent": "curl/8.5.0"},
        "requestContext": {
            "accountId": "123456789012", "apiId": "abc123", "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1",
                     "userAgent": "curl/8.5.0"},
            "requestId": "req-1", "routeKey": f"{method} {route}", "stage": "$default",
            "time": "01/Dec/2026:07:00:00 +0000", "timeEpoch": 1796108400000,
        },
        "pathParameters": {"id": parts[1]} if len(parts) >= 2 else {},
        "body": raw_body if raw_body is not None else (None if body is None else json.dumps(body)),
        "isBase64Encoded": False,
    }


class _Context:
    """A Lambda context whose remaining time runs down by a fixed step per call."""

    aws_request_id = "sweeper-req-1"

    def __init__(self, remaining_ms: int, step_ms: int) -> None:
        self.remaining = remaining_ms
        self.step = step_ms

    def get_remaining_time_in_millis(self) -> int:
        self.remaining -= self.step
        return self.remaining


@pytest.fixture()
def lam(monkeypatch):
    """Imported handler/sweeper modules over a moto table, with a ManualClock host."""
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
        for name in ("app", "handler", "sweeper"):
            sys.modules.pop(name, None)
        app = importlib.import_module("app")
        handler = importlib.import_module("handler")
        sweeper = importlib.import_module("sweeper")
        clock = sb.ManualClock(now_ms=1_796_108_400_000)
        host = app.build_host(client=client, clock=clock)
        app.configure(host)

        class L:
            pass
        env = L()
        env.app, env.handler, env.sweeper, env.clock, env.client, env.host = app, handler, sweeper, clock, client, host
        yield env
        app.configure(None)
    for name in ("app", "handler", "sweeper"):
        sys.modules.pop(name, None)


def _call(lam, method, path, body=None, **kw):
    resp = lam.handler.handle(_http(method, path, body, **kw), None)
    return resp["statusCode"], json.loads(resp["body"])


def test_order_story_times_out_through_the_sweeper(lam):
    status, body = _call(lam, "POST", "/instances/order-1",
                         {"chart": "order", "data": {"amount": 25, "payment_timeout": "30s"}})
    assert status == 201 and body["configuration"] == ["Pending"] and body["datamodel"]["amount"] == 25
    status, body = _call(lam, "POST", "/instances/order-1/events", {"event": "StartPayment", "data": {"card": "4242"}})
    assert status == 200 and body["configuration"] == ["Started"]
    assert [t["name"] for t in body["timers"]] == ["PaymentTimeout"]
    assert body["timers"][0]["due_at_ms"] == lam.clock.now_ms() + 30_000

    # Not due yet: a sweep fires nothing.
    report = lam.sweeper.handle({"source": "aws.events"}, _Context(10_000, 2_000))
    assert report["fired"] == 0
    assert _call(lam, "GET", "/instances/order-1")[1]["configuration"] == ["Started"]

    lam.clock.advance(30_000)
    report = lam.sweeper.handle({"source": "aws.events"}, _Context(10_000, 2_000))
    assert report["fired"] == 1 and report["failed"] == 0
    status, body = _call(lam, "GET", "/instances/order-1")
    assert status == 200 and body["configuration"] == ["Cancelled"] and body["status"] == "done"
    assert body["timers"] == []


def test_complete_in_time_cancels_the_timer(lam):
    _call(lam, "POST", "/instances/order-2", {"chart": "order", "data": {"payment_timeout": "30s"}})
    _call(lam, "POST", "/instances/order-2/events", {"event": "StartPayment"})
    status, body = _call(lam, "POST", "/instances/order-2/events", {"event": "Complete"})
    assert status == 200 and body["configuration"] == ["Done"] and body["timers"] == []
    lam.clock.advance(60_000)
    report = lam.sweeper.handle({}, _Context(8_000, 2_000))
    assert report["fired"] == 0 and report["discarded"] == 0


def test_basic_http_form_post_is_an_event(lam):
    _call(lam, "POST", "/instances/order-3", {"chart": "order"})
    status, body = _call(lam, "POST", "/instances/order-3/events",
                         content_type="application/x-www-form-urlencoded",
                         raw_body="_scxmleventname=StartPayment&card=4242")
    assert status == 200 and body["configuration"] == ["Started"] and body["datamodel"]["card"] == "4242"


@pytest.mark.parametrize("method,path,body,expected", [
    ("POST", "/instances/nope/events", {"event": "StartPayment"}, 404),
    ("GET", "/instances/nope", None, 404),
    ("POST", "/instances/x", {"chart": "no-such-chart"}, 404),
    ("POST", "/instances/x", {"data": {}}, 400),
    ("POST", "/instances/x", "not an object", 400),
])
def test_error_statuses(lam, method, path, body, expected):
    status, payload = _call(lam, method, path, body)
    assert status == expected and payload["error"]


def test_exists_halted_and_bad_json(lam):
    assert _call(lam, "POST", "/instances/o", {"chart": "order"})[0] == 201
    status, payload = _call(lam, "POST", "/instances/o", {"chart": "order"})
    assert status == 409 and payload["type"] == "InstanceExists"
    _call(lam, "POST", "/instances/o/events", {"event": "Cancel"})
    status, payload = _call(lam, "POST", "/instances/o/events", {"event": "StartPayment"})
    assert status == 410 and payload["type"] == "NotRunning"
    status, payload = _call(lam, "POST", "/instances/o/events", raw_body="{not json")
    assert status == 400


def test_too_large_is_413_and_writes_nothing(lam):
    _call(lam, "POST", "/instances/big", {"chart": "order"})
    before = lam.client.get_item(TableName=TABLE, Key={"pk": {"S": "big"}, "sk": {"S": "P"}}, ConsistentRead=True)
    huge = "x" * 500_000
    status, payload = _call(lam, "POST", "/instances/big/events", {"event": "StartPayment", "data": {"card": huge}})
    assert status == 413, payload
    after = lam.client.get_item(TableName=TABLE, Key={"pk": {"S": "big"}, "sk": {"S": "P"}}, ConsistentRead=True)
    assert after["Item"] == before["Item"]
    assert _call(lam, "GET", "/instances/big")[1]["configuration"] == ["Pending"]


def test_delete_purges_position_and_timers(lam):
    _call(lam, "POST", "/instances/d", {"chart": "order", "data": {"payment_timeout": "5s"}})
    _call(lam, "POST", "/instances/d/events", {"event": "StartPayment"})
    lam.host.delete("d")
    items = lam.client.query(TableName=TABLE, KeyConditionExpression="pk = :p",
                             ExpressionAttributeValues={":p": {"S": "d"}}, ConsistentRead=True)["Items"]
    assert items == []
    assert _call(lam, "GET", "/instances/d")[0] == 404
    lam.clock.advance(10_000)
    assert lam.sweeper.handle({}, _Context(6_000, 2_000))["fired"] == 0


def test_one_getitem_and_one_transaction_per_external_event(lam):
    """The cost claim: an external event is exactly one GetItem + one TransactWriteItems."""
    _call(lam, "POST", "/instances/c", {"chart": "order", "data": {"payment_timeout": "1h"}})
    calls: list[str] = []
    client = lam.host.store.client

    def count(event_name, **kwargs):
        calls.append(event_name.split(".")[-1])

    client.meta.events.register("before-call.dynamodb", count)
    try:
        lam.host.send("c", "StartPayment")       # arms the timeout: position + timer row
        first = list(calls)
        calls.clear()
        lam.host.send("c", "Complete")           # cancels it: position + timer delete
        second = list(calls)
        calls.clear()
    finally:
        client.meta.events.unregister("before-call.dynamodb", count)
    assert first == ["GetItem", "TransactWriteItems"]
    assert second == ["GetItem", "TransactWriteItems"]


def test_position_only_commit_is_one_conditional_putitem(lam):
    """A commit with no timer changes uses the cheaper conditional PutItem, still one write."""
    _call(lam, "POST", "/instances/p", {"chart": "order"})
    calls: list[str] = []
    client = lam.host.store.client
    client.meta.events.register("before-call.dynamodb", lambda event_name, **kw: calls.append(event_name.split(".")[-1]))
    lam.host.send("p", "Cancel")
    assert calls == ["GetItem", "PutItem"]


def test_sweeper_with_shard_leases_fires_and_gives_the_leases_back(lam, monkeypatch):
    """SWEEP_LEASES=1: the invocation takes the shards under leases, fires, and releases them."""
    monkeypatch.setenv("SWEEP_LEASES", "1")
    for i in range(6):
        _call(lam, "POST", f"/instances/l{i}", {"chart": "order", "data": {"payment_timeout": "10s"}})
        _call(lam, "POST", f"/instances/l{i}/events", {"event": "StartPayment"})
    lam.clock.advance(10_000)
    report = lam.sweeper.handle({}, _Context(12_000, 2_000))
    assert report["fired"] == 6 and report["shards"] == lam.host.store.shards  # alone: every shard
    leases = lam.client.scan(TableName=TABLE, FilterExpression="begins_with(pk, :p)",
                             ExpressionAttributeValues={":p": {"S": "lease#"}})["Items"]
    assert leases == []                       # released on the way out
    assert lam.host.store.owned_shards is None
    assert all(_call(lam, "GET", f"/instances/l{i}")[1]["configuration"] == ["Cancelled"] for i in range(6))
