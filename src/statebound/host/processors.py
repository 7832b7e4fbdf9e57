"""Send processors and invoke handlers: the seams through which a chart acts on the world.

A host is given them by type name::

    host = sb.Host(charts, store,
                   processors={"sqs": SQSProcessor(queue_url), "app": my_callable},
                   invokers={"payment": PaymentHandler()})

``<send type="sqs" ...>`` to a registered processor type, and ``<invoke type="payment">``
to a registered handler type, become **outbox rows** committed in the same transaction
as the position that asked for them. The host (right after its commit) and the sweeper
(as the safety net) hand each row to its processor or handler **at least once**, with a
stable idempotency key, so a receiver that remembers the key acts exactly once.

This module only declares the contract, the way ``host/store.py`` declares the store's:
the values handed over (:class:`Delivery`, :class:`InvokeRequest`), the two protocols
(:class:`SendProcessor`, :class:`InvokeHandler`) and :class:`Pending`. Built-ins that
need boto3 live under the ``aws`` extra, one per file; a plain Python callable is
accepted wherever a :class:`SendProcessor` is.

Failure rules (the receiver's side of the contract):

* raising any exception means "try again later": the row is released with backoff and
  retried, up to the host's ``max_attempts``;
* raising :class:`~statebound.DeliveryRejected` means "never going to work": the row is
  parked as dead at once;
* a row that is parked dead gives the sending instance ``error.communication`` (for a
  send, with ``sendid``) or ``error.execution`` (for an invoke), unless it has halted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Delivery", "InvokeRequest", "Pending", "SendProcessor", "InvokeHandler"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One ``<send>`` to a registered processor, as handed to it (perhaps more than once).

    :ivar idempotency_key: stable across every retry of this send, and unique per send:
        ``"{instance_id}:{ordinal}"``. A receiver that has seen it must not act again.
    :ivar instance_id: the sending instance.
    :ivar ordinal: the outbox row's ordinal (its key within the instance).
    :ivar send_id: the ``<send>``'s id (author-written or generated).
    :ivar type: the processor type name it was registered under.
    :ivar target: the evaluated ``target``/``targetexpr``, or ``None``.
    :ivar event: the evaluated ``event``/``eventexpr``, or ``None``.
    :ivar data: the payload: the ``<param>``/``namelist`` mapping or the ``<content>`` value.
    :ivar caller_context: the opaque host value of the event that caused the send
        (correlation ids, a ``traceparent``); never read by statebound.
    :ivar attempt: 1 on the first delivery, then 2, 3, ...
    """

    idempotency_key: str
    instance_id: str
    ordinal: int
    send_id: str
    type: str
    target: str | None
    event: str | None
    data: Any
    caller_context: Any = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class InvokeRequest:
    """One ``<invoke>`` of a registered handler type, as handed to the handler.

    :ivar idempotency_key: stable across retries of this start: ``"{instance_id}:{invokeid}:{generation}"``.
    :ivar instance_id: the invoking instance.
    :ivar invokeid: the invoke id (author-written or generated).
    :ivar token: what :meth:`~statebound.Host.complete_invoke` and
        :meth:`~statebound.Host.fail_invoke` accept to finish this invocation later (the
        task-token pattern); a result presented with a stale token is discarded.
    :ivar type: the handler type name it was registered under.
    :ivar src: the evaluated ``src``/``srcexpr``, or ``None``.
    :ivar data: the ``<param>``/``namelist`` values.
    :ivar content: the ``<content>`` value, or ``None``.
    :ivar caller_context: the opaque host value of the event that entered the state.
    :ivar attempt: 1 on the first start, then 2, 3, ...
    """

    idempotency_key: str
    instance_id: str
    invokeid: str
    token: str
    type: str
    src: str | None
    data: dict[str, Any]
    content: Any = None
    caller_context: Any = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Pending:
    """Returned by :meth:`InvokeHandler.start` to say "I will answer later".

    The invocation stays open until someone calls ``host.complete_invoke`` or
    ``host.fail_invoke`` with the request's ``token`` (a Lambda function, a person, a
    batch job), or until the invoking state is exited, which cancels it.
    """

    note: str | None = None


@runtime_checkable
class SendProcessor(Protocol):
    """Delivers ``<send>``s of one type. A plain ``callable(delivery)`` is accepted too."""

    def deliver(self, delivery: Delivery) -> None:
        """Hand the send to the outside world. Must be idempotent on ``delivery.idempotency_key``.

        Return to acknowledge; raise to have it retried; raise
        :class:`~statebound.DeliveryRejected` to give up at once.
        """
        ...


@runtime_checkable
class InvokeHandler(Protocol):
    """Serves ``<invoke type=...>`` of one type: ``start``, and optionally ``cancel(request)``
    and ``forward(delivery)``.

    ``start`` runs at least once per invocation (idempotent on ``request.idempotency_key``).
    It returns the result data, delivered to the chart as ``done.invoke.<invokeid>``, or a
    :class:`Pending` to finish later. A ``cancel(request)`` method, if present, is called
    (best effort, once) when the invoking state is exited before a result arrived. A
    ``forward(delivery)`` method, if present, receives the events the chart autoforwards or
    sends to ``#_<invokeid>``, at least once each, like a :class:`SendProcessor`.
    """

    def start(self, request: InvokeRequest) -> Any:
        """Start the work; return its result, or :class:`Pending`. Raise as for a :class:`SendProcessor`."""
        ...
