"""Wake-ups: how a timer row written in one process is fired on time by a sweeper elsewhere.

The row in the store is the truth; a wake-up is only a hint that a row is worth firing at
a given time. After every successful commit the host asks its :class:`Wakeup` backend for
one per pending row the commit wrote that is due within the backend's ``horizon_ms``
(and per row a failed delivery released for a later attempt). Whoever receives it calls
:meth:`statebound.Sweeper.handle_wakeups`, which reads each named row by its key (one
consistent read, no index, no scan) and fires it if it is still pending and ready. So:

* a **lost** wake-up costs latency: the row still fires at the sweeper's next fallback
  read of its shard (``DynamoStore(fallback_ms=...)``);
* a **duplicated** or **stale** wake-up (the row fired, was cancelled, or was re-armed
  for later) costs one empty read; a row not due yet is asked for again at its time.

Backends, one per file: :class:`~statebound.host.memory_wakeup.MemoryWakeup` (in-process:
tests, and a writer and sweeper in one process) and
:class:`statebound.dynamodb.SQSWakeup` (SQS messages with ``DelaySeconds``, the ``aws``
extra). ``docs/dynamodb.md`` explains the choice of SQS over EventBridge Scheduler and
DynamoDB Streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .store import TimerKey

__all__ = ["WakeupRequest", "Wakeup", "WakeupSource", "wakeups_for"]


@dataclass(frozen=True, slots=True)
class WakeupRequest:
    """Fire the row ``(instance_id, ordinal)`` at ``due_at_ms`` (epoch ms)."""

    instance_id: str
    ordinal: int
    due_at_ms: int

    @property
    def key(self) -> TimerKey:
        """The row's key."""
        return (self.instance_id, self.ordinal)


@runtime_checkable
class Wakeup(Protocol):
    """Where the host sends wake-ups (see the module doc).

    :ivar horizon_ms: rows due further out than this get no wake-up from the host; the
        sweeper's fallback asks for theirs when they come within reach (``None``: no limit).
    """

    horizon_ms: int | None

    def request(self, requests: Sequence[WakeupRequest], now_ms: int) -> None:
        """Arrange for each request to reach a sweeper at (or just after) its due time.

        May raise: the host logs the failure and carries on, since the commit has landed
        and the row will be found by the fallback.
        """
        ...


@runtime_checkable
class WakeupSource(Protocol):
    """A wake-up backend a sweeper in the same process can drain (``Sweeper(wakeups=)``)."""

    def take_due(self, now_ms: int) -> list[WakeupRequest]:
        """Remove and return the requests due by ``now_ms``."""
        ...

    def next_ms(self) -> int | None:
        """When the earliest request held is due, or ``None``."""
        ...


def wakeups_for(due: Iterable[tuple[TimerKey, int]], now_ms: int, horizon_ms: int | None) -> list[WakeupRequest]:
    """The wake-ups for rows ``(key, ready_at_ms)`` that are ready within ``horizon_ms``
    of ``now_ms`` (``None``: all), whatever the row's kind (timer, spilled event, outbox)."""
    return [WakeupRequest(key[0], key[1], ready) for key, ready in due
            if horizon_ms is None or ready - now_ms <= horizon_ms]
