"""SQSProcessor on moto's in-process SQS, which emulates FIFO deduplication for real."""

from __future__ import annotations

import hashlib
import json
import logging
import re

import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

import statebound as sb
from statebound.aws import SQS_MAX_BYTES, SQSProcessor
from statebound.host.processors import SendProcessor

from .helpers import Requests, make_delivery


def _queue(sqs, name, fifo=False):
    attributes = {"FifoQueue": "true"} if fifo else {}
    return sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]


def _drain(sqs, url):
    """Every message now visible on the queue."""
    messages = []
    while True:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                                    VisibilityTimeout=60).get("Messages", [])
        if not batch:
            return messages
        messages += batch


def _sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


EXPECTED_ATTRIBUTES = {
    "statebound.idempotency_key": {"DataType": "String", "StringValue": "order-1:3"},
    "statebound.instance_id": {"DataType": "String", "StringValue": "order-1"},
    "statebound.send_id": {"DataType": "String", "StringValue": "notify"},
    "statebound.event": {"DataType": "String", "StringValue": "order.placed"},
}


def test_standard_queue_gets_the_envelope_and_the_attributes(client):
    sqs = client("sqs")
    url = _queue(sqs, "orders")
    processor = SQSProcessor(url, client=sqs)
    assert isinstance(processor, SendProcessor)
    sent = Requests(sqs)

    processor.deliver(make_delivery(caller_context={"traceparent": "00-abc-def-01"}))

    params = sent.only("SendMessage")
    expected_attributes = {**EXPECTED_ATTRIBUTES, "statebound.caller_context": {
        "DataType": "String", "StringValue": '{"traceparent":"00-abc-def-01"}'}}
    assert params == {
        "QueueUrl": url,
        "MessageBody": ('{"event":"order.placed","data":{"order_id":7,"total":12.5},"metadata":'
                        '{"idempotency_key":"order-1:3","instance_id":"order-1","send_id":"notify",'
                        '"caller_context":{"traceparent":"00-abc-def-01"}}}'),
        "MessageAttributes": expected_attributes,
    }  # a standard queue gets no group or deduplication id
    [message] = _drain(sqs, url)
    assert json.loads(message["Body"])["data"] == {"order_id": 7, "total": 12.5}
    assert {k: {"DataType": v["DataType"], "StringValue": v["StringValue"]}
            for k, v in message["MessageAttributes"].items()} == expected_attributes


def test_fifo_one_key_delivered_twice_leaves_one_message(client):
    sqs = client("sqs")
    url = _queue(sqs, "orders.fifo", fifo=True)
    processor = SQSProcessor(url, client=sqs)
    sent = Requests(sqs)

    processor.deliver(make_delivery())
    processor.deliver(make_delivery(attempt=2))        # the outbox's retry of the same send
    processor.deliver(make_delivery(idempotency_key="order-1:4", ordinal=4))

    bodies = [json.loads(m["Body"]) for m in _drain(sqs, url)]
    assert [b["metadata"]["idempotency_key"] for b in bodies] == ["order-1:3", "order-1:4"]
    first, retry, other = sent.of("SendMessage")
    assert first == retry                               # a retry sends the very same request
    assert first["MessageDeduplicationId"] == _sha("order-1:3")
    assert other["MessageDeduplicationId"] == _sha("order-1:4")
    assert first["MessageGroupId"] == other["MessageGroupId"] == "order-1"


def test_fifo_ids_always_fit_sqs_rules(client):
    sqs = client("sqs")
    url = _queue(sqs, "orders.fifo", fifo=True)
    sent = Requests(sqs)
    long_id = "commande-é" + "x" * 300                  # too long, and not ASCII
    SQSProcessor(url, client=sqs).deliver(make_delivery(instance_id=long_id, idempotency_key=f"{long_id}:1"))

    params = sent.only("SendMessage")
    assert params["MessageGroupId"] == _sha(long_id)
    assert params["MessageDeduplicationId"] == _sha(f"{long_id}:1")
    assert len(_drain(sqs, url)) == 1


@pytest.mark.parametrize(("group", "expected"), [
    ("all-orders", "all-orders"),
    (lambda d: f"{d.instance_id}/{d.send_id}", "order-1/notify"),
])
def test_fifo_group_id_is_configurable(client, group, expected):
    sqs = client("sqs")
    url = _queue(sqs, "orders.fifo", fifo=True)
    sent = Requests(sqs)
    SQSProcessor(url, client=sqs, message_group_id=group).deliver(make_delivery())
    assert sent.only("SendMessage")["MessageGroupId"] == expected


def test_queue_comes_from_the_target_when_the_processor_has_none(client):
    sqs = client("sqs")
    url = _queue(sqs, "orders")
    SQSProcessor(client=sqs).deliver(make_delivery(target=url))
    assert len(_drain(sqs, url)) == 1


def test_a_chart_cannot_redirect_a_processor_with_its_own_queue(client):
    sqs = client("sqs")
    url, other = _queue(sqs, "orders"), _queue(sqs, "elsewhere")
    sent = Requests(sqs)
    with pytest.raises(sb.DeliveryRejected, match="only sends to its own queue URL"):
        SQSProcessor(url, client=sqs).deliver(make_delivery(target=other))
    with pytest.raises(sb.DeliveryRejected, match="no queue URL"):
        SQSProcessor(client=sqs).deliver(make_delivery())
    SQSProcessor(url, client=sqs).deliver(make_delivery(target=url))   # naming its own queue is fine
    assert len(sent.of("SendMessage")) == 1
    assert _drain(sqs, other) == []


@pytest.mark.parametrize("data", [float("nan"), {"x": float("inf")}, {"blob": b"\x00"}])
def test_data_that_is_not_strict_json_is_rejected_before_the_call(client, data):
    sqs = client("sqs")
    sent = Requests(sqs)
    with pytest.raises(sb.PayloadNotJSON):
        SQSProcessor(_queue(sqs, "orders"), client=sqs).deliver(make_delivery(data=data))
    assert [name for name, _ in sent.calls] == ["CreateQueue"]


def test_size_is_checked_before_the_call_body_and_attributes_together(client):
    sqs = client("sqs")
    url = _queue(sqs, "orders")
    processor = SQSProcessor(url, client=sqs)
    sent = Requests(sqs)
    processor.deliver(make_delivery(data=""))
    [params] = sent.of("SendMessage")
    used = len(params["MessageBody"]) + sum(len(k) + len(v["DataType"]) + len(v["StringValue"])
                                            for k, v in params["MessageAttributes"].items())
    room = SQS_MAX_BYTES - used         # each "x" in the data string adds one byte to the body

    processor.deliver(make_delivery(data="x" * room))                  # exactly at the limit: sent
    with pytest.raises(sb.PayloadTooLarge) as err:
        processor.deliver(make_delivery(data="x" * (room + 1)))
    assert (err.value.size, err.value.limit) == (SQS_MAX_BYTES + 1, SQS_MAX_BYTES)
    assert isinstance(err.value, sb.DeliveryRejected)
    assert len(sent.of("SendMessage")) == 2                            # the oversized one never left
    assert len(_drain(sqs, url)) == 2


def test_non_ascii_text_is_escaped_so_every_code_point_is_valid_for_sqs(client):
    sqs = client("sqs")
    url = _queue(sqs, "orders")
    SQSProcessor(url, client=sqs).deliver(make_delivery(data={"name": "Zoë \ufffe 注文"}))
    [message] = _drain(sqs, url)
    assert message["Body"].isascii()
    assert json.loads(message["Body"])["data"] == {"name": "Zoë \ufffe 注文"}


def test_missing_queue_is_rejected_and_aws_message_stays_in_the_log(client, caplog):
    sqs = client("sqs")
    url = _queue(sqs, "orders") + "-gone"
    with caplog.at_level(logging.ERROR, logger="statebound.aws"), pytest.raises(sb.DeliveryRejected) as err:
        SQSProcessor(url, client=sqs).deliver(make_delivery())
    assert "NonExistentQueue" in str(err.value)
    assert "does not exist" not in str(err.value)                     # AWS's own words...
    assert "does not exist" in caplog.text                             # ...are logged only


@pytest.mark.parametrize(("code", "status", "outcome"), [
    ("RequestThrottled", 403, sb.DeliveryFailed),          # SQS's throttling code, whatever the status
    ("InternalError", 500, sb.DeliveryFailed),
    ("SomethingNew", 503, sb.DeliveryFailed),               # any 5xx
    ("TooManyRequests", 429, sb.DeliveryFailed),
    ("AccessDenied", 403, sb.DeliveryRejected),
    ("InvalidParameterValue", 400, sb.DeliveryRejected),
])
def test_aws_errors_map_to_retry_or_reject(client, code, status, outcome):
    # Stubber: moto cannot be made to throttle or fail, so the error response is injected
    sqs = client("sqs")
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/orders"
    with Stubber(sqs) as stub:
        stub.add_client_error("send_message", service_error_code=code, service_message="arn:aws:iam::1234 secret",
                              http_status_code=status)
        with pytest.raises(outcome) as err:
            SQSProcessor(url, client=sqs).deliver(make_delivery())
    assert code in str(err.value) and "secret" not in str(err.value)
    if outcome is sb.DeliveryFailed:
        assert not isinstance(err.value, sb.DeliveryRejected) and err.value.code == code


def test_connection_errors_are_retryable():
    class Unreachable:
        def send_message(self, **params):
            raise EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com/")

    with pytest.raises(sb.DeliveryFailed, match="EndpointConnectionError"):
        SQSProcessor("https://sqs.us-east-1.amazonaws.com/1/q", client=Unreachable()).deliver(make_delivery())


def test_default_client_uses_the_queue_urls_region(aws):
    processor = SQSProcessor("https://sqs.eu-west-3.amazonaws.com/123456789012/orders")
    assert processor.client.meta.region_name == "eu-west-3"
    assert SQSProcessor().client.meta.region_name == "us-east-1"       # AWS_DEFAULT_REGION


_SQS_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


@pytest.mark.parametrize("instance_id", ["order\x01", "order\uffff", "tab\tand\u00e9"])
def test_attribute_values_sqs_cannot_carry_travel_as_json(client, instance_id):
    """SQS refuses a whole message whose String attribute holds a character it does not
    allow in a body (moto does not check; the rule is SQS's, so the test checks what is
    sent). Such an instance id travels as ASCII JSON under ``String.json``; an id SQS can
    carry stays a plain String. Either way the consumer gets the id back."""
    sqs = client("sqs")
    url = _queue(sqs, "odd-ids")
    sent = Requests(sqs)
    SQSProcessor(url, client=sqs).deliver(make_delivery(instance_id=instance_id,
                                                        idempotency_key=f"{instance_id}:3"))
    attributes = sent.only("SendMessage")["MessageAttributes"]
    for attr in attributes.values():
        assert _SQS_TEXT.fullmatch(attr["StringValue"]), attr
    [message] = _drain(sqs, url)
    got = message["MessageAttributes"]["statebound.instance_id"]
    value = json.loads(got["StringValue"]) if got["DataType"] == "String.json" else got["StringValue"]
    assert value == instance_id
    assert (got["DataType"] == "String") == bool(_SQS_TEXT.fullmatch(instance_id))
    assert json.loads(message["Body"])["metadata"]["instance_id"] == instance_id
