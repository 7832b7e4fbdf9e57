"""What a datamodel provides to the interpreter.

A datamodel is prepared once per chart (:func:`datamodel_for`), compiling every
expression of the chart; then each drive opens a :class:`Context` over the position's
variables. The interpreter only talks to these two interfaces, so adding a datamodel
(ECMAScript, later) touches nothing in the algorithm.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgpack

from ..chart.model import Chart, Expr
from ..exceptions import EvaluationError, SerializationError
from ..jsonio import nests_deeper
from .budget import Budget

__all__ = ["Datamodel", "Context", "EventView", "AttrDict", "SYSTEM_VARIABLES", "pack_vars",
           "unpack_vars", "check_serializable", "check_stored", "datamodel_for", "MAX_NESTING", "too_deep", "copy_value"]

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


#: Types whose values nothing can change: the chart may share them with the caller.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes, complex, frozenset})
_MISSING = object()


def _owned(value: Any) -> Any:
    """A copy of event data that shares nothing the chart could change with ``value``.

    Lists, dicts, tuples, sets and bytearrays are copied all the way down, however deep (shared
    references and cycles stay shared within the copy); other objects with ``copy.deepcopy``,
    or passed as they are when they cannot be copied. A dict of immutable values, the common
    case, costs one shallow copy. The top-level dict is an :class:`AttrDict`.

    :raises EvaluationError: tuples (or objects ``deepcopy`` copies) nest deeper than Python's
        stack allows.
    """
    t = type(value)
    if t in _IMMUTABLE:
        return value
    if t is dict:
        for v in value.values():
            if type(v) not in _IMMUTABLE:
                break
        else:
            return AttrDict(value)
    return copy_value(value, AttrDict, "the event's data")


def copy_value(value: Any, mapping: type = dict, what: str = "the value") -> Any:
    """A deep copy of ``value`` that shares nothing chart code could change with it (see
    :func:`_owned`); a top-level dict comes back as a ``mapping``.

    :raises EvaluationError: it nests deeper than Python's stack allows (through tuples).
    """
    if type(value) in _IMMUTABLE:
        return value
    try:
        return _tree(value, {}, 0, mapping)
    except _NotATree:
        pass
    try:
        return _Copier().copy(value, top=mapping is not dict)
    except RecursionError:
        raise EvaluationError(f"{what} nests too deeply to be copied for the chart") from None


class _NotATree(Exception):
    """What :func:`_tree` leaves to :class:`_Copier`: an object of another type, or deep nesting."""


def _tree(v: Any, memo: dict[int, Any], depth: int, mapping: type = dict) -> Any:
    """The copy of JSON-like data nesting at most 64 levels: by recursion, about twice as fast
    as :class:`_Copier`, which takes over for anything else."""
    c = memo.get(id(v), _MISSING)
    if c is not _MISSING:
        return c
    t = type(v)
    if depth > 64:
        raise _NotATree
    if t is list:
        c = memo[id(v)] = []
        for x in v:
            c.append(x if type(x) in _IMMUTABLE else _tree(x, memo, depth + 1))
    elif t is dict or t is AttrDict:
        c = memo[id(v)] = mapping()
        for k, x in v.items():
            c[k] = x if type(x) in _IMMUTABLE else _tree(x, memo, depth + 1)
    elif t is tuple:
        # a cycle back through a list inside may have copied this tuple already: keep that copy
        c = memo.setdefault(id(v), tuple([x if type(x) in _IMMUTABLE else _tree(x, memo, depth + 1) for x in v]))
    elif t is set or t is bytearray:
        c = memo[id(v)] = t(v)  # (a set holds hashable values only)
    else:
        raise _NotATree
    return c


class _Copier:
    """One deep copy. Lists and dicts are made empty and filled from a work list, not by
    recursion: JSON-like data can nest deeper than Python's stack."""

    __slots__ = ("memo", "todo")

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}
        self.todo: list[tuple[Any, Any]] = []

    def copy(self, value: Any, top: bool = False) -> Any:
        out = self.one(value, AttrDict if top else dict)
        todo = self.todo
        one = self.one
        while todo:
            src, dst = todo.pop()
            if type(dst) is list:
                dst.extend([one(x) for x in src])
            else:
                for k, x in src.items():
                    dst[k] = one(x)
        return out

    def one(self, v: Any, mapping: type = dict) -> Any:
        """``v``'s copy; a list or dict comes back empty, to be filled from the work list."""
        t = type(v)
        if t in _IMMUTABLE:
            return v
        memo = self.memo
        c = memo.get(id(v), _MISSING)
        if c is not _MISSING:
            return c
        if t is dict or t is AttrDict or t is list:
            c = memo[id(v)] = [] if t is list else mapping()
            self.todo.append((v, c))
        elif t is tuple:
            # its lists and dicts are filled later; a cycle back through one finds this copy
            c = memo[id(v)] = tuple([self.one(x) for x in v])
        elif t is set or t is bytearray:
            c = memo[id(v)] = t(v)  # (a set holds hashable values only)
        else:
            try:
                c = copy.deepcopy(v, memo)
            except RecursionError:
                raise
            except Exception:  # a lock, a generator...: nothing Python can copy, so nothing to protect
                c = memo[id(v)] = v
        return c


class EventView:
    """The read-only ``_event`` object expressions see.

    ``data`` is the chart's own copy of the event's (see ``_owned``): chart code may change it
    without changing the caller's object, so the same drive gives the same result every time it
    runs. Data that nests is copied when first read, so a chart that never reads it pays nothing.
    """

    __slots__ = ("_source", "data", "invokeid", "name", "origin", "origintype", "raw", "sendid", "type")
    # the fields, in the order as_dict() lists them (the stored form of an _event kept in a variable)
    _FIELDS = ("data", "invokeid", "name", "origin", "origintype", "raw", "sendid", "type")
    data: Any
    _source: Any  # the caller's data, until it is copied

    def __init__(self, event: Any) -> None:
        self.name = event.name
        self.type = event.type
        self.sendid = event.sendid or ""
        self.origin = event.origin or ""
        self.origintype = event.origintype or ""
        self.invokeid = event.invokeid or ""
        self.raw = event.raw or ""
        d = event.data
        if d is None:
            self.data = None
        elif type(d) is dict:  # most data: a dict of scalars, copied as it always was
            for v in d.values():
                if type(v) not in _IMMUTABLE:
                    self._source = d  # data stays unset until read: see __getattr__
                    break
            else:
                self.data = AttrDict(d)
        elif type(d) in _IMMUTABLE:
            self.data = d
        else:
            self._source = d

    def __getattr__(self, name: str) -> Any:
        # called only for an attribute that is not set: data that nests, on its first read
        if name != "data":
            raise AttributeError(name)
        d = self.data = _owned(self._source)
        self._source = None
        return d

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (how an ``_event`` stored in a variable persists)."""
        return {k: getattr(self, k) for k in self._FIELDS}

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
#: Globals of the ecmascript datamodel that no variable may be named after: read-only in every
#: realm, so installing one fails every drive of the session (``<data id="NaN">`` and start
#: data are refused the same way).
_JS_READ_ONLY = frozenset({"undefined", "NaN", "Infinity"})

#: How deeply lists and objects may nest in an ecmascript datamodel value. Its values cross
#: into QuickJS as JSON, and Python's ``json`` recurses once per level on the caller's stack:
#: without a fixed cap a value stored from a shallow stack (900 levels) failed to load from a
#: deeper one, with a bare ``RecursionError`` on every later drive of the session.
MAX_NESTING = 256


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether containers (lists, dicts, tuples, sets) nest more than ``limit`` deep in ``value``
    (level by level, so it never runs out of stack itself): :func:`statebound.jsonio.nests_deeper`."""
    return nests_deeper(value, limit)


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
        if json_only and name in _JS_READ_ONLY:
            return f"{name!r} is a read-only global of the ecmascript datamodel, not a variable name"
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

    def evaluate_text(self, expr: Expr) -> str:
        """Evaluate an expression and convert the value to a string as the datamodel's
        language does (``str`` in Python, ``String(v)`` in ECMAScript), for the attributes
        whose value names something (``eventexpr``, ``sendidexpr``, ``srcexpr``)."""
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
