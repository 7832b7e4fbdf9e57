"""Executable content compiled into closures, once per chart.

Every block of a chart (an ``<onentry>``, a transition body, a ``<finalize>``...) becomes
a tuple of ``run(machine, owner)`` closures, and every transition condition a
``cond(ctx) -> bool``. The closures call the datamodel's own per-expression closures
when it offers them (the python datamodel's ``evaluator``/``condition``/``assigner``)
and its :class:`~statebound.datamodel.base.Context` methods otherwise, so a datamodel's
checks are never bypassed: the closure *is* what the context method runs.

What is compiled away is the interpretation overhead: the ``type(action)`` dispatch,
the attribute reads of the action record, the keyword arguments of the effect. The
order of evaluation and every error message stay those of executable content as the
W3C spec and :mod:`statebound.interpreter.content` describe them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..chart.model import (Action, Assign, Block, CancelAction, Chart, Expr, Foreach, If, LogAction, Raise,
                           Script, SendAction)
from ..exceptions import EvaluationError
from .content import _copy
from .values import new_event, new_log

__all__ = ["Program", "Run", "CBlock", "program_for", "FAST_ACTIONS"]

#: ``run(machine, owner)``: one compiled action.
Run = Callable[[Any, int], None]
#: A compiled block.
CBlock = tuple[Run, ...]

#: Actions whose only effects are on the datamodel and ``Log`` effects: a macrostep
#: whose content is made of these alone can take the interpreter's static path.
FAST_ACTIONS = (Assign, LogAction, If, Foreach, Script)


class Program:
    """The compiled content and conditions of one chart under its datamodel.

    :ivar onentry: per state index, its compiled ``<onentry>`` blocks.
    :ivar onexit: per state index, its compiled ``<onexit>`` blocks.
    :ivar content: per transition index, its compiled body.
    :ivar cond: per transition index, its compiled condition or ``None``.
    """

    __slots__ = ("_assigner", "_assignment", "_blocks", "_condition", "_evaluator", "_repeats", "algo", "cond",
                 "content", "late", "onentry", "onexit", "reads_event")

    def __init__(self, chart: Chart, dm: Any) -> None:
        self._evaluator: Callable[[Expr], Callable[[Any], Any]] = getattr(dm, "evaluator", None) or _ctx_evaluator
        self._condition: Callable[[Expr], Callable[[Any], bool]] = getattr(dm, "condition", None) or _ctx_condition
        self._assigner: Callable[[Expr], Callable[[Any, Any], None]] = getattr(dm, "assigner", None) or _ctx_assigner
        self._assignment: Callable[[Expr, Expr], Callable[[Any], None] | None] | None = \
            getattr(dm, "assignment", None)
        self._repeats: Callable[[Expr], bool] | None = getattr(dm, "repeats", None)
        # keyed by id(): a chart's blocks live as long as the chart, which holds this program
        self._blocks: dict[int, CBlock] = {}
        self.onentry = tuple(tuple(self.block(b) for b in s.onentry) for s in chart.states)
        self.onexit = tuple(tuple(self.block(b) for b in s.onexit) for s in chart.states)
        self.content = tuple(self.block(t.content) for t in chart.transitions)
        self.cond = tuple(None if t.cond is None else self._condition(t.cond) for t in chart.transitions)
        uses = getattr(dm, "uses", None)
        #: whether any expression can read ``_event`` (else binding it per event is wasted work)
        self.reads_event: bool = uses is None or "_event" in uses
        #: late data binding: states initialise their ``<data>`` on first entry
        self.late: bool = chart.binding == "late"
        #: the algorithm's per-chart caches (see :class:`~statebound.interpreter.algorithm.Machine`)
        self.algo: dict[str, dict[Any, Any]] = chart._caches.setdefault(
            "algo", {"select": {}, "conflict": {}, "plan": {}, "entry": {}, "eventless": {}})

    def block(self, block: Block) -> CBlock:
        """The compiled form of ``block`` (a block of this program's chart)."""
        compiled = self._blocks.get(id(block))
        if compiled is None:
            compiled = self._blocks[id(block)] = tuple(self._action(a) for a in block)
        return compiled

    def cost(self, block: Block) -> int | None:
        """The budget ticks running ``block`` spends at most (one per action, nested ones
        included), or ``None`` when it can loop: a ``<foreach>``, code the datamodel says
        can repeat, or a datamodel that cannot say."""
        total = 0
        for a in block:
            c = self._cost(a)
            if c is None:
                return None
            total += c
        return total

    def cond_loops(self, cond: Expr) -> bool:
        """Whether evaluating ``cond`` can loop (or the datamodel cannot say)."""
        return self._repeats is None or self._repeats(cond)

    def _cost(self, a: Action) -> int | None:
        repeats = self._repeats
        if repeats is None:
            return None
        t = type(a)
        if t is Assign:
            return None if repeats(a.location) or (a.expr is not None and repeats(a.expr)) else 1  # type: ignore[attr-defined]
        if t is LogAction:
            return None if a.expr is not None and repeats(a.expr) else 1  # type: ignore[attr-defined]
        if t is Script:
            return None if repeats(a.code) else 1  # type: ignore[attr-defined]
        if t is If:
            total = 1
            for cond, acts in a.branches:  # type: ignore[attr-defined]
                inner = self.cost(acts)
                if inner is None or (cond is not None and repeats(cond)):
                    return None
                total += inner
            return total
        return None  # foreach loops; the rest never takes the static path

    def _action(self, a: Action) -> Run:
        t = type(a)
        if t is Assign:
            return self._assign(a)  # type: ignore[arg-type]
        if t is LogAction:
            return self._log(a)  # type: ignore[arg-type]
        if t is Raise:
            event = a.event  # type: ignore[attr-defined]

            def run_raise(m: Any, owner: int) -> None:
                m.internal.append(new_event(event, None, "internal"))
            return run_raise
        if t is If:
            return self._if(a)  # type: ignore[arg-type]
        if t is SendAction:
            def run_send(m: Any, owner: int) -> None:
                m.send(a, owner)
            return run_send
        if t is CancelAction:
            def run_cancel(m: Any, owner: int) -> None:
                m.cancel(a, owner)
            return run_cancel
        if t is Foreach:
            body = tuple(self._action(b) for b in a.actions)  # type: ignore[attr-defined]

            def run_foreach(m: Any, owner: int) -> None:
                m.foreach(a, body, owner)
            return run_foreach
        if t is Script:
            code = a.code  # type: ignore[attr-defined]

            def run_script(m: Any, owner: int) -> None:
                m.ctx.execute(code)
            return run_script
        raise EvaluationError(f"unknown action {a!r}")  # pragma: no cover - the compiler builds only these

    def _assign(self, a: Assign) -> Run:
        if a.expr is not None and self._assignment is not None:
            fused = self._assignment(a.location, a.expr)
            if fused is not None:
                def run_assignment(m: Any, owner: int) -> None:
                    fused(m.ctx)
                return run_assignment
        assign = self._assigner(a.location)
        if a.expr is not None:
            evaluate = self._evaluator(a.expr)

            def run_assign(m: Any, owner: int) -> None:
                ctx = m.ctx
                assign(ctx, evaluate(ctx))
            return run_assign
        value = a.value

        def run_assign_value(m: Any, owner: int) -> None:
            assign(m.ctx, _copy(value))
        return run_assign_value

    def _log(self, a: LogAction) -> Run:
        label = a.label
        if a.expr is None:
            def run_log_label(m: Any, owner: int) -> None:
                m.effects.append(new_log(m.macrostep_no, m.microstep_no, m.round_no, label, None))
            return run_log_label
        evaluate = self._evaluator(a.expr)

        def run_log(m: Any, owner: int) -> None:
            value = evaluate(m.ctx)
            m.effects.append(new_log(m.macrostep_no, m.microstep_no, m.round_no, label, value))
        return run_log

    def _if(self, a: If) -> Run:
        branches = tuple((None if cond is None else self._condition(cond), tuple(self._action(b) for b in acts))
                         for cond, acts in a.branches)

        def run_if(m: Any, owner: int) -> None:
            ctx = m.ctx
            for cond, acts in branches:
                if cond is None or cond(ctx):
                    for run in acts:
                        m.ticks -= 1
                        if m.ticks <= 0:
                            m.tock()
                        run(m, owner)
                    break
        return run_if


def _ctx_evaluator(expr: Expr) -> Callable[[Any], Any]:
    def evaluate(ctx: Any) -> Any:
        return ctx.evaluate(expr)
    return evaluate


def _ctx_condition(expr: Expr) -> Callable[[Any], bool]:
    def cond(ctx: Any) -> bool:
        return ctx.cond(expr)
    return cond


def _ctx_assigner(location: Expr) -> Callable[[Any, Any], None]:
    def assign(ctx: Any, value: Any) -> None:
        ctx.assign(location, value)
    return assign


def program_for(chart: Chart, dm: Any) -> Program:
    """The chart's :class:`Program` under ``dm`` (its prepared datamodel), built once."""
    prog = chart._caches.get("program")
    if prog is None:
        prog = chart._caches["program"] = Program(chart, dm)
    return prog
