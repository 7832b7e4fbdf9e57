"""The ``null`` datamodel (W3C SCXML §B.1): no variables; the only expression is ``In(id)``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ..chart.model import Chart, Expr
from ..exceptions import EvaluationError
from .budget import Budget

__all__ = ["NullDatamodel"]

_IN = re.compile(r"^\s*In\(\s*['\"]?([^'\")\s]+)['\"]?\s*\)\s*$")


class NullDatamodel:
    """The null datamodel prepared for one chart."""

    name = "null"

    def __init__(self, chart: Chart) -> None:
        self.chart = chart

    def open(self, variables: dict[str, Any], session_id: str, name: str,
             ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
             budget: Budget | None = None) -> NullContext:
        """Open a context (variables are ignored: there are none; ``In()`` costs no budget)."""
        return NullContext(in_state)


class NullContext:
    """A drive's context under the null datamodel."""

    __slots__ = ("in_state",)

    def __init__(self, in_state: Callable[[str], bool]) -> None:
        self.in_state = in_state

    def evaluate(self, expr: Expr) -> Any:
        """Only ``In(id)`` can be evaluated."""
        m = _IN.match(expr.src)
        if not m:
            raise EvaluationError(f"the null datamodel has no expressions ({expr.src!r})")
        return self.in_state(m.group(1))

    def evaluate_text(self, expr: Expr) -> str:
        """``In(id)``, as text."""
        return str(self.evaluate(expr))

    def cond(self, expr: Expr) -> bool:
        """``In(id)`` conditions."""
        return bool(self.evaluate(expr))

    def assign(self, location: Expr, value: Any) -> None:
        """Always fails: there is nothing to assign to."""
        raise EvaluationError("the null datamodel has no locations")

    def declare(self, name: str, value: Any) -> None:
        """Always fails."""
        raise EvaluationError("the null datamodel has no variables")

    def is_declared(self, location: Expr) -> bool:
        """Nothing is declared."""
        return False

    def valid_location(self, location: Expr) -> bool:
        """No location is valid."""
        return False

    def execute(self, script: Expr) -> None:
        """Always fails."""
        raise EvaluationError("the null datamodel cannot run scripts")

    def set_event(self, event: Any) -> None:
        """Nothing to bind."""

    def variables(self) -> dict[str, Any]:
        """Always empty."""
        return {}
