"""Several processes on one SQLite file: sends serialise, timers fire exactly once.

Children are real processes (``subprocess`` running ``tests/_conc_child.py``) that share
nothing but the database file, on the SystemClock. A start barrier (a file the parent
creates) makes them contend from the first statement.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import statebound as sb

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_conc_child.py"
sys.path.insert(0, str(HERE))
from _conc_child import charts  # noqa: E402


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _release(go: str, procs: list[subprocess.Popen], timeout: float = 60) -> float:
    """Wait until every child is at the barrier, then open it; returns the start time."""
    deadline = time.monotonic() + timeout
    while sum(Path(f"{go}.ready.{p.pid}").exists() for p in procs) < len(procs):
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(p.stderr.read()[-3000:])
        assert time.monotonic() < deadline, "children never reached the barrier"
        time.sleep(0.005)
    t0 = time.perf_counter()
    Path(go).touch()
    return t0


def _collect(procs: list[subprocess.Popen], timeout: float = 120) -> list[dict]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_four_processes_sending_to_one_instance(tmp_path):
    db = str(tmp_path / "conc.db")
    go = str(tmp_path / "go")
    store = sb.SQLiteStore(db)
    host = sb.Host(charts(), store=store, clock=sb.SystemClock())
    host.start("counter", "c")
    procs = [_spawn("send", db, go, "250") for _ in range(4)]
    t0 = _release(go, procs)
    results = _collect(procs)
    elapsed = time.perf_counter() - t0
    pos = host.get("c")
    assert pos.datamodel["n"] == 1000
    assert store.load("c").version == 1001          # one commit per send, none lost or doubled
    assert sum(r["sent"] for r in results) == 1000
    conflicts = sum(r["conflicts"] for r in results)
    print(f"\n4 x 250 sends in {elapsed:.2f}s, {conflicts} conflicts retried")
    store.close()


def test_two_sweepers_fire_500_due_timers_exactly_once(tmp_path):
    db = str(tmp_path / "sweep.db")
    go = str(tmp_path / "go")
    store = sb.SQLiteStore(db)
    host = sb.Host(charts(), store=store, clock=sb.SystemClock())
    ids = [f"t{i:03d}" for i in range(500)]
    for iid in ids:
        host.start("ticker", iid)          # each leaves one row due 1 ms later
    assert all(len(host.pending_timers(i)) == 1 for i in ids[:5])
    procs = [_spawn("sweep", db, go, f"sweeper-{k}", "10", "2") for k in range(2)]
    t0 = _release(go, procs)
    results = _collect(procs)
    elapsed = time.perf_counter() - t0
    assert sum(r["fired"] for r in results) == 500
    assert sum(r["failed"] + r["discarded"] + r["stale"] for r in results) == 0
    fired = Counter((k[0], k[1]) for r in results for k in r["keys"] if k[2] == "fired")
    assert set(fired) == {(i, 1) for i in ids}
    assert set(fired.values()) == {1}                  # each row fired by exactly one sweeper
    assert all(r["fired"] > 0 for r in results), [r["fired"] for r in results]  # both took part
    con = sqlite3.connect(db)
    try:
        states = con.execute("SELECT state, outcome, count(*) FROM timers GROUP BY 1, 2").fetchall()
    finally:
        con.close()
    assert states == [("done", "fired", 500)]
    assert all(host.get(i).datamodel["n"] == 1 for i in ids)   # each counter +1 exactly
    assert host.next_due() is None
    print(f"\n2 sweepers: {[r['fired'] for r in results]} fired, "
          f"{sum(r['skipped'] for r in results)} skipped, in {elapsed:.2f}s")
    store.close()
