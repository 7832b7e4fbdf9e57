"""`make demo`: durable timers across processes, on the embedded SQLite store.

Every step below is a separate ``statebound`` process; nothing is kept in memory
between them. The payment timeout of order-1 is written to SQLite in the same
transaction as its position, and a sweeper started later, in a new process, fires it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHART = HERE / "order.scxml"
TIMEOUT_S = 3


def cli(db: str, *args: str) -> dict:
    """Run one `statebound` command in its own process and return its JSON output."""
    proc = subprocess.run([sys.executable, "-m", "statebound.cli", "--db", db, "--json", *args],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"statebound {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def step(n: int, text: str) -> None:
    print(f"\n[{n}] {text}", flush=True)


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="statebound-demo-"))
    db = str(workdir / "orders.db")
    print(f"statebound demo: order chart {CHART.relative_to(HERE.parent.parent)}, database {db}")

    step(1, "process A starts order-1 (payment must arrive within "
            f"{TIMEOUT_S}s) and sends StartPayment, then exits")
    data = json.dumps({"amount": 25, "payment_timeout": f"{TIMEOUT_S}s"})
    cli(db, "start", str(CHART), "order-1", "--data", data)
    pos = cli(db, "send", "order-1", "StartPayment", "--data", '{"card": "4242"}')
    print(f"    order-1 is {pos['configuration']} with timer(s): "
          + ", ".join(f"{t['name']} due {t['due_at']}" for t in pos["timers"]))

    step(2, "a sweeper starts in a new process (it knows nothing but the database)")
    sweeper = subprocess.Popen([sys.executable, "-m", "statebound.cli", "--db", db, "--json", "sweep",
                                "--interval", "0.25"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)

    step(3, "process B starts order-2, pays in time: Complete cancels its timer in the same commit")
    cli(db, "start", str(CHART), "order-2", "--data", data)
    cli(db, "send", "order-2", "StartPayment")
    before = cli(db, "timers", "order-2")
    pos2 = cli(db, "send", "order-2", "Complete")
    after = cli(db, "timers", "order-2")
    print(f"    order-2 timers before Complete: {len(before)}, after: {len(after)}; "
          f"order-2 ends {pos2['configuration']} ({pos2['status']})")

    step(4, f"waiting for order-1's payment timeout ({TIMEOUT_S}s after StartPayment)...")
    deadline = time.monotonic() + TIMEOUT_S + 15
    final = cli(db, "show", "order-1")
    while final["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.25)
        final = cli(db, "show", "order-1")
    print(f"    order-1 ends {final['configuration']} ({final['status']}); "
          f"pending timers: {len(final['timers'])}")

    sweeper.send_signal(signal.SIGINT)
    out, _err = sweeper.communicate(timeout=30)
    metrics = json.loads(out) if out.strip() else {}
    step(5, f"sweeper stopped: fired {metrics.get('fired', '?')} timer(s), "
            f"discarded {metrics.get('discarded', '?')}, failed {metrics.get('failed', '?')}")

    ok = (final["configuration"] == ["Cancelled"] and pos2["configuration"] == ["Done"]
          and not after and metrics.get("fired") == 1)
    print("\n" + ("demo OK: the timeout outlived the process that set it, and fired exactly once."
                  if ok else "demo FAILED"))
    if os.environ.get("STATEBOUND_DEMO_KEEP") is None:
        for f in workdir.iterdir():
            f.unlink()
        workdir.rmdir()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
