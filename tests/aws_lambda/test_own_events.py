"""A client cannot send the events a chart raises for itself: its timeouts, and the
platform's ``done.*`` and ``error.*``.

The order chart only lets ``Cancel`` through in ``Pending``. Before, any API client could
cancel a paid order anyway by posting the timer events the chart waits for,
``PaymentTimeout`` then ``GraceExpired``, a day and an hour early. The timers themselves
still fire as before.
"""

from __future__ import annotations

import json

import pytest

from .harness import LambdaContext, http_event


@pytest.mark.parametrize("event", ["PaymentTimeout", "GraceExpired", "done.invoke.payment", "error.execution",
                                   "done.state.Started",
                                   # SCXML takes these for the event they extend: the chart's
                                   # transition on PaymentTimeout matches PaymentTimeout.x
                                   "PaymentTimeout.x", "PaymentTimeout.", "GraceExpired.early.really",
                                   "error", "done"])
def test_posting_a_chart_s_own_event_is_403_and_changes_nothing(lam, event):
    lam.call("POST", "/instances/o", {"chart": "order"})
    lam.call("POST", "/instances/o/events", {"event": "StartPayment"})
    status, body = lam.call("POST", "/instances/o/events", {"event": event})
    assert status == 403 and event in body["error"]
    assert lam.call("GET", "/instances/o")[1]["configuration"] == ["Started"]


@pytest.mark.parametrize("event", ["PaymentTimeout", "PaymentTimeout.x"])
def test_a_form_post_cannot_name_a_timeout_either(lam, event):
    lam.call("POST", "/instances/f", {"chart": "order"})
    lam.call("POST", "/instances/f/events", {"event": "StartPayment"})
    status, _ = lam.call("POST", "/instances/f/events", raw_body=f"_scxmleventname={event}",
                         content_type="application/x-www-form-urlencoded")
    assert status == 403
    assert lam.call("GET", "/instances/f")[1]["configuration"] == ["Started"]


def test_the_timer_itself_still_fires(lam):
    lam.call("POST", "/instances/t", {"chart": "order", "data": {"payment_timeout": "1m"}})
    lam.call("POST", "/instances/t/events", {"event": "StartPayment"})
    lam.clock.advance(60_000)
    assert lam.sweep()["fired"] == 1
    assert lam.call("GET", "/instances/t")[1]["configuration"] == ["Overdue"]


@pytest.mark.parametrize("event", ["GraceExpired", "GraceExpired.early"])
def test_an_own_event_over_sqs_is_dead_lettered_with_its_reason(lam, event):
    lam.call("POST", "/instances/q", {"chart": "order"})
    lam.call("POST", "/instances/q/events", {"event": "StartPayment"})
    record = {"messageId": "m-1", "receiptHandle": "r-1", "eventSource": "aws:sqs", "messageAttributes": {},
              "body": json.dumps({"instance_id": "q", "event": event})}
    assert lam.sqs_events.handle({"Records": [record]}, LambdaContext(30_000)) == {"batchItemFailures": []}
    [dead] = lam.received(lam.dead_letters)
    assert event in dead["MessageAttributes"]["statebound.error"]["StringValue"]
    assert lam.call("GET", "/instances/q")[1]["configuration"] == ["Started"]


def test_ordinary_events_still_pass(lam):
    resp = lam.handler.handle(http_event("POST", "/instances/p", {"chart": "order"}), LambdaContext())
    assert resp["statusCode"] == 201
    for name in ("PaymentTimeoutX", "errors", "done_now", "x.PaymentTimeout"):   # not a token match
        assert lam.call("POST", "/instances/p/events", {"event": name})[0] == 200, name
    assert lam.call("POST", "/instances/p/events", {"event": "Cancel"})[0] == 200
