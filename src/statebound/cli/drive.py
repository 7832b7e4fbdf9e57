"""``statebound drive``: feed JSON-lines events to instances, in one or more processes."""

from __future__ import annotations

import argparse
import sys
import threading
import time
import zlib
from typing import Any

from .. import Event, Host, StateboundError, SystemClock, jsonio
from ._base import EXIT_ERROR, EXIT_USAGE, CliError, emit
from ._store import open_location

__all__ = ["register"]


def _drive_worker(location: str, lines: list[tuple[int, dict[str, Any]]], progress: Any) -> tuple[int, list[str]]:
    store, reg = open_location(location)
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
    close = getattr(store, "close", None)   # DynamoStore holds no connection to close
    if close is not None:
        close()
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
                q.put(("result", _drive_worker(args.store, parts[0], q)))
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
                res = [pool.apply_async(_drive_worker, (args.store, p, q)) for p in parts]
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
    emit(args, data, f"drove {ok}/{len(items)} events in {elapsed:.2f}s "
                      f"({len(items) / elapsed if elapsed else 0:,.0f}/s, {workers} worker(s))"
                      + "".join(f"\n  {e}" for e in errors[:20]))
    return 0 if not errors else EXIT_ERROR


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("drive", help="drive events from a JSON-lines file")
    s.add_argument("events", help='file of {"instance": ..., "event": ..., "data": ...} lines, or -')
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a tty")
    s.set_defaults(fn=cmd_drive)
