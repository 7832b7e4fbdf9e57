"""``statebound migrate``: move every stored instance of a chart onto a new revision.

``migrate --chart NAME --to new.scxml [--map OLD=NEW ...] [--dry-run]`` works on the store
(``--store``). ``migrate BLOB --from old.scxml --to new.scxml`` moves one blob file and
touches no store (``blobs.py``).

A store migration:

1. compiles the new revision under NAME and compares every remembered revision of NAME
   with it (:func:`statebound.diff`), printing what changed;
2. remembers the new revision in the store's chart registry *before* moving anything, so
   every ``statebound`` command from then on can drive a moved instance (a long-running
   host of your own must register the new revision before you migrate);
3. pages through the instances of NAME and moves each one in its own commit, conditional on
   its version (:meth:`statebound.Host.migrate`): a concurrent event is never lost;
4. prints one line per instance and a summary that counts what moved and what could not,
   and why. The exit code is 1 if any instance could not move.

It is resumable: a second run skips the instances already on the new revision (``already``)
and retries the others. ``--dry-run`` decides every instance and writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .. import Chart, Host, SystemClock
from ..host import migration
from ..position import diff
from ._base import EXIT_ERROR, EXIT_USAGE, CliError, add_trust_option, emit
from ._progress import Progress
from ._store import history_keep, open_store
from .blobs import cmd_migrate_blob, parse_map

__all__ = ["register"]

PAGE = 500


def _new_revision(path: str, name: str, trust: str = "trusted") -> tuple[Chart, bytes]:
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read chart {path!r}: {exc.strerror or exc}") from None
    return Chart.from_file(path, name=name, trust=trust), source


def cmd_migrate(args: argparse.Namespace) -> int:
    if args.chart is None:
        if args.blob is None or args.from_chart is None:
            raise CliError("migrate takes --chart NAME (every stored instance) or BLOB --from OLD (one blob file)",
                           EXIT_USAGE)
        if args.dry_run:
            raise CliError("--dry-run is for a store migration (--chart NAME)", EXIT_USAGE)
        return cmd_migrate_blob(args)
    if args.blob is not None or args.from_chart is not None or args.output is not None:
        raise CliError("--chart migrates the store's instances; BLOB, --from and -o are for one blob file",
                       EXIT_USAGE)
    return _migrate_store(args)


def _migrate_store(args: argparse.Namespace) -> int:
    mapping = parse_map(args.map)
    new, source = _new_revision(args.to_chart, args.chart, args.trust)
    store, reg = open_store(args)
    charts = reg.load_all()
    olds = [c for c in charts if c.name == args.chart and c.identity != new.identity]
    known = [c for c in charts if c.name == args.chart]
    if not known:
        raise CliError(f"the store has no chart named {args.chart!r} (start an instance of it first)")
    stray = [k for k in mapping if not any(c.has_state(k) for c in olds)]
    if stray:
        raise CliError(f"--map renames {', '.join(map(repr, stray))}, which no stored revision of "
                       f"{args.chart!r} has")
    diffs = {c.identity: diff(c, new, {k: v for k, v in mapping.items() if c.has_state(k)} or None) for c in olds}
    if not args.dry_run:
        reg.remember(new, str(Path(args.to_chart).resolve()), source)
    host = Host(charts, store=store, clock=SystemClock(), on_log=lambda *a: None, history=history_keep(args) or False)
    host.register(new)

    show = (not args.json and sys.stderr.isatty()) or args.progress
    progress = Progress(show, unit=" instances")
    if not args.json:
        for identity, d in diffs.items():
            progress.out(f"from {identity[:19]}: {d.kind}" + "".join(f"\n  {r}" for r in d.reasons))
    results: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    why: Counter[str] = Counter()
    cache: dict[str, Any] = {}
    after = None
    try:
        while True:
            page = store.list_positions(args.chart, after=after, limit=PAGE)
            if not page:
                break
            after = page[-1].instance_id
            for rec in page:
                res = migration.migrate(host, rec.instance_id, new, mapping=mapping or None, dry_run=args.dry_run,
                                        diffs=cache)
                counts[res.outcome] += 1
                if not res.moved:
                    why[f"{res.outcome}: {res.reason}"] += 1
                if args.json:
                    results.append({"instance": res.instance_id, "outcome": res.outcome, "reason": res.reason,
                                    "from": res.from_identity})
                else:
                    progress.out(f"{res.instance_id}: {res.outcome}" + (f" ({res.reason})" if res.reason else ""))
                progress.update(1)
    finally:
        progress.close()
    stuck = sum(n for outcome, n in counts.items() if outcome not in (migration.MOVED, migration.ALREADY,
                                                                        migration.WOULD_MOVE))
    summary = {"chart": args.chart, "to": new.identity, "dry_run": args.dry_run, "counts": dict(counts),
               "not_moved": stuck, "why": dict(why), "instances": results,
               "retried_after_concurrent_events": host.metrics["conflicts"],
               "diffs": {i: {"kind": d.kind, "reasons": list(d.reasons)} for i, d in diffs.items()}}
    total = sum(counts.values())
    verb = "would move" if args.dry_run else "moved"
    human = (f"{verb} {counts[migration.WOULD_MOVE if args.dry_run else migration.MOVED]} of {total} instance(s) "
             f"of {args.chart!r} to {new.identity[:19]}; {counts[migration.ALREADY]} already there; "
             f"{stuck} could not move" + "".join(f"\n  {n} x {reason}" for reason, n in why.most_common()))
    emit(args, summary, human)
    return EXIT_ERROR if stuck else 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("migrate", help="move every stored instance of a chart (--chart), or one blob file, "
                                       "onto a new revision")
    s.add_argument("blob", nargs="?", help="a blob file (one-blob mode, with --from)")
    s.add_argument("--chart", metavar="NAME", help="migrate every instance of this chart in --store")
    s.add_argument("--to", dest="to_chart", required=True, metavar="NEW.scxml", help="the new revision")
    s.add_argument("--map", action="append", metavar="OLD=NEW", help="rename a state id (repeatable)")
    s.add_argument("--dry-run", action="store_true", help="decide every instance, write nothing")
    add_trust_option(s)
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a tty")
    s.add_argument("--from", dest="from_chart", metavar="OLD.scxml", help="one-blob mode: the blob's revision")
    s.add_argument("-o", "--output", help="one-blob mode: write the new blob here (default: stdout)")
    s.add_argument("--codec", default="msgpack", choices=("msgpack", "cbor"))
    s.set_defaults(fn=cmd_migrate)
