"""Timer commands: ``timers``, ``sweep`` and ``purge``."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from .. import SystemClock, Sweeper
from ..exceptions import InstanceNotFound
from ._base import EXIT_USAGE, CliError, emit, timer_dict
from ._store import open_host, open_store

__all__ = ["register"]


def cmd_timers(args: argparse.Namespace) -> int:
    host, _ = open_host(args)
    if not host.exists(args.id):
        raise InstanceNotFound(args.id)
    rows = [timer_dict(r) for r in host.pending_timers(args.id)]
    human = "\n".join(f"#{t['ordinal']:<4} {t['name'] or '-':<16} {t['event']:<20} due {t['due_at']}  "
                      f"{t['state']}{'  attempts=' + str(t['attempts']) if t['attempts'] else ''}"
                      for t in rows) or f"{args.id}: no pending timers"
    emit(args, rows, human)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    host, _ = open_host(args)
    sweeper = Sweeper(host, interval_s=args.interval, batch=args.batch)
    if args.once:
        rep = sweeper.run_once()
    elif args.until_idle:
        rep = sweeper.run_until_idle()
    else:
        stop = threading.Event()
        try:
            sweeper.run_forever(stop)
        except KeyboardInterrupt:
            stop.set()
        m = sweeper.metrics
        emit(args, m.__dict__, f"swept {m.sweeps} times: fired {m.fired}, discarded {m.discarded}, "
                               f"stale {m.stale}, failed {m.failed}")
        return 0
    data = {"fired": rep.fired, "discarded": rep.discarded, "stale": rep.stale, "failed": rep.failed,
            "skipped": rep.skipped, "max_lag_ms": rep.max_lag_ms}
    emit(args, data, f"fired {rep.fired}, discarded {rep.discarded}, stale {rep.stale}, "
                     f"failed {rep.failed} (max lag {rep.max_lag_ms} ms)")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    from ..chart.compiler import parse_duration
    age = parse_duration(args.older_than)
    if age is None:
        raise CliError(f"--older-than takes a duration like '7d' or '12h', not {args.older_than!r}", EXIT_USAGE)
    store, _ = open_store(args)
    cutoff = SystemClock().now_ms() - age
    total = 0
    while True:  # in bounded batches, so a big purge never holds the write lock for long
        n = store.purge_done(cutoff, 5_000)
        total += n
        if n < 5_000:
            break
    emit(args, {"purged": total, "due_before_ms": cutoff},
         f"purged {total} completed timer row(s) due more than {args.older_than} ago")
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("timers", help="list an instance's timers")
    s.add_argument("id")
    s.set_defaults(fn=cmd_timers)

    s = sub.add_parser("sweep", help="fire due timers")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--once", action="store_true", help="one sweep, then exit")
    g.add_argument("--until-idle", action="store_true", help="sweep until nothing is due now")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between sweeps (default 1)")
    s.add_argument("--batch", type=int, default=100)
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("purge", help="delete completed timer rows (kept for inspection) older than a duration")
    s.add_argument("--older-than", default="7d", help="e.g. 7d, 12h (default 7d)")
    s.set_defaults(fn=cmd_purge)
