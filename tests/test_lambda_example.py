"""examples/lambda on moto (in-process ``mock_aws``): the handlers as API Gateway calls them.

Proves the order story end to end through ``handler.handle`` and ``sweeper.handle`` with
realistic HTTP API v2 payloads, the timer firing after a ``ManualClock`` is advanced,
cancel (Complete before the timeout), delete, a too-large item, an unknown instance,
and the DynamoDB request count per external event (one GetItem + one write), counted
with botocore hooks on the client, for the handler as a whole.
"""

from __future__ import annotations

import json

import pytest

from aws_lambda.harness import TABLE, count_requests, lambda_env


@pytest.fixture()
def lam(monkeypatch):
    yield from lambda_env(monkeypatch)


def _call(lam, method, path, body=None, **kw):
    return lam.call(method, path, body, **kw)


def test_order_story_times_out_through_the_sweeper(lam):
    status, body = _call(lam, "POST", "/instances/order-1",
                         {"chart": "order", "data": {"amount": 25, "payment_timeout": "30s"}})
    assert status == 201 and body["configuration"] == ["Pending"] and body["datamodel"]["amount"] == 25
    assert body["revision"] == "v3" and body["timeouts"] == []
    status, body = _call(lam, "POST", "/instances/order-1/events", {"event": "StartPayment", "data": {"card": "4242"}})
    assert status == 200 and body["configuration"] == ["Started"]
    assert body["timeouts"] == [{"name": "PaymentTimeout", "state": "Started", "ordinal": 1}]
    status, body = _call(lam, "GET", "/instances/order-1")
    assert [t["name"] for t in body["timers"]] == ["PaymentTimeout"]
    assert body["timers"][0]["due_at_ms"] == lam.clock.now_ms() + 30_000

    # Not due yet: a sweep fires nothing.
    report = lam.sweep(10_000, 2_000)
    assert report["fired"] == 0
    assert _call(lam, "GET", "/instances/order-1")[1]["configuration"] == ["Started"]

    lam.clock.advance(30_000)
    report = lam.sweep(10_000, 2_000)
    assert report["fired"] == 1 and report["failed"] == 0
    status, body = _call(lam, "GET", "/instances/order-1")
    assert status == 200 and body["configuration"] == ["Overdue"]  # v2: a grace period first
    assert [t["name"] for t in body["timers"]] == ["GraceExpired"]

    lam.clock.advance(24 * 3600_000)
    assert lam.sweep(10_000, 2_000)["fired"] == 1
    status, body = _call(lam, "GET", "/instances/order-1")
    assert status == 200 and body["configuration"] == ["Cancelled"] and body["status"] == "done"
    assert body["timers"] == []


def test_complete_in_time_cancels_the_timer(lam):
    _call(lam, "POST", "/instances/order-2", {"chart": "order", "data": {"payment_timeout": "30s"}})
    _call(lam, "POST", "/instances/order-2/events", {"event": "StartPayment"})
    status, body = _call(lam, "POST", "/instances/order-2/events", {"event": "Complete"})
    assert status == 200 and body["configuration"] == ["Done"] and body["timeouts"] == []
    assert _call(lam, "GET", "/instances/order-2")[1]["timers"] == []
    lam.clock.advance(60_000)
    report = lam.sweep(8_000, 2_000)
    assert report["fired"] == 0 and report["discarded"] == 0


def test_basic_http_form_post_is_an_event(lam):
    _call(lam, "POST", "/instances/order-3", {"chart": "order"})
    status, body = _call(lam, "POST", "/instances/order-3/events",
                         content_type="application/x-www-form-urlencoded",
                         raw_body="_scxmleventname=StartPayment&card=4242")
    assert status == 200 and body["configuration"] == ["Started"] and body["datamodel"]["card"] == "redacted"
    assert lam.host.get("order-3").datamodel["card"] == "4242"          # the chart has it; the API never echoes it


def test_no_answer_echoes_the_card(lam):
    card = "4111 1111 1111 1234"
    answers = [_call(lam, "POST", "/instances/order-4", {"chart": "order", "data": {"amount": 5}}),
               _call(lam, "POST", "/instances/order-4/events", {"event": "StartPayment", "data": {"card": card}}),
               _call(lam, "GET", "/instances/order-4")]
    assert [status for status, _ in answers] == [201, 200, 200]
    assert answers[0][1]["datamodel"]["card"] is None                    # nothing to hide yet
    for _status, body in answers[1:]:
        assert body["datamodel"]["card"] == "redacted" and body["datamodel"]["amount"] == 5
        assert "1234" not in json.dumps(body) and "4111" not in json.dumps(body)
    assert lam.host.get("order-4").datamodel["card"] == card


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
    # what is left is the tombstone (ADR 0028): no data, no rows
    assert [(i["sk"]["S"], i["status"]["S"]) for i in items] == [("P", "deleted")]
    assert _call(lam, "GET", "/instances/d")[0] == 404
    lam.clock.advance(10_000)
    assert lam.sweep(6_000, 2_000)["fired"] == 0
    # and the id takes a new order, numbered on from the old one
    assert _call(lam, "POST", "/instances/d", {"chart": "order", "data": {"payment_timeout": "5s"}})[0] == 201
    assert _call(lam, "GET", "/instances/d")[0] == 200


def test_an_event_through_the_http_handler_costs_one_getitem_and_one_write(lam):
    """The cost claim, for the handler as a whole: it answers from the committed position."""
    _call(lam, "POST", "/instances/c", {"chart": "order", "data": {"payment_timeout": "1h"}})
    with count_requests(lam.client) as calls:
        status, body = _call(lam, "POST", "/instances/c/events", {"event": "StartPayment"})  # arms the timeout
    assert status == 200 and body["timeouts"][0]["name"] == "PaymentTimeout"
    assert calls == ["GetItem", "TransactWriteItems"]


def test_an_event_that_sends_the_confirmation_adds_one_acknowledgement(lam):
    """v3's Complete cancels the timeout and sends the order confirmation: the outbox row
    rides in the same TransactWriteItems, and after SQS took the message one UpdateItem
    marks the row delivered (tests/aws_lambda/test_confirmation.py has the rest)."""
    _call(lam, "POST", "/instances/c", {"chart": "order", "data": {"payment_timeout": "1h"}})
    _call(lam, "POST", "/instances/c/events", {"event": "StartPayment"})
    with count_requests(lam.client) as calls:
        status, body = _call(lam, "POST", "/instances/c/events", {"event": "Complete"})  # cancels it
    assert status == 200 and body["configuration"] == ["Done"] and body["timeouts"] == []
    assert calls == ["GetItem", "TransactWriteItems", "UpdateItem"]


def test_a_start_costs_one_getitem_and_one_write_too(lam):
    with count_requests(lam.client) as calls:
        status, _ = _call(lam, "POST", "/instances/s", {"chart": "order"})
    assert status == 201 and calls == ["GetItem", "PutItem"]


def test_position_only_commit_is_one_conditional_putitem(lam):
    """A commit with no timer changes uses the cheaper conditional PutItem, still one write."""
    _call(lam, "POST", "/instances/p", {"chart": "order"})
    with count_requests(lam.client) as calls:
        status, body = _call(lam, "POST", "/instances/p/events", {"event": "Cancel"})
    assert status == 200 and body["status"] == "done"
    assert calls == ["GetItem", "PutItem"]


def test_sweeper_with_shard_leases_fires_and_gives_the_leases_back(lam, monkeypatch):
    """SWEEP_LEASES=1: the invocation takes the shards under leases, fires, and releases them."""
    monkeypatch.setenv("SWEEP_LEASES", "1")
    for i in range(6):
        _call(lam, "POST", f"/instances/l{i}", {"chart": "order", "data": {"payment_timeout": "10s"}})
        _call(lam, "POST", f"/instances/l{i}/events", {"event": "StartPayment"})
    lam.clock.advance(10_000)
    report = lam.sweep(12_000, 2_000)
    assert report["fired"] == 6 and report["shards"] == lam.host.store.shards  # alone: every shard
    leases = lam.client.scan(TableName=TABLE, FilterExpression="begins_with(pk, :p)",
                             ExpressionAttributeValues={":p": {"S": "lease#"}})["Items"]
    assert leases == []                       # released on the way out
    assert lam.host.store.owned_shards is None
    assert all(_call(lam, "GET", f"/instances/l{i}")[1]["configuration"] == ["Overdue"] for i in range(6))
