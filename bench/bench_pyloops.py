"""Bench section ``pyloops``: python datamodel code that loops, this tree against a baseline.

The python datamodel spends the drive's CPU budget wherever chart code can repeat. Before
ADR 0017's amendment it ran such code under ``sys.settrace`` (and only inside the evaluation
that contained the loop); now the compiler puts a tick of the budget into every loop body,
call and comprehension step. This section drives small charts whose every event runs one
kind of repeating code, plus the realistic chart (no loops), on both versions:

* **now**: the working tree's ``src``;
* **before**: ``BASELINE`` (or ``run.py --baseline REV``), exported from git.

Each version runs in its own worker process (``pyloops_worker.py``); samples are
interleaved (repeat ``r`` of every cell and both versions before repeat ``r + 1`` of any,
version order alternating) and each is the worker's process CPU time. Medians are printed,
never asserted.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench_macrostep import _Worker, calibrate
from revs import export_src

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "pyloops_worker.py"

#: main before the ticks: the python datamodel traced repeating code with sys.settrace.
BASELINE = "8a32006"
#: What each workload's transition runs, once per event.
WORKLOADS = ("realistic", "genexp50", "for50", "lambda", "foreach10")


def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

    @section("pyloops", "events/s, python datamodel code that loops, now against before (medians of "
             "process CPU time)", formats={"now/before": "{:.2f}x", "max spread": "{:.0%}"})
    def pyloops(ctx: Any) -> list[dict]:
        rev = ctx.baseline or BASELINE
        with tempfile.TemporaryDirectory(prefix="sb-pyloops-") as tmp:
            versions: dict[str, Path] = {"now": REPO / "src"}
            if rev != "none":
                try:
                    versions["before"] = export_src(rev, Path(tmp))
                except (subprocess.CalledProcessError, OSError) as exc:
                    ctx.note(f"before: baseline {rev} not exported ({exc}); only 'now' is shown")
            workers = {v: _Worker(p, WORKER) for v, p in versions.items()}
            try:
                return _measure(ctx, workers, rev)
            finally:
                for w in workers.values():
                    w.close()


def _measure(ctx: Any, workers: dict[str, _Worker], rev: str) -> list[dict]:
    sizes = calibrate(ctx, workers, list(WORKLOADS))
    rates: dict[tuple[str, str], list[float]] = {(v, c): [] for v in workers for c in WORKLOADS}
    for r in range(ctx.repeats):
        for cell in WORKLOADS:
            for v in (list(workers) if r % 2 == 0 else list(reversed(workers))):
                got = workers[v].ask({"run": cell})
                if "cpu" in got:
                    rates[(v, cell)].append(sizes[v][cell] / max(got["cpu"], 1e-9))
                else:
                    ctx.note(f"{v} {cell}: {got.get('error')}")
    rows = []
    for cell in WORKLOADS:
        med = {v: statistics.median(rates[(v, cell)]) for v in workers if rates[(v, cell)]}
        spreads = [(max(s) - min(s)) / statistics.median(s) for s in (rates[(v, cell)] for v in workers) if s]
        rows.append({"workload": cell, "before": med.get("before"), "now": med.get("now"),
                     "now/before": med["now"] / med["before"] if "now" in med and "before" in med else None,
                     "max spread": max(spreads) if spreads else None})
        for v in med:
            ctx.samples[f"pyloops/{v}/{cell}"] = {"n": sizes[v][cell], "rates": rates[(v, cell)], "median": med[v]}
    ctx.note(f"before = git {rev}; now = this tree. genexp50: sum(x for x in range(50)); for50: a <script> "
             "for loop of 50; lambda: (lambda a: a + 1)(n); foreach10: <foreach> over 10 items; realistic: "
             "the interpreter section's chart (no loops)")
    return rows
