"""Translation of botocore errors, at the boundary, into the outbox's two answers.

A built-in processor or handler may only say "try again later" (:class:`DeliveryFailed`)
or "this will never work" (:class:`DeliveryRejected`); the outbox decides the rest::

    botocore error                                         statebound error
    HTTP 5xx, HTTP 429, a throttling or "not ready" code   DeliveryFailed (retried with backoff)
    any other ClientError (validation, permission,
      missing queue/bus/function: HTTP 4xx)                DeliveryRejected (parked dead at once)
    ParamValidationError (botocore refused to send it)     DeliveryRejected
    connection, timeout or credential errors               DeliveryFailed

AWS's own error message can name accounts, roles and resource ARNs, so it goes to the
``statebound.aws`` log only. The raised error says which service and which error code,
nothing more; the botocore error stays attached as ``__cause__`` for tracebacks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from ..exceptions import DeliveryFailed, DeliveryRejected

__all__ = ["RETRYABLE_CODES", "map_aws_errors", "retryable", "log"]

log = logging.getLogger("statebound.aws")

#: Error codes that mean "not now", whatever HTTP status they came with.
RETRYABLE_CODES = frozenset({
    # throttling, across services
    "Throttling", "ThrottlingException", "ThrottledException", "TooManyRequestsException",
    "RequestThrottled", "RequestLimitExceeded", "RequestThrottledException",
    "AWS.SimpleQueueService.RequestThrottled", "KmsThrottled", "KMSThrottlingException",
    "EC2ThrottledException", "SlowDown",
    # the service is busy or broken, not the request
    "InternalFailure", "InternalError", "InternalServerError", "ServiceException",
    "ServiceUnavailable", "ServiceUnavailableException", "RequestTimeout", "RequestTimeoutException",
    # Lambda: the function is being created or updated; it will be ready shortly
    "ResourceNotReadyException", "ResourceConflictException",
})


def retryable(code: str, status: int | None) -> bool:
    """Whether an AWS error with this code and HTTP status is worth another attempt."""
    return code in RETRYABLE_CODES or status == 429 or (status is not None and status >= 500)


def _translate(exc: ClientError, service: str, operation: str) -> DeliveryRejected | DeliveryFailed:
    error = exc.response.get("Error", {})
    code = str(error.get("Code") or "error")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    aws_message = error.get("Message", "")
    if retryable(code, status):
        log.warning("%s %s failed, will retry: %s (HTTP %s): %s", service, operation, code, status, aws_message)
        return DeliveryFailed(f"{service} {operation} failed ({code}); it will be retried", code=code)
    log.error("%s %s refused: %s (HTTP %s): %s", service, operation, code, status, aws_message)
    return DeliveryRejected(f"{service} {operation} was refused ({code}); AWS's message is in the "
                            "'statebound.aws' log")


@contextmanager
def map_aws_errors(service: str, operation: str) -> Iterator[None]:
    """Turn botocore errors raised in the block into :class:`DeliveryFailed` or :class:`DeliveryRejected`."""
    try:
        yield
    except ClientError as exc:
        raise _translate(exc, service, operation) from exc
    except ParamValidationError as exc:
        # botocore's text quotes the offending values, which are the chart's data
        log.error("%s %s: botocore refused the parameters: %s", service, operation, exc)
        raise DeliveryRejected(f"{service} {operation}: the request parameters are invalid "
                               "(details in the 'statebound.aws' log)") from exc
    except BotoCoreError as exc:
        log.warning("%s %s could not reach AWS, will retry: %s", service, operation, exc)
        raise DeliveryFailed(f"{service} {operation} could not reach AWS ({type(exc).__name__}); "
                             "it will be retried", code=type(exc).__name__) from exc
