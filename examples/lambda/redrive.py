"""List the dead timers and send them round again: ``python redrive.py --table TABLE``.

A timer row is parked as *dead* after its last failed delivery attempt (the host's
``max_attempts``, 5 by default, with exponential backoff between them); the
``DeadTimersAlarm`` goes off. The row keeps the event, the attempts and the last error.
Find the cause in that error and the sweeper's log lines (search for the row's
``instance_id``), fix it (typically: ship again a chart revision that live instances
still run), then revive the rows: each becomes pending and due now, with its attempts
reset, and the next sweep delivers it. Outbox rows (an order confirmation SQS refused,
``OutboxDeadAlarm``) sit in the same dead index and are revived the same way; the sweeper
then hands them to their processor again, with their original idempotency key.

    python redrive.py --table T                      # list the dead rows
    python redrive.py --table T --retry all          # revive every dead row
    python redrive.py --table T --retry order-7      # ...of one instance
    python redrive.py --table T --retry order-7:3    # ...one row (instance:ordinal)

Cost: one Query of the sparse dead index (dead rows only) and one UpdateItem per revived row.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import statebound as sb
from statebound import jsonio
from statebound.dynamodb import DynamoStore


def _selected(row: Any, selector: str) -> bool:
    if selector == "all":
        return True
    instance, sep, ordinal = selector.rpartition(":")
    if sep and ordinal.isdigit():
        return (row.instance_id, row.ordinal) == (instance, int(ordinal))
    return row.instance_id == selector


def main(argv: Sequence[str] | None = None, *, client: Any = None, clock: Any = None) -> int:
    """The command line (``client``/``clock`` let tests pass moto and a ManualClock)."""
    p = argparse.ArgumentParser(prog="redrive.py", description=__doc__.splitlines()[0])
    p.add_argument("--table", required=True, help="the statebound table (the stack's TableName output)")
    p.add_argument("--retry", metavar="all|INSTANCE[:ORDINAL]", help="revive these dead rows")
    p.add_argument("--limit", type=int, default=1000, help="most dead rows to read (default 1000)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--region", help="AWS region (default: your AWS configuration's)")
    p.add_argument("--shards", type=int, default=16, help="the stack's DueShards (default 16)")
    args = p.parse_args(argv)
    if client is None:
        import boto3
        client = boto3.client("dynamodb", region_name=args.region)
    store = DynamoStore(args.table, client=client, shards=args.shards)
    now = (clock or sb.SystemClock()).now_ms()
    rows = list(store.dead_timers(args.limit))
    revived = []
    if args.retry:
        revived = [r for r in rows if _selected(r, args.retry) and store.retry_timer(r.key, now)]
    # a timer row names its event "name"; an outbox send row "event", an invoke row its invokeid
    report = [{"instance": r.instance_id, "ordinal": r.ordinal, "kind": r.kind,
               "event": r.event.get("name") or r.event.get("event") or r.event.get("invokeid"),
               "attempts": r.attempts, "last_error": r.last_error, "revived": r in revived} for r in rows]
    if args.json:
        print(jsonio.dumps(report, indent=2))
    else:
        for r in report:
            mark = "revived" if r["revived"] else "dead"
            print(f"{mark:8} {r['instance']}:{r['ordinal']}  {r['kind']} {r['event']}  after {r['attempts']} attempts: "
                  f"{(r['last_error'] or '')[:160]}")
        print(f"{len(rows)} dead, {len(revived)} revived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
