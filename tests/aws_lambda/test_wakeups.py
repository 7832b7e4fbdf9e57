"""The example wired for wake-ups (WAKEUP_QUEUE_URL, as the template sets it): the HTTP
handler sends a delayed SQS message per timer it arms, wake.py fires the timer when the
message arrives, and the scheduled sweeper becomes a one-pass fallback that arms wake-ups
for timers coming within the queue's 15-minute reach.

moto's SQS delays run on the wall clock, so SQS is played by a recording client on the
manual clock (the API itself is checked against moto in tests/dynamo/test_dynamo_wakeups.py).
"""

from __future__ import annotations

import importlib
import json

import pytest

from .harness import LambdaContext, count_requests


class RecordingSQS:
    """SendMessageBatch (wake-ups), kept with the manual clock's time each message becomes
    visible; SendMessage (the order confirmations of the outbox) just kept."""

    def __init__(self, clock):
        self.clock, self.messages, self.sent = clock, [], []

    def send_message(self, **kwargs):
        self.sent.append(kwargs)
        return {"MessageId": f"m-{len(self.sent)}"}

    def send_message_batch(self, QueueUrl, Entries):
        for e in Entries:
            self.messages.append((self.clock.now_ms() + e["DelaySeconds"] * 1000, e["DelaySeconds"], e["MessageBody"]))
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}

    def due(self):
        """Remove and return the bodies visible now."""
        now = self.clock.now_ms()
        out = [b for t, _, b in self.messages if t <= now]
        self.messages = [m for m in self.messages if m[0] > now]
        return out


@pytest.fixture()
def woken(lam, monkeypatch):
    monkeypatch.setenv("WAKEUP_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/wakeups")
    sqs = RecordingSQS(lam.clock)
    lam.host = lam.app.build_host(client=lam.client, clock=lam.clock, sqs_client=sqs)
    lam.app.configure(lam.host)
    lam.wake = importlib.import_module("wake")
    return lam, sqs


def sqs_event(bodies):
    return {"Records": [{"messageId": f"m{i}", "body": b, "eventSource": "aws:sqs"} for i, b in enumerate(bodies)]}


def test_an_armed_timer_sends_one_delayed_message_and_costs_no_extra_dynamodb_request(woken):
    lam, sqs = woken
    lam.call("POST", "/instances/o", {"chart": "order", "data": {"payment_timeout": "10s"}})
    with count_requests(lam.client) as calls:
        status, _ = lam.call("POST", "/instances/o/events", {"event": "StartPayment"})
    assert status == 200 and calls == ["GetItem", "TransactWriteItems"]
    [(visible, delay, body)] = sqs.messages
    assert visible == lam.clock.now_ms() + 10_000
    assert delay == 10 and json.loads(body)["rows"][0][:2] == ["o", 1]


def test_the_wake_function_fires_the_timer_when_its_message_arrives(woken):
    """Delivered at sent + DelaySeconds: the payment is overdue with no sweeper running."""
    lam, sqs = woken
    lam.call("POST", "/instances/o", {"chart": "order", "data": {"payment_timeout": "10s"}})
    lam.call("POST", "/instances/o/events", {"event": "StartPayment"})
    lam.clock.advance(9_999)
    assert sqs.due() == []
    lam.clock.advance(1)
    with count_requests(lam.client) as calls:
        assert lam.wake.handle(sqs_event(sqs.due()), LambdaContext()) == {"batchItemFailures": []}
    assert "Query" not in calls and "Scan" not in calls
    assert lam.call("GET", "/instances/o")[1]["configuration"] == ["Overdue"]


def test_a_duplicate_or_stale_wakeup_is_one_empty_read(woken):
    lam, sqs = woken
    lam.call("POST", "/instances/o", {"chart": "order", "data": {"payment_timeout": "10s"}})
    lam.call("POST", "/instances/o/events", {"event": "StartPayment"})
    lam.call("POST", "/instances/o/events", {"event": "Complete"})   # cancels the timer
    lam.clock.advance(10_000)
    with count_requests(lam.client) as calls:
        assert lam.wake.handle(sqs_event(sqs.due()), LambdaContext()) == {"batchItemFailures": []}
    assert calls == ["GetItem"]
    assert lam.call("GET", "/instances/o")[1]["configuration"] == ["Done"]


def test_the_scheduled_sweeper_is_a_one_pass_fallback_that_arms_long_timers(woken, monkeypatch):
    """A timer two hours out has no message; the fallback run whose look-ahead it enters
    sends one, and fires what was due and missed (here a message lost in transit)."""
    lam, sqs = woken
    monkeypatch.setenv("FALLBACK_MINUTES", "5")
    lam.call("POST", "/instances/long", {"chart": "order", "data": {"payment_timeout": "2h"}})
    lam.call("POST", "/instances/long/events", {"event": "StartPayment"})
    lam.call("POST", "/instances/lost", {"chart": "order", "data": {"payment_timeout": "30s"}})
    lam.call("POST", "/instances/lost/events", {"event": "StartPayment"})
    assert [json.loads(b)["rows"][0][0] for _, _, b in sqs.messages] == ["lost"]
    sqs.messages.clear()   # lost in transit
    lam.clock.advance(60_000)
    report = lam.sweep(60_000, 1)
    assert (report["fired"], report["armed"], report["sweeps"]) == (1, 0, 1)
    assert lam.call("GET", "/instances/lost")[1]["configuration"] == ["Overdue"]
    armed_at = None
    for _ in range(30):   # every 5 minutes, until the two-hour timer is armed
        lam.clock.advance(300_000)
        if lam.sweep(60_000, 1)["armed"]:
            armed_at = lam.clock.now_ms()
            break
    assert armed_at is not None and len(sqs.messages) == 1
    visible, delay, _ = sqs.messages[0]
    assert 600 <= delay <= 900   # armed 10 to 15 minutes ahead
    lam.clock.set(visible)
    lam.wake.handle(sqs_event(sqs.due()), LambdaContext())
    assert lam.call("GET", "/instances/long")[1]["configuration"] == ["Overdue"]
