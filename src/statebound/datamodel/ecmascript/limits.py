"""The resource caps of the ECMAScript sandbox, per chart or for every chart."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...chart.model import Chart
from ...exceptions import InvalidArgument

__all__ = ["Limits", "DEFAULT_LIMITS", "MIN_STACK_BYTES", "MAX_STACK_BYTES", "set_limits", "get_limits", "set_default_limits"]


#: The JS stack cap's bounds: the top stays well under a thread's default C stack (8 MiB).
MIN_STACK_BYTES = 64 * 1024
MAX_STACK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Resource caps of the ECMAScript sandbox.

    :ivar memory_bytes: the QuickJS heap cap of one drive: what its variables and every
        value it makes may take, on top of the shared realm the drive runs in.
    :ivar time_ms: CPU time one evaluation (expression, condition, ``<script>``, the
        commit's serialization) may take before it is interrupted.
    :ivar stack_bytes: the JS stack cap (deep recursion raises a ``RangeError``), from
        64 KiB to 4 MiB.
    """

    memory_bytes: int = 64 * 1024 * 1024
    time_ms: int = 1000
    stack_bytes: int = 512 * 1024

    def __post_init__(self) -> None:
        if self.memory_bytes < 1024 * 1024:
            raise InvalidArgument("memory_bytes must be at least 1 MiB")
        if self.time_ms < 1:
            raise InvalidArgument("time_ms must be at least 1")
        if not MIN_STACK_BYTES <= self.stack_bytes <= MAX_STACK_BYTES:
            # QuickJS checks its own stack against this cap only: at or past the C stack of
            # the thread that drives (8 MiB by default), deep recursion crashes the process
            raise InvalidArgument(f"stack_bytes must be from {MIN_STACK_BYTES} (64 KiB) to {MAX_STACK_BYTES} "
                                  f"(4 MiB), not {self.stack_bytes}")


#: The limits of charts that were given none.
DEFAULT_LIMITS = Limits()
_LIMITS_KEY = "ecmascript.limits"


def set_default_limits(limits: Limits) -> None:
    """Change the limits of every chart that has none of its own."""
    global DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise InvalidArgument("set_default_limits takes a Limits")
    DEFAULT_LIMITS = limits


def set_limits(chart: Chart, limits: Limits | None = None, *, memory_bytes: int | None = None,
               time_ms: int | None = None, stack_bytes: int | None = None) -> Limits:
    """Set the sandbox limits of ``chart`` (and of the sub-charts it invokes).

    ``set_limits(chart, Limits(...))`` or ``set_limits(chart, time_ms=50)`` (the other
    fields keep their current value). Takes effect from the next drive; returns the limits.
    Its inline and ``src`` children get them now; the children it compiles at run time
    (``srcexpr``, ``<content expr>``) get them from the host at each ``<invoke>``.
    """
    base = limits if limits is not None else get_limits(chart)
    changes = {k: v for k, v in (("memory_bytes", memory_bytes), ("time_ms", time_ms),
                                 ("stack_bytes", stack_bytes)) if v is not None}
    new = replace(base, **changes) if changes else base
    stack = [chart]
    while stack:
        c = stack.pop()
        c._caches[_LIMITS_KEY] = new
        stack.extend(getattr(c, "subcharts", ()) or ())
    return new


def get_limits(chart: Chart) -> Limits:
    """The limits in force for ``chart``."""
    return chart._caches.get(_LIMITS_KEY) or DEFAULT_LIMITS

