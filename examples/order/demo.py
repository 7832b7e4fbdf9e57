"""`make demo`: durable timers and a charge that happens once, across processes, on SQLite.

Every step below is a separate process (``shop.py``); nothing is kept in memory between
them. The order chart charges the card through the shop's payment gateway (an invoke
handler). The gateway charges order-1 but its answer is lost; the outbox row that asked
for the charge survives in SQLite, a sweeper started later retries it with the same
idempotency key, and the gateway recognises the key instead of charging again. Order-2
waits for a bank transfer that never comes in time: its durable payment timeout fires,
leaving the state cancels the invocation, and the bank's late answer is discarded.
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
from typing import Any

HERE = Path(__file__).resolve().parent
SHOP = HERE / "shop.py"
TIMEOUT = "3s"


def shop(db: str, *args: str) -> Any:
    """Run one shop command in its own process and return its JSON output."""
    proc = subprocess.run([sys.executable, str(SHOP), db, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SHOP_GATEWAY": "flaky"})
    if proc.returncode != 0:
        raise SystemExit(f"shop {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def step(n: int, text: str) -> None:
    print(f"\n[{n}] {text}", flush=True)


def wait_for(db: str, order: str, status: str, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    pos = shop(db, "show", order)
    while pos["status"] != status and time.monotonic() < deadline:
        time.sleep(0.25)
        pos = shop(db, "show", order)
    return pos


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="statebound-demo-"))
    db = str(workdir / "orders.db")
    print(f"statebound demo: order chart {CHART_NAME}, database {db}")

    step(1, "process A starts order-1 (25.00) and pays by card; the gateway charges it, "
            "but its answer is lost on the way back")
    shop(db, "start", "order-1", "25", "1h")
    pos = shop(db, "pay", "order-1", "4242")
    [charge_row] = [r for r in pos["rows"] if r["kind"] == "invoke"]
    print(f"    order-1 is {pos['configuration']}; its charge is an outbox row, "
          f"{charge_row['state']} after attempt {charge_row['attempts']}: {charge_row['last_error']}")
    ledger = shop(db, "ledger")
    print(f"    the gateway's ledger: {len(ledger['charges'])} charge(s) for order-1")

    step(2, "a sweeper starts in a new process and retries the charge with the same idempotency key")
    sweeper = subprocess.Popen([sys.executable, str(SHOP), db, "sweep"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "SHOP_GATEWAY": "flaky"})
    final1 = wait_for(db, "order-1", "done", 15)
    print(f"    order-1 ends {final1['configuration']} ({final1['status']}), charge {final1['charge']}")

    step(3, f"process B starts order-2 and pays by bank transfer; the payment is due within {TIMEOUT}")
    shop(db, "start", "order-2", "40", TIMEOUT)
    pos2 = shop(db, "pay", "order-2", "transfer")
    [waiting] = [r for r in pos2["rows"] if r["kind"] == "invoke"]
    print(f"    order-2 is {pos2['configuration']}; the gateway answered 'later': its row is {waiting['state']}")

    step(4, f"no transfer arrives: the sweeper fires order-2's payment timeout ({TIMEOUT})...")
    final2 = wait_for(db, "order-2", "done", 15)
    print(f"    order-2 ends {final2['configuration']}; leaving the state cancelled the invocation")
    late = shop(db, "bank-confirms", "order-2")
    print(f"    the bank confirms too late: {late['outcome']} ({late['row']['reason'] if late['row'] else late['reason']})")

    sweeper.send_signal(signal.SIGINT)
    out, _err = sweeper.communicate(timeout=30)
    metrics = json.loads(out) if out.strip() else {}
    ledger = shop(db, "ledger")
    charges = {c["instance"]: c for c in ledger["charges"]}
    step(5, f"sweeper stopped after firing {metrics.get('fired', '?')} rows (order-1's retried charge, "
            "order-2's timeout); the receipt and the cancellation went out right after those commits")
    for c in ledger["charges"]:
        print(f"    gateway: {c['instance']} {c['status']} {c['amount']:.2f} after {c['attempts']} "
              f"request(s) with key {c['key']}")
    for r in ledger["receipts"]:
        print(f"    receipt: {r['instance']} {r['event']} {r['data']}")

    ok = (final1["configuration"] == ["Done"] and final2["configuration"] == ["Cancelled"]
          and [c["instance"] for c in ledger["charges"]] == ["order-1", "order-2"]
          and charges["order-1"]["status"] == "charged" and charges["order-1"]["attempts"] == 2
          and charges["order-2"]["status"] == "cancelled"
          and [r["instance"] for r in ledger["receipts"]] == ["order-1"]
          and late["outcome"] == "discarded")
    print("\n" + ("demo OK: the charge was retried after a lost answer and happened once; the timeout "
                  "outlived its process, fired once, and cancelled the transfer." if ok else "demo FAILED"))
    if os.environ.get("STATEBOUND_DEMO_KEEP") is None:
        for f in workdir.iterdir():
            f.unlink()
        workdir.rmdir()
    return 0 if ok else 1


CHART_NAME = (HERE / "order.scxml").relative_to(HERE.parent.parent)

if __name__ == "__main__":
    sys.exit(main())
