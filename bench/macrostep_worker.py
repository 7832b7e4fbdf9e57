#!/usr/bin/env python
"""One statebound version, timed on command: the worker behind ``bench_macrostep.py``.

``python macrostep_worker.py SRC`` imports ``statebound`` from the directory ``SRC`` (the
working tree's ``src``, or a baseline exported from git) and answers JSON lines on stdin:

``{"cells": [[workload, static], ...], "target": s}``
    build a runner per cell (``static`` false: the full W3C macrostep every drive), check
    it takes the chart's cycle, calibrate ``n`` so one run lasts about ``target`` seconds;
    answer ``{"n": {cell: n}, "version": ...}`` or ``{"error": ...}``.
``{"run": cell}``
    drive ``n`` events through that cell; answer ``{"cpu": seconds}`` (process CPU time:
    on a shared machine it counts this worker's work, not the neighbours').

The parent interleaves the two versions' runs, so a burst of load hits both alike.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _runner(sb, adapters, workload: str, static: bool):
    chart = sb.Chart.from_scxml(adapters.scxml_text(workload), name=workload)
    try:
        interp = sb.Interpreter(chart, static_path=static)
    except TypeError:  # a version from before static_path: swap its cache for one that never answers
        interp = sb.Interpreter(chart)
        if not static:
            interp._static = adapters._AlwaysMiss()
    box = [interp.start(session_id=f"bench-{workload}")[0]]
    drive = interp.drive

    def run(n: int) -> None:
        pos = box[0]
        for _ in range(n):
            pos, _eff = drive(pos, "next")
        box[0] = pos

    def check(k: int) -> None:
        pos = box[0]
        leaves = frozenset(pos.configuration) & adapters.ATOMIC[workload]
        counter = pos.datamodel.get("n") if workload == "realistic" else None
        want = adapters.expected(workload, k)
        if (leaves, counter) != want:
            raise AssertionError(f"{workload} after {k} events: got {(set(leaves), counter)}, expected {want}")

    for k in range(7):  # the first events take the chart's cycle exactly
        check(k)
        if k < 6:
            run(1)
    return run


def serve(sb, make: Any) -> int:
    """Answer the parent's JSON lines; ``make(sb, spec) -> (cell name, run(n))`` builds a cell."""
    runs: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if "cells" in msg:
                for spec in msg["cells"]:
                    cell, run = make(sb, spec)
                    runs[cell] = run
                    n, dt = 64, 0.0
                    while True:  # warm-up and calibration: double n until >= 50 ms
                        t0 = time.process_time()
                        run(n)
                        dt = time.process_time() - t0
                        if dt >= 0.05 or n >= 1 << 24:
                            break
                        n *= 2
                    sizes[cell] = max(1, int(n * msg["target"] / max(dt, 1e-9)))
                reply: dict[str, object] = {"n": sizes, "version": getattr(sb, "__version__", "?"),
                                            "file": sb.__file__}
            else:
                cell = msg["run"]
                t0 = time.process_time()
                runs[cell](sizes[cell])
                reply = {"cpu": time.process_time() - t0}
        except Exception as exc:  # reported, and the parent prints "-" for this version
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, str(HERE))
    import adapters
    import statebound as sb

    def make(sb: Any, spec: list[Any]) -> tuple[str, Any]:
        workload, static = spec
        return f"{workload}/{'on' if static else 'off'}", _runner(sb, adapters, workload, static)
    return serve(sb, make)


if __name__ == "__main__":
    sys.exit(main())
