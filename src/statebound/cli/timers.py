"""Timer commands: ``timers`` (of one instance, due in a window, or dead), ``redrive``,
``sweep`` and ``purge``.

``sweep`` without ``--once`` runs until SIGTERM or Ctrl-C (SIGINT) (with ``--until-idle``, until
nothing is due or one of those), which stop it after the sweep in flight, so every row it claimed is fired or released, not left
for its lease to run out; it then prints its totals and exits 0. A second Ctrl-C interrupts
at once (exit 130).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from ..chart.compiler import instant_ms
from typing import Any

from .. import SystemClock, Sweeper
from ..exceptions import InstanceNotFound
from ..host.firing import redrive_refusal
from ..host.store import TimerRow, live
from ._base import EXIT_INTERRUPTED, EXIT_NOT_FOUND, EXIT_USAGE, CliError, emit, iso_ms, timer_dict
from ._store import is_digits, open_host, open_store

__all__ = ["register", "parse_time", "parse_age"]


def parse_age(text: str, option: str) -> int:
    """A duration option (``7d``, ``1h``, ``30s``, ``250ms``) in milliseconds."""
    from ..chart.compiler import parse_duration
    ms = parse_duration(text)
    if ms is None:
        raise CliError(f"{option} takes a duration like '7d', '1h' or '30s', not {text!r}", EXIT_USAGE)
    return ms


def parse_time(text: str, option: str) -> int:
    """An instant option: epoch milliseconds, or ISO-8601 (UTC unless it carries an offset)."""
    if is_digits(text):
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{option} takes an ISO-8601 time (2030-01-31T12:00:00Z) or epoch milliseconds, "
                       f"not {text!r}", EXIT_USAGE) from None
    return instant_ms(when)


def _row_line(t: dict[str, Any], *, instance: bool) -> str:
    who = f"{t['instance']:<24} " if instance else ""
    tail = f"  attempts={t['attempts']}" if t["attempts"] else ""
    if t["last_error"]:
        tail += f"  last error: {t['last_error']}"
    return (f"{who}#{t['ordinal']:<4} {t['name'] or '-':<16} {t['event'] or '-':<20} due {t['due_at']}  "
            f"{t['state']}{tail}")


def _listing(rows: list[TimerRow], limit: int) -> tuple[list[dict[str, Any]], bool]:
    return [timer_dict(r) for r in rows[:limit]], len(rows) > limit


def cmd_timers(args: argparse.Namespace) -> int:
    store, _ = open_store(args, create=False)
    if args.dead or args.due_before is not None or args.window is not None:
        if args.id is not None:
            raise CliError("--dead, --due-before and --window list every instance's rows; drop the ID", EXIT_USAGE)
        if args.limit < 1:
            raise CliError("--limit must be at least 1", EXIT_USAGE)
        if args.dead:
            rows, more = _listing(list(store.dead_timers(args.limit + 1)), args.limit)
            data: dict[str, Any] = {"dead": True, "count": len(rows), "truncated": more, "timers": rows}
            head = f"{len(rows)}{'+' if more else ''} dead timer row(s)"
        else:
            if args.window is not None:
                before = SystemClock().now_ms() + parse_age(args.window, "--window")
            else:
                before = parse_time(args.due_before, "--due-before")
            rows, more = _listing(list(store.due_timers(before, args.limit + 1)), args.limit)
            data = {"due_before_ms": before, "due_before": iso_ms(before), "count": len(rows),
                    "truncated": more, "timers": rows}
            head = f"{len(rows)}{'+' if more else ''} timer(s) due by {iso_ms(before)}"
        if more:
            head += f" (the first {args.limit}; raise --limit for more)"
        emit(args, data, "\n".join([head, *(_row_line(t, instance=True) for t in rows)]))
        return 0
    if args.id is None:
        raise CliError("timers needs an instance ID, or one of --due-before, --window, --dead", EXIT_USAGE)
    if live(store.load(args.id)) is None:
        raise InstanceNotFound(args.id)
    listed = [timer_dict(r) for r in store.pending_timers(args.id)]
    emit(args, listed, "\n".join(_row_line(t, instance=False) for t in listed) or f"{args.id}: no pending timers")
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    store, _ = open_store(args, create=False)
    now = SystemClock().now_ms()
    revived: list[tuple[str, int]] = []
    refused: list[tuple[tuple[str, int], str]] = []
    if args.all_dead:
        if args.id is not None:
            raise CliError("redrive takes ID ORDINAL or --all-dead, not both", EXIT_USAGE)
        seen: set[tuple[str, int]] = set()
        while True:     # the dead index may lag: stop when a page shows nothing new
            # Refused rows stay dead and sort where they were: a fixed first page filled up
            # with them and hid every row behind it. The page grows past all that was seen.
            fresh = [r.key for r in store.dead_timers(len(seen) + 500) if r.key not in seen]
            if not fresh:
                break
            for key in fresh:
                seen.add(key)
                why = redrive_refusal(store, key)
                if why is not None:
                    refused.append((key, why))
                elif store.retry_timer(key, now):
                    revived.append(key)
    else:
        if args.id is None or args.ordinal is None:
            raise CliError("redrive needs ID ORDINAL, or --all-dead", EXIT_USAGE)
        key = (args.id, args.ordinal)
        why = redrive_refusal(store, key)
        if why is not None:
            raise CliError(f"not redriven: {why}", EXIT_USAGE)
        if not store.retry_timer(key, now):
            raise CliError(f"instance {args.id!r} has no dead timer row #{args.ordinal}", EXIT_NOT_FOUND)
        revived.append(key)
    emit(args, {"redriven": [{"instance": i, "ordinal": o} for i, o in revived], "count": len(revived),
                "due_at_ms": now, "refused": [{"instance": k[0], "ordinal": k[1], "why": w} for k, w in refused]},
         f"redrove {len(revived)} dead timer row(s), due now" + "".join(f"\n  {i} #{o}" for i, o in revived)
         + "".join(f"\nleft dead: {k[0]} #{k[1]}: {w}" for k, w in refused))
    return 0


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While in the block, SIGTERM and SIGINT set ``stop`` instead of ending the process; after
    the first, SIGINT raises ``KeyboardInterrupt`` again. The previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield   # only the main thread may set handlers; a caller running us elsewhere keeps its own
        return

    def handler(signum: int, frame: object) -> None:
        # Not stop.set() here: the handler runs in the main thread, which may be inside
        # stop.wait() holding the Event's lock, and set() takes that lock: a deadlock. A
        # thread waits for the lock instead, and the handler returns at once.
        threading.Thread(target=stop.set, name="sweep-stop", daemon=True).start()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:   # None: a handler installed from C, which Python cannot restore
                signal.signal(sig, old)


def cmd_sweep(args: argparse.Namespace) -> int:
    host, _ = open_host(args)
    sweeper = Sweeper(host, interval_s=args.interval, batch=args.batch)
    try:
        if args.once:
            rep = sweeper.run_once()
        elif args.until_idle:
            stop_idle = threading.Event()
            with _stop_on_signals(stop_idle):   # as below: a signal ends it between sweeps
                rep = sweeper.run_until_idle(stop=stop_idle)
        else:
            stop = threading.Event()
            code = 0
            with _stop_on_signals(stop):
                try:
                    sweeper.run_forever(stop)
                except KeyboardInterrupt:   # a second Ctrl-C: the sweep in flight was cut short
                    code = EXIT_INTERRUPTED
            m = sweeper.metrics
            emit(args, m.__dict__, f"swept {m.sweeps} times: fired {m.fired}, discarded {m.discarded}, "
                                   f"stale {m.stale}, failed {m.failed}")
            return code
    finally:
        sweeper.close()
    data = {"fired": rep.fired, "discarded": rep.discarded, "stale": rep.stale, "failed": rep.failed,
            "skipped": rep.skipped, "max_lag_ms": rep.max_lag_ms}
    emit(args, data, f"fired {rep.fired}, discarded {rep.discarded}, stale {rep.stale}, "
                     f"failed {rep.failed} (max lag {rep.max_lag_ms} ms)")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    age = parse_age(args.older_than, "--older-than")
    store, _ = open_store(args, create=False)
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
    s = sub.add_parser("timers", help="list an instance's timers, what fires in a window, or dead rows")
    s.add_argument("id", nargs="?", help="the instance (omit with --due-before, --window or --dead)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--due-before", metavar="TIME", help="every instance's rows due by TIME (ISO-8601 or epoch ms)")
    g.add_argument("--window", metavar="DURATION", help="every instance's rows due within DURATION from now (1h)")
    g.add_argument("--dead", action="store_true", help="rows parked as dead, with attempts and last error")
    s.add_argument("--limit", type=int, default=1_000, help="list at most this many rows (default 1000)")
    s.set_defaults(fn=cmd_timers)

    s = sub.add_parser("redrive", help="revive dead timer rows: due now, attempts reset")
    s.add_argument("id", nargs="?")
    s.add_argument("ordinal", nargs="?", type=int)
    s.add_argument("--all-dead", action="store_true", help="every dead row")
    s.set_defaults(fn=cmd_redrive)

    s = sub.add_parser("sweep", help="fire due timers (until SIGTERM or Ctrl-C, which stop it between sweeps)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--once", action="store_true", help="one sweep, then exit")
    g.add_argument("--until-idle", action="store_true", help="sweep until nothing is due now")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between sweeps (default 1)")
    s.add_argument("--batch", type=int, default=100)
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("purge", help="delete completed timer rows (kept for inspection) older than a duration")
    s.add_argument("--older-than", default="7d", help="e.g. 7d, 12h (default 7d)")
    s.set_defaults(fn=cmd_purge)
