"""Translation of botocore errors into statebound errors, and the retry loop for throttling.

Every DynamoDB call in this package runs inside :func:`map_dynamodb_errors` (usually via
:func:`call`), so only :mod:`statebound.exceptions` errors leave the package and the host
can retry a :class:`~statebound.ConflictError` without importing botocore::

    botocore error                                    statebound error
    ConditionalCheckFailedException                   ConflictError
    TransactionCanceledException, a condition failed  ConflictError (naming the item)
    TransactionCanceledException, conflict/throttle   retried, then StoreUnavailable
    ProvisionedThroughputExceeded, Throttling,
      RequestLimitExceeded, TransactionConflict,
      TransactionInProgress, InternalServerError      retried, then StoreUnavailable
    ValidationException "Item size has exceeded"      ItemTooLarge
    ResourceNotFoundException                         StoreUnavailable (table missing)
    other ClientError                                 StoreError
    connection/credential errors (BotoCoreError)      StoreUnavailable
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from ..exceptions import ConflictError, ItemTooLarge, StoreError, StoreUnavailable

__all__ = ["ActionInfo", "Throttled", "map_dynamodb_errors", "call", "error_code"]

#: Error codes that mean "try again later", never "your request was wrong".
RETRYABLE_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "TransactionConflictException", "TransactionInProgressException", "InternalServerError",
    "ServiceUnavailable", "LimitExceededException",
})
#: Cancellation reason codes (inside TransactionCanceledException) worth a retry.
RETRYABLE_REASONS = frozenset({
    "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded",
    "RequestLimitExceeded", "InternalServerError",
})


class Throttled(StoreUnavailable):
    """Internal: the call may succeed if retried. :func:`call` retries it and, when the
    retries run out, raises a plain :class:`StoreUnavailable` from it."""


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """What one write action is, so a cancellation reason can be pinned on an item.

    :ivar kind: ``"position"``, ``"create"`` (a position that must not exist),
        ``"timer_put"``, ``"timer_state"`` (a put conditional on the row's state),
        ``"complete"``, ``"delete"`` or ``"other"``.
    :ivar instance_id: the instance the item belongs to.
    :ivar ordinal: the timer ordinal, for timer actions.
    """

    kind: str
    instance_id: str | None = None
    ordinal: int | None = None

    def conflict(self, old_item: dict[str, Any] | None) -> ConflictError:
        """The :class:`ConflictError` for a failed condition on this action."""
        current = None
        if old_item and "version" in old_item:
            current = int(old_item["version"]["N"])
        iid = self.instance_id
        if self.kind == "create":
            return ConflictError(f"instance {iid!r} already exists", iid, current)
        if self.kind == "position":
            return ConflictError(f"version of {iid!r} moved", iid, current)
        # A timer condition is not a version move, so, as in MemoryStore, no instance_id:
        # the host must not take it for "reload that instance and retry".
        key = (iid, self.ordinal)
        if self.kind == "complete":
            return ConflictError(f"timer {key} is no longer claimable")
        if self.kind == "timer_put":
            return ConflictError(f"timer row {key} already exists")
        if self.kind == "timer_state":
            return ConflictError(f"timer row {key} changed state")
        return ConflictError(f"a condition on {iid!r} failed", iid, current)


def error_code(exc: ClientError) -> str:
    """The AWS error code of a ClientError."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def _translate(exc: ClientError, actions: Sequence[ActionInfo] | None) -> StoreError:
    code = error_code(exc)
    message = exc.response.get("Error", {}).get("Message", str(exc))
    if code == "ConditionalCheckFailedException":
        info = actions[0] if actions else ActionInfo("other")
        return info.conflict(exc.response.get("Item"))
    if code == "TransactionCanceledException":
        reasons = exc.response.get("CancellationReasons") or []
        failed = [(actions[i] if actions and i < len(actions) else ActionInfo("other"), r)
                  for i, r in enumerate(reasons) if r.get("Code") == "ConditionalCheckFailed"]
        if failed:
            # When the fired row is done *and* the version moved, report the row: a
            # reload-and-retry cannot succeed, so that is what the caller must hear.
            failed.sort(key=lambda f: f[0].kind != "complete")
            info, reason = failed[0]
            return info.conflict(reason.get("Item"))
        if any("size" in str(r.get("Message", "")).lower() for r in reasons):
            return ItemTooLarge(f"DynamoDB refused the transaction: {message}")
        codes = {r.get("Code") for r in reasons}
        if codes & RETRYABLE_REASONS:
            return Throttled(f"DynamoDB transaction cancelled ({', '.join(sorted(map(str, codes)))})")
        return StoreError(f"DynamoDB transaction cancelled: {message}")
    if code in RETRYABLE_CODES:
        return Throttled(f"DynamoDB {code}: {message}")
    if code == "ValidationException" and "size" in message.lower() and "exceed" in message.lower():
        # our estimate should have refused it first; this is the backstop
        return ItemTooLarge(f"DynamoDB refused the write: {message}")
    if code == "ItemCollectionSizeLimitExceededException":
        return ItemTooLarge(f"DynamoDB item collection too large: {message}")
    if code == "ResourceNotFoundException":
        return StoreUnavailable(f"DynamoDB table or index not found ({message}); "
                                "create it with DynamoStore.create_table()")
    return StoreError(f"DynamoDB {code or 'error'}: {message}")


@contextmanager
def map_dynamodb_errors(actions: Sequence[ActionInfo] | None = None) -> Iterator[None]:
    """Translate botocore errors raised in the block into statebound errors (``from`` them).

    :param actions: for a write, what each action is (in request order), so a failed
        condition becomes a :class:`ConflictError` naming the instance.
    """
    try:
        yield
    except ClientError as exc:
        raise _translate(exc, actions) from exc
    except ParamValidationError as exc:
        # a request botocore refuses to send is a bug on our side, not an outage
        raise StoreError(f"invalid DynamoDB request: {exc}") from exc
    except BotoCoreError as exc:
        raise StoreUnavailable(f"DynamoDB call failed: {exc}") from exc


def call(fn: Callable[..., Any], *, actions: Sequence[ActionInfo] | None = None,
         attempts: int = 4, base_delay_s: float = 0.05,
         sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> Any:
    """Call ``fn(**kwargs)`` with errors mapped, retrying :class:`Throttled` with backoff.

    botocore already retries throttling inside one call; this outer loop adds a few
    longer, jittered waits (``base_delay_s * 2**n``) and then gives up with
    :class:`StoreUnavailable`, so a hot partition degrades into a typed error, not a hang.
    The same ``kwargs`` are resent, which keeps a ``ClientRequestToken`` stable.
    """
    for attempt in range(attempts):
        try:
            with map_dynamodb_errors(actions):
                return fn(**kwargs)
        except Throttled as exc:
            if attempt == attempts - 1:
                raise StoreUnavailable(f"{exc} (gave up after {attempts} attempts)") from exc
            # the jitter keeps two throttled sweepers from retrying in lockstep
            sleep(base_delay_s * (2 ** attempt) * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")  # pragma: no cover
