"""Hosts, stores and clocks: where positions and timers are kept between drives."""

from .clock import Clock, ManualClock, SystemClock
from .batch import SendResult
from .host import FireResult, Host, child_instance_id
from .memory import MemoryStore
from .memory_wakeup import MemoryWakeup
from .migration import MigrationResult
from .processors import Delivery, InvokeHandler, InvokeRequest, Pending, SendProcessor
from .store import (BatchStore, Commit, KeyRecord, PositionRecord, PositionWrite, RowClaimStore, Store,
                    TimerCompletion, TimerRef, TimerRow)
from .sweeper import SweepReport, Sweeper, SweeperMetrics
from .wakeup import Wakeup, WakeupRequest, WakeupSource

__all__ = ["Clock", "ManualClock", "SystemClock", "Host", "FireResult", "SendResult", "child_instance_id",
           "MemoryStore", "Store", "BatchStore", "RowClaimStore", "Commit", "KeyRecord", "PositionRecord", "PositionWrite",
           "TimerCompletion", "TimerRef", "TimerRow", "Sweeper", "SweepReport", "SweeperMetrics", "MigrationResult",
           "Wakeup", "WakeupRequest", "WakeupSource", "MemoryWakeup",
           "Delivery", "InvokeRequest", "Pending", "SendProcessor", "InvokeHandler"]
__all__ += ["SQLiteStore"]


def __getattr__(name: str) -> object:
    # SQLiteStore lives here with the other stores (DESIGN.md's layout), loaded on first use
    # so that a host on another backend never imports sqlite3
    if name == "SQLiteStore":
        from .sqlite import SQLiteStore
        return SQLiteStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
