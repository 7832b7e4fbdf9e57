"""SQSProcessor: a ``<send>`` becomes one SQS message, on a standard or a FIFO queue.

The body is the JSON envelope of :mod:`statebound.aws._payload`. The same keys travel as
message attributes, so a consumer can dedup or route without parsing the body:

==============================  ==========================================================
attribute (String)              value
==============================  ==========================================================
``statebound.idempotency_key``  the delivery's idempotency key (``"order-1:3"``)
``statebound.instance_id``      the sending instance
``statebound.send_id``          the ``<send>``'s id
``statebound.event``            the event name (absent when the send has none)
``statebound.caller_context``   the correlation data, as JSON (absent when ``None``)
==============================  ==========================================================

SQS carries in an attribute only the characters it allows in a body (XML's: tab, line
feed, carriage return, and ``U+0020``-``U+D7FF``, ``U+E000``-``U+FFFD``, ``U+10000`` and
up), and refuses the whole message otherwise. An instance id, send id or event name may
hold others (a control character, ``U+FFFF``); such a value is sent as an ASCII JSON string
under the data type ``String.json`` instead (``json.loads`` gives the value back), so the
message is not refused for good and parked dead. The body is ASCII JSON and always fits.

On a FIFO queue (its URL ends in ``.fifo``) the message also gets

* ``MessageDeduplicationId`` = SHA-256 hex of the idempotency key (64 characters, within
  SQS's 128 and its character set, whatever the instance id holds): SQS drops a repeat
  within its 5-minute deduplication window;
* ``MessageGroupId`` = the instance id by default, so one instance's messages stay in
  order and different instances do not block each other. An id SQS would refuse (over 128
  characters, or outside printable ASCII) is replaced by its SHA-256 hex.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from ..host.processors import Delivery
from ._client import quick_client
from ._errors import map_aws_errors
from ._payload import KIB, check_size, choose_target, send_envelope, to_json

__all__ = ["SQSProcessor", "SQS_MAX_BYTES", "ATTRIBUTE_PREFIX"]

#: SQS's default (and long-standing) maximum message size, body plus attributes.
SQS_MAX_BYTES = 256 * KIB
#: The prefix of the message attributes statebound sets on each message.
ATTRIBUTE_PREFIX = "statebound."

# SQS's rule for MessageGroupId / MessageDeduplicationId: 1-128 printable ASCII characters
_SQS_ID = re.compile(r"[\x21-\x7e]{1,128}")
# the characters SQS allows in a message body and a String attribute (XML 1.0's Char)
_SQS_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
_REGION_IN_URL = re.compile(r"^sqs[.-]([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fit_sqs_id(value: str) -> str:
    return value if _SQS_ID.fullmatch(value) else _sha256(value)


def _string_attribute(value: str) -> dict[str, str]:
    if _SQS_TEXT.fullmatch(value):
        return {"DataType": "String", "StringValue": value}
    return {"DataType": "String.json", "StringValue": to_json(value, "an attribute value")}


def _region_of(queue_url: str) -> str | None:
    match = _REGION_IN_URL.match(urlparse(queue_url).hostname or "")
    return match.group(1) if match else None


class SQSProcessor:
    """Sends each delivery as one SQS message (``sqs:SendMessage``).

    ::

        host = sb.Host(charts, store, processors={"sqs": SQSProcessor(queue_url)})
        # <send type="sqs" event="order.placed" namelist="order_id"/>

    :param queue_url: the queue to send to. ``None``: each ``<send>`` names its queue URL
        in ``target``. When given, a ``<send>`` whose target names another queue is
        rejected, so a chart cannot redirect messages.
    :param client: a boto3 SQS client; ``None`` builds the default one, in the queue
        URL's region when the URL shows it.
    :param message_group_id: FIFO only: a fixed group id, or ``callable(delivery) -> str``.
        It must depend only on the delivery's stable fields (not ``attempt``), or a retry
        lands in another group and escapes deduplication on high-throughput queues.
        Default: the instance id.
    :param max_bytes: the size refused before the call (body plus attributes). Raise it
        for a queue whose ``MaximumMessageSize`` is set higher (up to 1 MiB).
    """

    def __init__(self, queue_url: str | None = None, *, client: Any = None,
                 message_group_id: str | Callable[[Delivery], str] | None = None,
                 max_bytes: int = SQS_MAX_BYTES) -> None:
        self.queue_url = queue_url
        self.message_group_id = message_group_id
        self.max_bytes = max_bytes
        if client is None:
            region = _region_of(queue_url) if queue_url else None
            client = quick_client("sqs", region)
        self.client = client

    def deliver(self, delivery: Delivery) -> None:
        """Send one message; on a FIFO queue, deduplicated on the idempotency key."""
        queue_url = choose_target(self.queue_url, delivery.target, "queue URL")
        body = to_json(send_envelope(delivery), "the send's event data")
        attributes = self._attributes(delivery)
        size = len(body.encode("utf-8")) + sum(
            len(name.encode("utf-8")) + len(attr["DataType"]) + len(attr["StringValue"].encode("utf-8"))
            for name, attr in attributes.items())
        check_size(size, self.max_bytes, "the SQS message")
        params: dict[str, Any] = {"QueueUrl": queue_url, "MessageBody": body, "MessageAttributes": attributes}
        if queue_url.endswith(".fifo"):
            params["MessageDeduplicationId"] = _sha256(delivery.idempotency_key)
            params["MessageGroupId"] = _fit_sqs_id(self._group_id(delivery))
        with map_aws_errors("SQS", "SendMessage"):
            self.client.send_message(**params)

    def _group_id(self, delivery: Delivery) -> str:
        group = self.message_group_id
        if group is None:
            return delivery.instance_id
        return group(delivery) if callable(group) else group

    @staticmethod
    def _attributes(delivery: Delivery) -> dict[str, dict[str, str]]:
        values = {
            "idempotency_key": delivery.idempotency_key,
            "instance_id": delivery.instance_id,
            "send_id": delivery.send_id,
            "event": delivery.event,
            "caller_context": (None if delivery.caller_context is None
                               else to_json(delivery.caller_context, "the caller context")),
        }
        # SQS refuses an empty attribute value, so an absent one is left out
        return {ATTRIBUTE_PREFIX + name: _string_attribute(value) for name, value in values.items() if value}
