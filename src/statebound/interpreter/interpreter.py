"""The public :class:`Interpreter`: ``start`` and ``drive``, nothing else.

``drive(position, event) -> (position, effects)`` is a pure function of its inputs: no
clock, no I/O, no randomness. Ids are counters kept in the position, so the same inputs
always give an equal position and equal effects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..chart.model import Chart
from ..datamodel.base import (SYSTEM_VARIABLES, check_serializable, check_stored, copy_value, datamodel_for, pack_vars,
                              unpack_vars)
from ..datamodel.budget import DEFAULT_CPU_MS, DEFAULT_MEMORY_BYTES, ITEM_BYTES, Budget, BudgetSpent
from ..effects import BudgetExhausted, Effect
from ..events import SCXML_PROCESSOR, Event
from ..exceptions import (BudgetExceeded, ChartIdentityMismatch, EvaluationError, InvalidArgument, InvalidEvent,
                          NotRunning, SerializationError)
from .algorithm import Machine, OutOfRounds, _put
from .program import program_for
from .state import CANCELLED, DONE, RUNNING, Position, advance, make_position, restamped
from .static import Plan, Quick, choose, micro_step, plan_step, run_micro
from .values import new_event

__all__ = ["Interpreter"]


_UNKNOWN = object()
#: Plans abandoned this many times in a row are replaced by "take the full path".
ABANDON_LIMIT = 8


def _check_start_data(data: Mapping[str, Any] | None, datamodel: str,
                      declared: frozenset[str]) -> dict[str, Any] | None:
    """Refuse start data that could never be a datamodel, before anything runs."""
    if not data:
        return None
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"start data must be a mapping, not {type(data).__name__}")
    for k, v in data.items():
        if not isinstance(k, str) or not k.isidentifier() or k in SYSTEM_VARIABLES or k.startswith("__"):
            raise InvalidArgument(f"start data key {k!r} is not a usable variable name")
        try:
            check_serializable(v, f"start data {k!r}")
        except EvaluationError as exc:
            raise SerializationError(str(exc)) from None
        if type(v) is str and not v.isascii():
            # check_serializable passes a plain str unencoded (drives store many): here the
            # chart never saw it, so refuse it, as a nested one is, instead of the first drive
            # dropping it for an error.execution
            try:
                v.encode()
            except UnicodeEncodeError:
                raise SerializationError(f"start data {k!r} is not text a store can hold "
                                         "(a lone surrogate)") from None
    if datamodel == "null":  # declared <data> fail as error.execution; anything else has nowhere to go
        extra = sorted(k for k in data if k not in declared)
        why = f"the null datamodel has no variables ({', '.join(map(repr, extra))})" if extra else None
    else:
        why = check_stored(datamodel, dict(data))
    if why is not None:  # e.g. bytes for an ecmascript chart: its first drive would fail on them
        raise SerializationError(f"start data does not fit the {datamodel} datamodel: {why}")
    # the chart's own copy: its code may change what it was given, never the caller's objects
    try:
        return {k: copy_value(v, what=f"start data {k!r}") for k, v in data.items()}
    except EvaluationError as exc:
        raise SerializationError(str(exc)) from None


def _storable(datamodel: str, name: str, value: Any) -> bool:
    if check_stored(datamodel, {name: None}) is not None:
        return False   # a name no position holds: the variable is dropped, never forced
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
        if type(event.name) is not str or not event.name:
            raise InvalidEvent(f"an event needs a non-empty name, not {event.name!r}")
        return event
    if isinstance(event, str):
        if not event:
            raise InvalidEvent("an event needs a non-empty name")
        return new_event(event)
    raise InvalidEvent(f"drive() takes an Event or an event name, not {type(event).__name__}")


class _Inert:
    """The context of a chart with no expressions and no ``<data>``: nothing can read or
    change its datamodel, so the drive neither decodes nor encodes it."""

    __slots__ = ()

    def set_event(self, event: Any) -> None:
        """Nothing can read ``_event``."""


_INERT = _Inert()


class Interpreter:
    """Runs one chart. Holds no session state: positions are passed in and returned.

    :param chart: the compiled chart.
    :param max_rounds: microstep budget per drive (internal events that enable no
        transition count too); when exhausted the drive returns the unchanged position
        and one :class:`~statebound.effects.BudgetExhausted`.
    :param max_cpu_ms: CPU budget per drive, across every evaluation and round (``None``:
        none); exhausted, the drive ends the same way, with ``reason="cpu"``.
    :param max_memory_bytes: bytes of values one drive may bring out of its datamodel, and
        the ECMAScript heap cap (``None``: none); exhausted, ``reason="memory"``.
    :param static_path: answer the macrosteps whose shape does not depend on data from a
        per-chart plan (the default; see ``docs/adr/0020-static-path-plans.md``). ``False``
        runs the full W3C macrostep every time: the same positions and effects, slower;
        for diagnosis and benchmarks.
    """

    def __init__(self, chart: Chart, *, max_rounds: int = 10_000, max_cpu_ms: int | None = DEFAULT_CPU_MS,
                 max_memory_bytes: int | None = DEFAULT_MEMORY_BYTES, static_path: bool = True) -> None:
        if not isinstance(chart, Chart):
            raise InvalidArgument(f"Interpreter needs a Chart, not {type(chart).__name__}")
        if max_rounds < 1:
            raise InvalidArgument("max_rounds must be at least 1")
        Budget(max_cpu_ms, max_memory_bytes)  # refuse bad limits now, not at the first drive
        self.chart = chart
        self.max_rounds = max_rounds
        self.max_cpu_ms = max_cpu_ms
        self.max_memory_bytes = max_memory_bytes
        self._dm = datamodel_for(chart)
        self._prog = program_for(chart, self._dm)
        self._by_id = chart._by_id
        self._declared = frozenset(d.id for s in chart.states for d in s.data)
        uses = getattr(self._dm, "uses", None)  # the system variables the datamodel reads, if it says
        self._needs_event = uses is None or "_event" in uses
        self._needs_iop = uses is None or "_ioprocessors" in uses
        self._needs_in = uses is None or "In" in uses
        self._late = chart.binding == "late"
        # a datamodel that can say which of its code loops: its straight-line code needs no budget
        repeats = getattr(self._dm, "repeats", None)
        self._light = uses is not None and repeats is not None
        # ...and a chart none of whose code loops needs the budget only when a check is due
        self._loops = repeats is None or any(repeats(e) for e in chart.expressions)
        self._max_items = None if max_memory_bytes is None else max_memory_bytes // ITEM_BYTES
        self._events: dict[str, Event] = {}  # see _named
        # Nothing can read or change the datamodel of a chart with no expression and no <data>.
        self._inert = not chart.expressions and not self._declared and chart.datamodel in ("python", "null")
        self._static_path = static_path
        self._static: dict[tuple[tuple[int, ...], str], Any] = \
            chart._caches.setdefault("static", {}) if static_path else {}

    # ------------------------------------------------------------------ verbs
    def start(self, session_id: str = "session", data: Mapping[str, Any] | None = None, *,
              parent: str | None = None, invokeid: str | None = None, routes: Any = None,
              ioprocessors: Mapping[str, Any] | None = None, caller_context: Any = None,
              only_declared: bool = False, invokers: Any = None,
              budget: Budget | None = None, ordinal: int = 0) -> tuple[Position, tuple[Effect, ...]]:
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
        :param ordinal: the last ordinal already used under this session id (a host starting
            a new instance of a deleted one's id): the session's delayed sends and timeouts
            are numbered after it.
        :return: the first position and the effects of the initial macrostep.
        :raises BudgetExceeded: the chart did not settle within ``max_rounds``, or ran out of
            its CPU or memory budget.
        """
        if data and only_declared:
            declared = self._declared
            data = {k: v for k, v in data.items() if k in declared}
        start_data = _check_start_data(data, self.chart.datamodel, self._declared)
        if type(ordinal) is not int or ordinal < 0:
            raise InvalidArgument(f"ordinal must be an int >= 0, not {ordinal!r}")
        seed = Position(self.chart, session_id, RUNNING, (), parent=parent, invokeid=invokeid,
                        routes=routes, ioprocessors=ioprocessors, invokers=invokers, ordinal=ordinal)
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
        :raises InvalidEvent: ``event`` is neither an :class:`Event` nor a non-empty name.
        """
        return self.drive_as(position, None, event, caller_context=caller_context, budget=budget)

    def drive_as(self, position: Position, driver: Callable[[], tuple[Any, Any, Any]] | None,
                 event: Event | str, *, caller_context: Any = None,
                 budget: Budget | None = None) -> tuple[Position, tuple[Effect, ...]]:
        """:meth:`drive` of ``position`` restamped with the per-driver fields ``driver()``
        returns, ``(routes, ioprocessors, invokers)``, for a host that keeps positions
        without them.

        Exactly ``drive(position.restamp(routes=..., ioprocessors=..., invokers=...), event)``,
        except that ``driver`` is called only when the drive reads the fields (the full
        macrostep, or a chart whose code names ``_ioprocessors``), at most once; elsewhere
        (a cached transition) the new position keeps ``position``'s own per-driver fields, so
        no stamped copy is built or stripped again, and no offer is built that nothing reads.
        A drive that runs out of its budget or rounds returns ``position`` itself.
        ``driver`` ``None`` is :meth:`drive`.
        """
        if position.status != RUNNING:
            raise NotRunning(f"session {position.session_id!r} is {position.status}; it cannot be driven",
                             position.status)
        chart = position.chart
        if chart is not self.chart and chart.identity != self.chart.identity:
            raise ChartIdentityMismatch((self.chart.identity, self.chart.name, self.chart.version),
                                        (chart.identity, chart.name, chart.version))
        if driver is not None and self._needs_iop:
            position = restamped(position, *driver())   # the cached path too reads _ioprocessors
            driver = None
        # The static path first; a bare event name needs no Event object to be looked up.
        if type(event) is str:
            if not event:
                raise InvalidEvent("an event needs a non-empty name")
            ev = None
            name = event
            static = self._static_path and not position.timeouts and \
                (not position.invocations or not any(i.autoforward for i in position.invocations))
        else:
            ev = _as_event(event)
            name = ev.name
            static = self._static_path and not ev.is_cancel and not position.timeouts and \
                (not position.invocations or self._quiet_invocations(position, ev))
        if static:
            fast = self._static.get((position.states, name), _UNKNOWN)
            if type(fast) is tuple:
                return advance(position, fast), ()
            if fast is _UNKNOWN:
                fast, budget = self._static_lookup(position.states, name, budget)
                if type(fast) is tuple:
                    return advance(position, fast), ()
            if fast is not None and fast is not _UNKNOWN:
                # stepping aside, the plan hands back what it spent: the full macrostep goes
                # on with that budget, so one drive never gets two. Its CPU only: the memory
                # it counted, the full macrostep brings out again, and counted twice a drive
                # was refused on the plan's path that passed on the full one (and so after
                # ABANDON_LIMIT drives, or in a process that had dropped the plan).
                mark = None if budget is None else budget.memory_mark()
                done, budget = self._run_plan(fast, position, name, ev, budget)
                if done is not None:
                    return done
                if budget is not None:
                    budget.rewind_memory(mark)
        if ev is None:
            ev = self._events.get(name) or self._named(name)
        if budget is not None or self._loops:
            budget = self._budget(budget)
        given = position
        if driver is not None:   # the full macrostep reads every per-driver field
            position = restamped(position, *driver())
        m = self._machine(position, None, caller_context, macrostep=position.macrostep + 1, budget=budget)
        try:
            m.process_external(ev)
            packed = self._settle_data(m, None, position.data)
        except OutOfRounds:
            return given, (BudgetExhausted(rounds=self.max_rounds, event=ev.name,
                                           macrostep=position.macrostep + 1, microstep=m.microstep_no,
                                           round=m.round_no),)
        except BudgetSpent as exc:
            return given, _spent(exc, ev.name, position.macrostep + 1, m.microstep_no, m.round_no)
        return self._finish(position, m, packed)

    def _named(self, name: str) -> Event:
        """The external event of a bare name (an Event is immutable, so one per name serves)."""
        ev = self._events.get(name)
        if ev is None:
            ev = new_event(name)
            _put(self._events, name, ev)
        return ev

    def _budget(self, budget: Budget | None) -> Budget:
        if budget is None:
            return Budget.unchecked(self.max_cpu_ms, self.max_memory_bytes)
        if not isinstance(budget, Budget):
            raise InvalidArgument(f"budget must be a Budget, not {type(budget).__name__}")
        return budget.start()

    # ------------------------------------------------------------------ the static path
    def _static_lookup(self, states: tuple[int, ...], name: str,
                       budget: Budget | None) -> tuple[tuple[int, ...] | Plan | None, Budget | None]:
        """Plan the static answer for (configuration, event name), not yet cached, and return
        it with the budget.

        Planning spends the drive's budget (created here when none was given: a hit costs
        no budget at all), because a hostile configuration makes it expensive.
        """
        budget = self._budget(budget)
        try:
            fast = plan_step(self._scratch(states, budget), name)
        except BudgetSpent:
            return None, budget  # not cached; the full drive runs out of the same budget
        _put(self._static, (states, name), fast)
        return fast, budget

    @staticmethod
    def _quiet_invocations(pos: Position, ev: Event) -> bool:
        return ev.invokeid is None and not any(i.autoforward for i in pos.invocations)

    def _scratch(self, states: tuple[int, ...], budget: Budget) -> Machine:
        """A machine in configuration ``states`` for planning (its datamodel is never used)."""
        return Machine(self.chart, self._prog, _INERT, set(states), Position(self.chart, "static", RUNNING, states),
                       0, self.max_rounds, None, budget)

    def _run_plan(self, plan: Plan, pos: Position, name: str, ev: Event | None,
                  budget: Budget | None) -> tuple[tuple[Position, tuple[Effect, ...]] | None, Budget | None]:
        """Drive ``pos`` along ``plan``: ``(the drive's result, budget)``, or ``(None,
        budget)`` when the full macrostep must run instead, out of the same ``budget``.

        The drive's own budget (none was given) is made only when something needs it: code
        that can loop, or a check (see :class:`~statebound.interpreter.static.Quick`).
        """
        if budget is None:
            if plan.loops or not self._light:
                budget = self._budget(None)
        else:
            budget = budget.start()
        config = set(pos.states) if self._needs_in else None  # only In() reads it
        ctx = self._open(pos, config, None, budget)
        if self._needs_event:
            ctx.set_event(ev if ev is not None else self._named(name))
        q = Quick(ctx, pos.macrostep + 1, budget, self._budget, self._max_items)
        try:
            if plan.chains is None:
                micro = plan.fixed
            else:
                picked = choose(plan, self._prog, ctx)
                if picked in plan.micros:
                    micro = plan.micros[picked]
                else:
                    if q.budget is None:
                        q.budget = self._budget(None)
                    transitions = self.chart.transitions
                    micro = micro_step(self._scratch(pos.states, q.budget), [transitions[i] for i in picked])
                    _put(plan.micros, picked, micro)
            if micro is None:
                return None, q.budget
            if micro.cost is None and q.budget is None:  # content that can loop ticks the budget itself
                q.budget = ctx.budget = self._budget(None)
            run_micro(micro, q, config)
            packed = pos.data if ctx is _INERT else pack_vars(ctx.variables())
        except BudgetSpent as exc:
            return (pos, _spent(exc, name, pos.macrostep + 1, q.microstep_no, 0)), q.budget
        except (EvaluationError, SerializationError):
            self._abandon(plan, pos.states, name)
            return None, q.budget
        if plan.misses:
            plan.misses = 0
        initialized = pos.initialized
        if self._late and not micro.entered.issubset(initialized):
            initialized = tuple(sorted(micro.entered.union(initialized)))
        return (make_position(self.chart, pos.session_id, RUNNING, micro.states, pos.history, packed,
                              pos.macrostep + 1, pos.send_counter, pos.ordinal, pos.invoke_counter,
                              pos.invocations, initialized, pos.parent, pos.invokeid, pos.timeouts,
                              pos.routes, pos.ioprocessors, pos.callbacks, pos.invokers), tuple(q.effects)), q.budget

    def _abandon(self, plan: Plan, states: tuple[int, ...], name: str) -> None:
        """A plan stepped aside: after ``ABANDON_LIMIT`` in a row it is dropped, so a hot
        transition whose content keeps failing does not pay for two paths on every drive."""
        plan.misses += 1
        if plan.misses >= ABANDON_LIMIT:
            self._static[(states, name)] = None

    # ------------------------------------------------------------------ plumbing
    def _ioprocessors(self, pos: Position) -> dict[str, Any]:
        loc = {"location": f"#_scxml_{pos.session_id}"}
        iop: dict[str, Any] = {SCXML_PROCESSOR: loc, "scxml": loc}
        if pos.ioprocessors:
            iop.update(pos.ioprocessors)
        return iop

    def _open(self, pos: Position, config: set[int] | None, variables: dict[str, Any] | None,
              budget: Budget | None) -> Any:
        """Open the datamodel for a drive from ``pos`` (``variables`` at start)."""
        if self._inert and variables is None:
            return _INERT
        if self._needs_in:
            by_id = self._by_id

            def in_state(state_id: str) -> bool:
                i = by_id.get(state_id)
                return i is not None and i in config  # type: ignore[operator]
        else:
            in_state = _never_asked
        return self._dm.open(unpack_vars(pos.data) if variables is None else variables, pos.session_id,
                             self.chart.name, self._ioprocessors(pos) if self._needs_iop else _NO_IOP, in_state,
                             budget)

    def _machine(self, pos: Position, variables: dict[str, Any] | None, caller_context: Any,
                 macrostep: int, budget: Budget | None = None) -> Machine:
        config = set(pos.states)
        return Machine(self.chart, self._prog, self._open(pos, config, variables, budget), config, pos, macrostep,
                       self.max_rounds, caller_context, budget, self._budget, self._max_items)

    def _settle_data(self, m: Machine, before: dict[str, Any] | None, before_blob: bytes = b"") -> bytes:
        """Encode the datamodel; a value made unstorable in place becomes ``error.execution``.

        Assignments are checked as they happen, but an expression can still mutate a list
        in place (``xs.append({1})``). Such variables are put back as they were before the
        drive, ``error.execution`` is raised, and the macrostep continues, so the host never
        sees the failure and nothing is lost.
        """
        if m.ctx is _INERT:
            return before_blob
        variables = m.ctx.variables()
        try:
            return pack_vars(variables)
        except SerializationError as exc:
            # the message only: an exception kept past its handler would keep this frame,
            # the machine and its context alive in a cycle (a QuickJS realm stays lent)
            failure = str(exc)
        return self._restore_unstorable(m, before, before_blob, variables, failure)

    def _restore_unstorable(self, m: Machine, before: dict[str, Any] | None, before_blob: bytes,
                            variables: dict[str, Any], failure: str) -> bytes:
        """The rest of :meth:`_settle_data`, once ``variables`` failed to encode (``failure`` says why)."""
        dm = self.chart.datamodel
        original: dict[str, Any] = {}
        forced: dict[str, Any] = {}  # put back by the commit: the chart made the variable unwritable
        dropped: set[str] = set()    # names that cannot be stored at all (a lone surrogate)
        for attempt in range(8):
            if attempt:
                variables = _settled(m.ctx.variables(), forced, dropped)
                try:
                    return pack_vars(variables)
                except SerializationError as exc:
                    failure = str(exc)
            original = before if before is not None else unpack_vars(before_blob)
            for k, v in variables.items():
                if _storable(dm, k, v):
                    continue
                if not _storable(dm, k, None):
                    dropped.add(k)
                    continue
                try:
                    m.ctx.declare(k, original.get(k))
                except EvaluationError:
                    forced[k] = original.get(k)
            if not m.running:
                continue
            m.raise_error("error.execution", f"{failure}; the variable was restored")
            m.macrostep()
        # A chart that keeps making values unstorable (a polluted prototype...): store what can
        # be stored, and the value before the drive of every other variable, decoded afresh:
        # the values of `original` were handed to the chart, which may have spoiled them too.
        original = before if before is not None else unpack_vars(before_blob)
        keep: dict[str, Any] = {}
        for k, v in _settled(m.ctx.variables(), forced, dropped).items():
            if _storable(dm, k, v):
                keep[k] = v
            elif k in original:
                keep[k] = original[k]
        return pack_vars(keep)

    def _finish(self, pos: Position, m: Machine, packed: bytes) -> tuple[Position, tuple[Effect, ...]]:
        halted = not m.running
        new = make_position(
            self.chart, pos.session_id, (CANCELLED if m.cancelled else DONE) if halted else RUNNING,
            m.final_config if halted and m.final_config is not None else m.config_key(),
            tuple(sorted(m.history.items())) if m.history else (), packed, m.macrostep_no, m.send_counter,
            m.ordinal, m.invoke_counter, tuple(m.invocations), tuple(sorted(m.initialized)) if m.initialized else (),
            pos.parent, pos.invokeid,
            tuple(sorted(m.timeouts.values(), key=lambda t: (t.state, t.name))) if m.timeouts else (),
            pos.routes, pos.ioprocessors, pos.callbacks, pos.invokers)
        return new, tuple(m.effects)


_NO_IOP: Mapping[str, Any] = MappingProxyType({})


def _spent(exc: BudgetSpent, event: str, macrostep: int, microstep: int, round: int) -> tuple[Effect, ...]:
    """The effects of a drive abandoned because its CPU or memory budget ran out."""
    return (BudgetExhausted(rounds=microstep, event=event, reason=exc.reason, macrostep=macrostep,
                            microstep=microstep, round=round),)


def _never_asked(state_id: str) -> bool:  # In() for a datamodel that says it never calls it
    raise AssertionError("In() called by a datamodel that does not use it")
