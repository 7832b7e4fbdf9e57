"""The order confirmation (charts/order/v3): ``<send type="sqs">`` through the host's
``processors=`` (app.py), on moto's SQS FIFO queue and DynamoDB (in-process ``mock_aws``).

The HTTP function hands the confirmation over right after the commit that completed the
order; when that fails or the function dies first, the sweeper delivers it. Either way the
queue holds one message per idempotency key. Requests are counted with botocore hooks.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from botocore.exceptions import ClientError

from .harness import LambdaContext, count_requests, http_event, log_lines


class SimulatedCrash(BaseException):
    """The function's process dies here (no ``except Exception`` can catch it)."""


def paid_order(lam, iid: str = "o-1") -> None:
    assert lam.call("POST", f"/instances/{iid}", {"chart": "order", "data": {"amount": 25}})[0] == 201
    assert lam.call("POST", f"/instances/{iid}/events", {"event": "StartPayment"})[0] == 200


def sqs_calls(lam) -> list[str]:
    calls: list[str] = []
    lam.host.processors["sqs"].client.meta.events.register(
        "before-call.sqs", lambda model, **kw: calls.append(model.name))
    return calls


def test_complete_sends_one_confirmation_right_after_its_commit(lam):
    paid_order(lam)
    sent = sqs_calls(lam)
    with count_requests(lam.client) as calls:
        status, body = lam.call("POST", "/instances/o-1/events", {"event": "Complete"},
                                headers={"x-correlation-id": "checkout-9"})
    assert status == 200 and body["configuration"] == ["Done"]
    assert calls == ["GetItem", "TransactWriteItems", "UpdateItem"] and sent == ["SendMessage"]
    [message] = lam.received(lam.confirmations)
    assert json.loads(message["Body"]) == {
        "event": "order.confirmed", "data": {"order_id": "o-1", "amount": 25},
        "metadata": {"idempotency_key": "o-1:3", "instance_id": "o-1", "send_id": "confirmation",
                     "caller_context": {"correlation_id": "checkout-9"}}}
    assert lam.host.pending_timers("o-1") == []


def test_an_sqs_outage_during_the_request_is_delivered_by_the_sweeper(lam):
    paid_order(lam)
    outage = {"on": True}

    def throttle(params, **kw):
        if outage["on"]:
            raise ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "try later"},
                               "ResponseMetadata": {"HTTPStatusCode": 503}}, "SendMessage")
    lam.host.processors["sqs"].client.meta.events.register("before-parameter-build.sqs.SendMessage", throttle)
    status, body = lam.call("POST", "/instances/o-1/events", {"event": "Complete"})
    assert status == 200 and body["status"] == "done"          # the order is done; its message is owed
    [row] = lam.host.pending_timers("o-1")
    assert (row.kind, row.attempts) == ("send", 1) and lam.received(lam.confirmations) == []
    outage["on"] = False
    lam.clock.advance(1_000)                                   # the first backoff
    report = lam.sweep()
    assert report["delivered"] == 1 and report["failed"] == 0
    assert len(lam.received(lam.confirmations)) == 1 and lam.host.pending_timers("o-1") == []


@pytest.mark.parametrize("phase", ["before", "after"])
def test_a_crash_around_the_send_and_a_client_retry_leave_one_message(lam, phase):
    """The function dies just before SQS takes the message, or just after (SQS has it, the
    row is not acknowledged). The client, given a 502 by API Gateway, retries with its
    Idempotency-Key: nothing is applied twice. Once the row's lease ends the sweeper sends
    it (again): the FIFO queue deduplicates on the key, so one message."""
    paid_order(lam)

    def crash(**kw):
        raise SimulatedCrash(phase)
    client = lam.host.processors["sqs"].client
    client.meta.events.register(f"{phase}-call.sqs.SendMessage", crash, unique_id="crash")
    with pytest.raises(SimulatedCrash):
        lam.call("POST", "/instances/o-1/events", {"event": "Complete"}, headers={"Idempotency-Key": "done-1"})
    client.meta.events.unregister(f"{phase}-call.sqs.SendMessage", unique_id="crash")

    lam.rebuild()                                              # a new execution environment
    status, body = lam.call("POST", "/instances/o-1/events", {"event": "Complete"},
                            headers={"Idempotency-Key": "done-1"})
    assert status == 200 and body["configuration"] == ["Done"]
    assert lam.sweep()["delivered"] == 0                       # still hidden by the lease of the dead call
    lam.clock.advance(30_001)
    assert lam.sweep()["delivered"] == 1
    [message] = lam.received(lam.confirmations)
    assert message["MessageAttributes"]["statebound.idempotency_key"]["StringValue"] == "o-1:3"
    assert lam.host.pending_timers("o-1") == []


def test_the_fifo_queue_gets_the_key_as_deduplication_id_and_the_instance_as_group(lam):
    paid_order(lam)
    seen: list[dict] = []
    lam.host.processors["sqs"].client.meta.events.register(
        "before-parameter-build.sqs.SendMessage", lambda params, **kw: seen.append(dict(params)))
    lam.call("POST", "/instances/o-1/events", {"event": "Complete"})
    [sent] = seen
    assert sent["MessageGroupId"] == "o-1"
    assert sent["MessageDeduplicationId"] == hashlib.sha256(b"o-1:3").hexdigest()


def test_a_confirmation_sqs_refuses_is_dead_logged_and_counted_for_the_alarm(lam, capsys):
    """The queue is gone (a deployment mistake): SQS refuses, the row is dead at once, and
    the HTTP function reports Dead in the metric OutboxDeadAlarm adds up."""
    paid_order(lam)
    lam.sqs.delete_queue(QueueUrl=lam.confirmations)
    capsys.readouterr()
    resp = lam.handler.handle(http_event("POST", "/instances/o-1/events", {"event": "Complete"}), LambdaContext())
    assert resp["statusCode"] == 200
    [dead] = lam.host.dead_timers()
    assert (dead.instance_id, dead.send_id, dead.attempts) == ("o-1", "confirmation", 1)
    out = capsys.readouterr().out
    lines = log_lines(out)
    failed = next(d for d in lines if d.get("message") == "outbox send delivery failed")
    assert failed["event"] == "order.confirmed" and failed["level"] == "WARNING"
    processed = next(d for d in lines if d.get("message") == "event processed")
    assert processed["instance_id"] == "o-1" and processed["event"] == "Complete"   # the request's keys are back
    [emf] = [d for d in lines if "_aws" in d]
    metric = emf["_aws"]["CloudWatchMetrics"][0]
    # service: the function's POWERTOOLS_SERVICE_NAME (statebound-events in the template; this
    # test process set up telemetry once, without it)
    assert metric["Namespace"] == "statebound" and metric["Dimensions"] == [["service"]]
    assert {m["Name"] for m in metric["Metrics"]} == {"Failed", "Dead"} and emf["Dead"] == [1.0]


def test_a_request_that_sends_nothing_emits_no_metric(lam, capsys):
    capsys.readouterr()
    lam.call("POST", "/instances/o-2", {"chart": "order"})
    lam.call("POST", "/instances/o-2/events", {"event": "Cancel"})
    assert not [d for d in log_lines(capsys.readouterr().out) if "_aws" in d]


def test_a_dead_confirmation_is_redriven_once_the_queue_is_back(lam, capsys):
    """The README's redrive story for the outbox: fix the cause, revive the row with
    redrive.py, and the next sweep delivers it with its original key."""
    import importlib

    paid_order(lam)
    lam.sqs.delete_queue(QueueUrl=lam.confirmations)
    lam.call("POST", "/instances/o-1/events", {"event": "Complete"})
    lam.sqs.create_queue(QueueName="confirmations.fifo", Attributes={"FifoQueue": "true"})   # the fix
    redrive = importlib.import_module("redrive")
    capsys.readouterr()
    assert redrive.main(["--table", "statebound-example", "--json"], client=lam.client, clock=lam.clock) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["kind"], listed["event"], listed["instance"]) == ("send", "order.confirmed", "o-1")
    assert redrive.main(["--table", "statebound-example", "--retry", "o-1"], client=lam.client, clock=lam.clock) == 0
    # an operator redrives minutes later, when the store that parked the row no longer hides
    # it (DynamoStore skips a row it saw leave the index for GSI_LAG_S of real time)
    lam.rebuild()
    assert lam.sweep()["delivered"] == 1
    [message] = lam.received(lam.confirmations)
    assert message["MessageAttributes"]["statebound.idempotency_key"]["StringValue"] == "o-1:3"
    assert lam.host.dead_timers() == [] and lam.host.pending_timers("o-1") == []


def test_a_silent_sqs_costs_a_request_one_short_attempt_and_the_sweeper_sends_it(lam, monkeypatch):
    """SQS accepts the connection and never answers (a real local socket). The library's
    default client waited 60 s, and retried, after the commit: on Lambda the 10 s function
    died with the order complete, and the client saw a 5xx. The app's hand-over client makes
    one 2 s attempt; the answer is the order's, and the row waits for the sweeper."""
    import socket
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list = []
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in range(16)], daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{srv.getsockname()[1]}")
        lam.rebuild()
        monkeypatch.delenv("AWS_ENDPOINT_URL_SQS")
        paid_order(lam)
        t0 = time.monotonic()
        status, body = lam.call("POST", "/instances/o-1/events", {"event": "Complete"})
        took = time.monotonic() - t0
    finally:
        srv.close()
        for conn, _ in held:
            conn.close()
    assert status == 200 and body["configuration"] == ["Done"]
    assert took < 6, took   # connect 1 s + read 2 s, one attempt, well inside the 10 s function
    [row] = lam.host.pending_timers("o-1")   # the confirmation is kept for the sweeper
    assert (row.state, row.attempts) == ("pending", 1) and "ReadTimeoutError" in row.last_error
    lam.rebuild()                            # SQS answers again (the next cold start)
    lam.clock.advance(1_000)
    assert lam.sweep()["delivered"] == 1
    [message] = lam.received(lam.confirmations)
    assert json.loads(message["Body"])["metadata"]["idempotency_key"] == "o-1:3"
    assert lam.host.pending_timers("o-1") == []
