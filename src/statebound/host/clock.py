"""Clocks for the host and the sweeper. The pure core never reads time."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from ..exceptions import InvalidArgument

__all__ = ["Clock", "SystemClock", "ManualClock"]


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the time in epoch milliseconds and can sleep."""

    def now_ms(self) -> int:
        """Current time, epoch milliseconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a manual clock advances instead)."""
        ...


class SystemClock:
    """Wall-clock time (``time.time``), real sleeps."""

    def now_ms(self) -> int:
        """Current wall-clock time in epoch milliseconds."""
        return time.time_ns() // 1_000_000

    def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to. For tests and the conformance harness.

    :param now_ms: the starting time, epoch milliseconds.
    """

    def __init__(self, now_ms: int = 0) -> None:
        self._now = int(now_ms)

    def now_ms(self) -> int:
        """The clock's current reading."""
        return self._now

    def advance(self, ms: int) -> int:
        """Move forward by ``ms`` milliseconds; returns the new time. Refuses to go back."""
        if ms < 0:
            raise InvalidArgument("ManualClock cannot move backwards")
        self._now += int(ms)
        return self._now

    def set(self, now_ms: int) -> int:
        """Jump to ``now_ms``; refuses to go back in time."""
        if now_ms < self._now:
            raise InvalidArgument(f"ManualClock cannot move backwards ({now_ms} < {self._now})")
        self._now = int(now_ms)
        return self._now

    def sleep(self, seconds: float) -> None:
        """Advance instead of sleeping, so loops under test never block."""
        if seconds > 0:
            self.advance(int(seconds * 1000))
