"""Bench section ``macrostep``: one drive, this tree against a baseline ("today"), same run.

Issue 15 asks for a faster macrostep and for the figures to be read as same-run ratios.
This section times the four interpreter charts (``charts/*.scxml``) through
``Interpreter.drive`` on two versions of statebound:

* **now**: the working tree's ``src``;
* **today**: the interpreter before issue 15's work, exported from git
  (``BASELINE``, or ``run.py --baseline REV``; ``--baseline none`` skips it).

and both ways:

* **cache on**: the default, where the static path answers a macrostep whose shape does
  not depend on data from a per-chart plan (``docs/adr/0020-static-path-plans.md``);
* **cache off**: ``Interpreter(chart, static_path=False)``, the full W3C macrostep on every
  drive (the baseline, which predates the flag, gets the bench's never-answering cache).

Each version runs in its own worker process (``macrostep_worker.py``), so the two never
share a module; the parent interleaves their samples (repeat ``r`` of every cell and both
versions before repeat ``r + 1`` of any, and the version order alternates), and each
sample is the worker's *process CPU time*, which on a shared machine counts the drive's
own work rather than the neighbours'. Medians are printed, never asserted.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import adapters
from revs import export_src

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "macrostep_worker.py"

#: The last commit of main before issue 15's macrostep work: "today" in the issue's terms.
BASELINE = "c086498"



class _Worker:
    def __init__(self, src: Path, script: Path = WORKER) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script), str(src)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=str(HERE))

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"worker exited ({self.proc.wait()})"}
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

    @section("macrostep", "events/s per drive, now against today (baseline), cache on and off, same run "
             "(medians of process CPU time)",
             formats={"now/today": "{:.2f}x", "off: now/today": "{:.2f}x", "max spread": "{:.0%}"})
    def macrostep(ctx: Any) -> list[dict]:
        rev = ctx.baseline or BASELINE
        cells = [(w, True) for w in adapters.WORKLOADS] + [(w, False) for w in adapters.WORKLOADS]
        with tempfile.TemporaryDirectory(prefix="sb-baseline-") as tmp:
            versions: dict[str, Path] = {"now": REPO / "src"}
            if rev and rev != "none":
                try:
                    versions["today"] = export_src(rev, Path(tmp))
                except (subprocess.CalledProcessError, OSError) as exc:
                    ctx.note(f"today: baseline {rev} not exported ({exc}); only 'now' is shown")
            workers = {v: _Worker(p) for v, p in versions.items()}
            try:
                return _measure(ctx, workers, cells, rev)
            finally:
                for w in workers.values():
                    w.close()


def calibrate(ctx: Any, workers: dict[str, _Worker], cells: list[Any]) -> dict[str, dict[str, int]]:
    """Each worker's events per sample, by cell; a worker that fails is noted and dropped."""
    sizes: dict[str, dict[str, int]] = {}
    for v, w in list(workers.items()):
        got = w.ask({"cells": cells, "target": ctx.target_s})
        if "error" in got:
            ctx.note(f"{v}: {got['error']}")
            w.close()
            del workers[v]
            continue
        sizes[v] = got["n"]
    return sizes


def _measure(ctx: Any, workers: dict[str, _Worker], cells: list[tuple[str, bool]], rev: str) -> list[dict]:
    sizes = calibrate(ctx, workers, cells)
    names = [f"{wl}/{'on' if on else 'off'}" for wl, on in cells]
    rates: dict[tuple[str, str], list[float]] = {(v, c): [] for v in workers for c in names}
    for r in range(ctx.repeats):
        for cell in names:
            order = list(workers) if r % 2 == 0 else list(reversed(workers))
            for v in order:
                got = workers[v].ask({"run": cell})
                if "cpu" in got:
                    rates[(v, cell)].append(sizes[v][cell] / max(got["cpu"], 1e-9))
                else:
                    ctx.note(f"{v} {cell}: {got.get('error')}")
    for key, samples in rates.items():
        if samples:
            ctx.samples[f"macrostep/{key[0]}/{key[1]}"] = {"n": sizes[key[0]][key[1]], "rates": samples,
                                                           "median": statistics.median(samples)}

    def med(v: str, cell: str) -> float | None:
        s = rates.get((v, cell))
        return statistics.median(s) if s else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    rows = []
    for wl in adapters.WORKLOADS:
        on, off = f"{wl}/on", f"{wl}/off"
        spreads = [(max(s) - min(s)) / statistics.median(s) for s in
                   (rates.get((v, c), []) for v in workers for c in (on, off)) if s]
        rows.append({
            "workload": wl,
            "today": med("today", on), "now": med("now", on), "now/today": ratio(med("now", on), med("today", on)),
            "today off": med("today", off), "now off": med("now", off),
            "off: now/today": ratio(med("now", off), med("today", off)),
            "max spread": max(spreads) if spreads else None,
        })
    ctx.note(f"today = git {rev} (the interpreter before issue 15's macrostep work); now = this tree")
    ctx.note("on = the default (static path: per-chart plans); off = Interpreter(static_path=False), the full "
             "W3C macrostep on every drive. On realistic the baseline never took its static path, so its "
             "on and off are the same code")
    ctx.note("each version in its own process; samples interleaved, version order alternating; rates are "
             "events per second of the worker's CPU time")
    return rows
