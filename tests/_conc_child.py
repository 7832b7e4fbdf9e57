"""Child process for tests/test_host_concurrency.py (and bench/bench_host.py).

``python _conc_child.py send DB GOFILE N``   send ``inc`` N times to instance ``c``
``python _conc_child.py sweep DB GOFILE NODE BATCH [PEERS]``  sweep until idle as node NODE
(with PEERS, its first fire waits until PEERS sweepers have each fired once)

Each creates GOFILE.ready.<pid>, waits for GOFILE to exist (a start barrier), then prints one JSON line of results.
"""

from __future__ import annotations

import json
import os
import sys
import time

import statebound as sb

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
       name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>"""

# each instance leaves one delayed inc (due 1 ms after its start) behind
TICKER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
       name="ticker" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <onentry><send event="inc" delay="1ms"/></onentry>
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>"""


def charts() -> list[sb.Chart]:
    return [sb.Chart.from_scxml(TICKER), sb.Chart.from_scxml(COUNTER)]


def wait_for(path: str, timeout: float = 60.0) -> None:
    """Announce readiness (``GOFILE.ready.<pid>``), then wait for the barrier file."""
    open(f"{path}.ready.{os.getpid()}", "w").close()
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit("start barrier never opened")
        time.sleep(0.002)


def meet(go: str, node: str, peers: int, timeout: float = 30.0) -> None:
    """After this sweeper's first fire, wait for its peers' first fires (or a timeout).

    The race under test needs every sweeper inside it: on a loaded machine one process
    could otherwise drain all rows before another has claimed any. A sweeper holds its
    claimed batch while it waits, so the others have to claim different rows.
    """
    open(f"{go}.fired.{node}", "w").close()
    deadline = time.monotonic() + timeout
    folder, stem = os.path.split(go)
    while sum(n.startswith(f"{stem}.fired.") for n in os.listdir(folder or ".")) < peers:
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    mode, db, go = argv[0], argv[1], argv[2]
    store = sb.SQLiteStore(db)
    # contention is the point here: retry for as long as it takes rather than give up under load
    host = sb.Host(charts(), store=store, clock=sb.SystemClock(), max_conflict_retries=200)
    if mode == "send":
        n = int(argv[3])
        wait_for(go)
        t0 = time.perf_counter()
        for _ in range(n):
            host.send("c", "inc")
        print(json.dumps({"sent": n, "conflicts": host.metrics["conflicts"],
                          "seconds": time.perf_counter() - t0}), flush=True)
    elif mode == "sweep":
        node, batch = argv[3], int(argv[4])
        keys: list[list] = []
        orig = host.fire_many

        peers = int(argv[5]) if len(argv) > 5 else 1

        def fire_many(rows, **kw):
            results = orig(rows, **kw)
            first = not keys
            keys.extend([res.key[0], res.key[1], res.outcome] for res in results)
            if first and keys and peers > 1:
                meet(go, node, peers)
            return results
        host.fire_many = fire_many  # type: ignore[method-assign]
        sweeper = sb.Sweeper(host, batch=batch, node_id=node)
        wait_for(go)
        t0 = time.perf_counter()
        rep = sweeper.run_until_idle()
        m = sweeper.metrics
        print(json.dumps({"node": node, "fired": m.fired, "discarded": m.discarded, "failed": m.failed,
                          "skipped": m.skipped, "stale": m.stale, "keys": keys, "sweeps": m.sweeps,
                          "seconds": time.perf_counter() - t0, "lag_ms": list(rep.lag_ms)}), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
