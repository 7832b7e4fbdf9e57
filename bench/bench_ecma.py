"""Bench section ``ecmascript``: the realistic chart on the python and ecmascript datamodels.

The same chart text with only ``datamodel=`` changed (``n + 1``, ``n >= 0`` and ``n`` mean
the same in both languages). Each ecmascript drive that evaluates anything opens a fresh
QuickJS runtime with memory and time caps (see docs/datamodels.md), which is what it
costs to run untrusted charts safely. Printed only, never asserted.
"""

from __future__ import annotations

from typing import Any

import adapters
import statebound as sb


def _runner(datamodel: str) -> Any:
    text = adapters.scxml_text("realistic").replace('datamodel="python"', f'datamodel="{datamodel}"')
    interp = sb.Interpreter(sb.Chart.from_scxml(text, name=f"realistic-{datamodel}"))
    box = [interp.start(session_id="bench")[0]]

    def run(n: int) -> None:
        pos = box[0]
        for _ in range(n):
            pos, _ = interp.drive(pos, "next")
        box[0] = pos
    return run, box


def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

    @section("ecmascript", "realistic chart, events/s, python vs ecmascript (QuickJS) datamodel",
             formats={"vs python": "{:.3f}x"})
    def ecmascript(ctx: Any) -> list[dict]:
        import contextlib
        try:
            import quickjs  # noqa: F401
        except ImportError:
            ctx.note("skipped: the ecmascript extra (quickjs-ng) is not installed")
            return []
        runs = {dm: _runner(dm) for dm in ("python", "ecmascript")}
        got = ctx.measure_group({dm: (r[0], contextlib.nullcontext) for dm, r in runs.items()},
                                key_prefix="ecmascript/")
        py = getattr(got.get("python"), "median", None)
        rows = []
        for dm, (_, box) in runs.items():
            m = got.get(dm)
            rate = getattr(m, "median", None)
            rows.append({"datamodel": dm, "events/s": rate, "µs per drive": 1e6 / rate if rate else None,
                         "vs python": rate / py if rate and py else None,
                         "n after run": box[0].datamodel["n"]})
        ctx.note("ecmascript: one sandboxed QuickJS runtime per drive (memory/time/stack caps)")
        return rows
