"""A tiny shop on statebound: the order chart, a payment gateway and a receipt inbox.

Each command is one short-lived process on a SQLite file, as a web handler or a worker
would be; nothing survives in memory between them::

    python shop.py DB start ORDER AMOUNT [TIMEOUT]   create an order (payment due within TIMEOUT)
    python shop.py DB pay ORDER CARD                 StartPayment: the chart invokes the gateway
    python shop.py DB bank-confirms ORDER            a late answer for a bank transfer
    python shop.py DB show ORDER                     the order, as JSON
    python shop.py DB sweep                          retry and fire what is due, until SIGINT
    python shop.py DB ledger                         the gateway's charges and the receipts

The gateway (``payment`` invoke handler) charges a card once per idempotency key, so a
retried start after a lost answer does not charge twice. ``SHOP_GATEWAY=flaky`` makes it
lose its first answer to every charge, after charging. Card ``transfer`` is a bank
transfer: the gateway answers "later" (``Pending``) and ``bank-confirms`` finishes it with
the request's token. The receipt inbox (``receipts`` send processor) keeps one receipt
per idempotency key. Both keep their books in ``DB.gateway``, a database of their own.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import statebound as sb
from statebound.host.processors import Delivery, InvokeRequest, Pending

CHART = Path(__file__).resolve().parent / "order.scxml"


class Books:
    """The outside world's own database: charges and receipts, keyed by idempotency key."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, instance TEXT, amount REAL, "
                        "charge TEXT, status TEXT, token TEXT, attempts INTEGER)")
        self.db.execute("CREATE TABLE IF NOT EXISTS receipts (key TEXT PRIMARY KEY, instance TEXT, body TEXT)")


class Gateway:
    """The ``payment`` invoke handler: idempotent on ``request.idempotency_key``."""

    def __init__(self, books: Books) -> None:
        self.books = books

    def start(self, request: InvokeRequest) -> Any:
        db = self.books.db
        card = request.data.get("card") or ""
        status = "awaiting transfer" if card == "transfer" else "charged"
        # the key makes this a no-op on a retry: the card is charged once
        db.execute("INSERT OR IGNORE INTO charges VALUES (?, ?, ?, ?, ?, ?, 0)",
                   (request.idempotency_key, request.instance_id, request.data.get("amount"),
                    f"ch_{request.instance_id}", status, request.token))
        db.execute("UPDATE charges SET attempts = attempts + 1 WHERE key = ?", (request.idempotency_key,))
        charge, status = db.execute("SELECT charge, status FROM charges WHERE key = ?",
                                    (request.idempotency_key,)).fetchone()
        if status == "awaiting transfer":
            return Pending("awaiting the bank transfer")
        if os.environ.get("SHOP_GATEWAY") == "flaky" and request.attempt == 1:
            raise TimeoutError("the gateway charged the card, but its answer was lost")
        return {"charge": charge, "amount": request.data.get("amount")}

    def cancel(self, request: InvokeRequest) -> None:
        self.books.db.execute("UPDATE charges SET status = 'cancelled' WHERE key = ?", (request.idempotency_key,))


class ReceiptInbox:
    """The ``receipts`` send processor: one receipt per idempotency key."""

    def __init__(self, books: Books) -> None:
        self.books = books

    def deliver(self, d: Delivery) -> None:
        self.books.db.execute("INSERT OR IGNORE INTO receipts VALUES (?, ?, ?)",
                              (d.idempotency_key, d.instance_id, json.dumps({"event": d.event, "data": d.data})))


def open_shop(db: str) -> tuple[sb.Host, Books]:
    books = Books(db + ".gateway")
    host = sb.Host([sb.Chart.from_file(CHART)], store=sb.SQLiteStore(db), backoff_ms=500,
                   invokers={"payment": Gateway(books)}, processors={"receipts": ReceiptInbox(books)},
                   on_log=lambda iid, label, value: print(f"    [{iid}] {label}: {value}", file=sys.stderr))
    return host, books


def show(host: sb.Host, order: str) -> dict[str, Any]:
    pos = host.get(order)
    dm = pos.datamodel
    return {"order": order, "status": pos.status, "configuration": sorted(pos.configuration),
            "charge": dm["charge"], "failure": dm["failure"],
            "rows": [{"kind": r.kind, "state": r.state, "attempts": r.attempts, "last_error": r.last_error}
                     for r in host.pending_timers(order)]}


def main(argv: list[str]) -> int:
    db, command, args = argv[0], argv[1], argv[2:]
    host, books = open_shop(db)
    out: Any
    if command == "start":
        data = {"amount": float(args[1]), "payment_timeout": args[2] if len(args) > 2 else "1h"}
        host.start("order", args[0], data, idempotency_key=f"create-{args[0]}")
        out = show(host, args[0])
    elif command == "pay":
        host.send(args[0], "StartPayment", {"card": args[1]}, idempotency_key=f"pay-{args[0]}")
        out = show(host, args[0])
    elif command == "bank-confirms":
        (token,) = books.db.execute("SELECT token FROM charges WHERE instance = ?", (args[0],)).fetchone()
        res = host.complete_invoke(args[0], "charge", {"charge": f"tr_{args[0]}"}, token=token)
        row = host.store.get_timer(res.key) if res.key else None
        out = {"outcome": res.outcome, "reason": res.reason,
               "row": None if row is None else {"outcome": row.outcome, "reason": row.reason}}
    elif command == "show":
        out = show(host, args[0])
    elif command == "sweep":
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        sweeper = sb.Sweeper(host, interval_s=0.25)
        m = sweeper.run_forever(stop)
        out = {"fired": m.fired, "delivered": m.delivered, "failed": m.failed, "discarded": m.discarded,
               "cancelled": m.cancelled}
    elif command == "ledger":
        out = {"charges": [dict(zip(("key", "instance", "amount", "charge", "status", "attempts"), r, strict=True))
                           for r in books.db.execute("SELECT key, instance, amount, charge, status, attempts "
                                                     "FROM charges ORDER BY key")],
               "receipts": [{"key": k, "instance": i, **json.loads(b)}
                            for k, i, b in books.db.execute("SELECT key, instance, body FROM receipts ORDER BY key")]}
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
