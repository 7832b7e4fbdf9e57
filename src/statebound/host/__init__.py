"""Hosts, stores and clocks: where positions and timers are kept between drives."""

from .clock import Clock, ManualClock, SystemClock
from .batch import SendResult
from .host import FireResult, Host, child_instance_id
from .memory import MemoryStore
from .memory_wakeup import MemoryWakeup
from .migration import MigrationResult
from .processors import Delivery, InvokeHandler, InvokeRequest, Pending, SendProcessor
from .store import (BatchStore, Commit, KeyRecord, PositionRecord, PositionWrite, Store, TimerCompletion, TimerRef,
                    TimerRow)
from .sweeper import SweepReport, Sweeper, SweeperMetrics
from .wakeup import Wakeup, WakeupRequest, WakeupSource

__all__ = ["Clock", "ManualClock", "SystemClock", "Host", "FireResult", "SendResult", "child_instance_id",
           "MemoryStore", "Store", "BatchStore", "Commit", "KeyRecord", "PositionRecord", "PositionWrite",
           "TimerCompletion", "TimerRef", "TimerRow", "Sweeper", "SweepReport", "SweeperMetrics", "MigrationResult",
           "Wakeup", "WakeupRequest", "WakeupSource", "MemoryWakeup",
           "Delivery", "InvokeRequest", "Pending", "SendProcessor", "InvokeHandler"]
