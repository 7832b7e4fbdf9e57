"""Bench section ``import``: what a cold start pays to import statebound, now against before.

Issue 15 asks that ``import statebound`` stay at or under 60 ms and never import boto3.
Each sample is a fresh interpreter, timed inside the child with ``time.perf_counter``
around the import, so nothing is cached in-process. Three
things are timed, for this tree and for ``BASELINE`` (the commit before this round's work,
exported from git), interleaved so load from elsewhere hits both alike:

* ``import statebound``: the facade alone;
* ``+ Chart``: the chart layer, what validating a chart needs;
* ``+ Host``: the whole host stack, what a Lambda handler or a sweeper needs.

Medians of ``repeats * 4`` samples are printed, never asserted.

The samples read bytecode, as an installed package does: each tree's ``.pyc`` files are
written once, before timing, to a temporary ``PYTHONPYCACHEPREFIX`` (so the checkout is
left alone and ``PYTHONDONTWRITEBYTECODE`` in the caller's environment cannot turn the
figures into compile times). The ``now, from source`` column times this tree with no
bytecode at all (``-B`` and an empty cache), what a package shipped without ``.pyc`` files
pays on a read-only file system such as Lambda's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from revs import export_src

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: The last commit before this round's issues (10 to 15): "before" in the table.
BASELINE = "9d5b42b"

_PROBE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import statebound
t1 = time.perf_counter()
statebound.Chart
t2 = time.perf_counter()
statebound.Host
t3 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t0, t3 - t0, "boto3" in sys.modules]))
"""



def _env(cache: Path | None) -> dict[str, str]:
    """The child's environment: bytecode read from (and written once to) ``cache``, or with
    ``None`` none at all."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def _sample(src: Path, env: dict[str, str]) -> list[Any]:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(src)], capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout)  # type: ignore[no-any-return]



def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

    @section("import", "cold-start import cost, ms (fresh interpreter per sample, medians), now against before",
             formats={"now ms": "{:.1f}", "before ms": "{:.1f}", "now/before": "{:.2f}x",
                      "now, from source ms": "{:.1f}"})
    def import_cost(ctx: Any) -> list[dict]:
        n = ctx.repeats * 4
        with tempfile.TemporaryDirectory() as tmp:
            try:
                before_src: Path | None = export_src(BASELINE, Path(tmp))
            except (subprocess.CalledProcessError, OSError) as exc:
                before_src = None
                ctx.note(f"baseline {BASELINE} not available ({exc}); 'before' column left empty")
            cached = _env(Path(tmp) / "pyc")
            source = _env(None)
            source["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "empty")   # no checkout __pycache__ either
            _sample(REPO / "src", cached)                                  # writes the bytecode, untimed
            if before_src is not None:
                _sample(before_src, cached)
            now: list[list[Any]] = []
            before: list[list[Any]] = []
            cold: list[list[Any]] = []
            for _ in range(n):
                now.append(_sample(REPO / "src", cached))
                if before_src is not None:
                    before.append(_sample(before_src, cached))
                cold.append(_sample(REPO / "src", source))
        rows = []
        for i, what in enumerate(["import statebound", "+ Chart", "+ Host"]):
            m_now = statistics.median(s[i] for s in now) * 1000
            row: dict[str, Any] = {"what": what, "now ms": m_now}
            if before:
                m_before = statistics.median(s[i] for s in before) * 1000
                row.update({"before ms": m_before, "now/before": m_now / m_before})
            row["now, from source ms"] = statistics.median(s[i] for s in cold) * 1000
            rows.append(row)
        if any(s[3] for s in now):
            ctx.note("boto3 WAS imported by import statebound")
        else:
            ctx.note("boto3 is not imported")
        ctx.note(f"{n} fresh interpreters per column, reading bytecode written before timing (the last column: "
                 "none, every module compiled); the issue's limit is 60 ms for 'import statebound'")
        ctx.note(f"before = {BASELINE}: the facade imported every layer eagerly, so its three rows are equal")
        return rows
