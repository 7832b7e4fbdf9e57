"""The SQS-triggered events function (examples/lambda/sqs_events.py) on moto SQS and DynamoDB.

The events queue and its dead-letter queue are moto queues shaped as the template
defines them. :func:`poll` plays Lambda's event source mapping: it receives a batch, hands
the function the records in Lambda's format, deletes what the function did not report as
failed, and (standing in for the visibility timeout running out) makes the failed ones
visible again. SQS's at-least-once redelivery is played by handing the same records twice.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import LambdaContext, count_requests

REGION = "eu-west-1"


def send(lam, body: Any, **attributes: str) -> str:
    """A producer's SendMessage to the events queue; the message id."""
    raw = body if isinstance(body, str) else json.dumps(body)
    attrs = {k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()}
    return lam.sqs.send_message(QueueUrl=lam.events_queue, MessageBody=raw, MessageAttributes=attrs)["MessageId"]


def records(lam, url: str | None = None) -> list[dict[str, Any]]:
    """One receive, as the Lambda service hands it to the function (its record format)."""
    url = url or lam.events_queue
    arn = lam.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    messages = lam.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                       MessageAttributeNames=["All"]).get("Messages", [])
    return [{"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
             "attributes": m.get("Attributes", {}), "md5OfBody": m["MD5OfBody"],
             "messageAttributes": {name: {"stringValue": a["StringValue"], "stringListValues": [],
                                          "binaryListValues": [], "dataType": a["DataType"]}
                                   for name, a in m.get("MessageAttributes", {}).items()},
             "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": REGION} for m in messages]


def handle(lam, batch: list[dict[str, Any]]) -> set[str]:
    """The function on one batch: the ids it reported as failed."""
    result = lam.sqs_events.handle({"Records": batch}, LambdaContext())
    return {f["itemIdentifier"] for f in result["batchItemFailures"]}


def poll(lam) -> tuple[list[dict[str, Any]], set[str]]:
    """One round of the event source mapping: receive, handle, delete the successes."""
    batch = records(lam)
    failed = handle(lam, batch)
    for r in batch:
        if r["messageId"] in failed:   # as if the visibility timeout ran out
            lam.sqs.change_message_visibility(QueueUrl=lam.events_queue, ReceiptHandle=r["receiptHandle"],
                                              VisibilityTimeout=0)
        else:
            lam.sqs.delete_message(QueueUrl=lam.events_queue, ReceiptHandle=r["receiptHandle"])
    return batch, failed


def start(lam, *ids: str) -> None:
    for iid in ids:
        assert lam.call("POST", f"/instances/{iid}", {"chart": "order", "data": {"amount": 10}})[0] == 201


def test_each_record_is_applied_and_a_redelivered_batch_applies_nothing(lam):
    start(lam, "o-1", "o-2")
    send(lam, {"instance_id": "o-1", "event": "StartPayment", "data": {"card": "4242"}})
    send(lam, {"instance_id": "o-2", "event": "Cancel"})
    batch = records(lam)
    with count_requests(lam.client) as calls:
        assert handle(lam, batch) == set()
    assert sorted(calls) == sorted(["GetItem", "TransactWriteItems", "GetItem", "PutItem"])   # 2 per record
    assert lam.host.get("o-1").configuration == {"Started"} and lam.host.get("o-2").status == "done"
    versions = {i: lam.host.store.load(i).version for i in ("o-1", "o-2")}

    with count_requests(lam.client) as calls:     # SQS delivers the same messages again
        assert handle(lam, batch) == set()
    assert calls == ["GetItem", "GetItem"]            # the message ids are the keys: nothing applied
    assert {i: lam.host.store.load(i).version for i in ("o-1", "o-2")} == versions
    assert [r.ordinal for r in lam.host.pending_timers("o-1")] == [1]   # one PaymentTimeout, not two
    assert lam.received(lam.dead_letters) == []


def test_a_producer_key_makes_the_producers_own_retry_apply_once(lam):
    """A producer that retried its SendMessage made two messages (two ids); with one
    idempotency_key attribute they are one event. The confirmation goes out once."""
    start(lam, "o-1")
    lam.call("POST", "/instances/o-1/events", {"event": "StartPayment"})
    for _ in range(2):
        send(lam, {"instance_id": "o-1", "event": "Complete"}, idempotency_key="webhook-991",
             correlation_id="pay-991")
    batch, failed = poll(lam)
    assert len(batch) == 2 and failed == set()
    assert lam.host.get("o-1").status == "done"
    [confirmation] = lam.received(lam.confirmations)
    assert json.loads(confirmation["Body"])["data"] == {"order_id": "o-1", "amount": 10}
    assert lam.received(lam.dead_letters) == []       # the repeat was not an error


def test_without_a_producer_key_a_second_message_is_a_second_event(lam):
    """Two SendMessages of one event with no key are two events: the second finds the
    order halted, which no retry can change, so it is dead-lettered at once."""
    start(lam, "o-1")
    first = send(lam, {"instance_id": "o-1", "event": "Cancel"})
    second = send(lam, {"instance_id": "o-1", "event": "Cancel"})
    assert poll(lam)[1] == set()
    [dead] = lam.received(lam.dead_letters)
    attrs = {k: v["StringValue"] for k, v in dead["MessageAttributes"].items()}
    assert attrs["statebound.error_type"] == "NotRunning"
    assert attrs["statebound.source_message_id"] in (first, second)
    assert attrs["idempotency_key"] == attrs["statebound.source_message_id"]   # a redriven copy keeps its key


def test_bad_records_are_dead_lettered_with_the_reason_and_the_others_applied(lam):
    start(lam, "o-1", "done")
    lam.call("POST", "/instances/done/events", {"event": "Cancel"})
    good = send(lam, {"instance_id": "o-1", "event": "StartPayment"})
    bad = {
        send(lam, "not json"): "BadRecord",
        send(lam, '{"instance_id": "o-1", "event": "StartPayment", "data": NaN}'): "BadRecord",
        send(lam, {"instance_id": "o-1"}): "BadRecord",
        send(lam, {"instance_id": "a::b", "event": "x"}): "BadRecord",
        send(lam, {"instance_id": "nobody", "event": "StartPayment"}): "InstanceNotFound",
        send(lam, {"instance_id": "done", "event": "StartPayment"}): "NotRunning",
        send(lam, {"instance_id": "o-1", "event": "StartPayment"}, idempotency_key="x" * 257): "BadRecord",
    }
    sent_bodies = {}
    received: list[str] = []
    while True:
        batch, failed = poll(lam)
        if not batch:
            break
        assert failed == set()                        # none of them is worth a retry
        received += [r["messageId"] for r in batch]
        sent_bodies.update({r["messageId"]: r["body"] for r in batch})
    assert sorted(received) == sorted([good, *bad])
    assert lam.host.get("o-1").configuration == {"Started"}
    dead = lam.received(lam.dead_letters)
    by_source = {m["MessageAttributes"]["statebound.source_message_id"]["StringValue"]: m for m in dead}
    assert set(by_source) == set(bad)
    for source, error_type in bad.items():
        m = by_source[source]
        assert m["MessageAttributes"]["statebound.error_type"]["StringValue"] == error_type
        assert m["MessageAttributes"]["statebound.error"]["StringValue"]
        assert m["Body"] == sent_bodies[source]          # a redrive sends the same event


@pytest.mark.parametrize("taken", [7, 10])
def test_a_dead_letter_copy_keeps_the_key_first_when_the_producer_took_the_attribute_slots(lam, taken, caplog):
    """SQS allows 10 attributes. A producer that sent 10 left no room, and the copy lost
    the reason and the idempotency key without a word; one that sent 7 lost the key's
    company. Now the key comes first, then the reason; what does not fit is logged."""
    producer = {f"a{i}": str(i) for i in range(taken)}
    source = send(lam, {"instance_id": "nobody", "event": "StartPayment"}, **producer)
    poll(lam)
    [dead] = lam.received(lam.dead_letters)
    attrs = dead["MessageAttributes"]
    assert {k: attrs[k]["StringValue"] for k in producer} == producer     # the producer's are kept
    if taken == 7:
        assert attrs["idempotency_key"]["StringValue"] == source
        assert attrs["statebound.error_type"]["StringValue"] == "InstanceNotFound"
        assert "statebound.error" in attrs and "statebound.source_message_id" in caplog.text
    else:
        assert len(attrs) == 10 and "no room for idempotency_key" in caplog.text


def test_a_copy_dead_lettered_again_carries_the_new_reason(lam):
    send(lam, {"instance_id": "nobody", "event": "StartPayment"},
         **{"statebound.error": "an old reason", "statebound.error_type": "OldError"})
    poll(lam)
    [dead] = lam.received(lam.dead_letters)
    assert dead["MessageAttributes"]["statebound.error_type"]["StringValue"] == "InstanceNotFound"
    assert "old" not in dead["MessageAttributes"]["statebound.error"]["StringValue"]


def test_a_transient_failure_is_reported_alone_and_applied_once_on_redelivery(lam):
    """DynamoDB throttles every read of one instance: the store's retries run out
    (StoreUnavailable), that record alone is reported, and SQS's redelivery applies it."""
    start(lam, "o-1", "o-2")
    hot = {"on": True}

    def throttle(params, **kw):
        if hot["on"] and params.get("Key", {}).get("pk", {}).get("S") == "o-2":
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetItem")
    lam.client.meta.events.register("before-parameter-build.dynamodb.GetItem", throttle)
    send(lam, {"instance_id": "o-1", "event": "StartPayment"})
    stuck = send(lam, {"instance_id": "o-2", "event": "StartPayment"})
    batch, failed = poll(lam)
    assert len(batch) == 2 and failed == {stuck}
    assert lam.host.get("o-1").configuration == {"Started"}
    hot["on"] = False
    batch, failed = poll(lam)
    assert [r["messageId"] for r in batch] == [stuck] and failed == set()
    assert lam.host.get("o-2").configuration == {"Started"}
    assert lam.received(lam.dead_letters) == []


def test_without_a_dead_letter_queue_a_bad_record_is_reported_never_dropped(lam, monkeypatch):
    monkeypatch.delenv("DEAD_LETTER_QUEUE_URL")
    bad = send(lam, {"instance_id": "nobody", "event": "StartPayment"})
    assert poll(lam)[1] == {bad}


def test_a_bad_record_whose_dead_letter_send_fails_is_reported(lam):
    lam.sqs.delete_queue(QueueUrl=lam.dead_letters)
    bad = send(lam, {"instance_id": "nobody", "event": "StartPayment"})
    assert poll(lam)[1] == {bad}


def test_a_record_that_keeps_failing_reaches_the_dead_letters_through_the_redrive_policy(lam):
    """The template's redrive policy (maxReceiveCount 5), as moto enforces it."""
    start(lam, "o-1")

    def throttle(params, **kw):
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow"},
                           "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetItem")
    lam.client.meta.events.register("before-parameter-build.dynamodb.GetItem", throttle)
    stuck = send(lam, {"instance_id": "o-1", "event": "StartPayment"})
    receives = 0
    while poll(lam)[0]:
        receives += 1
    assert receives == 5
    [dead] = lam.received(lam.dead_letters)
    assert dead["MessageId"] == stuck


def test_not_an_sqs_event_fails_the_invocation(lam):
    with pytest.raises(ValueError, match="not an SQS event"):
        lam.sqs_events.handle({"source": "aws.events"}, LambdaContext())


def test_each_record_logs_with_its_own_keys_and_a_sane_correlation_id(lam, capsys):
    """One batch: a record for o-1, one for a missing instance, one whose body is no JSON.
    The refusals used to carry o-1's chart and revision (the store's keys outlived the
    record) and no instance or correlation id of their own, since they were logged after
    the record's scope; a correlation_id attribute was logged as it came, escapes and all."""
    from .harness import log_lines
    start(lam, "o-1")
    send(lam, {"instance_id": "o-1", "event": "StartPayment"}, correlation_id="corr-A")
    ghost = send(lam, {"instance_id": "ghost", "event": "StartPayment"}, correlation_id="corr-B")
    bad = send(lam, "not json", correlation_id="c\n\x1b[2Jx")
    capsys.readouterr()
    poll(lam)
    lines = log_lines(capsys.readouterr().out)
    refused = {d["message_id"]: d for d in lines if d.get("message") == "record refused"}
    assert set(refused) == {ghost, bad}
    assert refused[ghost]["instance_id"] == "ghost" and refused[ghost]["correlation_id"] == "corr-B"
    assert refused[bad]["correlation_id"] == bad          # not the forged value: the message id
    for d in [*refused.values(), *(d for d in lines if d.get("message") == "batch done")]:
        assert "chart" not in d and "revision" not in d, d
    assert not any("\x1b" in json.dumps(d, ensure_ascii=False) for d in lines)
