"""The static path: macrosteps whose shape does not depend on data, planned once per chart.

For one ``(configuration, event name)`` the W3C macrostep selects transitions, resolves
their conflicts, computes the exit and entry sets and runs the content of each. When
nothing in that but the transition conditions and the content's *values* can vary, all
of it is computed once (with the very functions of :mod:`.algorithm`) and a drive
becomes: evaluate the conditions, look up the plan for the transitions they chose, run
its list of compiled blocks, encode the datamodel.

A plan exists only when, for the transitions chosen:

* no target is a history state and no exited state records history;
* no exited or entered state has an ``<invoke>`` or a named timeout, no entered state is
  final, and (late binding) none has ``<data>`` to initialise (entered states are still
  recorded as initialised, as ``enterStates`` does);
* every action in the content that runs is an assign, log, if, foreach or script (no
  event is raised and no counter advances);
* the new configuration has no eventless transition.

Anything else at run time abandons the plan and the caller runs the full macrostep from
the untouched position: an ``EvaluationError`` (which would raise ``error.execution``),
a datamodel that cannot be encoded. Nothing is emitted before the plan has run to its
end, so abandoning it leaves no trace. A macrostep that runs no content and evaluates no
condition is answered by the new configuration alone (a tuple), without the datamodel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..chart.model import Action, Foreach, If, Transition
from .algorithm import Machine
from ..datamodel.budget import Budget
from .content import ContentMixin
from .program import FAST_ACTIONS, CBlock, Program

__all__ = ["Plan", "Micro", "Quick", "plan_step", "micro_step", "choose", "run_micro"]


class Micro:
    """One microstep, planned: the blocks to run and the configuration changes around them.

    :ivar exits: ``(state, its onexit blocks)`` in exit order.
    :ivar bodies: ``(compiled transition body, source state)`` in document order.
    :ivar entries: ``(state, its onentry blocks then its default-entry content)`` in entry order.
    :ivar states: the configuration it ends in.
    :ivar inert: no block runs at all.
    :ivar entered: the states it enters (late binding records them as initialised).
    :ivar flat: every ``(action, owner)`` in order, for datamodels that never call ``In()``
        (then the configuration need not be kept current along the way).
    :ivar cost: the budget ticks it spends at most (the microstep's own, and one per action),
        or ``None`` when some of its content can loop: then the budget is ticked as it runs.
    """

    __slots__ = ("bodies", "cost", "entered", "entries", "exits", "flat", "inert", "states")

    def __init__(self, exits: tuple[tuple[int, tuple[CBlock, ...]], ...], bodies: tuple[tuple[CBlock, int], ...],
                 entries: tuple[tuple[int, tuple[CBlock, ...]], ...], states: tuple[int, ...],
                 cost: int | None = 1) -> None:
        self.cost = cost
        self.exits = exits
        self.bodies = bodies
        self.entries = entries
        self.states = states
        self.inert = not any(b for _, b in exits) and not bodies and not any(b for _, b in entries)
        self.entered = frozenset(s for s, _ in entries)
        self.flat = (*((run, s) for s, blocks in exits for block in blocks for run in block),
                     *((run, s) for block, s in bodies for run in block),
                     *((run, s) for s, blocks in entries for block in blocks for run in block))


class Plan:
    """The static answer for one ``(configuration, event name)`` that needs the datamodel.

    :ivar chains: per atomic state, the candidate transitions (``None``: no conditions,
        the one microstep is ``fixed``).
    :ivar micros: chosen transition indices -> :class:`Micro`, or ``None`` when that
        choice must take the full path (filled as choices are seen, bounded).
    :ivar misses: how many drives in a row abandoned it (see ``Interpreter._abandon``).
    :ivar loops: some condition can loop (it then needs the drive's budget).
    """

    __slots__ = ("chains", "fixed", "loops", "micros", "misses")

    def __init__(self, chains: tuple[tuple[Transition, ...], ...] | None, fixed: Micro | None,
                 loops: bool = False) -> None:
        self.chains = chains
        self.loops = loops
        self.fixed = fixed
        self.micros: dict[tuple[int, ...], Micro | None] = {}
        self.misses = 0


class Quick(ContentMixin):
    """What compiled content sees on the static path: the datamodel, the effects, the stamp,
    and the budget.

    ``budget`` may be ``None`` until the first check needs it (see ``ContentMixin.tock``):
    most planned macrosteps spend fewer ticks than a check takes.
    """

    __slots__ = ("ctx", "effects", "macrostep_no")

    #: a planned macrostep raises no event, and is one microstep of round 0
    internal: tuple[Any, ...] = ()
    microstep_no = 1
    round_no = 0

    def __init__(self, ctx: Any, macrostep: int, budget: Budget | None,
                 new_budget: Callable[[None], Budget], max_items: int | None) -> None:
        self.ctx = ctx
        self.effects: list[Any] = []
        self.macrostep_no = macrostep
        self.init_budget(budget, new_budget, max_items)


def _fast(block: tuple[Action, ...]) -> bool:
    for a in block:
        if not isinstance(a, FAST_ACTIONS):
            return False
        if type(a) is If and not all(_fast(acts) for _, acts in a.branches):
            return False
        if type(a) is Foreach and not _fast(a.actions):
            return False
    return True


def plan_step(m: Machine, name: str) -> tuple[int, ...] | Plan | None:
    """The static answer for ``m``'s configuration and event ``name``.

    ``m`` is a scratch machine in that configuration (its datamodel is never used).
    :return: the new configuration when nothing runs, a :class:`Plan`, or ``None``.
    """
    states = m.config_key()
    chains = m._chains(states, name)
    conds = [t.cond for chain in chains for t in chain if t.cond is not None]
    if conds:
        return Plan(chains, None, any(m.prog.cond_loops(c) for c in conds))
    micro = micro_step(m, m._pick(chains))
    if micro is None:
        return None
    # late binding records every entered state as initialised: that needs the position
    return micro.states if micro.inert and not (m.late and micro.entered) else Plan(None, micro)


def micro_step(m: Machine, enabled: list[Transition]) -> Micro | None:
    """The :class:`Micro` for ``enabled`` (the transitions chosen in ``m``'s configuration), or ``None``.

    Leaves ``m`` unusable: its configuration is changed on the way.
    """
    states = m.config_key()
    if not enabled:
        return None if m._chains(states, None) else Micro((), (), (), states)
    if len(enabled) > 1:
        enabled = m.remove_conflicting_transitions(enabled)
    st = m.states
    prog: Program = m.prog
    if any(not _fast(t.content) or any(st[x].kind == "history" for x in t.targets) for t in enabled):
        return None
    exit_set, records_history, _ = m._exit_plan(enabled)
    if records_history:
        return None
    for s in exit_set:
        n = st[s]
        if n.invokes or n.timeouts or not all(_fast(b) for b in n.onexit):
            return None
    uses_history = [False]
    to_enter: list[int] = []
    default_entry: set[int] = set()
    default_history: dict[int, Any] = {}
    m.config -= set(exit_set)
    m.compute_entry_set(enabled, to_enter, default_entry, default_history, uses_history)
    if uses_history[0] or default_history:
        return None
    entries = []
    for s in sorted(set(to_enter)):
        n = st[s]
        if n.invokes or n.timeouts or n.kind == "final" or (m.late and n.data) or \
                not all(_fast(b) for b in n.onentry):
            return None
        blocks = prog.onentry[s]
        if s in default_entry and n.initial is not None and n.initial.content:
            if not _fast(n.initial.content):
                return None
            blocks = (*blocks, prog.content[n.initial.index])
        entries.append((s, blocks))
    new = tuple(sorted(m.config | set(to_enter)))
    if m._chains(new, None):
        return None
    cost: int | None = 1  # the microstep's own check
    for block in (*(b for s in exit_set for b in st[s].onexit), *(t.content for t in enabled),
                  *(b for s, _ in entries for b in st[s].onentry),
                  *(st[s].initial.content for s, _ in entries  # type: ignore[union-attr]
                    if s in default_entry and st[s].initial is not None and st[s].initial.content)):  # type: ignore[union-attr]
        c = prog.cost(block)
        cost = None if c is None or cost is None else cost + c
    return Micro(tuple((s, prog.onexit[s]) for s in exit_set),
                 tuple((prog.content[t.index], t.source) for t in enabled if t.content),
                 tuple(entries), new, cost)


def choose(plan: Plan, prog: Program, ctx: Any) -> tuple[int, ...]:
    """Evaluate the plan's conditions as ``selectTransitions`` does: the indices it picks.

    :raises EvaluationError: a condition failed (the full path will raise ``error.execution``).
    """
    conds = prog.cond
    picked: list[int] = []
    for chain in plan.chains:  # type: ignore[union-attr]
        for t in chain:
            c = conds[t.index]
            if c is None or c(ctx):
                if t.index not in picked:
                    picked.append(t.index)
                break
    return tuple(picked)


def run_micro(micro: Micro, q: Quick, config: set[int] | None) -> None:
    """Run a planned microstep, keeping ``config`` (what ``In()`` reads) as ``microstep`` would.

    ``config`` is ``None`` when the datamodel never reads it. The budget ticks the full path
    spends one by one (the microstep's, one per action) are spent up front when the
    content cannot loop, so the clock is read before the content runs rather than between
    two of its actions.

    :raises EvaluationError: some content failed; the caller abandons the plan.
    """
    if micro.cost is not None:
        q.ticks -= micro.cost
        if q.ticks <= 0:
            q.tock()
        if config is None:
            for run, owner in micro.flat:
                run(q, owner)
            return
        _run_structured(micro, q, config, tick=False)
        return
    q.check_items()  # the microstep's own check, as ``Machine.microstep`` makes it
    if config is None:
        for run, owner in micro.flat:
            q.tick()
            run(q, owner)
        return
    _run_structured(micro, q, config, tick=True)


def _run_structured(micro: Micro, q: Quick, config: set[int], tick: bool) -> None:
    for s, blocks in micro.exits:
        for block in blocks:
            for run in block:
                if tick:
                    q.tick()
                run(q, s)
        config.discard(s)
    for block, owner in micro.bodies:
        for run in block:
            if tick:
                q.tick()
            run(q, owner)
    for s, blocks in micro.entries:
        config.add(s)
        for block in blocks:
            for run in block:
                if tick:
                    q.tick()
                run(q, s)
