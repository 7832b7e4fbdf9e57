"""The public :class:`Interpreter`: ``start`` and ``drive``, nothing else.

``drive(position, event) -> (position, effects)`` is a pure function of its inputs: no
clock, no I/O, no randomness. Ids are counters kept in the position, so the same inputs
always give an equal position and equal effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chart.model import Chart
from ..datamodel.base import (SYSTEM_VARIABLES, check_serializable, check_stored, datamodel_for, pack_vars,
                              unpack_vars)
from ..datamodel.budget import DEFAULT_CPU_MS, DEFAULT_MEMORY_BYTES, Budget, BudgetSpent
from ..effects import BudgetExhausted, Effect
from ..events import SCXML_PROCESSOR, Event
from ..exceptions import (BudgetExceeded, ChartIdentityMismatch, EvaluationError, NotRunning,
                          SerializationError)
from .algorithm import Machine, OutOfRounds, _put
from .state import CANCELLED, DONE, RUNNING, Position, advance, make_position

__all__ = ["Interpreter"]


_UNKNOWN = object()


def _check_start_data(data: Mapping[str, Any] | None, datamodel: str,
                      declared: frozenset[str]) -> dict[str, Any] | None:
    """Refuse start data that could never be a datamodel, before anything runs."""
    if not data:
        return None
    if not isinstance(data, Mapping):
        raise TypeError(f"start data must be a mapping, not {type(data).__name__}")
    for k, v in data.items():
        if not isinstance(k, str) or not k.isidentifier() or k in SYSTEM_VARIABLES or k.startswith("__"):
            raise ValueError(f"start data key {k!r} is not a usable variable name")
        try:
            check_serializable(v, f"start data {k!r}")
        except EvaluationError as exc:
            raise SerializationError(str(exc)) from None
    if datamodel == "null":  # declared <data> fail as error.execution; anything else has nowhere to go
        extra = sorted(k for k in data if k not in declared)
        why = f"the null datamodel has no variables ({', '.join(map(repr, extra))})" if extra else None
    else:
        why = check_stored(datamodel, dict(data))
    if why is not None:  # e.g. bytes for an ecmascript chart: its first drive would fail on them
        raise SerializationError(f"start data does not fit the {datamodel} datamodel: {why}")
    return dict(data)


def _storable(name: str, value: Any) -> bool:
    try:
        check_serializable({name: value})
        return True
    except EvaluationError:
        return False


def _settled(variables: dict[str, Any], forced: dict[str, Any], dropped: set[str]) -> dict[str, Any]:
    if not forced and not dropped:
        return variables
    out = {k: v for k, v in variables.items() if k not in dropped}
    out.update(forced)
    return out


def _as_event(event: Event | str) -> Event:
    if isinstance(event, Event):
        return event
    if isinstance(event, str):
        if not event:
            raise ValueError("an event needs a non-empty name")
        return Event(event)
    raise TypeError(f"drive() takes an Event or an event name, not {type(event).__name__}")


class Interpreter:
    """Runs one chart. Holds no session state: positions are passed in and returned.

    :param chart: the compiled chart.
    :param max_rounds: microstep budget per drive; when exhausted the drive returns the
        unchanged position and one :class:`~statebound.effects.BudgetExhausted`.
    :param max_cpu_ms: CPU budget per drive, across every evaluation and round (``None``:
        none); exhausted, the drive ends the same way, with ``reason="cpu"``.
    :param max_memory_bytes: bytes of values one drive may bring out of its datamodel, and
        the ECMAScript heap cap (``None``: none); exhausted, ``reason="memory"``.
    """

    def __init__(self, chart: Chart, *, max_rounds: int = 10_000, max_cpu_ms: int | None = DEFAULT_CPU_MS,
                 max_memory_bytes: int | None = DEFAULT_MEMORY_BYTES) -> None:
        if not isinstance(chart, Chart):
            raise TypeError(f"Interpreter needs a Chart, not {type(chart).__name__}")
        if max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        Budget(max_cpu_ms, max_memory_bytes)  # refuse bad limits now, not at the first drive
        self.chart = chart
        self.max_rounds = max_rounds
        self.max_cpu_ms = max_cpu_ms
        self.max_memory_bytes = max_memory_bytes
        self._dm = datamodel_for(chart)
        self._by_id = chart._by_id
        self._declared = frozenset(d.id for s in chart.states for d in s.data)
        self._static: dict[tuple[tuple[int, ...], str], tuple[int, ...] | None] = \
            chart._caches.setdefault("static", {})

    # ------------------------------------------------------------------ verbs
    def start(self, session_id: str = "session", data: Mapping[str, Any] | None = None, *,
              parent: str | None = None, invokeid: str | None = None, routes: Any = None,
              ioprocessors: Mapping[str, Any] | None = None, caller_context: Any = None,
              only_declared: bool = False, invokers: Any = None,
              budget: Budget | None = None) -> tuple[Position, tuple[Effect, ...]]:
        """Start a session: initialise the datamodel, enter the initial configuration.

        :param session_id: the ``_sessionid`` (hosts use the instance id).
        :param data: initial values; each key overrides the ``<data>`` of the same id, and
            keys the chart does not declare become variables too.
        :param parent: the parent's session id, for an invoked child.
        :param invokeid: the id this child runs under in its parent.
        :param only_declared: ignore ``data`` keys the chart does not declare (what an
            ``<invoke>`` needs: SCXML passes only values whose names the child declares).
        :param routes, ioprocessors, invokers: the per-driver fields (see :class:`Position`).
        :param budget: the CPU and memory budget to spend (a host shares one across the
            drives of a call); a fresh one from the interpreter's limits by default.
        :return: the first position and the effects of the initial macrostep.
        :raises BudgetExceeded: the chart did not settle within ``max_rounds``, or ran out of
            its CPU or memory budget.
        """
        if data and only_declared:
            declared = self._declared
            data = {k: v for k, v in data.items() if k in declared}
        start_data = _check_start_data(data, self.chart.datamodel, self._declared)
        seed = Position(self.chart, session_id, RUNNING, (), parent=parent, invokeid=invokeid,
                        routes=routes, ioprocessors=ioprocessors, invokers=invokers)
        budget = self._budget(budget)
        m = self._machine(seed, {}, caller_context, macrostep=0, budget=budget)
        m.start_data = start_data
        try:
            m.start()
            packed = self._settle_data(m, {})
        except OutOfRounds:
            raise BudgetExceeded(f"chart {self.chart.name!r} did not settle within {self.max_rounds} "
                                 "microsteps while starting") from None
        except BudgetSpent as exc:
            raise BudgetExceeded(f"chart {self.chart.name!r} could not start: {exc}") from None
        return self._finish(seed, m, packed)

    def drive(self, position: Position, event: Event | str, *, caller_context: Any = None,
              budget: Budget | None = None) -> tuple[Position, tuple[Effect, ...]]:
        """Process one external event: one macrostep of the W3C algorithm.

        :param position: the current position (never modified).
        :param event: an :class:`~statebound.Event` or a bare event name. ``Event.cancel()``
            cancels the session: every state is exited (onexit runs, invocations and timeouts
            are cancelled) and the status becomes ``cancelled``.
        :param caller_context: an opaque host value copied onto the effects it causes.
        :param budget: as for :meth:`start`.
        :return: ``(new_position, effects)``.
        :raises NotRunning: if the position has halted.
        """
        if position.status != RUNNING:
            raise NotRunning(f"session {position.session_id!r} is {position.status}; it cannot be driven",
                             position.status)
        chart = position.chart
        if chart is not self.chart and chart.identity != self.chart.identity:
            raise ChartIdentityMismatch((self.chart.identity, self.chart.name, self.chart.version),
                                        (chart.identity, chart.name, chart.version))
        # The static fast path first; a bare event name needs no Event object to be looked up.
        if type(event) is str:
            if event and not position.timeouts and \
                    (not position.invocations or not any(i.autoforward for i in position.invocations)):
                fast, budget = self._static_lookup(position.states, event, budget)
                if fast is not None:
                    return advance(position, fast), ()
            ev = _as_event(event)
        else:
            ev = _as_event(event)
            if not ev.is_cancel and not position.timeouts and \
                    (not position.invocations or self._quiet_invocations(position, ev)):
                fast, budget = self._static_lookup(position.states, ev.name, budget)
                if fast is not None:
                    return advance(position, fast), ()
        budget = self._budget(budget)
        m = self._machine(position, None, caller_context, macrostep=position.macrostep + 1, budget=budget)
        try:
            m.process_external(ev)
            packed = self._settle_data(m, None, position.data)
        except OutOfRounds:
            return position, (BudgetExhausted(rounds=self.max_rounds, event=ev.name,
                                              macrostep=position.macrostep + 1, microstep=m.microstep_no,
                                              round=m.round_no),)
        except BudgetSpent as exc:
            return position, (BudgetExhausted(rounds=m.microstep_no, event=ev.name, reason=exc.reason,
                                              macrostep=position.macrostep + 1, microstep=m.microstep_no,
                                              round=m.round_no),)
        return self._finish(position, m, packed)

    def _budget(self, budget: Budget | None) -> Budget:
        if budget is None:
            return Budget.unchecked(self.max_cpu_ms, self.max_memory_bytes)
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, not {type(budget).__name__}")
        return budget.start()

    # ------------------------------------------------------------------ the static fast path
    def _static_lookup(self, states: tuple[int, ...], name: str,
                       budget: Budget | None) -> tuple[tuple[int, ...] | None, Budget | None]:
        """The cached :meth:`_static_step` answer for (configuration, event name), and the budget.

        Working the answer out spends the drive's budget (created here when none was given:
        a hit costs no budget at all), because a hostile configuration makes it expensive.
        """
        key = (states, name)
        fast = self._static.get(key, _UNKNOWN)
        if fast is _UNKNOWN:
            budget = self._budget(budget)
            try:
                fast = self._static_step(states, name, budget)
            except BudgetSpent:
                return None, budget  # not cached; the full drive runs out of the same budget
            _put(self._static, key, fast)
        return fast, budget  # type: ignore[return-value]

    @staticmethod
    def _quiet_invocations(pos: Position, ev: Event) -> bool:
        return ev.invokeid is None and not any(i.autoforward for i in pos.invocations)

    def _static_step(self, states: tuple[int, ...], name: str, budget: Budget) -> tuple[int, ...] | None:
        """The configuration a macrostep reaches when nothing in it can vary, else ``None``.

        "Nothing can vary" means: the selected transitions have no conditions, and no state
        exited or entered (nor any transition taken) has executable content, invocations,
        data, history, timeouts or a final state, and the new configuration has no eventless
        transitions. Such a macrostep depends only on (configuration, event name), so the
        answer is computed once per chart and the drive is a lookup.
        """
        m = self._machine(Position(self.chart, "static", RUNNING, states), {}, None, macrostep=0, budget=budget)
        chains = m._chains(states, name)
        if any(chain[0].cond is not None for chain in chains):
            return None
        enabled = m._pick(chains)
        if not enabled:
            return None if m._chains(states, None) else states
        st = self.chart.states
        if any(t.content or any(st[x].kind == "history" for x in t.targets) for t in enabled):
            return None
        exit_set, records_history = m._exit_plan(enabled)
        if records_history or any(st[s].onexit or st[s].invokes or st[s].timeouts for s in exit_set):
            return None
        uses_history = [False]
        to_enter: list[int] = []
        default_entry: set[int] = set()
        default_history: dict[int, Any] = {}
        m.config -= set(exit_set)
        m.compute_entry_set(enabled, to_enter, default_entry, default_history, uses_history)
        if uses_history[0] or default_history:
            return None
        for s in to_enter:
            n = st[s]
            if n.onentry or n.invokes or n.timeouts or n.data or n.kind == "final" or \
                    (s in default_entry and n.initial is not None and n.initial.content):
                return None
        new = tuple(sorted(m.config | set(to_enter)))
        if m._chains(new, None):
            return None
        return new

    # ------------------------------------------------------------------ plumbing
    def _ioprocessors(self, pos: Position) -> dict[str, Any]:
        loc = {"location": f"#_scxml_{pos.session_id}"}
        iop: dict[str, Any] = {SCXML_PROCESSOR: loc, "scxml": loc}
        if pos.ioprocessors:
            iop.update(pos.ioprocessors)
        return iop

    def _machine(self, pos: Position, variables: dict[str, Any] | None, caller_context: Any,
                 macrostep: int, budget: Budget | None = None) -> Machine:
        config = set(pos.states)
        by_id = self._by_id

        def in_state(state_id: str) -> bool:
            i = by_id.get(state_id)
            return i is not None and i in config

        ctx = self._dm.open(unpack_vars(pos.data) if variables is None else variables, pos.session_id,
                            self.chart.name, self._ioprocessors(pos), in_state, budget)
        m = Machine(self.chart, ctx, config=config, history=dict(pos.history), session_id=pos.session_id,
                    macrostep=macrostep, send_counter=pos.send_counter, ordinal=pos.ordinal,
                    invoke_counter=pos.invoke_counter, invocations=list(pos.invocations),
                    initialized=set(pos.initialized), parent=pos.parent,
                    timeouts={(t.state, t.name): t for t in pos.timeouts}, routes=pos.routes,
                    max_rounds=self.max_rounds, caller_context=caller_context, budget=budget)
        m.ioprocessors = pos.ioprocessors
        m.invokers = pos.invokers
        return m

    def _settle_data(self, m: Machine, before: dict[str, Any] | None, before_blob: bytes = b"") -> bytes:
        """Encode the datamodel; a value made unstorable in place becomes ``error.execution``.

        Assignments are checked as they happen, but an expression can still mutate a list
        in place (``xs.append({1})``). Such variables are put back as they were before the
        drive, ``error.execution`` is raised, and the macrostep continues, so the host never
        sees the failure and nothing is lost.
        """
        original: dict[str, Any] = {}
        forced: dict[str, Any] = {}  # put back by the commit: the chart made the variable unwritable
        dropped: set[str] = set()    # names that cannot be stored at all (a lone surrogate)
        for _ in range(8):
            variables = _settled(m.ctx.variables(), forced, dropped)
            try:
                return pack_vars(variables)
            except SerializationError as exc:
                original = before if before is not None else unpack_vars(before_blob)
                for k, v in variables.items():
                    if _storable(k, v):
                        continue
                    if not _storable(k, None):
                        dropped.add(k)
                        continue
                    try:
                        m.ctx.declare(k, original.get(k))
                    except EvaluationError:
                        forced[k] = original.get(k)
                if not m.running:
                    continue
                m.raise_error("error.execution", f"{exc}; the variable was restored")
                m.macrostep()
        # A chart that keeps making values unstorable (a polluted prototype...): store what can
        # be stored, and the value before the drive of every other variable.
        keep: dict[str, Any] = {}
        for k, v in _settled(m.ctx.variables(), forced, dropped).items():
            if _storable(k, v):
                keep[k] = v
            elif k in original:
                keep[k] = original[k]
        return pack_vars(keep)

    def _finish(self, pos: Position, m: Machine, packed: bytes) -> tuple[Position, tuple[Effect, ...]]:
        halted = not m.running
        new = make_position(
            self.chart, pos.session_id, (CANCELLED if m.cancelled else DONE) if halted else RUNNING,
            m.final_config if halted and m.final_config is not None else tuple(sorted(m.config)),
            tuple(sorted(m.history.items())), packed, m.macrostep_no, m.send_counter,
            m.ordinal, m.invoke_counter, tuple(m.invocations), tuple(sorted(m.initialized)), pos.parent,
            pos.invokeid, tuple(sorted(m.timeouts.values(), key=lambda t: (t.state, t.name))),
            pos.routes, pos.ioprocessors, pos.callbacks, pos.invokers)
        return new, tuple(m.effects)
