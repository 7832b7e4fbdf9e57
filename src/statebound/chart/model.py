"""The compiled, immutable chart model.

Everything is indexed in document order: ``Chart.states[i].index == i`` and a state's
descendants are exactly the indices ``index + 1 .. last``. The root ``<scxml>`` element is
state 0 (kind ``"root"``); it never appears in a configuration.

Expressions are kept as source text (:class:`Expr`) with a chart-wide number; a datamodel
compiles them once per chart. The chart itself never evaluates anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import UnknownState

__all__ = [
    "Expr", "Param", "Action", "Raise", "SendAction", "CancelAction", "Assign", "LogAction",
    "If", "Foreach", "Script", "Block", "DataSpec", "InvokeSpec", "DoneData", "TimeoutSpec",
    "Transition", "StateNode", "Chart", "INVOKE_SCXML_TYPES",
]

#: Spellings of the SCXML invoke type on ``<invoke type>``; any other literal type names
#: a host invoke handler, whose ``src`` is never read as a chart.
INVOKE_SCXML_TYPES = frozenset({"http://www.w3.org/TR/scxml/", "http://www.w3.org/TR/scxml", "scxml",
                                "http://www.w3.org/TR/scxml/#SCXMLEventProcessor"})


@dataclass(frozen=True, slots=True)
class Expr:
    """An expression (or script, or location) as written, with its chart-wide number."""

    id: int
    src: str
    kind: str = "expr"  # "expr" | "cond" | "location" | "script"
    line: int | None = None


@dataclass(frozen=True, slots=True)
class Param:
    """A ``<param>``: ``name`` and either ``expr`` or ``location``."""

    name: str
    expr: Expr | None
    location: Expr | None


@dataclass(frozen=True, slots=True)
class Action:
    """Base of executable content. ``c_index`` is the element's document index."""

    c_index: int


@dataclass(frozen=True, slots=True)
class Raise(Action):
    """``<raise event>``."""

    event: str


@dataclass(frozen=True, slots=True)
class SendAction(Action):
    """``<send>`` with all its attributes (the ``*expr`` forms as expressions)."""

    event: str | None
    eventexpr: Expr | None
    target: str | None
    targetexpr: Expr | None
    type: str | None
    typeexpr: Expr | None
    id: str | None
    idlocation: Expr | None
    delay: str | None
    delayexpr: Expr | None
    namelist: tuple[Expr, ...]
    params: tuple[Param, ...]
    content: Any  # None | ("expr", Expr) | ("value", value)


@dataclass(frozen=True, slots=True)
class CancelAction(Action):
    """``<cancel sendid|sendidexpr>``."""

    sendid: str | None
    sendidexpr: Expr | None


@dataclass(frozen=True, slots=True)
class Assign(Action):
    """``<assign location expr>`` (or inline content as the value)."""

    location: Expr
    expr: Expr | None
    value: Any = None  # inline content, when no expr


@dataclass(frozen=True, slots=True)
class LogAction(Action):
    """``<log label expr>``."""

    label: str | None
    expr: Expr | None


@dataclass(frozen=True, slots=True)
class If(Action):
    """``<if>/<elseif>/<else>``: ``branches`` are ``(cond or None, actions)`` in order."""

    branches: tuple[tuple[Expr | None, tuple[Action, ...]], ...]


@dataclass(frozen=True, slots=True)
class Foreach(Action):
    """``<foreach array item index>``."""

    array: Expr
    item: Expr
    index: Expr | None
    actions: tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class Script(Action):
    """``<script>`` (inline or from ``src``)."""

    code: Expr


#: A block of executable content (one ``<onentry>``, a transition body...).
Block = tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class DataSpec:
    """A ``<data>`` declaration. ``value`` holds inline/src content when there is no expr."""

    id: str
    expr: Expr | None
    value: Any
    has_value: bool
    line: int | None = None


@dataclass(frozen=True, slots=True)
class InvokeSpec:
    """An ``<invoke>``. ``chart`` is the compiled child when known at compile time."""

    c_index: int
    state: int
    type: str | None
    typeexpr: Expr | None
    src: str | None
    srcexpr: Expr | None
    id: str | None
    idlocation: Expr | None
    namelist: tuple[Expr, ...]
    params: tuple[Param, ...]
    autoforward: bool
    content: Any  # None | ("expr", Expr) | ("value", value)
    chart: Any  # Chart | None
    finalize: Block


@dataclass(frozen=True, slots=True)
class DoneData:
    """``<donedata>``: either ``content`` or ``params``."""

    content: Any  # None | ("expr", Expr) | ("value", value)
    params: tuple[Param, ...]


@dataclass(frozen=True, slots=True)
class TimeoutSpec:
    """A named durable timeout (``<sb:timeout>``) declared on a state.

    :ivar kind: ``"after"``, ``"afterexpr"``, ``"at"`` or ``"atexpr"``.
    :ivar duration_ms: for ``after``; ``at_ms`` for ``at``; ``expr`` for the ``*expr`` kinds.
    """

    c_index: int
    state: int
    name: str
    event: str
    kind: str
    duration_ms: int | None = None
    at_ms: int | None = None
    expr: Expr | None = None
    namelist: tuple[Expr, ...] = ()
    data: Expr | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A ``<transition>`` (or the synthetic initial transition of a compound state)."""

    index: int
    source: int
    events: tuple[str, ...]   # normalised descriptors; () = eventless
    cond: Expr | None
    targets: tuple[int, ...]
    type: str                 # "external" | "internal"
    content: Block
    c_index: int
    line: int | None = None


@dataclass(frozen=True, slots=True)
class StateNode:
    """One state. ``kind`` is ``atomic``, ``compound``, ``parallel``, ``final``, ``history`` or ``root``."""

    index: int
    id: str
    kind: str
    parent: int | None
    children: tuple[int, ...]        # child states, history excluded, document order
    histories: tuple[int, ...]       # child history pseudo-states
    last: int                        # last descendant index (== index for leaves)
    depth: int
    ancestors: tuple[int, ...]       # proper ancestors, nearest first, root last
    initial: Transition | None       # compound states and history defaults
    transitions: tuple[Transition, ...]
    onentry: tuple[Block, ...]
    onexit: tuple[Block, ...]
    invokes: tuple[InvokeSpec, ...]
    data: tuple[DataSpec, ...]
    donedata: DoneData | None
    history_type: str | None         # "shallow" | "deep" for history states
    timeouts: tuple[TimeoutSpec, ...] = ()
    line: int | None = None

    def is_descendant_of(self, other: StateNode) -> bool:
        """True when this state is a proper descendant of ``other``."""
        return other.index < self.index <= other.last

    @property
    def is_atomic(self) -> bool:
        """Atomic in the W3C sense: no child states (final states included)."""
        return self.kind in ("atomic", "final")


@dataclass(frozen=True, eq=False)
class Chart:
    """An immutable compiled SCXML chart. Build it with :meth:`from_scxml` or :meth:`from_file`.

    :ivar name: the chart's name (given, or the ``<scxml name>``, or the file stem).
    :ivar version: an optional user version label, carried in position blobs.
    :ivar identity: ``"sha256:<hex>"`` over a canonical form of the document; whitespace
        and comments do not change it, any semantic change does.
    :ivar datamodel: ``"python"`` or ``"null"`` (``"ecmascript"`` with the extra).
    :ivar binding: ``"early"`` or ``"late"``.
    :ivar states: every state in document order; ``states[0]`` is the root.
    :ivar transitions: every transition in document order.
    :ivar trust: ``"trusted"`` or ``"untrusted"`` (see ``docs/security.md``); an untrusted
        chart's identity differs from the same document trusted.
    :ivar src_roots: the real directories its ``src`` attributes may read under.
    """

    name: str
    version: str | None
    identity: str
    datamodel: str
    binding: str
    states: tuple[StateNode, ...]
    transitions: tuple[Transition, ...]
    expressions: tuple[Expr, ...]
    script: Block                    # the top-level <script>, run at start
    base_path: str | None
    subcharts: tuple[Chart, ...] = ()
    trust: str = "trusted"
    src_roots: tuple[str, ...] = ()
    _by_id: Mapping[str, int] = field(default_factory=dict, repr=False)
    _caches: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # constructors are attached in chart/__init__.py (to keep this module free of parsing)
    @classmethod
    def from_scxml(cls, text: str | bytes, name: str | None = None, version: str | None = None,
                   base_path: str | None = None, *, trust: str = "trusted", allow_dirs: Any = ()) -> Chart:
        """Parse, validate and compile an SCXML document.

        :param text: the SCXML document.
        :param name: chart name; defaults to ``<scxml name>`` or ``"chart"``.
        :param version: a version label recorded in position blobs (not part of identity).
        :param base_path: directory that ``<invoke src>``, ``<data src>`` and ``<script src>``
            resolve against; they may read inside its tree only. Without it, ``src`` is refused.
        :param trust: ``"trusted"`` (the default) or ``"untrusted"``: an untrusted chart, and
            every chart it reaches, may use only the ``ecmascript`` and ``null`` datamodels.
        :param allow_dirs: more directories ``src`` may read under (for trusted callers who
            keep shared files outside the chart's tree).
        :raises ChartSyntaxError: malformed or hostile XML, with line and column.
        :raises ChartValidationError: every validation problem at once.
        :raises ChartPolicyError: a ``src`` or a datamodel the policy refuses (all problems).
        :raises ChartError: e.g. an unsupported datamodel.
        :raises InvalidTrustLevel: ``trust`` is neither ``"trusted"`` nor ``"untrusted"``.
        """
        from .compiler import compile_chart
        return compile_chart(text, name=name, version=version, base_path=base_path, trust=trust,
                             allow_dirs=allow_dirs)

    @classmethod
    def from_file(cls, path: Any, name: str | None = None, version: str | None = None, *,
                  trust: str = "trusted", allow_dirs: Any = ()) -> Chart:
        """Read and compile an SCXML file; relative ``src`` attributes resolve beside it.

        The name defaults to ``<scxml name>`` or the file's stem. ``src`` may read inside
        the file's directory tree (and ``allow_dirs``); ``trust`` is as for :meth:`from_scxml`.
        """
        from .compiler import compile_file
        return compile_file(path, name=name, version=version, trust=trust, allow_dirs=allow_dirs)

    def state(self, id: str) -> StateNode:
        """Return the state with this id.

        :raises UnknownState: if the chart has no such state (a ``KeyError`` too).
        """
        try:
            return self.states[self._by_id[id]]
        except KeyError:
            raise UnknownState(self.name, id) from None

    def has_state(self, id: str) -> bool:
        """True if a state with this id exists."""
        return id in self._by_id

    def index_of(self, id: str) -> int:
        """Document index of the state with this id (``KeyError`` if unknown)."""
        return self._by_id[id]

    @property
    def state_ids(self) -> tuple[str, ...]:
        """All state ids in document order (root excluded)."""
        return tuple(s.id for s in self.states[1:])

    def timeouts_for(self, id: str) -> tuple[TimeoutSpec, ...]:
        """The named durable timeouts (``<sb:timeout>``) declared on state ``id``."""
        return self.state(id).timeouts

    def __repr__(self) -> str:
        return f"<Chart {self.name!r} version={self.version!r} {self.identity[:19]}… {len(self.states) - 1} states>"
