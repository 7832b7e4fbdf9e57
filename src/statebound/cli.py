"""The ``statebound`` command.

Instances live in a SQLite database (``--db PATH``, default ``$STATEBOUND_DB`` or
``statebound.db``). Charts given to ``start`` are remembered in the same file (their
source and location), so later commands need only the instance id.

Every error prints one line on stderr and exits non-zero; output is for humans unless
``--json`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import Chart, Event, Host, Position, StateboundError, Sweeper, SystemClock, jsonio
from .exceptions import (ChartError, InstanceExists, InstanceNotFound, NotRunning, PositionError,
                         UnknownChart)
from .host.sqlite import SQLiteStore

__all__ = ["main", "mermaid"]

EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_EXISTS, EXIT_NOT_RUNNING = 1, 2, 3, 4, 5


class CliError(Exception):
    """A one-line error for the user, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- chart registry


class ChartRegistry:
    """Charts remembered beside the instances, so ``send ID`` can find the chart again.

    Every revision is kept, keyed by (name, identity): a host built from the registry runs
    each stored position on the revision it was written for, and starts new instances on
    the revision given to ``start`` last (the "drain on the old chart" migration).
    """

    def __init__(self, db_path: str) -> None:
        self.db = sqlite3.connect(db_path, timeout=30, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS cli_chart_revisions (name TEXT NOT NULL, identity TEXT NOT NULL, "
                        "path TEXT, source BLOB NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (name, identity))")

    def remember(self, chart: Chart, path: str, source: bytes) -> None:
        """Record ``chart`` (a new revision, or the latest again)."""
        seq = self.db.execute("SELECT coalesce(max(seq), 0) + 1 FROM cli_chart_revisions").fetchone()[0]
        self.db.execute("INSERT INTO cli_chart_revisions VALUES (?, ?, ?, ?, ?) ON CONFLICT (name, identity) "
                        "DO UPDATE SET path = excluded.path, seq = excluded.seq",
                        (chart.name, chart.identity, path, source, seq))

    def load_all(self) -> list[Chart]:
        """Every remembered revision, oldest first (so the latest is registered last)."""
        out = []
        for name, path, source in self.db.execute(
                "SELECT name, path, source FROM cli_chart_revisions ORDER BY seq"):
            base = str(Path(path).parent) if path else None
            out.append(Chart.from_scxml(source, name=name, base_path=base))
        return out

    def close(self) -> None:
        """Close the registry's connection."""
        self.db.close()


def _load_chart_file(path: str) -> tuple[Chart, bytes]:
    p = Path(path)
    try:
        source = p.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read chart {path!r}: {exc.strerror or exc}") from None
    chart = Chart.from_file(p)
    return chart, source


def _host(args: argparse.Namespace) -> tuple[Host, ChartRegistry]:
    store = SQLiteStore(args.db)
    reg = ChartRegistry(args.db)
    host = Host(reg.load_all(), store=store, clock=SystemClock(), on_log=_log_printer(args))
    return host, reg


def _log_printer(args: argparse.Namespace) -> Any:
    def on_log(instance_id: str, label: str | None, value: Any) -> None:
        if not args.json:
            print(f"  log [{instance_id}] {label or ''}: {value!r}", file=sys.stderr)
    return on_log


def _parse_data(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return jsonio.loads(text)
    except ValueError as exc:
        raise CliError(f"--data is not valid JSON: {exc}", EXIT_USAGE) from None


# --------------------------------------------------------------------------- output


def _position_dict(pos: Position, host: Host | None = None, instance_id: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "instance": instance_id or pos.session_id, "chart": pos.chart.name, "status": pos.status,
        "configuration": sorted(pos.configuration), "datamodel": _jsonable(dict(pos.datamodel)),
        "macrostep": pos.macrostep,
    }
    if host is not None and instance_id is not None:
        d["timers"] = [_timer_dict(r) for r in host.pending_timers(instance_id)]
    return d


def _timer_dict(r: Any) -> dict[str, Any]:
    return {"ordinal": r.ordinal, "name": r.name, "event": r.event.get("name"), "send_id": r.send_id,
            "target": r.target_id, "due_at_ms": r.due_at_ms,
            "due_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.due_at_ms / 1000)),
            "state": r.state, "attempts": r.attempts, "last_error": r.last_error}


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    if args.json:
        print(jsonio.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human)


def _human_position(d: dict[str, Any]) -> str:
    lines = [f"{d['instance']}  [{d['chart']}]  {d['status']}",
             f"  configuration: {', '.join(d['configuration']) or '-'}",
             f"  datamodel:     {json.dumps(d['datamodel'], default=str)}",
             f"  macrostep:     {d['macrostep']}"]
    for t in d.get("timers", []):
        lines.append(f"  timer #{t['ordinal']}: {t['name'] or t['event']} due {t['due_at']} ({t['state']})")
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands


def cmd_start(args: argparse.Namespace) -> int:
    chart, source = _load_chart_file(args.chart)
    host, reg = _host(args)
    reg.remember(chart, str(Path(args.chart).resolve()), source)
    data = _parse_data(args.data)
    if data is not None and not isinstance(data, dict):
        raise CliError(f"--data for start must be a JSON object, not {type(data).__name__}", EXIT_USAGE)
    host.register(chart)
    pos = host.start(chart.name, args.id, data)
    d = _position_dict(pos, host, args.id)
    _emit(args, d, _human_position(d))
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    host, _ = _host(args)
    pos = host.send(args.id, Event(args.event, _parse_data(args.data)))
    d = _position_dict(pos, host, args.id)
    _emit(args, d, _human_position(d))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    host, _ = _host(args)
    d = _position_dict(host.get(args.id), host, args.id)
    _emit(args, d, _human_position(d))
    return 0


def cmd_timers(args: argparse.Namespace) -> int:
    host, _ = _host(args)
    if not host.exists(args.id):
        raise InstanceNotFound(args.id)
    rows = [_timer_dict(r) for r in host.pending_timers(args.id)]
    human = "\n".join(f"#{t['ordinal']:<4} {t['name'] or '-':<16} {t['event']:<20} due {t['due_at']}  "
                      f"{t['state']}{'  attempts=' + str(t['attempts']) if t['attempts'] else ''}"
                      for t in rows) or f"{args.id}: no pending timers"
    _emit(args, rows, human)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    host, _ = _host(args)
    host.delete(args.id)
    _emit(args, {"deleted": args.id}, f"deleted {args.id}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    host, _ = _host(args)
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
        _emit(args, m.__dict__, f"swept {m.sweeps} times: fired {m.fired}, discarded {m.discarded}, "
                                f"stale {m.stale}, failed {m.failed}")
        return 0
    data = {"fired": rep.fired, "discarded": rep.discarded, "stale": rep.stale, "failed": rep.failed,
            "skipped": rep.skipped, "max_lag_ms": rep.max_lag_ms}
    _emit(args, data, f"fired {rep.fired}, discarded {rep.discarded}, stale {rep.stale}, "
                      f"failed {rep.failed} (max lag {rep.max_lag_ms} ms)")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    from .chart.compiler import parse_duration
    age = parse_duration(args.older_than)
    if age is None:
        raise CliError(f"--older-than takes a duration like '7d' or '12h', not {args.older_than!r}", EXIT_USAGE)
    store = SQLiteStore(args.db)
    cutoff = SystemClock().now_ms() - age
    total = 0
    while True:  # in bounded batches, so a big purge never holds the write lock for long
        n = store.purge_done(cutoff, 5_000)
        total += n
        if n < 5_000:
            break
    _emit(args, {"purged": total, "due_before_ms": cutoff},
          f"purged {total} completed timer row(s) due more than {args.older_than} ago")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    chart, _ = _load_chart_file(args.chart)
    kinds: dict[str, int] = {}
    for s in chart.states[1:]:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    data = {"valid": True, "name": chart.name, "identity": chart.identity, "datamodel": chart.datamodel,
            "states": len(chart.states) - 1, "transitions": len(chart.transitions), "kinds": kinds}
    _emit(args, data, f"{args.chart}: valid ({chart.name}, {len(chart.states) - 1} states, "
                      f"{chart.datamodel} datamodel)\n  identity {chart.identity}")
    return 0


def mermaid(chart: Chart) -> str:
    """Render a chart as a Mermaid ``stateDiagram-v2``."""
    st = chart.states
    lines = ["stateDiagram-v2"]

    def name(i: int) -> str:
        return st[i].id.replace("-", "_").replace(".", "_").replace(":", "_")

    def emit(i: int, indent: str) -> None:
        node = st[i]
        kids = list(node.children)
        if node.initial is not None and kids:
            for t in node.initial.targets:
                lines.append(f"{indent}[*] --> {name(t)}")
        for k in kids:
            c = st[k]
            if c.kind in ("compound", "parallel"):
                lines.append(f"{indent}state {name(k)} {{")
                if c.kind == "parallel":
                    for j, region in enumerate(c.children):
                        if j:
                            lines.append(f"{indent}    --")
                        r = st[region]
                        if r.children:
                            lines.append(f"{indent}    state {name(region)} {{")
                            emit(region, indent + "        ")
                            lines.append(f"{indent}    }}")
                        else:
                            lines.append(f"{indent}    {name(region)}")
                else:
                    emit(k, indent + "    ")
                lines.append(f"{indent}}}")
            if c.kind == "final":
                lines.append(f"{indent}{name(k)} --> [*]")
            for h in c.histories:
                lines.append(f"{indent}state \"{st[h].id} (H{'*' if st[h].history_type == 'deep' else ''})\" "
                             f"as {name(h)}")

    emit(0, "    ")
    for t in chart.transitions:
        if not t.targets or t.source == 0 or st[t.source].kind == "history":
            continue
        src = st[t.source]
        if src.initial is t:
            continue
        label = " ".join(t.events) or "(eventless)"
        if t.cond is not None:
            label += f" [{t.cond.src}]"
        label = label.replace(":", "\\:")
        for tgt in t.targets:
            lines.append(f"    {name(t.source)} --> {name(tgt)} : {label}")
    for s in st[1:]:
        for tm in s.timeouts:
            lines.append(f"    note right of {name(s.index)} : timeout {tm.name} ({tm.kind})")
    return "\n".join(lines)


def cmd_diagram(args: argparse.Namespace) -> int:
    chart, _ = _load_chart_file(args.chart)
    text = mermaid(chart)
    _emit(args, {"mermaid": text}, text)
    return 0


def _drive_worker(db: str, lines: list[tuple[int, dict[str, Any]]], progress: Any) -> tuple[int, list[str]]:
    store = SQLiteStore(db)
    reg = ChartRegistry(db)
    host = Host(reg.load_all(), store=store, clock=SystemClock(), on_log=lambda *a: None)
    ok, errors = 0, []
    for n, (lineno, item) in enumerate(lines, 1):
        try:
            if "start" in item:
                host.start(item["start"], item["instance"], item.get("data"))
            else:
                host.send(item["instance"], Event(item["event"], item.get("data")))
            ok += 1
        except (StateboundError, ValueError, TypeError) as exc:  # bad id, non-object data...
            errors.append(f"line {lineno}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        if progress is not None and n % 50 == 0:
            progress.put(50)
    if progress is not None:
        progress.put(len(lines) % 50)
    store.close()
    return ok, errors


def _read_jsonl(path: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    try:
        fh = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115  (closed by the with below)
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = jsonio.loads(line)
            except ValueError as exc:
                raise CliError(f"{path}:{lineno}: not JSON ({exc})", EXIT_USAGE) from None
            if not isinstance(item, dict) or not isinstance(item.get("instance"), str) or \
                    not (isinstance(item.get("event"), str) or isinstance(item.get("start"), str)):
                raise CliError(f"{path}:{lineno}: expected {{\"instance\": ..., \"event\": ..., \"data\": ...}}",
                               EXIT_USAGE)
            out.append((lineno, item))
    return out


def _progress_bar(done: int, total: int, started: float) -> None:
    width = 30
    frac = done / total if total else 1.0
    rate = done / max(time.perf_counter() - started, 1e-9)
    bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
    sys.stderr.write(f"\r[{bar}] {done}/{total} events  {rate:,.0f}/s")
    sys.stderr.flush()


def cmd_drive(args: argparse.Namespace) -> int:
    items = _read_jsonl(args.events)
    workers = max(1, args.workers)
    # Events of one instance must stay in order: partition by instance, keep file order within.
    parts: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(workers)]
    for lineno, item in items:
        parts[zlib.crc32(item["instance"].encode()) % workers].append((lineno, item))
    started = time.perf_counter()
    show = (not args.json and sys.stderr.isatty()) or args.progress
    ok, errors = 0, []
    if workers == 1:
        import queue
        q: Any = queue.SimpleQueue()
        def work() -> None:
            try:
                q.put(("result", _drive_worker(args.db, parts[0], q)))
            except BaseException as exc:  # never leave the loop below waiting forever
                q.put(("error", exc))
        t = threading.Thread(target=work)
        t.start()
        done = 0
        while True:
            msg = q.get()
            if isinstance(msg, tuple):
                if msg[0] == "error":
                    t.join()
                    raise msg[1]
                ok, errors = msg[1]
                break
            done += msg
            if show:
                _progress_bar(done, len(items), started)
        t.join()
    else:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager:
            q = manager.Queue()
            with ctx.Pool(workers) as pool:
                res = [pool.apply_async(_drive_worker, (args.db, p, q)) for p in parts]
                done = 0
                while not all(r.ready() for r in res) or not q.empty():
                    try:
                        done += q.get(timeout=0.1)
                    except Exception:  # noqa: S110  (queue.Empty from the manager proxy)
                        pass
                    if show:
                        _progress_bar(done, len(items), started)
                for r in res:
                    k, errs = r.get()
                    ok += k
                    errors.extend(errs)
    elapsed = time.perf_counter() - started
    if show:
        _progress_bar(len(items), len(items), started)
        sys.stderr.write("\n")
    data = {"events": len(items), "ok": ok, "errors": errors, "seconds": round(elapsed, 3),
            "events_per_s": round(len(items) / elapsed) if elapsed else None}
    _emit(args, data, f"drove {ok}/{len(items)} events in {elapsed:.2f}s "
                      f"({len(items) / elapsed if elapsed else 0:,.0f}/s, {workers} worker(s))"
                      + "".join(f"\n  {e}" for e in errors[:20]))
    return 0 if not errors else EXIT_ERROR


def _read_blob(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read blob {path!r}: {exc.strerror or exc}") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    from . import position as codec
    blob = _read_blob(args.blob)
    h = codec.read_header(blob)
    header = {"format_version": h.version, "codec": h.codec, "chart_identity": h.identity,
              "chart_name": h.name, "chart_version": h.chart_version, "size": len(blob),
              "payload_offset": h.payload_offset}
    data: dict[str, Any] = {"header": header}
    if args.chart:
        chart, _ = _load_chart_file(args.chart)
        data["position"] = _jsonable(Position.from_bytes(blob, chart).export())
    if args.json:
        print(jsonio.dumps(data, indent=2, sort_keys=True, default=str))
        return 0
    lines = [f"statebound position, format v{h.version}, codec {h.codec}, {len(blob)} bytes",
             f"  chart:    {h.name!r} version {h.chart_version!r}",
             f"  identity: {h.identity}"]
    if "position" in data:
        p = data["position"]
        lines += [f"  session:  {p['session_id']}  status {p['status']}",
                  f"  configuration: {', '.join(p['configuration'])}",
                  f"  datamodel:     {json.dumps(p['datamodel'], default=str)}",
                  f"  counters:      {json.dumps(p['counters'])}"]
        if p.get("history"):
            lines.append(f"  history:       {json.dumps(p['history'])}")
    else:
        lines.append("  (pass --chart FILE to decode the payload)")
    print("\n".join(lines))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from . import position as codec
    blob = _read_blob(args.blob)
    old, _ = _load_chart_file(args.from_chart)
    new, _ = _load_chart_file(args.to_chart)
    mapping = {}
    for m in args.map or []:
        if "=" not in m:
            raise CliError(f"--map takes old=new, not {m!r}", EXIT_USAGE)
        a, b = m.split("=", 1)
        mapping[a] = b
    d = codec.diff(old, new, mapping or None)
    if not d.migratable:
        raise CliError("the revision is breaking: " + "; ".join(d.reasons))
    moved = codec.import_(Position.from_bytes(blob, old).export(), new, mapping=mapping or None)
    out = moved.to_bytes(args.codec)
    if args.output and args.output != "-":
        Path(args.output).write_bytes(out)
        _emit(args, {"diff": d.kind, "reasons": list(d.reasons), "bytes": len(out), "output": args.output},
              f"migrated ({d.kind}) to {args.output}, {len(out)} bytes")
    else:
        sys.stdout.buffer.write(out)
    return 0


def cmd_dynamodb(args: argparse.Namespace) -> int:
    try:
        from .dynamodb import DynamoStore
    except ImportError as exc:
        raise CliError(f"the DynamoDB backend needs the 'aws' extra (pip install 'statebound[aws]'): {exc}") from None
    if args.dynamo_cmd == "create-table":
        DynamoStore.create_table(args.name)
        _emit(args, {"table": args.name, "created": True}, f"table {args.name} is ready")
    return 0


# --------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (``statebound send: error: ...``), exit code 2."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message.splitlines()[0] if message else ''}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = _Parser(prog="statebound", description="Durable SCXML statecharts.")
    p.add_argument("--db", default=os.environ.get("STATEBOUND_DB", "statebound.db"),
                   help="SQLite database (default: $STATEBOUND_DB or statebound.db)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # --db and --json are also accepted after the command (`statebound show ID --json`);
    # SUPPRESS keeps the global value when they are not repeated there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", required=True)
    _add = sub.add_parser
    sub.add_parser = lambda name, **kw: _add(name, parents=[common], **kw)  # type: ignore[method-assign, list-item]

    s = sub.add_parser("start", help="start an instance of a chart")
    s.add_argument("chart")
    s.add_argument("id")
    s.add_argument("--data", help="initial datamodel values, as a JSON object")
    s.set_defaults(fn=cmd_start)

    s = sub.add_parser("send", help="send an event to an instance")
    s.add_argument("id")
    s.add_argument("event")
    s.add_argument("--data", help="event data, as JSON")
    s.set_defaults(fn=cmd_send)

    for name, fn, helptext in (("show", cmd_show, "show an instance"), ("timers", cmd_timers, "list its timers"),
                               ("delete", cmd_delete, "purge an instance, its timers and children")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("id")
        s.set_defaults(fn=fn)

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

    s = sub.add_parser("validate", help="check a chart")
    s.add_argument("chart")
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("diagram", help="print a chart as a Mermaid stateDiagram-v2")
    s.add_argument("chart")
    s.set_defaults(fn=cmd_diagram)

    s = sub.add_parser("drive", help="drive events from a JSON-lines file")
    s.add_argument("events", help='file of {"instance": ..., "event": ..., "data": ...} lines, or -')
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a tty")
    s.set_defaults(fn=cmd_drive)

    s = sub.add_parser("inspect", help="decode a position blob")
    s.add_argument("blob", help="file, or - for stdin")
    s.add_argument("--chart", help="the chart, to decode the payload")
    s.set_defaults(fn=cmd_inspect)

    s = sub.add_parser("migrate", help="move a position blob onto a revised chart")
    s.add_argument("blob")
    s.add_argument("--from", dest="from_chart", required=True)
    s.add_argument("--to", dest="to_chart", required=True)
    s.add_argument("--map", action="append", metavar="OLD=NEW", help="rename a state id (repeatable)")
    s.add_argument("-o", "--output", help="write the new blob here (default: stdout)")
    s.add_argument("--codec", default="msgpack", choices=("msgpack", "cbor"))
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("dynamodb", help="DynamoDB backend tools")
    dsub = s.add_subparsers(dest="dynamo_cmd", required=True)
    c = dsub.add_parser("create-table", help="create the statebound table (idempotent)")
    c.add_argument("name")
    s.set_defaults(fn=cmd_dynamodb)
    return p


_CODES = ((InstanceNotFound, EXIT_NOT_FOUND), (UnknownChart, EXIT_NOT_FOUND), (InstanceExists, EXIT_EXISTS),
          (NotRunning, EXIT_NOT_RUNNING), (ChartError, EXIT_ERROR), (PositionError, EXIT_ERROR))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed on one line
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return args.fn(args)
    except CliError as exc:
        print(f"statebound: error: {exc}", file=sys.stderr)
        return exc.code
    except StateboundError as exc:
        code = next((c for t, c in _CODES if isinstance(exc, t)), EXIT_ERROR)
        first = str(exc).splitlines()
        msg = first[0] if len(first) == 1 else "; ".join(x.strip(" -") for x in first)
        print(f"statebound: error: {msg}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except ValueError as exc:  # e.g. an instance id the host refuses ('::', empty, too long)
        print(f"statebound: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # never a traceback; STATEBOUND_TRACEBACK=1 shows it
        if os.environ.get("STATEBOUND_TRACEBACK"):
            raise
        text = str(exc).splitlines()[0] if str(exc) else ""
        print(f"statebound: error: {type(exc).__name__}: {text}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
