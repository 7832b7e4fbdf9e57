"""List the dead timers and send them round again: ``python redrive.py --table TABLE``.

A timer row is parked as *dead* after its last failed delivery attempt (the host's
``max_attempts``, 5 by default, with exponential backoff between them); the
``DeadTimersAlarm`` goes off. The row keeps the event, the attempts and the last error.
Find the cause in that error and the log lines of the wake function and the sweeper
(search for the row's ``instance_id``), fix it (typically: ship again a chart revision that live instances
still run), then revive the rows: each becomes pending and due now, with its attempts
reset, and the next sweep delivers it. Outbox send rows (an order confirmation SQS
refused, ``OutboxDeadAlarm``) sit in the same dead index and are revived the same way; the
sweeper then hands them to their processor again, with their original idempotency key.

Some dead rows are left dead, with the reason, as ``statebound redrive`` and
``Host.retry_timer`` leave them (``statebound.host.firing.redrive_refusal``): an invoke
row whose invocation was ended (the chart was told ``error.execution``; reviving it would
start the handler again and throw its answer away), a cancel row (its hook is one try), and
any row of a suspended instance (resume the instance first).

    python redrive.py --table T                          # list the dead rows
    python redrive.py --table T --retry all              # revive every dead row
    python redrive.py --table T --instance ID            # ...of one instance (ID taken as it is)
    python redrive.py --table T --instance ID --ordinal 3    # ...one row
    python redrive.py --table T --retry order-7          # short forms of the two above; refused
    python redrive.py --table T --retry order-7:3        # when they could mean either

Instance ids may contain ``:``, so ``--retry A:3`` could name the instance ``A:3`` or row 3 of
``A``. It is read as whichever has dead rows; when both do, nothing is revived and the tool
asks for ``--instance``/``--ordinal``.

Cost: one Query per shard of the sparse dead index (dead rows only); per row to revive, two
GetItems (the row and its instance, to check that it may be revived) and one UpdateItem.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import statebound as sb
from statebound import jsonio
from statebound.dynamodb import DynamoStore
from statebound.host.firing import redrive_refusal


def _selector(rows: Sequence[Any], args: argparse.Namespace, p: argparse.ArgumentParser) -> Any:
    """Which dead rows the arguments name, as a predicate over a row; ``None``: none (list only)."""
    if args.instance is not None:
        return lambda r: r.instance_id == args.instance and args.ordinal in (None, r.ordinal)
    if args.retry is None:
        return None
    if args.retry == "all":
        return lambda r: True
    selector = args.retry
    as_instance = any(r.instance_id == selector for r in rows)
    instance, sep, ordinal = selector.rpartition(":")
    as_row = bool(sep) and ordinal.isdigit() and any(r.key == (instance, int(ordinal)) for r in rows)
    if as_instance and as_row:
        p.error(f"--retry {selector!r} names both the dead rows of instance {selector!r} and row {ordinal} of "
                f"instance {instance!r}: use --instance ID, and --ordinal N for one row")
    if as_row:
        return lambda r: r.key == (instance, int(ordinal))
    return lambda r: r.instance_id == selector


def main(argv: Sequence[str] | None = None, *, client: Any = None, clock: Any = None) -> int:
    """The command line (``client``/``clock`` let tests pass moto and a ManualClock)."""
    p = argparse.ArgumentParser(prog="redrive.py", description=__doc__.splitlines()[0])
    p.add_argument("--table", required=True, help="the statebound table (the stack's TableName output)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--retry", metavar="all|INSTANCE[:ORDINAL]", help="revive these dead rows")
    which.add_argument("--instance", metavar="ID", help="revive this instance's dead rows (the id as it is)")
    p.add_argument("--ordinal", type=int, metavar="N", help="with --instance: only its row N")
    p.add_argument("--limit", type=int, default=1000, help="most dead rows to read (default 1000)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--region", help="AWS region (default: your AWS configuration's)")
    p.add_argument("--shards", type=int, default=16, help="the stack's DueShards (default 16)")
    args = p.parse_args(argv)
    if args.ordinal is not None and args.instance is None:
        p.error("--ordinal needs --instance")
    if client is None:
        import boto3
        client = boto3.client("dynamodb", region_name=args.region)
    store = DynamoStore(args.table, client=client, shards=args.shards)
    now = (clock or sb.SystemClock()).now_ms()
    rows = list(store.dead_timers(args.limit))
    selected = _selector(rows, args, p)
    revived: list[Any] = []
    refused: dict[Any, str] = {}
    for r in rows if selected is not None else ():
        if not selected(r):
            continue
        why = redrive_refusal(store, r.key)
        if why is not None:
            refused[r.key] = why
        elif store.retry_timer(r.key, now):
            revived.append(r)
    # a timer row names its event "name"; an outbox send row "event", an invoke row its invokeid
    report = [{"instance": r.instance_id, "ordinal": r.ordinal, "kind": r.kind,
               "event": r.event.get("name") or r.event.get("event") or r.event.get("invokeid"),
               "attempts": r.attempts, "last_error": r.last_error, "revived": r in revived,
               "left_dead": refused.get(r.key)} for r in rows]
    if args.json:
        print(jsonio.dumps(report, indent=2))
    else:
        for r in report:
            mark = "revived" if r["revived"] else "dead"
            print(f"{mark:8} {r['instance']}:{r['ordinal']}  {r['kind']} {r['event']}  after {r['attempts']} attempts: "
                  f"{(r['last_error'] or '')[:160]}")
            if r["left_dead"]:
                print(f"         left dead: {r['left_dead']}")
        print(f"{len(rows)} dead, {len(revived)} revived" + (f", {len(refused)} left dead" if refused else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
