"""The :class:`Position`: everything a chart session is, between two drives.

A position is an immutable value. The interpreter never changes one; ``drive`` returns a
new one. It holds indices into the chart rather than names, so it stays small; the
chart itself is referenced but never stored (see ``docs/persistence.md``).

The blob codec (``to_bytes``/``from_bytes``/``export``/``import_``) lives one layer up,
in :mod:`statebound.position`, which registers itself here. That keeps imports flowing
one way (interpreter -> position) while the methods stay where users look for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from ..chart.model import Chart
from ..datamodel.base import unpack_vars

__all__ = ["Position", "Invocation", "ArmedTimeout", "RUNNING", "DONE", "CANCELLED"]

#: The values of ``Position.status``.
RUNNING = "running"
DONE = "done"
CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Invocation:
    """An active ``<invoke>``: its id, the state that owns it and which of its invokes it is."""

    invokeid: str
    state: int
    index: int
    autoforward: bool


@dataclass(frozen=True, slots=True)
class ArmedTimeout:
    """A named timeout that is armed: the generation (``ordinal``) of its current row.

    :ivar at_ms: the absolute deadline for ``at``/``atexpr`` timeouts, so a stay can tell
        whether an ``atexpr`` moved.
    """

    state: int
    name: str
    ordinal: int
    send_id: str
    at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Position:
    """A chart session at rest. Create one with :meth:`Interpreter.start`.

    :ivar session_id: the ``_sessionid`` (the host uses the instance id).
    :ivar status: ``"running"``, ``"done"`` or ``"cancelled"``.
    :ivar states: active state indices in document order. A halted position keeps the
        configuration it halted in.
    :ivar history: ``((history state index, recorded state indices), ...)``.
    :ivar data: the datamodel variables, msgpack-encoded (see :attr:`datamodel`).
    :ivar macrostep: how many external events (drives) this session has processed.
    :ivar send_counter: generated send-id counter.
    :ivar ordinal: timer ordinal counter (advances on every ``SendDelayed`` and ``Cancel``).
    :ivar invoke_counter: generated invoke-id counter.
    :ivar invocations: the active invocations.
    :ivar initialized: states whose ``<data>`` was initialised (late binding).
    :ivar parent: the parent's session id, for an invoked child.
    :ivar invokeid: the invoke id this session runs under in its parent.
    :ivar timeouts: the armed named timeouts (their current generation).

    Per-driver fields (not persisted; ``None`` after ``from_bytes``; the host re-stamps):

    :ivar routes: a callable ``session_id -> bool`` telling whether ``#_scxml_<id>`` is reachable.
    :ivar ioprocessors: extra ``_ioprocessors`` entries the driver offers. Besides the
        SCXML and Basic HTTP processors, every entry names a send processor: a ``<send
        type>`` of that name is accepted and handed to the host as an effect.
    :ivar callbacks: opaque host hooks.
    :ivar invokers: the ``<invoke type>`` names the driver serves besides SCXML (a host's
        invoke handlers); any other type raises ``error.execution``.
    """

    chart: Chart = field(compare=False, repr=False)
    session_id: str
    status: str
    states: tuple[int, ...]
    history: tuple[tuple[int, tuple[int, ...]], ...] = ()
    data: bytes = b""
    macrostep: int = 0
    send_counter: int = 0
    ordinal: int = 0
    invoke_counter: int = 0
    invocations: tuple[Invocation, ...] = ()
    initialized: tuple[int, ...] = ()
    parent: str | None = None
    invokeid: str | None = None
    timeouts: tuple[ArmedTimeout, ...] = ()
    routes: Any = field(default=None, compare=False, repr=False)
    ioprocessors: Any = field(default=None, compare=False, repr=False)
    callbacks: Any = field(default=None, compare=False, repr=False)
    invokers: Any = field(default=None, compare=False, repr=False)

    #: names of the per-driver fields, re-stamped by the host after a load
    PER_DRIVER_FIELDS: ClassVar[tuple[str, ...]] = ("routes", "ioprocessors", "callbacks", "invokers")
    _codec: ClassVar[Any] = None

    # -- reading -----------------------------------------------------------------
    @property
    def configuration(self) -> frozenset[str]:
        """The active state ids, ancestors included."""
        st = self.chart.states
        return frozenset(st[i].id for i in self.states)

    @property
    def datamodel(self) -> Mapping[str, Any]:
        """A read-only mapping of the datamodel variables (a fresh decode each call)."""
        return MappingProxyType(unpack_vars(self.data))

    @property
    def running(self) -> bool:
        """True while the session can still be driven."""
        return self.status == RUNNING

    def is_active(self, state_id: str) -> bool:
        """True if ``state_id`` is in the configuration."""
        return self.chart.has_state(state_id) and self.chart.index_of(state_id) in self.states

    def restamp(self, *, routes: Any = None, ioprocessors: Any = None, callbacks: Any = None,
                invokers: Any = None) -> Position:
        """Return a copy with the per-driver fields set (what a host does after a load).

        A position already carrying exactly these values (the same objects) is returned as is.
        """
        return restamped(self, routes, ioprocessors, invokers, callbacks)

    # -- the blob codec (installed by statebound.position) ----------------------------
    def to_bytes(self, codec: str = "msgpack") -> bytes:
        """Encode as a version-stamped, identity-checked blob (``codec``: msgpack or cbor)."""
        return _codec().to_bytes(self, codec)

    @classmethod
    def from_bytes(cls, blob: bytes, chart: Chart) -> Position:
        """Decode a blob written by :meth:`to_bytes`, checking format version and chart identity.

        :raises PositionError: ``NotAPosition``, ``UnsupportedFormatVersion``,
            ``ChartIdentityMismatch`` or ``CorruptPosition`` -- never anything else.
        """
        return _codec().from_bytes(blob, chart)

    def export(self) -> dict[str, Any]:
        """A plain dict keyed by state *ids*, for moving a position onto a revised chart."""
        return _codec().export(self)

    @classmethod
    def import_(cls, data: Mapping[str, Any], chart: Chart, *,
                mapping: Mapping[str, str] | None = None) -> Position:
        """Build a position on ``chart`` from :meth:`export` output, checking it is legal there.

        :param mapping: ``{old_id: new_id}`` renames to apply first (see :func:`statebound.diff`).
        :raises PositionError: a ``MigrationError`` listing every unknown id at once.
        """
        return _codec().import_(data, chart, mapping=mapping)

    def __repr__(self) -> str:
        conf = ",".join(sorted(self.configuration))
        return (f"Position(session_id={self.session_id!r}, status={self.status!r}, "
                f"configuration={{{conf}}}, macrostep={self.macrostep})")


# Building a Position is on every drive's path. A frozen dataclass's __init__ pays a
# name lookup per field through object.__setattr__; the slot descriptors' own setters do
# the same store for half the cost. Only these two functions use them, and only on a
# freshly allocated object, so immutability is untouched for everyone else.
_FIELDS = ("chart", "session_id", "status", "states", "history", "data", "macrostep", "send_counter",
           "ordinal", "invoke_counter", "invocations", "initialized", "parent", "invokeid", "timeouts",
           "routes", "ioprocessors", "callbacks", "invokers")
(_s_chart, _s_session_id, _s_status, _s_states, _s_history, _s_data, _s_macrostep, _s_send_counter,
 _s_ordinal, _s_invoke_counter, _s_invocations, _s_initialized, _s_parent, _s_invokeid, _s_timeouts,
 _s_routes, _s_ioprocessors, _s_callbacks, _s_invokers) = (getattr(Position, f).__set__ for f in _FIELDS)
_new = object.__new__


def make_position(chart: Chart, session_id: str, status: str, states: tuple[int, ...],
                  history: tuple[tuple[int, tuple[int, ...]], ...], data: bytes, macrostep: int,
                  send_counter: int, ordinal: int, invoke_counter: int, invocations: tuple[Invocation, ...],
                  initialized: tuple[int, ...], parent: str | None, invokeid: str | None,
                  timeouts: tuple[ArmedTimeout, ...], routes: Any = None, ioprocessors: Any = None,
                  callbacks: Any = None, invokers: Any = None) -> Position:
    """``Position(...)`` with every field given positionally, built the fast way."""
    o = _new(Position)
    _s_chart(o, chart)
    _s_session_id(o, session_id)
    _s_status(o, status)
    _s_states(o, states)
    _s_history(o, history)
    _s_data(o, data)
    _s_macrostep(o, macrostep)
    _s_send_counter(o, send_counter)
    _s_ordinal(o, ordinal)
    _s_invoke_counter(o, invoke_counter)
    _s_invocations(o, invocations)
    _s_initialized(o, initialized)
    _s_parent(o, parent)
    _s_invokeid(o, invokeid)
    _s_timeouts(o, timeouts)
    _s_routes(o, routes)
    _s_ioprocessors(o, ioprocessors)
    _s_callbacks(o, callbacks)
    _s_invokers(o, invokers)
    return o


def advance(pos: Position, states: tuple[int, ...]) -> Position:
    """``pos`` one macrostep later in configuration ``states``, everything else unchanged."""
    return make_position(pos.chart, pos.session_id, pos.status, states, pos.history, pos.data, pos.macrostep + 1,
                         pos.send_counter, pos.ordinal, pos.invoke_counter, pos.invocations, pos.initialized,
                         pos.parent, pos.invokeid, pos.timeouts, pos.routes, pos.ioprocessors, pos.callbacks,
                         pos.invokers)


def restamped(pos: Position, routes: Any = None, ioprocessors: Any = None, invokers: Any = None,
              callbacks: Any = None) -> Position:
    """:meth:`Position.restamp`, positionally (a host runs it several times per call):
    ``dataclasses.replace`` costs about three times as much as :func:`make_position`."""
    if (routes is pos.routes and ioprocessors is pos.ioprocessors and invokers is pos.invokers
            and callbacks is pos.callbacks):
        return pos   # immutable: a copy would be equal in every field, per-driver ones included
    return make_position(pos.chart, pos.session_id, pos.status, pos.states, pos.history, pos.data, pos.macrostep,
                         pos.send_counter, pos.ordinal, pos.invoke_counter, pos.invocations, pos.initialized,
                         pos.parent, pos.invokeid, pos.timeouts, routes, ioprocessors, callbacks, invokers)


def _codec() -> Any:
    codec = Position._codec
    if codec is None:  # only when statebound.position was never imported
        import importlib
        codec = importlib.import_module("statebound.position")
    return codec


def register_codec(codec: Any) -> None:
    """Called by :mod:`statebound.position` to provide the blob methods."""
    Position._codec = codec
