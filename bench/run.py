#!/usr/bin/env python
"""statebound benchmarks: ``python bench/run.py`` (``make bench``).

Sections are registered with :func:`section`; each returns a list of rows (dicts) that
the printer lays out as a table. Add one like this::

    @section("blob", "position to_bytes/from_bytes, ops/s")
    def blob(ctx: Ctx) -> list[dict]:
        ...
        return [{"codec": "msgpack", "encode/s": ctx.measure(run_encode).median, ...}]

``ctx.measure(run)`` times ``run(n)`` (``run`` does ``n`` operations) and returns a
:class:`Measurement` with the median rate; ``ctx.note(text)`` adds a line under the table.
Numbers are medians over repeats and only ever printed, never asserted: the machine
this runs on is noisy.

Options: ``--quick`` (fewer repeats, shorter runs), ``--only NAME`` (repeatable, or
comma-separated), ``--list``, ``--json PATH`` (write every sample as JSON).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
# bench the working tree, installed or not
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import adapters  # noqa: E402


# ------------------------------------------------------------------------ registry / API
@dataclass
class Section:
    name: str
    title: str
    fn: Callable[[Ctx], list[dict]]
    #: per-column format strings; other floats print as "{:,.0f}"
    formats: dict[str, str] = field(default_factory=dict)


SECTIONS: dict[str, Section] = {}


def section(name: str, title: str = "", *, formats: dict[str, str] | None = None):
    """Register ``fn(ctx) -> list[row dict]`` as the bench section ``name``."""

    def deco(fn):
        if name in SECTIONS:
            raise ValueError(f"duplicate bench section {name!r}")
        SECTIONS[name] = Section(name, title or name, fn, dict(formats or {}))
        return fn

    return deco


@dataclass
class Measurement:
    n: int                 # operations per sample
    rates: list[float]     # operations/s, one per repeat

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median of the samples: how noisy this cell was."""
        return (max(self.rates) - min(self.rates)) / self.median if self.rates else 0.0

    def as_json(self) -> dict:
        return {"n": self.n, "median": self.median, "spread": self.spread, "rates": self.rates}


@dataclass
class Ctx:
    quick: bool = False
    repeats: int = 5
    target_s: float = 0.5      # wall time of one timed sample
    baseline: str = ""         # git revision the macrostep section compares against ("" = its default)
    notes: list[str] = field(default_factory=list)
    samples: dict[str, Any] = field(default_factory=dict)   # for --json

    def note(self, text: str) -> None:
        self.notes.append(text)

    def measure(self, run: Callable[[int], Any], *, key: str | None = None,
                quiet: Callable[[], Any] | None = None) -> Measurement:
        """Warm up, pick ``n`` so that one ``run(n)`` takes about ``target_s``, then time
        ``repeats`` samples with ``time.perf_counter`` and return their rates."""
        import contextlib

        m = self.measure_group({"_": (run, quiet or contextlib.nullcontext)})["_"]
        if isinstance(m, Exception):
            raise m
        self.samples.pop("_", None)
        if key:
            self.samples[key] = m.as_json()
        return m

    def measure_group(self, runs: dict[str, tuple[Callable[[int], Any], Callable[[], Any]]],
                      *, key_prefix: str = "") -> dict[str, Measurement | Exception]:
        """Like :meth:`measure` for several competitors, with their samples interleaved:
        repeat ``r`` of every competitor runs before repeat ``r + 1`` of any, so a burst of
        load from elsewhere hits all of them alike and their *ratios* stay meaningful.

        ``runs`` maps a name to ``(run, quiet)``. A competitor whose run raises gets the
        exception instead of a measurement; the others carry on."""
        perf = time.perf_counter
        sizes: dict[str, int] = {}
        out: dict[str, Measurement | Exception] = {}
        for name, (run, quiet) in runs.items():
            try:
                with quiet():
                    n, dt = 64, 0.0
                    while True:  # warm-up and calibration: double n until >= 50 ms
                        t0 = perf()
                        run(n)
                        dt = perf() - t0
                        if dt >= 0.05 or n >= 1 << 26:
                            break
                        n *= 2
                    sizes[name] = max(1, int(n * self.target_s / max(dt, 1e-9)))
                    run(max(1, sizes[name] // 4))
            except Exception as e:
                out[name] = e
        rates: dict[str, list[float]] = {name: [] for name in sizes}
        for _ in range(self.repeats):
            for name, n in sizes.items():
                if name in out:
                    continue
                run, quiet = runs[name]
                try:
                    with quiet():
                        gc.collect()
                        t0 = perf()
                        run(n)
                        dt = perf() - t0
                except Exception as e:
                    out[name] = e
                    continue
                rates[name].append(n / dt)
        for name, n in sizes.items():
            if name not in out:
                out[name] = m = Measurement(n, rates[name])
                self.samples[f"{key_prefix}{name}"] = m.as_json()
        return out


# ----------------------------------------------------------------------------- printer
def _fmt(value: Any, col: str, formats: dict[str, str]) -> str:
    if value is None:
        return "-"
    if col in formats:
        try:
            return formats[col].format(value)
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float):
        return f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_table(sec: Section, rows: list[dict], notes: list[str], out=sys.stdout) -> None:
    print(f"\n== {sec.name}: {sec.title}", file=out)
    if rows:
        cols: list[str] = []
        for r in rows:
            cols.extend(c for c in r if c not in cols)
        cells = [[_fmt(r.get(c), c, sec.formats) for c in cols] for r in rows]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        left = {0}  # first column left-aligned, numbers right-aligned

        def line(vals):
            return "  ".join(v.ljust(w) if i in left else v.rjust(w)
                             for i, (v, w) in enumerate(zip(vals, widths, strict=True)))

        print(line(cols), file=out)
        print("  ".join("-" * w for w in widths), file=out)
        for row in cells:
            print(line(row), file=out)
    else:
        print("(no rows)", file=out)
    for n in notes:
        print(f"  note: {n}", file=out)


# ----------------------------------------------------------------- section: interpreter
@section(
    "interpreter",
    "events/s, one `next` per event, same SCXML charts (medians; ratio = statebound / best peer)",
    formats={"sb/best": "{:.2f}x", "sb/psm": "{:.2f}x", "max spread": "{:.0%}"},
)
def interpreter(ctx: Ctx) -> list[dict]:
    engines: dict[str, Any] = {}
    for name, (probe, factory, workloads) in adapters.ENGINES.items():
        try:
            version = probe()
        except Exception as e:  # the statebound interpreter may not exist yet
            ctx.note(f"{name}: not available ({type(e).__name__}: {e})")
            continue
        engines[name] = (version, factory, workloads)
    ctx.note("engines: " + ", ".join(f"{n} {v[0]}" for n, v in engines.items()))

    rows = []
    for w in adapters.WORKLOADS:
        row: dict[str, Any] = {"workload": w}
        runners: dict[str, adapters.Runner] = {}
        for name in adapters.ENGINES:
            row[name] = None
            if name not in engines or w not in engines[name][2]:
                continue
            try:
                runner = engines[name][1](w)
                _check(runner, w)
            except Exception as e:
                _failed(ctx, name, w, e)
                continue
            runners[name] = runner
        results = ctx.measure_group({n: (r.run, r.quiet) for n, r in runners.items()},
                                    key_prefix=f"interpreter/{w}/")
        spreads = []
        for name, m in results.items():
            try:
                if isinstance(m, Exception):
                    raise m
                _check_after(runners[name], w)
            except Exception as e:
                _failed(ctx, name, w, e)
                continue
            row[name] = m.median
            spreads.append(m.spread)
        # The benchmark spec: every workload is the same SCXML through python-statemachine;
        # transitions and sismic (hand-built equivalents, not SCXML) count on the flat chart.
        ratio_peers = adapters.PEERS if w == "flat" else ("python-statemachine",)
        peers = {p: row[p] for p in ratio_peers if row.get(p)}
        best = max(peers, key=peers.get) if peers else None
        sb = row.get("statebound")
        row["best peer"] = best
        row["sb/best"] = sb / peers[best] if sb and best else None
        row["sb/psm"] = (sb / row["python-statemachine"]
                         if sb and row.get("python-statemachine") else None)
        row["max spread"] = max(spreads) if spreads else None
        rows.append(row)
    ctx.note("best peer: on flat, the best of python-statemachine, transitions and sismic; on the "
             "other charts python-statemachine, the peer that runs the same SCXML. transitions and "
             "sismic run hand-built equivalents (no W3C semantics: no event queue, no conflict "
             "resolution, no datamodel isolation) and are shown there for information")
    ctx.note("max spread = (max - min) / median of the repeats, worst engine in the row")
    ctx.note("sb no-cache = Interpreter(chart, static_path=False) (diagnostic: the full W3C macrostep "
             "on every drive; not in the ratios). The macrostep section compares both with the "
             "interpreter before issue 15")
    return rows


def _failed(ctx: Ctx, name: str, w: str, e: BaseException) -> None:
    ctx.note(f"{name} on {w}: failed ({type(e).__name__}: {e})")
    if ctx.samples.get("_debug"):
        traceback.print_exception(e)


def _check(runner: adapters.Runner, w: str) -> None:
    """Before timing: the engine is in the initial configuration and takes the first
    6 events exactly as the chart says (leaves, and `n` for the realistic chart)."""
    for k in range(7):
        with runner.quiet():
            got = (runner.leaves(), runner.counter())
        want = adapters.expected(w, k)
        if got != want:
            raise AssertionError(f"after {k} events: got {got}, expected {want}")
        if k < 6:
            with runner.quiet():
                runner.run(1)


def _check_after(runner: adapters.Runner, w: str) -> None:
    """After timing: still on the cycle (the number of events sent is not tracked, so
    only that the configuration is one of the cycle's)."""
    leaves = runner.leaves()
    valid = {adapters.expected(w, k)[0] for k in range(6)}
    if leaves not in valid:
        raise AssertionError(f"after timing: configuration {set(leaves)} is off the cycle")


__import__("bench_blob").register(section)  # section blob (bench/bench_blob.py)
__import__("bench_host").register(section)  # sections host, sweeper, lag (bench/bench_host.py)
__import__("bench_batch").register(section)  # section batch: group commit (bench/bench_batch.py)
__import__("bench_outbox").register(section)  # section outbox (bench/bench_outbox.py)
__import__("bench_dynamo").register(section)  # section dynamodb, on moto (bench/bench_dynamo.py)
__import__("bench_ecma").register(section)  # section ecmascript (bench/bench_ecma.py)
__import__("bench_pyloops").register(section)  # section pyloops (bench/bench_pyloops.py)
__import__("bench_macrostep").register(section)  # section macrostep, now vs today (bench/bench_macrostep.py)
__import__("bench_import").register(section)  # section import: cold-start cost (bench/bench_import.py)


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats of ~0.15 s instead of 5 of ~0.5 s")
    ap.add_argument("--only", action="append", metavar="SECTION",
                    help="run only this section (repeatable, or comma-separated)")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    ap.add_argument("--json", metavar="PATH", help="also write rows and every sample as JSON")
    ap.add_argument("--repeats", type=int, help="override the number of repeats")
    ap.add_argument("--target", type=float, help="override seconds per timed sample")
    ap.add_argument("--debug", action="store_true", help="print tracebacks of failed cells")
    ap.add_argument("--baseline", metavar="REV", default="",
                    help="git revision the macrostep section compares against ('none' to skip)")
    args = ap.parse_args(argv)

    if args.list:
        for s in SECTIONS.values():
            print(f"{s.name:14} {s.title}")
        return 0
    names = list(SECTIONS)
    if args.only:
        names = [n.strip() for o in args.only for n in o.split(",") if n.strip()]
        unknown = [n for n in names if n not in SECTIONS]
        if unknown:
            ap.error(f"unknown section(s) {unknown}; known: {list(SECTIONS)}")

    repeats = args.repeats or (2 if args.quick else 5)
    target = args.target or (0.15 if args.quick else 0.5)
    print(f"statebound bench: python {platform.python_version()} on {platform.machine()}, "
          f"{repeats} repeats x ~{target:g} s per cell, medians")
    report: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "repeats": repeats, "target_s": target, "sections": {},
    }
    failed = False
    for name in names:
        sec = SECTIONS[name]
        ctx = Ctx(quick=args.quick, repeats=repeats, target_s=target, baseline=args.baseline)
        if args.debug:
            ctx.samples["_debug"] = True
        t0 = time.perf_counter()
        try:
            rows = sec.fn(ctx)
        except Exception as e:
            failed = True
            rows = []
            ctx.note(f"section failed: {type(e).__name__}: {e}")
            traceback.print_exc()
        ctx.note(f"section took {time.perf_counter() - t0:.1f} s")
        print_table(sec, rows, ctx.notes)
        ctx.samples.pop("_debug", None)
        report["sections"][name] = {"rows": rows, "notes": ctx.notes, "samples": ctx.samples}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
