"""Hosts, stores and clocks: where positions and timers are kept between drives."""

from .clock import Clock, ManualClock, SystemClock
from .memory import MemoryStore
from .store import Commit, PositionRecord, PositionWrite, Store, TimerCompletion, TimerRef, TimerRow

__all__ = ["Clock", "ManualClock", "SystemClock", "MemoryStore", "Store", "Commit",
           "PositionRecord", "PositionWrite", "TimerCompletion", "TimerRef", "TimerRow"]
