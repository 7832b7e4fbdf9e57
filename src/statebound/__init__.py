"""statebound: durable SCXML statecharts.

A pure W3C SCXML interpreter (``Interpreter.drive(position, event) -> (position, effects)``),
a version-stamped position blob, and hosts that keep positions and durable timers in
SQLite or DynamoDB.

The facade is deliberately small: charts, the interpreter and its values, the host and
its parts, the store opener, and the error tree. Only the error tree is imported with the
package; every other name loads its module on first use (PEP 562), so a program pays only
for the layers it touches and ``import statebound`` stays cheap for a CLI or a Lambda cold
start. ``statebound.dynamodb`` and ``statebound.aws`` (the ``aws`` extra) are imported on
their own: ``import statebound`` pulls in neither boto3 nor sqlite3.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .exceptions import *  # noqa: F403  (the error tree is part of the facade)
from .exceptions import __all__ as _errors

if TYPE_CHECKING:
    from . import effects
    from .chart import Chart
    from .events import Event
    from .host import Host, ManualClock, MemoryStore, Sweeper, SystemClock
    from .host.sqlite import SQLiteStore
    from .interpreter import Interpreter, Position
    from .position import diff
    from .storeurl import open_store

__version__ = "0.1.0"

__all__ = ["Chart", "Interpreter", "Position", "Event", "effects", "diff", "Host", "Sweeper",  # noqa: PLE0604
           "ManualClock", "SystemClock", "MemoryStore", "SQLiteStore", "open_store", *_errors]

#: where each lazily loaded public name lives
_LAZY = {
    "Chart": ".chart", "Event": ".events", "Interpreter": ".interpreter", "Position": ".interpreter",
    "diff": ".position", "Host": ".host", "Sweeper": ".host", "ManualClock": ".host", "SystemClock": ".host",
    "MemoryStore": ".host", "SQLiteStore": ".host.sqlite", "open_store": ".storeurl",
}


#: subpackages and modules that ``import statebound`` used to load eagerly: ``sb.host.Store``
#: and the like keep working without an explicit import
_SUBMODULES = frozenset({"effects", "chart", "datamodel", "interpreter", "position", "host", "events",
                         "storeurl", "jsonio"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        if name in ("interpreter", "host"):
            import_module(".position", __name__)
        return import_module(f".{name}", __name__)
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'statebound' has no attribute {name!r}")
    if where in (".interpreter", ".host", ".host.sqlite"):
        import_module(".position", __name__)   # registers the blob codec on Position first
    value = getattr(import_module(where, __name__), name)
    globals()[name] = value   # later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
