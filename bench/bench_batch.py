"""Bench section ``batch``: group commit against one commit per event (registered into ``run.py``).

Both columns run on a SQLite file with ``synchronous=FULL`` (the store's default: one WAL
fsync per transaction), in the same run, in short alternating slots so that load from
elsewhere on the machine hits both alike:

* **events/s**: 100 counter instances; *one commit per event* is ``host.send`` in a loop;
  *group commit* is ``host.send_many`` with the same events in batches of 100 (one per
  instance, so every batch is one transaction). A slot is 100 sends, or 5 batches.
* **fires/s**: 600 instances with one due timer row each (and each its own datamodel), drained by a
  ``Sweeper(batch=100)``; *one commit per event* is a host with ``max_batch=1`` (every
  fire commits alone, as before group commit), *group commit* the default ``max_batch=100``.
  The two sweep in turn, one ``run_once`` (100 rows) each.

The issue's goal is a ratio of at least 10x for both. ``ratio`` is the median of the
per-repetition ratios, ``ratio range`` their min and max; nothing is asserted.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import statebound as sb
from bench_host import T0, _charts, _due_rows, _sync
from statebound.events import Event
from statebound.host.store import Commit, PositionWrite, TimerCompletion

SIZE = 100
GOAL = 10.0


def _load() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # not on every platform
        return "?"


def _fsync_rate(tmp: str, seconds: float = 0.3) -> float:
    """The disk's raw rate of 4 KB append + fsync: the bound of one commit per event."""
    path = os.path.join(tmp, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def _counters(path: Path, n: int, max_batch: int) -> sb.Host:
    """``n`` started counter instances (set up without fsyncs), reopened with FULL sync."""
    counter = _charts()[0]
    setup = _sync(sb.SQLiteStore(path), "OFF")
    host = sb.Host([counter], store=setup, clock=sb.ManualClock(T0))
    for i in range(n):
        host.start("counter", f"c{i:03d}")
    setup.close()
    return sb.Host([counter], store=sb.SQLiteStore(path), clock=sb.ManualClock(T0), max_batch=max_batch)


def _events(ctx: Any, tmp: str) -> tuple[dict, list[float]]:
    hosts = {"single": _counters(Path(tmp) / "events-single.db", SIZE, 1),
             "group": _counters(Path(tmp) / "events-group.db", SIZE, SIZE)}
    ids = [f"c{i:03d}" for i in range(SIZE)]
    items = [(iid, "inc") for iid in ids]

    def single() -> int:
        host = hosts["single"]
        for iid in ids:
            host.send(iid, "inc")
        return SIZE

    def group() -> int:
        host = hosts["group"]
        for _ in range(5):   # a slot of five batches: single's slot is one batch, twenty times longer
            if not all(r.ok for r in host.send_many(items)):
                raise AssertionError("a send_many item failed")
        return 5 * SIZE

    run = {"single": single, "group": group}
    slots = 2 if ctx.quick else 4
    rates: dict[str, list[float]] = {"single": [], "group": []}
    sent = dict.fromkeys(run, 0)
    for _r in range(ctx.repeats):
        spent = dict.fromkeys(run, 0.0)
        done = dict.fromkeys(run, 0)
        # slots of each in turn, the order alternating, as for the fires below
        for k in range(slots):
            for mode in (("single", "group") if k % 2 == 0 else ("group", "single")):
                t0 = time.perf_counter()
                done[mode] += run[mode]()
                spent[mode] += time.perf_counter() - t0
        for mode in run:
            rates[mode].append(done[mode] / spent[mode])
            sent[mode] += done[mode]
    for mode, host in hosts.items():
        total = sum(host.get(i).datamodel["n"] for i in ids)
        if total != sent[mode]:
            raise AssertionError(f"{mode}: {total} events applied, {sent[mode]} sent")
        host.store.close()  # type: ignore[attr-defined]
    ratios = [g / s for g, s in zip(rates["group"], rates["single"], strict=True)]
    return rates, ratios


def _floor_sweep(store: sb.SQLiteStore, host: sb.Host) -> Callable[[], int]:
    """A sweep of the same rows with no host at all: the claim, one batch load, the decode, the
    drive, the encode and one ``commit_many`` of hand-built commits. What the store and the
    interpreter cost alone, so the ratio it reaches is the most any host could reach on them."""
    interps = {name: sb.Interpreter(c) for name, c in ((c.name, c) for c in _charts())}

    def sweep() -> int:
        rows = store.claim_due(host.clock.now_ms(), SIZE, "bench", 30_000)
        recs = store.load_many([row.target_id for row in rows])
        commits = []
        for row in rows:
            rec = recs[row.target_id]
            it = interps[rec.chart]
            pos, _ = it.drive(sb.Position.from_bytes(rec.blob, it.chart), Event.from_dict(row.event))
            write = PositionWrite(row.target_id, rec.chart, rec.version, pos.to_bytes(), pos.status)
            commits.append(Commit((write,), complete=TimerCompletion(row.key, "fired", None, "bench")))
        if any(store.commit_many(commits)):
            raise AssertionError("a floor commit was refused")
        return len(rows)
    return sweep


def _sweeper(host: sb.Host) -> Callable[[], int]:
    sweeper = sb.Sweeper(host, batch=SIZE, node_id="bench")
    return lambda: sweeper.run_once().fired


def _fires(ctx: Any, tmp: str) -> tuple[dict, list[float], list[float], int]:
    n = 300 if ctx.quick else 600
    modes = {"single": 1, "group": SIZE, "floor": SIZE}
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(ctx.repeats):
        sweeps, stores = {}, []
        for mode, max_batch in modes.items():
            store, host, _clock = _due_rows(tmp, n, f"{mode}-{r}", "FULL")
            host.max_batch = max_batch
            sweeps[mode] = _floor_sweep(store, host) if mode == "floor" else _sweeper(host)
            stores.append(store)
        # one sweep of each in turn (the order rotating), so a burst of load from elsewhere
        # falls on every mode alike instead of on one mode's whole repetition
        spent = dict.fromkeys(modes, 0.0)
        fired = dict.fromkeys(modes, 0)
        order = list(modes)
        for k in range(n // SIZE):
            for mode in order[k % 3:] + order[:k % 3]:
                t0 = time.perf_counter()
                fired[mode] += sweeps[mode]()
                spent[mode] += time.perf_counter() - t0
        for mode in modes:
            if fired[mode] != n:
                raise AssertionError(f"{mode}: fired {fired[mode]} of {n}")
            rates[mode].append(n / spent[mode])
        for store in stores:
            store.close()
    ratios = [g / s for g, s in zip(rates["group"], rates["single"], strict=True)]
    floor = [f / s for f, s in zip(rates["floor"], rates["single"], strict=True)]
    return rates, ratios, floor, n


def _row(what: str, rates: dict, ratios: list[float], group: str = "group", diagnostic: bool = False) -> dict:
    s, g = statistics.median(rates["single"]), statistics.median(rates[group])
    ratio = statistics.median(ratios)
    return {"measure": what, "one commit per event": s, "group commit": g, "ratio": ratio,
            "ratio range": f"{min(ratios):.1f}-{max(ratios):.1f}x",
            "spread": max((max(rates[m]) - min(rates[m])) / statistics.median(rates[m]) for m in ("single", group)),
            "goal": GOAL, "meets goal": "(diagnostic)" if diagnostic else "yes" if ratio >= GOAL else "no"}


def bench_batch(ctx: Any) -> list[dict]:
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        probes = [_fsync_rate(tmp)]
        ev_rates, ev_ratios = _events(ctx, tmp)
        probes.append(_fsync_rate(tmp))
        fire_rates, fire_ratios, floor_ratios, n = _fires(ctx, tmp)
        probes.append(_fsync_rate(tmp))
    ctx.samples["batch/fires"] = {"n": n, "rates": fire_rates, "ratios": fire_ratios, "floor_ratios": floor_ratios}
    ctx.samples["batch/event_ratios"] = ev_ratios
    ctx.note(f"SQLite file, synchronous=FULL, batches of {SIZE}; {ctx.repeats} repetitions, each of "
             "short slots alternating between the two (ratio = median of the per-repetition ratios; "
             "range = their min-max)")
    ctx.note(f"events: {SIZE} counter instances, host.send in a loop vs host.send_many of {SIZE} "
             "(one transaction per batch)")
    ctx.note(f"fires: {n} rows due, one per instance, Sweeper(batch={SIZE}).run_until_idle on a host with "
             "max_batch=1 vs the default 100 (per sweep: the claim's transaction plus one group commit)")
    ctx.note(f"fires, no host: the same {n} rows swept in the same slots by the store and the interpreter "
             "alone (claim, batch load, decode, drive, encode, one commit_many), the most any host could "
             "reach on them; its ratio is against the same one-commit-per-event column")
    ctx.note(f"load average (1/5/15 min) before {load_before}, after {_load()}: the machine is shared, so "
             "read the ratios, not the absolute rates")
    ctx.note("the disk's raw 4 KB append+fsync rate before, between and after: "
             + " / ".join(f"{p:,.0f}/s" for p in probes) + ". The ratio is about (cpu + fsync) / (cpu + fsync/100) "
             "per event: it is large when an fsync costs much more than a unit's CPU, and small on a disk "
             "whose fsync is cheap")
    ctx.samples["batch/fsync_per_s"] = probes
    return [_row("events/s", ev_rates, ev_ratios), _row("fires/s", fire_rates, fire_ratios),
            _row("fires/s, no host", fire_rates, floor_ratios, "floor", diagnostic=True)]


def register(section: Any) -> None:
    """Register the section with run.py's ``@section`` decorator."""
    section("batch", "group commit vs one commit per event, SQLite synchronous=FULL, batches of 100",
            formats={"ratio": "{:.1f}x", "spread": "{:.0%}", "goal": "{:.0f}x"})(bench_batch)
