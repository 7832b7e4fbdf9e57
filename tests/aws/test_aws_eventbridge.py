"""EventBridgeProcessor on moto. moto's EventBridge is an API surface, but it does route
an event to an SQS rule target, so the tests read back what a subscriber would get."""

from __future__ import annotations

import json
import logging

import pytest
from botocore.stub import Stubber

import statebound as sb
from statebound.aws import EVENTBRIDGE_MAX_BYTES, EventBridgeProcessor

from .helpers import Requests, make_delivery


def _subscribe(client, bus="default", source="statebound"):
    """An SQS queue receiving every event of ``source`` on ``bus``, as a rule target."""
    sqs, events = client("sqs"), client("events")
    url = sqs.create_queue(QueueName=f"sub-{bus}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name=f"all-{bus}", EventBusName=bus, EventPattern=json.dumps({"source": [source]}))
    events.put_targets(Rule=f"all-{bus}", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])

    def received():
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]
    return received


def test_put_events_entry_and_what_a_subscriber_receives(client):
    events = client("events")
    received = _subscribe(client)
    sent = Requests(events)

    EventBridgeProcessor(client=events).deliver(make_delivery(caller_context={"request_id": "r-1"}))

    detail = ('{"event":"order.placed","data":{"order_id":7,"total":12.5},"metadata":{"idempotency_key":'
              '"order-1:3","instance_id":"order-1","send_id":"notify","caller_context":{"request_id":"r-1"}}}')
    assert sent.only("PutEvents") == {"Entries": [
        {"EventBusName": "default", "Source": "statebound", "DetailType": "order.placed", "Detail": detail}]}
    [event] = received()
    assert (event["source"], event["detail-type"]) == ("statebound", "order.placed")
    assert event["detail"] == json.loads(detail)


def test_custom_bus_and_source_and_a_bus_from_the_target(client):
    events = client("events")
    events.create_event_bus(Name="orders")
    received = _subscribe(client, bus="orders", source="shop.orders")
    EventBridgeProcessor("orders", source="shop.orders", client=events).deliver(make_delivery())
    EventBridgeProcessor(None, source="shop.orders", client=events).deliver(
        make_delivery(target="orders", idempotency_key="order-1:4"))
    keys = sorted(e["detail"]["metadata"]["idempotency_key"] for e in received())
    assert keys == ["order-1:3", "order-1:4"]


def test_a_chart_cannot_redirect_events_to_another_bus(client):
    events = client("events")
    sent = Requests(events)
    with pytest.raises(sb.DeliveryRejected, match="only sends to its own event bus"):
        EventBridgeProcessor("orders", client=events).deliver(make_delivery(target="attacker-bus"))
    assert sent.calls == []


def test_missing_bus_is_rejected(client):
    with pytest.raises(sb.DeliveryRejected, match="ResourceNotFoundException"):
        EventBridgeProcessor("no-such-bus", client=client("events")).deliver(make_delivery())


@pytest.mark.parametrize("event", [None, "", "x" * 129])
def test_detail_type_needs_an_event_name_that_fits(client, event):
    events = client("events")
    sent = Requests(events)
    with pytest.raises(sb.DeliveryRejected, match="event name"):
        EventBridgeProcessor(client=events).deliver(make_delivery(event=event))
    assert sent.calls == []


def test_size_counts_source_detail_type_and_detail(client):
    events = client("events")
    processor = EventBridgeProcessor(source="s" * 100, client=events)
    sent = Requests(events)
    processor.deliver(make_delivery(data=""))
    [entry] = sent.of("PutEvents")[0]["Entries"]
    used = sum(len(entry[k]) for k in ("Source", "DetailType", "Detail"))
    room = EVENTBRIDGE_MAX_BYTES - used
    processor.deliver(make_delivery(data="x" * room))
    with pytest.raises(sb.PayloadTooLarge) as err:
        processor.deliver(make_delivery(data="x" * (room + 1)))
    assert (err.value.size, err.value.limit) == (EVENTBRIDGE_MAX_BYTES + 1, EVENTBRIDGE_MAX_BYTES)
    assert len(sent.of("PutEvents")) == 2


def test_data_that_is_not_strict_json_is_rejected(client):
    with pytest.raises(sb.PayloadNotJSON):
        EventBridgeProcessor(client=client("events")).deliver(make_delivery(data={"x": float("nan")}))


@pytest.mark.parametrize(("code", "outcome"), [
    ("InternalFailure", sb.DeliveryFailed),
    ("ThrottlingException", sb.DeliveryFailed),
    ("SomethingAWSAddsLater", sb.DeliveryFailed),
    ("MalformedDetail", sb.DeliveryRejected),
    ("InvalidArgument", sb.DeliveryRejected),
    ("NotAuthorizedForSourceException", sb.DeliveryRejected),
])
def test_a_failed_entry_in_a_200_response(client, code, outcome, caplog):
    # Stubber: moto only fails an entry for malformed detail, which this processor never sends
    events = client("events")
    processor = EventBridgeProcessor(client=events)
    delivery = make_delivery()
    with Stubber(events) as stub:
        stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [
            {"ErrorCode": code, "ErrorMessage": "account 123456789012 said no"}]})
        with caplog.at_level(logging.WARNING, logger="statebound.aws"), pytest.raises(outcome) as err:
            processor.deliver(delivery)
    assert code in str(err.value) and "123456789012" not in str(err.value)
    assert "123456789012" in caplog.text
    if outcome is sb.DeliveryFailed:
        assert not isinstance(err.value, sb.DeliveryRejected)


@pytest.mark.parametrize(("code", "status", "outcome"), [
    ("ThrottlingException", 400, sb.DeliveryFailed),
    ("InternalException", 500, sb.DeliveryFailed),
    ("AccessDeniedException", 400, sb.DeliveryRejected),
])
def test_a_failed_call(client, code, status, outcome):
    # Stubber: moto cannot be made to throttle or to deny
    events = client("events")
    with Stubber(events) as stub:
        stub.add_client_error("put_events", service_error_code=code, http_status_code=status)
        with pytest.raises(outcome, match=code):
            EventBridgeProcessor(client=events).deliver(make_delivery())
