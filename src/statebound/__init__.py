"""statebound: durable SCXML statecharts.

A pure W3C SCXML interpreter (``Interpreter.drive(position, event) -> (position, effects)``),
a version-stamped position blob, and hosts that keep positions and durable timers in
SQLite or DynamoDB. ``statebound.dynamodb`` (the ``aws`` extra) is imported separately.
"""

from . import effects
from .chart import Chart
from .events import Event
from .exceptions import *  # noqa: F401,F403  (the error tree is part of the facade)
from .exceptions import __all__ as _errors
from .host import Host, ManualClock, MemoryStore, Sweeper, SystemClock
from .interpreter import Interpreter, Position
from . import position as _position  # registers the blob codec
from .position import diff

__version__ = "0.1.0"

__all__ = ["Chart", "Interpreter", "Position", "Event", "effects", "Host", "Sweeper", "ManualClock",
           "SystemClock", "MemoryStore", "diff", *_errors]
