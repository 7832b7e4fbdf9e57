"""Bench section ``ecmascript``: the realistic chart on the python and ecmascript datamodels.

The same chart text with only ``datamodel=`` changed (``n + 1``, ``n >= 0`` and ``n`` mean
the same in both languages). Three competitors, their repeats interleaved:

* ``python``: the python datamodel;
* ``ecmascript``: the ecmascript datamodel as it is, one frozen QuickJS realm per thread,
  wiped between drives (docs/adr/0024-one-frozen-quickjs-realm-per-thread.md);
* ``ecmascript before``: the ecmascript datamodel of commit :data:`BEFORE`, which started a
  QuickJS runtime and parsed its prelude on every drive. Its source is read from git and
  loaded beside the current package, so both run in this process on the same interpreter;
  without git (or if that commit is gone) the row is left out with a note.

``vs before`` is the ratio of medians; ``ratio range`` is the per-repeat ratio's min and max
(repeat ``r`` of each competitor runs back to back, so each such ratio saw the same load),
and ``spread`` is each competitor's (max - min) / median over its repeats: how noisy the
machine was. Printed only, never asserted.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import adapters
import statebound as sb

#: The last commit whose ecmascript datamodel made a runtime per drive (main, 2026-12).
BEFORE = "a90ba68"
_BEFORE_PATH = "src/statebound/datamodel/ecmascript.py"


def _before_module() -> Any:
    """The ecmascript datamodel module of :data:`BEFORE`, loaded under ``statebound.datamodel``."""
    repo = Path(__file__).resolve().parent.parent
    src = subprocess.run(["git", "-C", str(repo), "show", f"{BEFORE}:{_BEFORE_PATH}"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    name = "statebound.datamodel._ecmascript_before"
    mod = types.ModuleType(name)
    mod.__package__ = "statebound.datamodel"  # its relative imports resolve against today's package
    sys.modules[name] = mod
    exec(compile(src, f"{BEFORE}:{_BEFORE_PATH}", "exec"), mod.__dict__)  # (our own history, from git)
    return mod


def _runner(datamodel: str, before: Any = None) -> Any:
    text = adapters.scxml_text("realistic").replace('datamodel="python"', f'datamodel="{datamodel}"')
    chart = sb.Chart.from_scxml(text, name=f"realistic-{datamodel}{'-before' if before else ''}")
    if before is not None:
        chart._caches["datamodel"] = before.EcmaScriptDatamodel(chart)
    interp = sb.Interpreter(chart)
    box = [interp.start(session_id="bench")[0]]

    def run(n: int) -> None:
        pos = box[0]
        for _ in range(n):
            pos, _ = interp.drive(pos, "next")
        box[0] = pos
    return run, box


def _spread(rates: list[float]) -> float | None:
    if len(rates) < 2:
        return None
    rates = sorted(rates)
    return (rates[-1] - rates[0]) / rates[len(rates) // 2]


def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

    @section("ecmascript", "realistic chart, events/s: python, ecmascript, and ecmascript before the shared realm",
             formats={"vs python": "{:.3f}x", "cost vs before": "{:.3f}x", "spread": "{:.0%}", "µs per drive": "{:,.1f}"})
    def ecmascript(ctx: Any) -> list[dict]:
        try:
            import quickjs  # noqa: F401
        except ImportError:
            ctx.note("skipped: the ecmascript extra (quickjs-ng) is not installed")
            return []
        runs = {"python": _runner("python"), "ecmascript": _runner("ecmascript")}
        try:
            runs["ecmascript before"] = _runner("ecmascript", _before_module())
        except Exception as exc:  # no git, a shallow clone, or that module no longer loads
            ctx.note(f"ecmascript before ({BEFORE}) left out: {type(exc).__name__}: {str(exc)[:200]}")
        got = ctx.measure_group({k: (r[0], contextlib.nullcontext) for k, r in runs.items()},
                                key_prefix="ecmascript/")
        py = getattr(got.get("python"), "median", None)
        old = got.get("ecmascript before")
        rows = []
        for name, (_, box) in runs.items():
            m = got.get(name)
            rate = getattr(m, "median", None)
            row = {"datamodel": name, "events/s": rate, "µs per drive": 1e6 / rate if rate else None,
                   "vs python": rate / py if rate and py else None,
                   "cost vs before": None, "ratio range": None,
                   "spread": _spread(m.rates) if rate else None, "n after run": box[0].datamodel["n"]}
            if rate and getattr(old, "median", None):
                # a drive's cost relative to before: the inverse of the rates' ratio
                row["cost vs before"] = old.median / rate
                ratios = [b / r for b, r in zip(old.rates, m.rates, strict=False)]
                row["ratio range"] = f"{min(ratios):.3f}-{max(ratios):.3f}"
            rows.append(row)
        ctx.note("cost vs before: the cost of a drive relative to ecmascript before (0.100x is ten times cheaper)")
        return rows
