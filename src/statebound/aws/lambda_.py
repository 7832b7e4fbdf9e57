"""Lambda as a send processor (:class:`LambdaProcessor`) and as an invoke handler (:class:`LambdaInvoker`).

``LambdaProcessor`` invokes asynchronously (``InvocationType="Event"``) with the send
envelope; Lambda queues the event and answers 202. What the function does with it is
Lambda's business (its own retries, its dead-letter queue); the function must dedup on
``metadata.idempotency_key``.

``LambdaInvoker`` serves ``<invoke type="lambda" src="function-name">`` in one of two modes:

* **sync** (the default): ``InvocationType="RequestResponse"``; the function's JSON
  result becomes the ``done.invoke.<id>`` data.
* **callback** (``callback=True``): ``InvocationType="Event"`` with the invoke token in the payload; ``start``
  returns :class:`~statebound.host.processors.Pending` and the function (or whatever it
  hands the token to) finishes the invocation later with ``host.complete_invoke`` or
  ``host.fail_invoke``. For work longer than a host should block on.

Which failures retry (the decision, argued in ``docs/aws-processors.md``):

* the function raised (``FunctionError``): :class:`DeliveryFailed`, retried. It may have
  timed out or met a passing outage, and it is idempotent on the key by contract;
* ... unless its ``errorType`` is in ``fatal_errors`` (the author says it is final) or is
  a runtime set-up error (``Runtime.ImportModuleError``...: broken code does not mend
  itself between retries): :class:`DeliveryRejected`;
* a result that is not strict JSON: :class:`~statebound.PayloadNotJSON`;
* throttled, a 5xx, the function still being updated: :class:`DeliveryFailed`;
* a missing function, no permission, an invalid request: :class:`DeliveryRejected`.

The function's ``errorMessage`` is its own text and may hold anything; like AWS's
messages it goes to the ``statebound.aws`` log, not into the raised error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import boto3
from botocore.config import Config

from ..exceptions import DeliveryFailed, DeliveryRejected
from ..host.processors import Delivery, InvokeRequest, Pending
from ._client import quick_client
from ._errors import log, map_aws_errors
from ._payload import KIB, MIB, check_size, choose_target, from_json, invoke_envelope, send_envelope, to_json

__all__ = ["LambdaProcessor", "LambdaInvoker", "LAMBDA_ASYNC_MAX_BYTES", "LAMBDA_SYNC_MAX_BYTES",
           "RUNTIME_SETUP_ERRORS"]

#: The request payload limit for ``InvocationType="Event"`` that holds in every region
#: (AWS has since raised it to 1 MB; pass ``max_bytes`` to use more).
LAMBDA_ASYNC_MAX_BYTES = 256 * KIB
#: The request payload limit for ``InvocationType="RequestResponse"``.
LAMBDA_SYNC_MAX_BYTES = 6 * MIB

#: ``errorType`` values the runtime reports when the code cannot even start.
RUNTIME_SETUP_ERRORS = frozenset({
    "Runtime.ImportModuleError", "Runtime.HandlerNotFound", "Runtime.UserCodeSyntaxError",
    "Runtime.MalformedHandlerName", "Runtime.InvalidEntrypoint",
})

# Lambda runs a function for up to 900 s. botocore's default 60 s read timeout would give
# up on a longer synchronous call *and retry it*, running the function again.
_SYNC_CLIENT_CONFIG = Config(read_timeout=910, connect_timeout=10)


def _invoke(client: Any, function: str, qualifier: str | None, invocation_type: str,
            payload: str) -> dict[str, Any]:
    params: dict[str, Any] = {"FunctionName": function, "InvocationType": invocation_type,
                              "Payload": payload.encode("ascii")}
    if qualifier is not None:
        params["Qualifier"] = qualifier
    with map_aws_errors("Lambda", "Invoke"):
        response: dict[str, Any] = client.invoke(**params)
        if "Payload" in response:
            # reading the stream is part of the call: a connection can drop here too
            response = {**response, "Payload": response["Payload"].read()}
    return response


class LambdaProcessor:
    """Sends each delivery to a Lambda function, asynchronously (``lambda:InvokeFunction``).

    ::

        host = sb.Host(charts, store, processors={"notify": LambdaProcessor("notify-fn")})

    :param function_name: the function name or ARN. ``None``: each ``<send>`` names it in
        ``target``. When given, a ``<send>`` whose target names another function is rejected.
    :param qualifier: a version or alias to invoke.
    :param client: a boto3 Lambda client; ``None`` builds the default one.
    :param max_bytes: the payload size refused before the call.
    """

    def __init__(self, function_name: str | None = None, *, qualifier: str | None = None,
                 client: Any = None, max_bytes: int = LAMBDA_ASYNC_MAX_BYTES) -> None:
        self.function_name = function_name
        self.qualifier = qualifier
        self.max_bytes = max_bytes
        self.client = client if client is not None else quick_client("lambda")

    def deliver(self, delivery: Delivery) -> None:
        """Queue one asynchronous invocation with the send envelope as its event."""
        function = choose_target(self.function_name, delivery.target, "function")
        payload = to_json(send_envelope(delivery), "the send's event data")
        check_size(len(payload), self.max_bytes, "the Lambda event payload")
        _invoke(self.client, function, self.qualifier, "Event", payload)


class LambdaInvoker:
    """Serves ``<invoke type=...>`` by invoking a Lambda function (``lambda:InvokeFunction``).

    ::

        host = sb.Host(charts, store, invokers={"lambda": LambdaInvoker()})
        # <invoke type="lambda" src="charge-card"><param name="amount" expr="total"/></invoke>

    :param function_name: the function name or ARN. ``None``: each ``<invoke>`` names it in
        ``src``. When given, an ``<invoke>`` whose ``src`` names another function is rejected.
    :param callback: ``False`` (sync: the result is the ``done.invoke`` data) or ``True``
        (queue the invocation, return :class:`Pending`, and let the function answer
        through ``host.complete_invoke``/``fail_invoke`` with the token it was given).
    :param qualifier: a version or alias to invoke.
    :param fatal_errors: ``errorType`` names that will never succeed on retry (a declined
        card, a validation error): the invocation is rejected at once instead of retried.
    :param client: a boto3 Lambda client; ``None`` builds one whose read timeout outlasts
        the longest function (botocore would otherwise retry a slow call, running it twice).
    :param max_bytes: the payload size refused before the call; by default 6 MiB in sync
        mode and 256 KiB in callback mode.
    """

    def __init__(self, function_name: str | None = None, *, callback: bool = False, qualifier: str | None = None,
                 fatal_errors: Iterable[str] = (), client: Any = None, max_bytes: int | None = None) -> None:
        self.function_name = function_name
        self.callback = callback
        self.qualifier = qualifier
        self.fatal_errors = frozenset(fatal_errors)
        if max_bytes is None:
            max_bytes = LAMBDA_ASYNC_MAX_BYTES if callback else LAMBDA_SYNC_MAX_BYTES
        self.max_bytes = max_bytes
        self.client = client if client is not None else boto3.client("lambda", config=_SYNC_CLIENT_CONFIG)

    def start(self, request: InvokeRequest) -> Any:
        """Invoke the function; return its result (sync) or :class:`Pending` (callback)."""
        function = choose_target(self.function_name, request.src, "function")
        payload = to_json(invoke_envelope(request, with_token=self.callback), "the invoke's data")
        check_size(len(payload), self.max_bytes, "the Lambda invoke payload")
        if self.callback:
            _invoke(self.client, function, self.qualifier, "Event", payload)
            return Pending(note=f"Lambda {function} answers with the invoke token")
        response = _invoke(self.client, function, self.qualifier, "RequestResponse", payload)
        raw = response.get("Payload") or b""
        if response.get("FunctionError"):
            self._raise_function_error(function, response["FunctionError"], raw)
        if not raw.strip():
            return None
        return from_json(raw, f"the result of Lambda {function}")

    def _raise_function_error(self, function: str, kind: str, raw: bytes) -> None:
        try:
            error = from_json(raw, "the function error")
        except DeliveryRejected:
            error = None
        if not isinstance(error, dict):
            error = {}
        error_type = str(error.get("errorType") or kind)
        log.warning("Lambda %s raised %s (%s): %s", function, error_type, kind, error.get("errorMessage", ""))
        if error_type in self.fatal_errors or error_type in RUNTIME_SETUP_ERRORS:
            raise DeliveryRejected(f"Lambda {function} failed with {error_type}, which retrying cannot mend")
        raise DeliveryFailed(f"Lambda {function} failed with {error_type}; it will be retried", code=error_type)
