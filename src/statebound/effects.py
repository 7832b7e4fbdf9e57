"""Effects: what a drive asks the outside world to do.

``Interpreter.drive`` never performs I/O. It returns a tuple of these frozen values and
the host carries them out. Every effect carries ``macrostep``, ``microstep`` and
``round`` as they stood when it was produced, so a re-run of the same drive yields the
same effects (they are deterministic dedup material, see ``docs/persistence.md``).

=================  ==========================================  ===========================
effect             emitted by                                  host's job
=================  ==========================================  ===========================
``Send``           ``<send>`` without delay, external target   deliver now (route it)
``SendDelayed``    ``<send delay>``, ``<sb:timeout>``          write a timer row
``Cancel``         ``<cancel>``, exit of a timed state         delete the timer rows
``Invoke``         ``<invoke>`` in an entered state            start the child session
``CancelInvoke``   exit of a state with an active invoke       purge the child session
``Autoforward``    external event + ``autoforward="true"``     forward the event to child
``Log``            ``<log>``, and each ``error.*`` raised      log it
                   (labelled with the error's name)
``Done``           reaching a top-level final state            report, notify a parent
``BudgetExhausted``rounds, CPU or memory budget ran out       alert; position unchanged
=================  ==========================================  ===========================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ._fastinit import fast_init

__all__ = [
    "Send", "SendDelayed", "Cancel", "Invoke", "CancelInvoke", "Autoforward",
    "Log", "Done", "BudgetExhausted", "Effect",
]


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class _Stamp:
    macrostep: int = 0
    microstep: int = 0
    round: int = 0


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Send(_Stamp):
    """An immediate ``<send>`` to an external target (another session, the parent, a child).

    :ivar event: the event name.
    :ivar target: the target URI as written (``"#_parent"``, ``"#_scxml_x"``, ``"#_child"``), or
        ``None`` for the sending session's own external queue.
    :ivar type: the I/O processor type URI.
    :ivar data: the payload (``namelist``/``param`` dict, or ``content`` value).
    :ivar send_id: the send id (author-written or generated).
    :ivar c_index: document index of the ``<send>`` element.
    :ivar owner: document index of the state (or transition) whose content ran it.
    :ivar origin: the sender's ``#_scxml_<sessionid>`` URI.
    :ivar caller_context: opaque host value copied from the triggering event, never read.
    :ivar id_from_author: whether ``send_id`` was written by the author (only then does the
        receiver see it as ``_event.sendid``).
    """

    event: str
    target: str | None
    type: str
    data: Any
    send_id: str
    c_index: int
    owner: int
    origin: str | None = None
    caller_context: Any = None
    id_from_author: bool = False


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class SendDelayed(_Stamp):
    """A ``<send>`` with a delay (or a named ``<sb:timeout>``): the host stores a timer row.

    Exactly one of ``delay_ms`` (relative to the moment of commit) and ``at_ms`` (an
    absolute epoch-milliseconds deadline) is set.

    :ivar ordinal: per-session counter value, unique per session; ``(scope, ordinal)`` is
        the timer row key.
    :ivar id_from_author: whether ``send_id`` was written by the chart author.
    :ivar name: the timeout name, for ``<sb:timeout>``; ``None`` for plain ``<send>``.
    """

    event: str
    target: str | None
    type: str
    data: Any
    send_id: str
    delay_ms: int | None
    c_index: int
    owner: int
    ordinal: int
    id_from_author: bool
    origin: str | None = None
    caller_context: Any = None
    at_ms: int | None = None
    name: str | None = None


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(_Stamp):
    """Cancel every pending timer row with this ``send_id`` in this session (no-op if none)."""

    send_id: str
    c_index: int | None
    owner: int | None
    ordinal: int
    caller_context: Any = None


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Invoke(_Stamp):
    """Start an invoked child session.

    :ivar invokeid: the invoke id (author-written or generated); routes ``#_<invokeid>``.
    :ivar type: the invoke type: the SCXML type URI, or the name of a host invoke handler
        (``Host(invokers=...)``), which then gets ``src``, ``data`` and ``content`` as input.
    :ivar chart: the compiled child chart (inline ``<content>`` or ``src`` resolved at
        compile time), or ``None`` when only ``src`` is known (``srcexpr``), and always for
        a handler.
    :ivar src: the evaluated ``src``/``srcexpr``, when given.
    :ivar content: for SCXML, a document given by ``<content expr>``, to compile at run
        time; for a handler, the ``<content>`` value (any data).
    :ivar data: the ``param``/``namelist`` values passed to the child's datamodel.
    :ivar autoforward: whether external events are forwarded to the child.
    :ivar state: id of the state that owns the ``<invoke>``.
    """

    invokeid: str
    type: str
    chart: Any
    src: str | None
    content: Any
    data: dict[str, Any]
    autoforward: bool
    state: str
    c_index: int


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class CancelInvoke(_Stamp):
    """Cancel (purge) the child session started by the invoke with this id."""

    invokeid: str


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Autoforward(_Stamp):
    """Forward an external event to an invoked child (``autoforward="true"``)."""

    invokeid: str
    event: Any  # statebound.Event


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Log(_Stamp):
    """A ``<log>``: ``label`` as written, ``value`` as evaluated."""

    label: str | None
    value: Any


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Done(_Stamp):
    """The session reached a top-level final state. ``donedata`` is its ``<donedata>``."""

    donedata: Any


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetExhausted(_Stamp):
    """The drive ran out of budget; the position was not changed.

    :ivar reason: ``"rounds"`` (``max_rounds`` microsteps without settling), ``"cpu"`` or
        ``"memory"`` (the drive's :class:`~statebound.datamodel.budget.Budget`).
    :ivar rounds: the microsteps it ran.
    """

    rounds: int
    event: str | None = None
    reason: str = "rounds"


#: Any effect a drive can return.
Effect = Union[Send, SendDelayed, Cancel, Invoke, CancelInvoke, Autoforward, Log, Done, BudgetExhausted]  # noqa: UP007  (a runtime alias)
