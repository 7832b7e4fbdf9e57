"""What a datamodel provides to the interpreter.

A datamodel is prepared once per chart (:func:`datamodel_for`), compiling every
expression of the chart; then each drive opens a :class:`Context` over the position's
variables. The interpreter only talks to these two interfaces, so adding a datamodel
(ECMAScript, later) touches nothing in the algorithm.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgpack

from ..chart.model import Chart, Expr
from ..exceptions import EvaluationError, SerializationError
from .budget import Budget

__all__ = ["Datamodel", "Context", "EventView", "AttrDict", "SYSTEM_VARIABLES", "pack_vars",
           "unpack_vars", "check_serializable", "check_stored", "datamodel_for", "MAX_NESTING", "too_deep"]

#: Names an expression can read but never assign.
SYSTEM_VARIABLES = frozenset({"_event", "_sessionid", "_name", "_ioprocessors", "_x", "In"})


class AttrDict(dict):
    """A dict whose string keys can also be read as attributes (``_event.data.amount``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            v = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return AttrDict(v) if type(v) is dict else v


class EventView:
    """The read-only ``_event`` object expressions see."""

    __slots__ = ("data", "invokeid", "name", "origin", "origintype", "raw", "sendid", "type")

    def __init__(self, event: Any) -> None:
        self.name = event.name
        self.type = event.type
        self.sendid = event.sendid or ""
        self.origin = event.origin or ""
        self.origintype = event.origintype or ""
        self.invokeid = event.invokeid or ""
        d = event.data
        self.data = AttrDict(d) if type(d) is dict else d
        self.raw = event.raw or ""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (how an ``_event`` stored in a variable persists)."""
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventView):
            return self.as_dict() == other.as_dict()
        if isinstance(other, dict):
            return self.as_dict() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"_event(name={self.name!r}, data={self.data!r})"


def _default(obj: Any) -> Any:
    if isinstance(obj, EventView):  # `<assign expr="_event">` stores the event's fields
        return obj.as_dict()
    if isinstance(obj, (set, frozenset)):
        raise TypeError("sets are not serializable; use a list")
    raise TypeError(f"{type(obj).__name__} is not serializable")


_packer_opts = {"use_bin_type": True, "default": _default, "datetime": False}
# A Packer is reusable but keeps a buffer, and ``default`` can call back into Python
# mid-pack: one per thread. Building one per call cost more than the packing itself.
_local = threading.local()


def _pack(value: Any) -> bytes:
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(**_packer_opts)
    try:
        return packer.pack(value)
    except BaseException:
        packer.reset()  # a failed pack leaves what it wrote so far in the buffer
        raise


def _roundtrip(value: Any) -> bytes:
    # msgpack packs tuple keys as arrays, which no reader can turn back into dict keys:
    # decoding once here is what makes "it packed" mean "it will load".
    blob = _pack(value)
    msgpack.unpackb(blob, raw=False, strict_map_key=False)
    return blob


def pack_vars(values: Mapping[str, Any]) -> bytes:
    """Encode datamodel variables (msgpack). Raises :class:`SerializationError`."""
    if not values:
        return b""
    try:
        for k, v in values.items():
            if type(v) not in _PY_SCALARS or type(k) is not str:
                return _roundtrip(values)
        return _pack(values)  # names and scalars: what packs always loads
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"datamodel value cannot be stored: {exc}") from None


def unpack_vars(blob: bytes) -> dict[str, Any]:
    """Decode datamodel variables written by :func:`pack_vars` (fresh objects each call).

    :raises SerializationError: if the bytes are not a datamodel.
    """
    if not blob:
        return {}
    try:
        out = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except (TypeError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise SerializationError(f"stored datamodel cannot be decoded: {exc}") from None
    if not isinstance(out, dict):
        raise SerializationError("stored datamodel is not a mapping")
    return out


_SCALARS = (str, float, bool, type(None), bytes)
#: msgpack's plain scalar types: what the python datamodel stores as is.
_PY_SCALARS = frozenset({*_SCALARS, int})
#: What :func:`check_serializable` passes without an encode: these types, and ints in msgpack's range.
_PLAIN = frozenset(_SCALARS)
_INT_MIN = -(1 << 63)
_INT_END = 1 << 64


def check_serializable(value: Any, what: str = "value") -> None:
    """Raise :class:`EvaluationError` if ``value`` cannot be stored in a position."""
    t = type(value)
    # Most assignments store a scalar: skip the encode. (A str with a lone surrogate still
    # fails at the end of the drive, where the interpreter turns it into error.execution.)
    if t in _PLAIN or (t is int and _INT_MIN <= value < _INT_END):
        return
    try:
        _roundtrip(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EvaluationError(f"{what} cannot be stored in the datamodel (msgpack): {exc}") from None


_JSON_SCALARS = frozenset((str, int, float, bool, type(None)))

#: How deeply lists and objects may nest in an ecmascript datamodel value. Its values cross
#: into QuickJS as JSON, and Python's ``json`` recurses once per level on the caller's stack:
#: without a fixed cap a value stored from a shallow stack (900 levels) failed to load from a
#: deeper one, with a bare ``RecursionError`` on every later drive of the session.
MAX_NESTING = 256
_SEQUENCES = frozenset({list, tuple, set, frozenset})


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether containers (lists, dicts, tuples, sets) nest more than ``limit`` deep in ``value``
    (level by level, so it never runs out of stack itself)."""
    level = [value]
    depth = 0
    while level:
        depth += 1
        below = []
        for v in level:
            t = type(v)
            if t is dict:
                v = v.values()
            elif t not in _SEQUENCES:
                continue
            if depth > limit:
                return True
            for x in v:
                if type(x) is dict or type(x) in _SEQUENCES:
                    below.append(x)
        level = below
    return False


def check_stored(datamodel: str, values: Any) -> str | None:
    """Why ``values`` (decoded from a position, an export or start data) cannot be the
    variables of a chart on ``datamodel``, or ``None`` when they can.

    A blob is outside data: msgpack alone would let ``bin``, ``ExtType`` or ``Timestamp``
    values into an ecmascript datamodel, and the next drive would fail far from the cause.
    The python datamodel keeps msgpack's plain types (``bytes`` included, and scalar keys
    in nested maps); the ecmascript one JSON's (string keys, no ``bytes``); the null one
    has no variables at all.
    """
    if type(values) is not dict:
        return "the datamodel is not a map of variable names"
    if datamodel == "null":
        return "the null datamodel has no variables" if values else None
    json_only = datamodel == "ecmascript"
    scalars = _JSON_SCALARS if json_only else _PY_SCALARS
    for name in values:
        if type(name) is not str or not name or name in SYSTEM_VARIABLES or name.startswith("__"):
            return f"{name!r} is not a variable name"
    todo = [(v, 1) for v in values.values() if type(v) not in scalars]   # most variables are scalars
    limit = MAX_NESTING if json_only else None  # python values never cross as JSON
    while todo:  # iterative: depth is bounded by the decoder, but no need to recurse
        v, depth = todo.pop()
        t = type(v)
        if t in scalars:
            continue
        if limit is not None and depth > limit:
            return f"values nest more than {limit} levels deep"
        if t is list:
            todo.extend((x, depth + 1) for x in v)
        elif t is dict:
            for k in v:
                if type(k) is not str and (json_only or type(k) not in _PY_SCALARS):
                    return f"a map key {k!r} is not a {'string' if json_only else 'scalar'}"
            todo.extend((x, depth + 1) for x in v.values())
        else:
            return f"a {t.__name__} is not a value of the {datamodel} datamodel"
    return None


class Context(Protocol):
    """One drive's view of the datamodel."""

    def evaluate(self, expr: Expr) -> Any:
        """Evaluate an expression; raise :class:`EvaluationError` on failure."""
        ...

    def cond(self, expr: Expr) -> bool:
        """Evaluate a condition to a bool; raise :class:`EvaluationError` on failure."""
        ...

    def assign(self, location: Expr, value: Any) -> None:
        """Assign ``value`` to a location; raise :class:`EvaluationError` on failure."""
        ...

    def declare(self, name: str, value: Any) -> None:
        """Create (or overwrite) variable ``name`` (``<data>``, ``foreach`` item)."""
        ...

    def is_declared(self, location: Expr) -> bool:
        """Whether a location names an existing variable (for ``foreach`` item/index)."""
        ...

    def valid_location(self, location: Expr) -> bool:
        """Whether the location is a legal assignment target."""
        ...

    def execute(self, script: Expr) -> None:
        """Run a ``<script>``; raise :class:`EvaluationError` on failure."""
        ...

    def set_event(self, event: Any) -> None:
        """Bind ``_event`` to the event being processed."""
        ...

    def variables(self) -> dict[str, Any]:
        """The datamodel variables (system variables excluded)."""
        ...


class Datamodel(Protocol):
    """A datamodel prepared for one chart."""

    name: str

    def open(self, variables: dict[str, Any], session_id: str, name: str,
             ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
             budget: Budget | None = None) -> Context:
        """Open a context over ``variables`` (owned by the context from now on).

        Every evaluation spends ``budget`` (see :mod:`statebound.datamodel.budget`): the
        context checks it around each one and raises ``BudgetSpent`` when it runs out.
        """
        ...


def datamodel_for(chart: Chart) -> Datamodel:
    """The datamodel of ``chart``, prepared (expressions compiled) once and cached on it."""
    dm = chart._caches.get("datamodel")
    if dm is None:
        if chart.datamodel == "null":
            from .null import NullDatamodel
            dm = NullDatamodel(chart)
        elif chart.datamodel == "ecmascript":
            from .ecmascript import EcmaScriptDatamodel
            dm = EcmaScriptDatamodel(chart)
        else:
            from .python import PythonDatamodel
            dm = PythonDatamodel(chart)
        chart._caches["datamodel"] = dm
    return dm
