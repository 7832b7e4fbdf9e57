"""The HTTP handler's ``Idempotency-Key`` header, on moto (in-process ``mock_aws``).

A retried POST with the same key applies nothing and answers as the first one did; the
same key with another body is a 422. DynamoDB requests are counted with botocore hooks:
a keyed event costs what an unkeyed one does (GetItem + PutItem), a repeat one GetItem.
"""

from __future__ import annotations

import json

import pytest

from .harness import LambdaContext, count_requests, http_event


def post(lam, path, body, key=None, **kw):
    headers = {"Idempotency-Key": key} if key is not None else {}
    resp = lam.handler.handle(http_event("POST", path, body, headers=headers, **kw), LambdaContext())
    return resp["statusCode"], json.loads(resp["body"]), resp["headers"]


def test_a_repeated_event_applies_nothing_and_answers_as_the_first(lam):
    post(lam, "/instances/o-1", {"chart": "order", "data": {"amount": 10}})
    with count_requests(lam.client) as first_calls:
        first = post(lam, "/instances/o-1/events", {"event": "StartPayment", "data": {"card": "4242"}}, "pay-1")
    with count_requests(lam.client) as repeat_calls:
        repeat = post(lam, "/instances/o-1/events", {"event": "StartPayment", "data": {"card": "4242"}}, "pay-1")
    assert first[0] == repeat[0] == 200 and first[1] == repeat[1]
    assert first[1]["configuration"] == ["Started"]
    assert "idempotent-replayed" not in first[2] and repeat[2]["idempotent-replayed"] == "true"
    assert first_calls == ["GetItem", "TransactWriteItems"]     # it armed the PaymentTimeout
    assert repeat_calls == ["GetItem"]                          # nothing written
    assert [r.ordinal for r in lam.host.pending_timers("o-1")] == [1]   # one timer, not two


def test_a_keyed_event_costs_what_an_unkeyed_one_does(lam):
    post(lam, "/instances/o-2", {"chart": "order"})
    with count_requests(lam.client) as calls:
        assert post(lam, "/instances/o-2/events", {"event": "Cancel"}, "cancel-1")[0] == 200
    assert calls == ["GetItem", "PutItem"]


def test_the_same_key_with_another_body_is_a_422_and_writes_nothing(lam):
    post(lam, "/instances/o-3", {"chart": "order"})
    post(lam, "/instances/o-3/events", {"event": "StartPayment", "data": {"card": "4242"}}, "pay-1")
    version = lam.host.store.load("o-3").version
    with count_requests(lam.client) as calls:
        status, body, _ = post(lam, "/instances/o-3/events", {"event": "StartPayment", "data": {"card": "1111"}},
                               "pay-1")
    assert status == 422 and body["type"] == "IdempotencyKeyReused"
    assert "'pay-1' was already used on instance 'o-3' with a different event or data" in body["error"]
    assert calls == ["GetItem"] and lam.host.store.load("o-3").version == version
    assert post(lam, "/instances/o-3/events", {"event": "Cancel"}, "pay-1")[0] == 422


def test_a_repeated_start_answers_201_again_and_a_reused_key_for_another_start_is_422(lam):
    body = {"chart": "order", "data": {"amount": 5}}
    first = post(lam, "/instances/o-4", body, "create-o-4")
    repeat = post(lam, "/instances/o-4", body, "create-o-4")
    assert first[0] == repeat[0] == 201 and first[1] == repeat[1]
    assert repeat[2]["idempotent-replayed"] == "true"
    assert post(lam, "/instances/o-4", body)[0] == 409                           # no key: it exists
    assert post(lam, "/instances/o-4", {"chart": "order", "data": {"amount": 6}}, "create-o-4")[0] == 422


def test_a_repeat_of_the_event_that_finished_the_instance_is_200_not_410(lam):
    post(lam, "/instances/o-5", {"chart": "order"})
    assert post(lam, "/instances/o-5/events", {"event": "Cancel"}, "end")[0] == 200
    status, body, headers = post(lam, "/instances/o-5/events", {"event": "Cancel"}, "end")
    assert (status, body["status"], headers["idempotent-replayed"]) == (200, "done", "true")
    assert post(lam, "/instances/o-5/events", {"event": "Cancel"}, "another")[0] == 410


def test_the_quoted_form_names_the_same_key(lam):
    post(lam, "/instances/o-6", {"chart": "order"})
    post(lam, "/instances/o-6/events", {"event": "StartPayment"}, '"k-1"')
    assert post(lam, "/instances/o-6/events", {"event": "StartPayment"}, "k-1")[2]["idempotent-replayed"] == "true"


@pytest.mark.parametrize("key", ["", "   ", '""', "x" * 257, "caf\u00e9", "a\tb"])
def test_a_malformed_key_is_a_400_before_any_request(lam, key):
    post(lam, "/instances/o-7", {"chart": "order"})
    with count_requests(lam.client) as calls:
        status, body, _ = post(lam, "/instances/o-7/events", {"event": "StartPayment"}, key)
    assert status == 400 and "Idempotency-Key" in body["error"] and calls == []
