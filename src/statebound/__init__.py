"""statebound: durable SCXML statecharts.

A pure W3C SCXML interpreter (``Interpreter.drive(position, event) -> (position, effects)``),
a version-stamped position blob, and hosts that keep positions and durable timers in
SQLite or DynamoDB.

The facade is deliberately small: charts, the interpreter and its values, the host and
its parts, and the error tree. ``statebound.dynamodb`` (the ``aws`` extra) is imported
on its own, and ``SQLiteStore`` is loaded on first use so that ``import statebound``
pulls in neither boto3 nor sqlite3.
"""

from typing import Any

from . import effects
from . import position as _position  # noqa: F401  (registers the blob codec on Position)
from .chart import Chart
from .events import Event
from .exceptions import *  # noqa: F403  (the error tree is part of the facade)
from .exceptions import __all__ as _errors
from .host import Host, ManualClock, MemoryStore, Sweeper, SystemClock
from .interpreter import Interpreter, Position
from .position import diff
from .storeurl import open_store

__version__ = "0.1.0"

__all__ = ["Chart", "Interpreter", "Position", "Event", "effects", "diff", "Host", "Sweeper",  # noqa: PLE0604
           "ManualClock", "SystemClock", "MemoryStore", "SQLiteStore", "open_store", *_errors]  # noqa: F405


def __getattr__(name: str) -> Any:
    if name == "SQLiteStore":
        from .host.sqlite import SQLiteStore
        return SQLiteStore
    raise AttributeError(f"module 'statebound' has no attribute {name!r}")
