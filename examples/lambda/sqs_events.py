"""SQS-triggered events function: each message is one event for one instance.

A producer that should not wait for the HTTP API (a payment webhook relay, another
service, a batch import) sends to the events queue instead::

    body (strict JSON)   {"instance_id": "order-1", "event": "Complete", "data": {...}}
    message attributes   idempotency_key  (String, optional) the producer's key for this event
                         correlation_id   (String, optional) logged and stored with any timer

**Applied once.** SQS delivers at least once: a message comes back after a visibility
timeout, a function error, or simply twice. Each record is sent to the host with an
idempotency key, recorded in the same DynamoDB write as the event, so a redelivery applies
nothing (and costs one GetItem). The key is the ``idempotency_key`` attribute when the
producer gives one, else the SQS message id. Only the attribute survives the producer's
own retries (a second ``SendMessage`` is a new message with a new id), so a producer that
retries should set it.

**Partial batch failures.** The event source mapping has ``ReportBatchItemFailures``: the
function returns ``{"batchItemFailures": [{"itemIdentifier": messageId}, ...]}`` and SQS
deletes every other message of the batch. One record's failure never fails the others.

**It ends before its timeout.** It starts no record with ``SQS_EVENTS_MARGIN_MS`` (5000) or
less left, and reports the records it did not reach as failures, so SQS delivers them
again. An invocation killed by its timeout would return nothing, and SQS would deliver the
whole batch again, the records it applied included: each such receive counts towards the
redrive policy's ``maxReceiveCount``, and a copy moved to the dead-letter queue that way
has no ``idempotency_key`` attribute (see the README, "Events over SQS"). The margin is
longer than one record takes while SQS hangs: its dead-letter send, like the outbox
hand-over and the wake-ups, gets one attempt of 1 s to connect and 2 s to read
(``app.HANDOVER_CONFIG``), not botocore's 60 s, retried.

**Which failures are retried, and which go to the dead-letter queue at once:**

============================================  ==============================================
retried: reported as a batch item failure     dead-lettered at once: sent to
(visible again after the queue's visibility   ``DEAD_LETTER_QUEUE_URL`` with the reason,
timeout; after ``maxReceiveCount`` receives   then dropped from the events queue
SQS's redrive policy moves it to the same
dead-letter queue)
============================================  ==============================================
``ConflictError`` (contention outlasted the   a body that is not strict JSON, or lacks
host's retries), ``StoreUnavailable``         ``instance_id``/``event``; an instance id,
(throttled), ``ChartIdentityMismatch`` and    key or event the API would refuse (a chart's
                                              own timeout, ``done.*``, ``error.*``);
                                              ``InstanceNotFound``;
``UnknownChart`` (the instance runs a         ``NotRunning`` (the instance has halted);
revision this deployment lacks: deploy it     ``IdempotencyKeyReused``; ``SerializationError``
and the retry works), anything unexpected     and ``ItemTooLarge`` (data that cannot be stored)
============================================  ==============================================

The right-hand column cannot change on a retry, so retrying would only spend five
receives and a quarter of an hour before the redrive policy gave up. The dead-lettered
copy keeps the original body and attributes (so a redrive sends the same event) and adds
``statebound.error_type``, ``statebound.error`` and ``statebound.source_message_id``; when
the producer gave no key it also gets ``idempotency_key`` = the original message id, so a
redriven copy keeps its key. If that send fails, the record is reported as a batch item
failure instead: it is never lost, only retried.

Environment: ``DEAD_LETTER_QUEUE_URL`` (the template's ``EventsDeadLetters``),
``SQS_EVENTS_MARGIN_MS`` (default 5000), plus what app.py reads.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import boto3
from botocore.config import Config

import statebound as sb
from statebound import jsonio
from statebound.dynamodb.lambda_handlers import Deadline

from app import HANDOVER_CONFIG, OwnEvent, flush_outbox_metrics, get_host, refuse_own_event
from handler import CORRELATION_ID, BadRequest, check_instance_id, from_aws
from telemetry import logger, scope

__all__ = ["handle", "permanent", "PERMANENT", "BadRecord"]


class BadRecord(Exception):
    """The message itself is malformed: no retry can apply it."""


#: Failures a retry cannot change: the record goes to the dead-letter queue at once.
PERMANENT: tuple[type[BaseException], ...] = (
    BadRecord, sb.InstanceNotFound, sb.NotRunning, sb.IdempotencyKeyReused, sb.SerializationError,
    sb.ItemTooLarge, sb.InvalidInstanceId,
)
#: SQS takes at most 10 message attributes.
_MAX_ATTRIBUTES = 10
_sqs: Any = None


def permanent(exc: BaseException) -> bool:
    """Whether no retry can apply the record (see the module doc's table)."""
    # a ValueError of our own is an id or key the host refuses; botocore's are not about the record
    return isinstance(exc, PERMANENT) or (isinstance(exc, ValueError) and not from_aws(exc))


def _client() -> Any:
    global _sqs
    if _sqs is None:
        # one short attempt: a send that fails is reported and SQS retries the record, while
        # botocore's defaults (60 s to read, retried) would hold the batch past the timeout
        _sqs = boto3.client("sqs", config=Config(**HANDOVER_CONFIG))
    return _sqs


def _deadline(context: Any) -> Deadline:
    """When to stop starting records: ``SQS_EVENTS_MARGIN_MS`` before the invocation's end."""
    try:
        clock = get_host().clock
    except Exception:   # every record meets this again in _apply, where it is logged and reported
        clock = None
    return Deadline(context.get_remaining_time_in_millis, int(os.environ.get("SQS_EVENTS_MARGIN_MS", "5000")),
                    clock=clock)


def _attribute(record: dict[str, Any], name: str) -> str | None:
    attr = (record.get("messageAttributes") or {}).get(name) or {}
    value = attr.get("stringValue")
    return value if isinstance(value, str) and value else None


def _parse(record: dict[str, Any]) -> tuple[str, sb.Event, str]:
    """``(instance_id, event, idempotency key)`` of one record, or :class:`BadRecord`."""
    try:
        body = jsonio.loads(record.get("body") or "")
    except sb.InvalidJSON as exc:
        raise BadRecord(f"body is not strict JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRecord("body must be a JSON object")
    instance_id, name = body.get("instance_id"), body.get("event")
    if not isinstance(instance_id, str) or not isinstance(name, str) or not name:
        raise BadRecord('body needs "instance_id" and "event", both non-empty strings')
    try:
        check_instance_id(instance_id)
    except BadRequest as exc:
        raise BadRecord(str(exc)) from None
    key = _attribute(record, "idempotency_key") or record["messageId"]
    if len(key) > 256:
        raise BadRecord("the idempotency_key attribute may be at most 256 characters")
    return instance_id, sb.Event(name, body.get("data")), key


def _correlation_id(record: dict[str, Any]) -> str:
    """The producer's ``correlation_id`` attribute if it looks like an id (it goes into every
    log line and onto the timers the event arms, as the HTTP header does), else the message id."""
    cid = _attribute(record, "correlation_id")
    return cid if cid is not None and CORRELATION_ID.fullmatch(cid) else record["messageId"]


def _apply(parsed: tuple[str, sb.Event, str], cid: str) -> None:
    """Send one parsed record's event (its log keys are set by :func:`handle`, so that its
    refusal lines carry them too)."""
    instance_id, event, key = parsed
    host = get_host()
    try:
        refuse_own_event(host, event.name)
    except OwnEvent as exc:
        raise BadRecord(str(exc)) from None
    repeats = host.metrics.get("duplicates", 0)
    pos = host.send(instance_id, event, caller_context={"correlation_id": cid}, idempotency_key=key)
    repeated = host.metrics.get("duplicates", 0) > repeats
    logger.info("repeated event: nothing applied" if repeated else "event processed",
                extra={"configuration": sorted(pos.configuration), "status": pos.status})


def _dead_letter(record: dict[str, Any], exc: BaseException) -> bool:
    """Send the record to the dead-letter queue with the reason; whether that worked."""
    url = os.environ.get("DEAD_LETTER_QUEUE_URL")
    if not url:
        return False
    attributes = {}
    for name, attr in (record.get("messageAttributes") or {}).items():
        kind = attr.get("dataType", "String")
        value = {"StringValue": attr["stringValue"]} if "stringValue" in attr else \
            {"BinaryValue": base64.b64decode(attr.get("binaryValue") or "")}   # Lambda hands it base64
        attributes[name] = {"DataType": kind, **value}
    # Most needed first: without the key, two dead-lettered copies of one message would both
    # apply when redriven. A name already there is overwritten (an earlier failure's reason
    # is stale); a new one needs one of SQS's 10 slots, and a producer may have taken them.
    ours = {"statebound.error": (str(exc).splitlines() or [""])[0][:1000] or type(exc).__name__,
            "statebound.error_type": type(exc).__name__,
            "statebound.source_message_id": record["messageId"]}
    if "idempotency_key" not in attributes:
        ours = {"idempotency_key": record["messageId"], **ours}
    dropped = []
    for name, value in ours.items():
        if name in attributes or len(attributes) < _MAX_ATTRIBUTES:
            attributes[name] = {"DataType": "String", "StringValue": value}
        else:
            dropped.append(name)
    if dropped:
        logger.warning("the dead-letter copy keeps the producer's attributes and has no room for %s",
                       ", ".join(dropped), extra={"error_type": type(exc).__name__, "error": ours.get(
                           "statebound.error")})
    try:
        _client().send_message(QueueUrl=url, MessageBody=record.get("body") or "", MessageAttributes=attributes)
    except Exception:
        logger.exception("could not dead-letter the record; reporting it as failed instead")
        return False
    return True


@logger.inject_lambda_context(clear_state=True)
def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point for the events queue's event source mapping."""
    records = event.get("Records")
    if not isinstance(records, list):
        raise ValueError("not an SQS event: no Records")   # fails the batch, which SQS retries
    failures = []
    counts = {"applied": 0, "retried": 0, "dead_lettered": 0, "not_reached": 0}
    deadline = _deadline(context)
    for n, record in enumerate(records):
        if deadline():
            # reported, not left to the timeout: a killed invocation would have SQS deliver
            # the records already applied again too
            rest = records[n:]
            failures += [{"itemIdentifier": r["messageId"]} for r in rest]
            counts["not_reached"] = len(rest)
            logger.warning("%d ms or less left: %d record(s) not reached; SQS will deliver them again",
                           deadline.margin_ms, len(rest))
            break
        message_id = record["messageId"]
        cid = _correlation_id(record)
        keys: dict[str, Any] = {"message_id": message_id, "correlation_id": cid}
        parsed: tuple[str, sb.Event, str] | None = None
        refused: BadRecord | None = None
        try:
            parsed = _parse(record)
            keys.update(instance_id=parsed[0], event=parsed[1].name, idempotency_key=parsed[2])
        except BadRecord as exc:
            refused = exc
        # one scope per record, refusal lines included; and none of its keys (the chart and
        # revision the store adds when it loads the instance) may reach the next record's lines
        with scope(**keys):
            try:
                if parsed is None:
                    assert refused is not None
                    raise refused
                _apply(parsed, cid)
                counts["applied"] += 1
                continue
            except Exception as exc:
                if permanent(exc):
                    logger.warning("record refused", extra={"error_type": type(exc).__name__,
                                                            "reason": (str(exc).splitlines() or [""])[0]})
                    if _dead_letter(record, exc):
                        counts["dead_lettered"] += 1
                        continue
                else:
                    logger.exception("record failed; SQS will deliver it again",
                                     extra={"error_type": type(exc).__name__})
            finally:
                logger.remove_keys(["chart", "revision"])
            failures.append({"itemIdentifier": message_id})
            counts["retried"] += 1
    logger.info("batch done", extra={"records": len(records), **counts})
    flush_outbox_metrics()
    return {"batchItemFailures": failures}
