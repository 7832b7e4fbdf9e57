"""The wire shape every built-in sends: strict JSON envelopes, size checks, target choice.

Every payload is **strict JSON**: ``NaN``, ``Infinity``, ``bytes`` and cycles are refused
with :class:`~statebound.PayloadNotJSON` before any call, and non-ASCII text is escaped
(``\\u00e9``), so the bytes are valid for every service (SQS refuses some code points
raw) and identical on every retry.

A send travels as the envelope::

    {"event": "order.paid", "data": {...},
     "metadata": {"idempotency_key": "order-1:3", "instance_id": "order-1",
                  "send_id": "notify", "caller_context": null}}

An invoke as::

    {"invokeid": "charge", "src": "charge-card", "data": {...}, "content": null,
     "metadata": {"idempotency_key": "order-1:charge:1", "instance_id": "order-1",
                  "invokeid": "charge", "caller_context": null}}

plus ``"token"`` in ``metadata`` when the function is to answer later (callback mode).
The ``attempt`` number is left out on purpose: a retry sends the same bytes.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from ..exceptions import DeliveryRejected, PayloadNotJSON, PayloadTooLarge
from ..host.processors import Delivery, InvokeRequest

__all__ = ["to_json", "from_json", "send_envelope", "invoke_envelope", "check_size", "choose_target",
           "KIB", "MIB"]

KIB = 1024
MIB = 1024 * KIB


def to_json(value: Any, what: str) -> str:
    """``value`` as compact, ASCII-only, strict JSON; :class:`PayloadNotJSON` if it is not JSON data."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=True)
    except (TypeError, ValueError, RecursionError) as exc:
        # the message names the Python type or "out of range float", never the value itself
        raise PayloadNotJSON(f"{what} is not strict JSON: {exc}") from exc


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def from_json(raw: bytes | str, what: str) -> Any:
    """Parse strict JSON (no ``NaN``/``Infinity``); :class:`PayloadNotJSON` otherwise."""
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PayloadNotJSON(f"{what} is not strict JSON") from exc


def send_envelope(delivery: Delivery) -> dict[str, Any]:
    """What a receiver gets for one ``<send>``: the event, its data, and the keys to dedup and correlate."""
    return {
        "event": delivery.event,
        "data": delivery.data,
        "metadata": {
            "idempotency_key": delivery.idempotency_key,
            "instance_id": delivery.instance_id,
            "send_id": delivery.send_id,
            "caller_context": delivery.caller_context,
        },
    }


def invoke_envelope(request: InvokeRequest, *, with_token: bool) -> dict[str, Any]:
    """What a function gets for one ``<invoke>``; the token only when it must answer later.

    The token equals the idempotency key and is no secret: it names the invocation so a
    stale answer is recognised. A function that answers synchronously returns its result
    and has no use for one.
    """
    metadata: dict[str, Any] = {
        "idempotency_key": request.idempotency_key,
        "instance_id": request.instance_id,
        "invokeid": request.invokeid,
        "caller_context": request.caller_context,
    }
    if with_token:
        metadata["token"] = request.token
    return {"invokeid": request.invokeid, "src": request.src, "data": request.data,
            "content": request.content, "metadata": metadata}


def check_size(size: int, limit: int, what: str) -> None:
    """:class:`PayloadTooLarge` when ``size`` bytes exceed ``limit``."""
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes, over the {limit}-byte limit; "
                              "send a reference (an S3 key) instead of the data", size=size, limit=limit)


def choose_target(configured: str | None, given: str | None, what: str) -> str:
    """The destination of one delivery: the processor's own, or the chart's ``target``/``src``.

    A processor built with a destination sends only there, so a chart cannot redirect
    its messages; one built without takes the chart's.
    """
    if configured is None:
        if not given:
            raise DeliveryRejected(f"no {what}: give one to the processor, or as the chart's target/src")
        return given
    if given and given != configured:
        raise DeliveryRejected(f"this processor only sends to its own {what}, not to the chart's {given!r}")
    return configured
