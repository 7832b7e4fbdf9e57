"""Counters: the running totals behind ``Host.metrics``, safe to add to from many threads.

A sweeper with ``workers > 1`` fires rows of one host from a thread pool, and every fire
adds to the host's totals. ``d[k] = d.get(k, 0) + 1`` reads and writes in two steps, and
a thread switch between them loses the other thread's count, so every addition goes
through :meth:`Counters.add`, under one lock. Reading stays a plain dict read, so
``host.metrics["fired"]`` and ``dict(host.metrics)`` work as they always did.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["Counters"]


class Counters(dict[str, int]):
    """A ``dict`` of named totals whose additions are atomic (see the module doc).

    Assigning an item directly still works, but is not atomic with other additions: add
    with :meth:`add`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the total called ``name`` (a missing total counts from 0)."""
        with self._lock:
            self[name] = self.get(name, 0) + n

    def add_many(self, counts: dict[str, int]) -> None:
        """Add several totals under one lock (a group commit counts its units at once)."""
        with self._lock:
            for name, n in counts.items():
                self[name] = self.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        """A plain copy, consistent across names (taken under the lock)."""
        with self._lock:
            return dict(self)

    def __reduce__(self) -> Any:
        # the lock cannot be copied or pickled: a copy gets a lock of its own
        return (Counters, (dict(self),))
