"""SQSWakeup: wake-ups as SQS messages with ``DelaySeconds`` (the ``aws`` extra).

The host calls :meth:`SQSWakeup.request` after a commit; each message becomes visible at
its rows' due time (``DelaySeconds`` is whole seconds, at most 900, rounded up so a message
never arrives early) and a Lambda function subscribed to the queue fires the rows
(:func:`statebound.dynamodb.lambda_handlers.handle_wakeup_event`). ``docs/dynamodb.md``
compares this with EventBridge Scheduler and DynamoDB Streams.

Message body (JSON, strict: no NaN)::

    {"statebound": "wakeup", "v": 1, "rows": [["<instance id>", <ordinal>, <due ms>], ...]}

Rows due in the same second share a message (up to :data:`ROWS_PER_MESSAGE`), messages go
ten to a ``SendMessageBatch``. A row further out than 900 s is sent with the full 900 s;
the handler finds it not due yet and asks again, so longer delays chain. The host only asks
for rows within ``horizon_ms`` (900 s by default); the scheduled fallback sweep asks for the
others when they come within reach (:func:`~statebound.dynamodb.lambda_handlers.fallback_sweep`).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ..exceptions import InvalidArgument, InvalidInstanceId, StoreUnavailable
from ..host.wakeup import WakeupRequest
from ._codec import check_id

__all__ = ["SQSWakeup", "MAX_DELAY_S", "ROWS_PER_MESSAGE", "decode_wakeup"]

#: SQS's longest ``DelaySeconds``.
MAX_DELAY_S = 900
#: Rows per message: a 1,000-byte id escaped to JSON is at most about 6 KB, so 32 rows stay
#: well inside SQS's 256 KB message limit.
ROWS_PER_MESSAGE = 32
#: Most messages, and bytes, one ``SendMessageBatch`` takes.
_BATCH_MESSAGES = 10
_BATCH_BYTES = 250_000
_MARK = "wakeup"


def decode_wakeup(body: str) -> list[WakeupRequest]:
    """The requests in one message body; a body that is not a statebound wake-up is a
    ``ValueError`` (it can never be processed: drop it).

    Strict, because whatever may send to the queue may send anything: each row must be an
    instance id this table can key on and two integers. Anything else raising later, in
    the handler, would fail the whole batch, and SQS would redeliver the good messages
    with it until they were dead-lettered.
    """
    try:
        data = json.loads(body, parse_constant=_refuse)
        if data.get("statebound") != _MARK or data.get("v") != 1:
            raise InvalidArgument("not a statebound wake-up (v1)")
        return [_request(row) for row in data["rows"]]
    except InvalidArgument:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, RecursionError, InvalidInstanceId) as exc:
        # ValueError: a row of the wrong length, and JSONDecodeError; RecursionError: a body
        # nested deeper than the parser goes
        raise InvalidArgument(f"malformed wake-up message: {type(exc).__name__}: {str(exc)[:200]}") from None


def _request(row: Any) -> WakeupRequest:
    iid, ordinal, due = row
    # the bounds the table's keys and due index hold: a row outside them cannot exist
    if not all(type(n) is int and 0 <= n <= _MAX_INT for n in (ordinal, due)):
        raise InvalidArgument(f"a row's ordinal and due time must be integers from 0 to 2**63 - 1, "
                              f"not {str(ordinal)[:40]} and {str(due)[:40]}")
    return WakeupRequest(check_id(iid), ordinal, due)


_MAX_INT = (1 << 63) - 1


def _refuse(token: str) -> Any:
    raise InvalidArgument(f"{token} is not JSON")


class SQSWakeup:
    """Send wake-ups to an SQS queue (standard; duplicates are harmless).

    :param queue_url: the queue's URL.
    :param client: a boto3 SQS client; by default one that gives up within seconds
        (``statebound.aws._client.QUICK_CALL``): a wake-up is sent after every commit.
        Thread-safe.
    :param horizon_ms: rows due later than this get no message from the host.
    """

    def __init__(self, queue_url: str, client: Any = None, *, horizon_ms: int | None = MAX_DELAY_S * 1000) -> None:
        if client is None:
            from ..aws._client import quick_client   # a request after every commit: never minutes
            client = quick_client("sqs")
        self.queue_url = queue_url
        self.client = client
        self.horizon_ms = horizon_ms
        #: messages sent so far (for metrics and tests)
        self.sent = 0
        # a sweeper's pool threads send after their commits: the count is added under a lock
        self._lock = threading.Lock()

    def messages(self, requests: Sequence[WakeupRequest], now_ms: int) -> list[tuple[int, str]]:
        """``(DelaySeconds, body)`` per message: rows grouped by the second they are due."""
        by_delay: dict[int, list[WakeupRequest]] = {}
        for r in requests:
            delay = min(MAX_DELAY_S, max(0, math.ceil((r.due_at_ms - now_ms) / 1000)))
            by_delay.setdefault(delay, []).append(r)
        out = []
        for delay, rows in sorted(by_delay.items()):
            for start in range(0, len(rows), ROWS_PER_MESSAGE):
                chunk = rows[start:start + ROWS_PER_MESSAGE]
                body = json.dumps({"statebound": _MARK, "v": 1,
                                   "rows": [[r.instance_id, r.ordinal, r.due_at_ms] for r in chunk]},
                                  allow_nan=False, separators=(",", ":"))
                out.append((delay, body))
        return out

    def request(self, requests: Sequence[WakeupRequest], now_ms: int) -> None:
        """Send the messages, ten to a batch.

        :raises StoreUnavailable: SQS refused a message or could not be reached (the host
            logs it; the rows are found by the fallback sweep).
        """
        messages = self.messages(requests, now_ms)
        batch: list[dict[str, Any]] = []
        size = 0
        for delay, body in messages:
            if batch and (len(batch) == _BATCH_MESSAGES or size + len(body) > _BATCH_BYTES):
                self._send(batch)
                batch, size = [], 0
            batch.append({"Id": str(len(batch)), "MessageBody": body, "DelaySeconds": delay})
            size += len(body)
        if batch:
            self._send(batch)

    def _send(self, entries: list[dict[str, Any]]) -> None:
        try:
            response = self.client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"SQS wake-up send failed: {exc}") from exc
        failed = response.get("Failed") or []
        with self._lock:
            self.sent += len(entries) - len(failed)
        if failed:
            reasons = sorted({f"{f.get('Code')}: {f.get('Message')}" for f in failed})
            raise StoreUnavailable(f"SQS refused {len(failed)} of {len(entries)} wake-up messages ({'; '.join(reasons)})")
