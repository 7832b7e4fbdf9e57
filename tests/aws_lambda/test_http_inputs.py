"""The HTTP handler's edges: strict JSON in and out, no AWS error text in a response,
instance ids checked at the door, and completed timer rows that expire."""

from __future__ import annotations

import json
import time

import pytest
from botocore.exceptions import ClientError

from .harness import TABLE, LambdaContext, count_requests, http_event, log_lines

SECRET = "arn:aws:sts::123456789012:assumed-role/statebound-prod-EventsRole-Q1W2E3/fn"


def _position(lam, iid: str):
    return lam.client.get_item(TableName=TABLE, Key={"pk": {"S": iid}, "sk": {"S": "P"}},
                               ConsistentRead=True).get("Item")


@pytest.mark.parametrize("raw", ['{"chart": "order", "data": {"amount": NaN}}',
                                 '{"chart": "order", "data": {"amount": Infinity}}',
                                 '{"chart": "order", "data": {"amount": -1e999}}'])
def test_nan_and_infinity_in_a_body_are_400_and_nothing_is_written(lam, raw):
    status, payload = lam.call("POST", "/instances/n", raw_body=raw)
    assert status == 400 and "strict JSON" in payload["error"]
    assert _position(lam, "n") is None


@pytest.mark.parametrize("key", [None, "start-1"])
def test_data_nested_too_deeply_is_400_before_anything_is_written(lam, key):
    """600 levels: the parser took it, the instance was written, and then writing the
    answer (or fingerprinting the key) ran out of stack: a 500, a 409 on the retry, and an
    instance whose every later answer was a 500."""
    deep: object = 1
    for _ in range(600):
        deep = [deep]
    headers = {"Idempotency-Key": key} if key else {}
    status, payload = lam.call("POST", "/instances/deep", {"chart": "order", "data": {"amount": 1, "x": deep}},
                               headers=headers)
    assert status == 400 and "nest" in payload["error"]
    assert _position(lam, "deep") is None


def test_nan_in_an_event_body_is_400_and_the_instance_is_unchanged(lam):
    lam.call("POST", "/instances/n", {"chart": "order"})
    before = _position(lam, "n")
    status, _ = lam.call("POST", "/instances/n/events", raw_body='{"event": "StartPayment", "data": {"card": NaN}}')
    assert status == 400 and _position(lam, "n") == before


def test_every_response_body_is_strict_json(lam):
    lam.call("POST", "/instances/f", {"chart": "order", "data": {"amount": 1e308}})
    resp = lam.handler.handle(http_event("GET", "/instances/f"), LambdaContext())

    def refuse(name):
        raise AssertionError(name)
    assert json.loads(resp["body"], parse_constant=refuse)["datamodel"]["amount"] == 1e308


def _fail_with(lam, operation: str, code: str, message: str):
    def raise_error(**kwargs):
        raise ClientError({"Error": {"Code": code, "Message": message}}, operation)
    lam.client.meta.events.register(f"before-call.dynamodb.{operation}", raise_error)
    return raise_error


@pytest.mark.parametrize("code,status", [("AccessDeniedException", 500), ("ResourceNotFoundException", 503),
                                         ("ProvisionedThroughputExceededException", 503)])
def test_aws_error_text_stays_in_the_log(lam, capsys, code, status):
    lam.call("POST", "/instances/a", {"chart": "order"})
    lam.host.store._retry_base_s = 0   # no real backoff sleeps in a test
    hook = _fail_with(lam, "GetItem", code, f"User: {SECRET} is not authorized to perform: dynamodb:GetItem")
    capsys.readouterr()
    try:
        resp = lam.handler.handle(http_event("POST", "/instances/a/events", {"event": "StartPayment"},
                                             headers={"x-correlation-id": "trace-9"}), LambdaContext())
    finally:
        lam.client.meta.events.unregister("before-call.dynamodb.GetItem", hook)
    assert resp["statusCode"] == status
    body = json.loads(resp["body"])
    assert SECRET not in resp["body"] and "arn:" not in resp["body"] and code not in resp["body"]
    assert body["request_id"] == "trace-9" and body["error"]
    logged = [d for d in log_lines(capsys.readouterr().out) if d.get("message") == "request failed"]
    assert len(logged) == 1 and logged[0]["correlation_id"] == "trace-9" and logged[0]["level"] == "ERROR"
    assert SECRET in logged[0]["exception"] and logged[0]["function_request_id"] == "lambda-req-1"


def test_a_conflict_reported_by_aws_is_generic_too(lam):
    lam.call("POST", "/instances/c", {"chart": "order"})
    hook = _fail_with(lam, "PutItem", "ConditionalCheckFailedException", f"The conditional request failed ({SECRET})")
    lam.host.max_conflict_retries = 2
    try:
        status, body = lam.call("POST", "/instances/c/events", {"event": "Cancel"})
    finally:
        lam.client.meta.events.unregister("before-call.dynamodb.PutItem", hook)
    assert status == 409 and "arn:" not in json.dumps(body) and body["request_id"] == "req-1"


@pytest.mark.parametrize("iid,ok", [
    ("lease#members", True), ("sweep#3", True), ("a#b", True), ("订单-1", True), ("é" * 500, True),
    ("x" * 512, True), ("x" * 513, False), ("é" * 501, False), ("x" * 1001, False), ("a::b", False),
    ("bad\nid", False), ("tab\tid", False), ("\x1f", False), ("\ud800", False), ("\x85", False),
])
def test_instance_ids_are_checked_at_the_door(lam, iid, ok):
    with count_requests(lam.client) as calls:
        status, body = lam.call("POST", "/instances/x", {"chart": "order"}, instance_id=iid)
    if ok:
        assert status == 201 and body["id"] == iid
        assert lam.call("GET", "/instances/x", instance_id=iid)[1]["id"] == iid
    else:
        assert status == 400 and body["error"] and calls == []   # refused before any request


def test_a_start_with_an_invalid_delay_logs_it_and_answers_200(lam, capsys):
    """The issue's "soon": no timer, and the log says why (with the request's ids)."""
    lam.call("POST", "/instances/s", {"chart": "order", "data": {"payment_timeout": "soon"}})
    capsys.readouterr()
    status, body = lam.call("POST", "/instances/s/events", {"event": "StartPayment"}, headers={"x-correlation-id": "c-1"})
    assert status == 200 and body["timeouts"] == []
    (warning,) = [d for d in log_lines(capsys.readouterr().out) if d.get("level") == "WARNING"]
    assert warning["message"] == "chart raised error.execution" and warning["correlation_id"] == "c-1"
    assert warning["instance_id"] == "s" and "'soon'" in warning["log_value"]


def test_completed_timer_rows_expire_through_ttl(lam, monkeypatch):
    """DONE_TTL_S (the template sets it) reaches the store; fired rows get expires_at,
    the attribute the template's TimeToLiveSpecification names."""
    monkeypatch.setenv("DONE_TTL_S", "3600")
    lam.rebuild()
    lam.call("POST", "/instances/t", {"chart": "order", "data": {"payment_timeout": "1s"}})
    lam.call("POST", "/instances/t/events", {"event": "StartPayment"})
    lam.clock.advance(1_000)
    assert lam.sweep(8_000, 2_000)["fired"] == 1
    rows = lam.client.query(TableName=TABLE, KeyConditionExpression="pk = :p AND begins_with(sk, :t)",
                            ExpressionAttributeValues={":p": {"S": "t"}, ":t": {"S": "T#"}},
                            ConsistentRead=True)["Items"]
    done = [r for r in rows if r["state"]["S"] == "done"]
    assert len(done) == 1
    expires = int(done[0]["expires_at"]["N"])
    assert abs(expires - (time.time() + 3600)) < 120   # DynamoDB TTL is wall-clock epoch seconds
    ttl = lam.client.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at"


def test_without_done_ttl_completed_rows_are_kept(lam):
    lam.call("POST", "/instances/k", {"chart": "order", "data": {"payment_timeout": "1s"}})
    lam.call("POST", "/instances/k/events", {"event": "StartPayment"})
    lam.clock.advance(1_000)
    lam.sweep(8_000, 2_000)
    rows = lam.client.query(TableName=TABLE, KeyConditionExpression="pk = :p AND begins_with(sk, :t)",
                            ExpressionAttributeValues={":p": {"S": "k"}, ":t": {"S": "T#"}},
                            ConsistentRead=True)["Items"]
    done = [r for r in rows if r["state"]["S"] == "done"]
    assert len(done) == 1 and "expires_at" not in done[0]
