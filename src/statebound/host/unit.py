"""The working set of one host call: the records it loaded and what it will commit.

Built and committed by ``runner.py``, filled by ``delivery.py``, ``children.py`` and
``outbox.py`` (which adds outbox rows to it); nothing here does I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._fastinit import fast_init
from ..datamodel.budget import Budget
from ..interpreter import Position
from .store import KeyRecord, PositionRecord, TimerKey, TimerRef, TimerRow

__all__ = ["Entry", "Unit", "AlreadyDone", "FireResult"]


@fast_init
@dataclass(frozen=True, slots=True)
class FireResult:
    """What happened to one row: ``fired``, ``discarded``, ``stale``, ``skipped`` or ``failed``
    for timers; ``delivered``, ``waiting`` or ``cancelled`` for outbox rows too.

    :ivar key: the row; ``None`` only when ``complete_invoke`` found no row to name.
    :ivar reason: why it was discarded, skipped or failed.
    :ivar lag_ms: how late it fired relative to its ready time.
    """

    key: TimerKey | None
    outcome: str
    reason: str | None = None
    lag_ms: int = 0


@dataclass(slots=True)
class Entry:
    """One instance as the unit sees it: loaded (``record``) or created, and its pending edits."""

    record: PositionRecord | None
    position: Position | None
    chart_name: str
    refs: list[TimerRef]
    parent: str | None
    dirty: bool = False
    deleted: bool = False
    keys: list[KeyRecord] = field(default_factory=list)
    suspended: bool = False     # Host.suspend: takes no events; its rows are parked
    #: with history on: what the host did to the position, in order (see host/history.py)
    steps: list[dict[str, Any]] | None = None
    #: with history on: the effects summary, and for a start its data, parent and invokeid
    effects: dict[str, Any] | None = None
    started: dict[str, Any] | None = None
    #: ``(position, the same without per-driver fields)``, made once for the call's result
    #: and the host's table of decoded positions (``runner.py``)
    bare: tuple[Position, Position] | None = None
    #: the position was decoded from ``record`` in this unit (not found among the host's
    #: kept positions); it is kept when the unit does not rewrite it
    decoded: bool = False
    #: ``() -> (routes, ioprocessors, invokers)``, what this host offers the loaded instance
    #: in this unit (``routing.offer``), handed to each drive, which calls it only if it
    #: reads them: the position itself stays without them, so nothing is stamped on the way
    #: in or stripped on the way out (``None``: the position carries its own, as a session
    #: started in this unit does)
    driver: Callable[[], tuple[Any, Any, Any]] | None = None


@dataclass(slots=True, init=False)
class Unit:
    """The working set of one host call."""

    entries: dict[str, Entry] = field(default_factory=dict)
    queue: deque[tuple[str, Any, Any]] = field(default_factory=deque)
    puts: dict[TimerKey, TimerRow] = field(default_factory=dict)
    deletes: list[TimerKey] = field(default_factory=list)
    protected: TimerKey | None = None   # the row being fired: completed, never deleted
    deliveries: int = 0
    #: outbox rows this host hands over itself, right after the commit lands
    deliver: set[TimerKey] = field(default_factory=set)
    #: (instance, invokeid) of handler invocations answered in this unit: their exit
    #: cancels nothing
    answered: set[tuple[str, str]] = field(default_factory=set)
    #: the host call this unit runs, for its history records: op, instance, key or timer
    call: dict[str, Any] = field(default_factory=dict)
    #: CPU and memory of the whole call, shared by all its drives (see datamodel/budget.py)
    budget: Budget | None = None
    #: sessions started in this unit (drives that deliveries does not count)
    starts: int = 0
    #: records read ahead for a batch (``None``: the instance does not exist); a unit of a
    #: group commit loads from here first (``batch.py``)
    cache: dict[str, PositionRecord | None] | None = None
    #: instances this unit looked for and did not find (a batch keeps them out of other units)
    missing: set[str] = field(default_factory=set)
    #: rows this unit rewrites from a read, with the states it read them in (Commit.timers_expect)
    expect: dict[TimerKey, tuple[str, ...]] | None = None

    def __init__(self, cache: dict[str, PositionRecord | None] | None = None, budget: Budget | None = None) -> None:
        # One per host call: literals instead of the generated init's eight factory calls.
        self.entries = {}
        self.queue = deque()
        self.puts = {}
        self.deletes = []
        self.protected = None
        self.deliveries = 0
        self.deliver = set()
        self.answered = set()
        self.call = {}
        self.budget = budget
        self.starts = 0
        self.cache = cache
        self.missing = set()
        self.expect = None


class AlreadyDone(Exception):
    """Internal: the row being completed was completed (or parked) by someone else."""
