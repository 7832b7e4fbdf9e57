"""MemoryWakeup: the in-process wake-up backend (tests, and writer and sweeper in one process).

It implements both sides: the host's :class:`~statebound.host.wakeup.Wakeup` (``request``)
and the sweeper's :class:`~statebound.host.wakeup.WakeupSource` (``take_due``, ``next_ms``),
on a heap guarded by a lock. A condition variable lets a sweeper blocked in :meth:`wait`
wake as soon as an earlier request arrives. Nothing survives the process, which is fine:
the rows are the truth.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

from .wakeup import WakeupRequest

__all__ = ["MemoryWakeup"]


class MemoryWakeup:
    """Wake-ups held in memory until due.

    :param horizon_ms: see :class:`~statebound.host.wakeup.Wakeup`; ``None``: every row.
    """

    def __init__(self, horizon_ms: int | None = None) -> None:
        self.horizon_ms = horizon_ms
        self._heap: list[tuple[int, str, int]] = []
        self._changed = threading.Condition()
        #: every request received, in order (handy in tests)
        self.requested: list[WakeupRequest] = []

    def request(self, requests: Sequence[WakeupRequest], now_ms: int) -> None:
        """Hold each request until its due time."""
        with self._changed:
            for r in requests:
                heapq.heappush(self._heap, (r.due_at_ms, r.instance_id, r.ordinal))
                self.requested.append(r)
            self._changed.notify_all()

    def take_due(self, now_ms: int) -> list[WakeupRequest]:
        """Remove and return the requests due by ``now_ms``, earliest first."""
        out = []
        with self._changed:
            while self._heap and self._heap[0][0] <= now_ms:
                due, iid, ordinal = heapq.heappop(self._heap)
                out.append(WakeupRequest(iid, ordinal, due))
        return out

    def next_ms(self) -> int | None:
        """The earliest due time held, or ``None``."""
        with self._changed:
            return self._heap[0][0] if self._heap else None

    def wait(self, timeout_s: float) -> None:
        """Block until a request arrives or ``timeout_s`` passes (real time)."""
        with self._changed:
            self._changed.wait(timeout_s)

    def __len__(self) -> int:
        with self._changed:
            return len(self._heap)
