"""``Host.metrics`` counts every outcome when several threads share one host (a sweeper
with ``workers > 1``, a server's request threads).

A bare ``d[k] = d.get(k, 0) + 1`` reads and writes in two steps, and a thread switch
between them loses another thread's count. On CPython's GIL that window is narrow: with
the switch interval forced down to a microsecond, unlocked counting lost about one fire
in 40,000 through an eight-worker sweeper here, too rare to catch every run. So the tests
also widen the window the way a loaded machine would: a profile hook makes the thread
that just read a total from ``host.metrics`` give up the interpreter (``time.sleep(0)``)
before it writes, so the other threads run in between. The counting itself is the
host's real path (a sweeper's fires, keyed sends); only the scheduling is forced.
"""

from __future__ import annotations

import copy
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import statebound as sb
from statebound.host import SweepReport, SweeperMetrics

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="null"'
T0 = 1_000_000
TICK = sb.Chart.from_scxml(f"""<scxml {NS} name="tick" initial="s">
  <state id="s"><onentry><send event="a" delay="1s"/></onentry><transition event="a" target="t"/></state>
  <state id="t"><transition event="go" target="t"/></state>
</scxml>""")


@pytest.fixture()
def tiny_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _yield_after_reading(metrics: dict[str, int]) -> Any:
    """A profile hook: a thread returning from a method of ``metrics`` (a read of a total)
    sleeps for no time, which hands the interpreter to another thread."""
    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__self__", None) is metrics:
            time.sleep(0)
    return hook


def _run_threads(n: int, target, metrics: dict[str, int] | None = None) -> None:
    barrier = threading.Barrier(n)
    hook = None if metrics is None else _yield_after_reading(metrics)

    def run(i: int) -> None:
        barrier.wait()
        if hook is not None:
            sys.setprofile(hook)   # this thread only
        try:
            target(i)
        finally:
            sys.setprofile(None)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_repeated_keyed_sends_from_eight_threads_count_every_duplicate(tiny_switch_interval):
    """4,000 repeats of an applied key, from eight threads: each is one ``duplicates``."""
    host = sb.Host([TICK], store=sb.MemoryStore(), clock=sb.ManualClock(T0))
    for i in range(8):
        host.start(TICK, f"i{i}")
        host.send(f"i{i}", "go", idempotency_key="k")
    before = host.metrics.get("duplicates", 0)
    repeats = 500

    def repeat(i: int) -> None:
        for _ in range(repeats):
            host.send(f"i{i}", "go", idempotency_key="k")
    _run_threads(8, repeat, host.metrics)
    assert host.metrics["duplicates"] - before == 8 * repeats


def test_a_sweeper_with_eight_workers_counts_every_fire_commit_and_drive(tiny_switch_interval):
    """1,000 due rows of 1,000 instances through ``Sweeper(workers=8)``: the host's totals
    move by exactly the rows fired."""
    clock = sb.ManualClock(T0)
    host = sb.Host([TICK], store=sb.MemoryStore(), clock=clock)
    rows = 1_000
    for i in range(rows):
        host.start(TICK, f"i{i}")
    before = dict(host.metrics)
    clock.set(T0 + 1_000)
    sweeper = sb.Sweeper(host, workers=8, batch=rows)
    threading.setprofile(_yield_after_reading(host.metrics))   # the pool's threads start under it
    try:
        report = sweeper.run_once()
    finally:
        threading.setprofile(None)   # type: ignore[arg-type]
        sweeper.close()
    assert report.fired == rows
    moved = {k: host.metrics.get(k, 0) - before.get(k, 0) for k in ("fired", "commits", "drives", "conflicts")}
    assert moved == {"fired": rows, "commits": rows, "drives": rows, "conflicts": 0}


def test_metrics_stay_a_dict_that_copies_and_pickles():
    host = sb.Host([TICK], store=sb.MemoryStore(), clock=sb.ManualClock(T0))
    host.start(TICK, "i")
    assert isinstance(host.metrics, dict) and host.metrics["commits"] == 1
    for twin in (copy.deepcopy(host.metrics), pickle.loads(pickle.dumps(host.metrics))):
        assert twin == host.metrics
        twin.add("commits")   # a copy counts on its own
        assert twin["commits"] == 2 and host.metrics["commits"] == 1


def test_sweeper_metrics_fold_reports_from_eight_threads_without_losing_one():
    """``handle_wakeups`` may be called for several wake-up batches at once on one sweeper;
    each folds its report into ``sweeper.metrics``. The hook hands the interpreter over
    after every C call, between the read of a total and its write."""
    metrics = SweeperMetrics()
    report = SweepReport(fired=2, discarded=1, lag_ms=(5, 7), empty=1)

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return":
            time.sleep(0)

    def fold(i: int) -> None:
        for _ in range(100):
            metrics.add(report)
    before = threading.getprofile() if hasattr(threading, "getprofile") else None
    threading.setprofile(hook)
    try:
        _run_threads(8, fold)
    finally:
        threading.setprofile(before)   # type: ignore[arg-type]
    assert (metrics.sweeps, metrics.fired, metrics.discarded, metrics.empty) == (800, 1_600, 800, 800)
    assert metrics.max_lag_ms == 7


def test_sweeper_metrics_stay_a_plain_dataclass():
    import dataclasses
    metrics = SweeperMetrics()
    metrics.add(SweepReport(fired=1, lag_ms=(3,)))
    assert dataclasses.asdict(metrics)["fired"] == 1
    assert copy.deepcopy(metrics) == metrics == pickle.loads(pickle.dumps(metrics))
