"""EventBridgeProcessor: a ``<send>`` becomes one EventBridge event (``PutEvents``).

The entry is::

    Source      the processor's source ("statebound" unless configured)
    DetailType  the send's event name
    Detail      the JSON envelope of statebound.aws._payload:
                {"event": ..., "data": ..., "metadata": {"idempotency_key": ..., ...}}
    EventBusName  the processor's bus, or the send's target

EventBridge gives every accepted entry a new event ``id``, so a retried delivery is a
new event there: rules and targets must dedup on ``detail.metadata.idempotency_key``.

``PutEvents`` answers 200 even when the entry failed; the failure is in the response
(``FailedEntryCount`` and the entry's ``ErrorCode``). ``InternalFailure``,
``ThrottlingException`` and codes AWS may add later are retried; the codes AWS lists as
not retryable (``MalformedDetail``, ``InvalidArgument``, ``AccessDeniedException``, the
``NotAuthorizedFor...`` pair...) are rejected.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import DeliveryFailed, DeliveryRejected
from ..host.processors import Delivery
from ._client import quick_client
from ._errors import log, map_aws_errors
from ._payload import KIB, check_size, choose_target, send_envelope, to_json

__all__ = ["EventBridgeProcessor", "EVENTBRIDGE_MAX_BYTES", "REJECTED_ENTRY_CODES"]

#: PutEvents' limit on one entry, counted as AWS documents it (Source + DetailType + Detail + Resources).
EVENTBRIDGE_MAX_BYTES = 256 * KIB

#: Entry error codes that AWS documents as not retryable.
REJECTED_ENTRY_CODES = frozenset({
    "AccessDeniedException", "InvalidAccountIdException", "InvalidArgument", "MalformedDetail",
    "RedactionFailure", "NotAuthorizedForSourceException", "NotAuthorizedForDetailTypeException",
})

_DETAIL_TYPE_MAX_CHARS = 128


class EventBridgeProcessor:
    """Publishes each delivery as one event on an EventBridge bus (``events:PutEvents``).

    ::

        host = sb.Host(charts, store, processors={"events": EventBridgeProcessor("orders-bus")})
        # <send type="events" event="OrderPlaced" namelist="order_id"/>

    :param event_bus_name: the bus name or ARN. ``None``: each ``<send>`` names its bus in
        ``target``. When given, a ``<send>`` whose target names another bus is rejected.
    :param source: the events' ``Source`` (must not start with ``aws.``).
    :param client: a boto3 EventBridge (``events``) client; ``None`` builds the default one.
    :param max_bytes: the entry size refused before the call.
    """

    def __init__(self, event_bus_name: str | None = "default", *, source: str = "statebound",
                 client: Any = None, max_bytes: int = EVENTBRIDGE_MAX_BYTES) -> None:
        self.event_bus_name = event_bus_name
        self.source = source
        self.max_bytes = max_bytes
        self.client = client if client is not None else quick_client("events")

    def deliver(self, delivery: Delivery) -> None:
        """Put one event; raise if its entry failed (see the module doc for which codes retry)."""
        bus = choose_target(self.event_bus_name, delivery.target, "event bus")
        if not delivery.event or len(delivery.event) > _DETAIL_TYPE_MAX_CHARS:
            raise DeliveryRejected("an EventBridge send needs an event name of 1 to 128 characters "
                                   "(it becomes the DetailType)")
        detail = to_json(send_envelope(delivery), "the send's event data")
        size = sum(len(part.encode("utf-8")) for part in (self.source, delivery.event, detail))
        check_size(size, self.max_bytes, "the EventBridge entry")
        entry = {"EventBusName": bus, "Source": self.source, "DetailType": delivery.event, "Detail": detail}
        with map_aws_errors("EventBridge", "PutEvents"):
            response = self.client.put_events(Entries=[entry])
        if response.get("FailedEntryCount", 0):
            result = (response.get("Entries") or [{}])[0]
            code = str(result.get("ErrorCode") or "unknown")
            if code in REJECTED_ENTRY_CODES:
                log.error("EventBridge PutEvents refused the entry: %s: %s", code, result.get("ErrorMessage", ""))
                raise DeliveryRejected(f"EventBridge PutEvents refused the entry ({code}); "
                                       "AWS's message is in the 'statebound.aws' log")
            log.warning("EventBridge PutEvents entry failed, will retry: %s: %s",
                        code, result.get("ErrorMessage", ""))
            raise DeliveryFailed(f"EventBridge PutEvents entry failed ({code}); it will be retried", code=code)
