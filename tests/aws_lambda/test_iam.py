"""Each function's IAM policy in template.yaml allows every DynamoDB request its handler
makes. moto checks no IAM, so a missing action passes every other test and fails only
once deployed (AccessDenied). Here each handler runs on moto with botocore hooks recording
what it sends and to which resource (the table, or an index for a ``Query``), and every
request must be allowed by the SAM-transformed template's statements for that function.
``TransactWriteItems`` is authorised per item (``PutItem``, ``UpdateItem``, ...), as IAM does.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any

import pytest

from .harness import LambdaContext
from .test_template import TEMPLATE, _actions, _statements, sam_transform
from .test_wakeups import RecordingSQS, sqs_event

from samtranslator.yaml_helper import yaml_parse  # after .test_template, which skips without it

TABLE_ARN = {"Fn::GetAtt": ["Table", "Arn"]}
_ITEM_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem"}


@pytest.fixture(scope="module")
def transformed() -> dict[str, Any]:
    mp = pytest.MonkeyPatch()
    mp.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    try:
        return sam_transform(yaml_parse(TEMPLATE.read_text()))
    finally:
        mp.undo()


def _resource_of(index: str | None) -> Any:
    return TABLE_ARN if index is None else {"Fn::Sub": f"${{Table.Arn}}/index/{index}"}


@contextmanager
def _requests(client: Any):
    """``(IAM action, resource)`` of every DynamoDB request the client sends in the block."""
    seen: set[tuple[str, str]] = set()

    def record(params: dict[str, Any], model: Any, **kwargs: Any) -> None:
        if model.name == "TransactWriteItems":
            for item in params["TransactItems"]:
                (kind, _), = item.items()
                seen.add((f"dynamodb:{_ITEM_ACTIONS[kind]}", json.dumps(TABLE_ARN)))
        elif model.name == "TransactGetItems":
            seen.add(("dynamodb:GetItem", json.dumps(TABLE_ARN)))
        else:
            seen.add((f"dynamodb:{model.name}", json.dumps(_resource_of(params.get("IndexName")))))
    client.meta.events.register("before-parameter-build.dynamodb", record)
    try:
        yield seen
    finally:
        client.meta.events.unregister("before-parameter-build.dynamodb", record)


def _allowed(transformed: dict[str, Any], function: str) -> set[tuple[str, str]]:
    out = set()
    for st in _statements(transformed, function):
        if st.get("Effect", "Allow") != "Allow":
            continue
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        for action in _actions(st):
            out |= {(action, json.dumps(r)) for r in resources}
    return out


def _missing(transformed: dict[str, Any], function: str, used: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return used - _allowed(transformed, function)


def test_the_wake_and_events_functions_may_send_what_wake_ups_need(lam, monkeypatch, transformed):
    """Three timers armed through the API, each with its wake-up, then fired by one batch
    of wake-ups (ObservedHost fires row by row, so no BatchGetItem here; a plain Host's
    group commit would need it, and WakeFunction would have to be granted it)."""
    monkeypatch.setenv("WAKEUP_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/wakeups")
    queue = RecordingSQS(lam.clock)
    lam.host = lam.app.build_host(client=lam.client, clock=lam.clock, sqs_client=queue)
    lam.app.configure(lam.host)
    import wake
    for i in range(3):
        lam.call("POST", f"/instances/w{i}", {"chart": "order", "data": {"payment_timeout": "10s"}})
    with _requests(lam.client) as used:   # the arming commits happen in EventsFunction
        for i in range(3):
            lam.call("POST", f"/instances/w{i}/events", {"event": "StartPayment"})
    assert not _missing(transformed, "EventsFunction", used)
    lam.clock.advance(10_000)
    bodies = queue.due()
    with _requests(lam.client) as used:
        assert wake.handle(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    assert ("dynamodb:GetItem", json.dumps(TABLE_ARN)) in used
    assert all(lam.call("GET", f"/instances/w{i}")[1]["configuration"] == ["Overdue"] for i in range(3))
    assert not _missing(transformed, "WakeFunction", used)


def test_the_http_sqs_and_fallback_functions_may_send_what_they_do(lam, transformed):
    with _requests(lam.client) as used:
        lam.call("POST", "/instances/h", {"chart": "order", "data": {"payment_timeout": "1m"}})
        lam.call("POST", "/instances/h/events", {"event": "StartPayment"}, headers={"idempotency-key": "k"})
        lam.call("POST", "/instances/h/events", {"event": "StartPayment"}, headers={"idempotency-key": "k"})
        lam.call("GET", "/instances/h")
    assert not _missing(transformed, "EventsFunction", used)
    lam.call("POST", "/instances/s", {"chart": "order"})
    record = {"messageId": "m-1", "receiptHandle": "r", "eventSource": "aws:sqs", "messageAttributes": {},
              "body": json.dumps({"instance_id": "s", "event": "StartPayment"})}
    with _requests(lam.client) as used:
        assert lam.sqs_events.handle({"Records": [record]}, LambdaContext(30_000)) == {"batchItemFailures": []}
    assert not _missing(transformed, "SqsEventsFunction", used)
    lam.clock.advance(60_000)
    with _requests(lam.client) as used:
        assert lam.sweep(60_000, 1_000)["fired"] == 1
    assert used and not _missing(transformed, "SweeperFunction", used)
