"""Clocks for the host and the sweeper. The pure core never reads time."""

from __future__ import annotations

import math
import time
from typing import Any, Protocol, runtime_checkable

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

    :param now_ms: the starting time, epoch milliseconds (a fraction is dropped).
    :raises InvalidArgument: a time or a step that is not a finite number.
    """

    def __init__(self, now_ms: float = 0) -> None:
        self._now = _ms(now_ms, "the starting time")

    def now_ms(self) -> int:
        """The clock's current reading."""
        return self._now

    def advance(self, ms: float) -> int:
        """Move forward by ``ms`` milliseconds; returns the new time. Refuses to go back."""
        step = _ms(ms, "advance()'s step")
        if step < 0:
            raise InvalidArgument("ManualClock cannot move backwards")
        self._now += step
        return self._now

    def set(self, now_ms: float) -> int:
        """Jump to ``now_ms``; refuses to go back in time."""
        when = _ms(now_ms, "set()'s time")
        if when < self._now:
            raise InvalidArgument(f"ManualClock cannot move backwards ({now_ms} < {self._now})")
        self._now = when
        return self._now

    def sleep(self, seconds: float) -> None:
        """Advance instead of sleeping, so loops under test never block."""
        if seconds > 0:
            self.advance(seconds * 1000)


def _ms(value: Any, what: str) -> int:
    """A reading or a step of a ManualClock: a finite number, in whole milliseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number of milliseconds, not {value!r}")
    return int(value)
