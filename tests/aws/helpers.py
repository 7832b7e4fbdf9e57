"""Plain helpers shared by the AWS processor tests (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import copy
from typing import Any

from statebound.host.processors import Delivery, InvokeRequest

REGION = "us-east-1"


def make_delivery(**fields: Any) -> Delivery:
    """A Delivery as the outbox would hand it over; any field can be overridden."""
    values: dict[str, Any] = {
        "idempotency_key": "order-1:3", "instance_id": "order-1", "ordinal": 3, "send_id": "notify",
        "type": "test", "target": None, "event": "order.placed", "data": {"order_id": 7, "total": 12.5},
        "caller_context": None, "attempt": 1,
    }
    values.update(fields)
    return Delivery(**values)


def make_request(**fields: Any) -> InvokeRequest:
    """An InvokeRequest as the outbox would hand it over; any field can be overridden."""
    values: dict[str, Any] = {
        "idempotency_key": "order-1:charge:1", "instance_id": "order-1", "invokeid": "charge",
        "token": "tok-123", "type": "lambda", "src": None, "data": {"amount": 12.5},
        "content": None, "caller_context": None, "attempt": 1,
    }
    values.update(fields)
    return InvokeRequest(**values)


class Requests:
    """Records the parameters of every call a client makes, as the caller passed them."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        service = client.meta.service_model.service_name
        client.meta.events.register(f"provide-client-params.{service}", self._record)

    def _record(self, params: dict[str, Any], model: Any, **kwargs: Any) -> None:
        self.calls.append((model.name, copy.deepcopy(params)))

    def of(self, operation: str) -> list[dict[str, Any]]:
        """The parameters of every ``operation`` call, in order."""
        return [params for name, params in self.calls if name == operation]

    def only(self, operation: str) -> dict[str, Any]:
        """The parameters of the one ``operation`` call made, and no other call before it."""
        assert [name for name, _ in self.calls][:1] == [operation] and len(self.of(operation)) == 1
        return self.calls[0][1]
