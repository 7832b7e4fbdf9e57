"""``statebound drive``: feed JSON-lines events to instances, at scale, on any store.

Each line is one object, from a file or from stdin (``-``); blank lines are skipped::

    {"instance": "order-1", "start": "order", "data": {"amount": 10}}
    {"instance": "order-1", "event": "StartPayment", "data": {"card": "4242"}, "idempotency_key": "req-17"}

**Order.** With ``--workers N`` the lines are partitioned by instance (CRC-32 of the id), so
the events of one instance keep file order; each worker is a process with its own store
connection. The input is streamed, never held in memory: the reader hands each worker
batches through a bounded queue, so a slow store slows the reader down.

**Group commit.** Lines are applied ``BATCH`` (100) at a time, events with
``Host.send_many``: on SQLite one transaction, one fsync, for each run of events to distinct
instances (``docs/batch.md``). A start line ends a run, so the events after it find it.

**Errors.** A line that is not UTF-8, not JSON or not an event, and an event the host
refuses (unknown instance, halted, bad data), prints ``line N: why`` on stderr, and the run
goes on. The exit code is 1 if any line failed.

**Resuming.** ``--checkpoint FILE`` records, about once a second and at the end, the
first line not yet known to be done. After a crash, ``--resume-from FILE`` (or a line
number) skips everything before it. Lines handled after the last checkpoint are sent
again, so across a resume delivery is at least once; a line that carries an
``idempotency_key`` is applied once (``Host.send``/``Host.start`` with that key: a repeat
returns the instance as it is, and a start sent again is not an "already exists" error).

**Progress.** A bar on stderr (``tqdm``, the ``cli`` extra) when stderr is a terminal, or
with ``--progress``; without tqdm the command runs the same, without a bar.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import sys
import time
import zlib
from collections import deque
from collections.abc import Iterator
from typing import Any, TextIO

from .. import Event, Host, SystemClock, jsonio
from ._base import EXIT_ERROR, EXIT_USAGE, CliError, emit
from ._progress import Progress
from ._store import history_keep, is_digits, open_location

__all__ = ["register"]

BATCH = 100                     # lines per message to a worker, and per group commit
CHECKPOINT_EVERY_S = 1.0
MAX_ERRORS_KEPT = 1_000         # in the summary; every error is printed as it happens

_SHAPE = 'expected {"instance": ID, "event": NAME} or {"instance": ID, "start": CHART}'

Item = tuple[int, dict[str, Any]]


# --------------------------------------------------------------------------- lines


def _parse(lineno: int, line: str) -> tuple[dict[str, Any] | None, str | None]:
    """One input line as an item, or the error to report for it."""
    # The input is decoded with surrogateescape (see _open_events), so bytes that are not
    # UTF-8 arrive as lone surrogates, which valid UTF-8 never decodes to.
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            return None, f"line {lineno}: not valid UTF-8"
    try:
        item = jsonio.loads(line)
    except ValueError as exc:
        return None, f"line {lineno}: not JSON ({exc})"
    if not isinstance(item, dict) or not isinstance(item.get("instance"), str) or \
            not (isinstance(item.get("event"), str) or isinstance(item.get("start"), str)):
        return None, f"line {lineno}: {_SHAPE}"
    key = item.get("idempotency_key")
    if key is not None and not isinstance(key, str):
        return None, f"line {lineno}: idempotency_key must be a string"
    return item, None


def _apply(host: Host, item: dict[str, Any]) -> None:
    key = item.get("idempotency_key")
    if "start" in item:
        host.start(item["start"], item["instance"], item.get("data"), idempotency_key=key)
    else:
        host.send(item["instance"], Event(item["event"], item.get("data")), idempotency_key=key)


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def _apply_batch(host: Host, batch: list[Item]) -> tuple[int, list[str]]:
    """Apply lines in order: runs of events with ``send_many`` (group commit), each start on
    its own (it ends a run, so the events after it see the instance it created)."""
    ok, errors = 0, []
    events: list[Item] = []

    def flush() -> None:
        nonlocal ok
        results = host.send_many([(item["instance"], Event(item["event"], item.get("data")), None,
                                   item.get("idempotency_key")) for _, item in events])
        for (lineno, _), res in zip(events, results, strict=True):
            if res.error is None:
                ok += 1
            else:   # a refused event is reported, and the run goes on
                errors.append(f"line {lineno}: {_one_line(res.error)}")
        events.clear()

    for lineno, item in batch:
        if "start" not in item:
            events.append((lineno, item))
            continue
        if events:
            flush()
        try:
            _apply(host, item)
            ok += 1
        except Exception as exc:  # a refused start is reported, and the run goes on
            errors.append(f"line {lineno}: {_one_line(exc)}")
    if events:
        flush()
    return ok, errors


def _open_host(location: str, history: int) -> tuple[Host, Any]:
    store, reg = open_location(location)
    return Host(reg.load_all(), store=store, clock=SystemClock(), on_log=lambda *a: None,
                history=history or False), store


def _close(store: Any) -> None:
    close = getattr(store, "close", None)   # DynamoStore holds no connection to close
    if close is not None:
        close()


# --------------------------------------------------------------------------- progress and checkpoints


class _Run:
    """Totals of one drive, and its checkpoint file."""

    def __init__(self, args: argparse.Namespace, progress: Progress) -> None:
        self.progress = progress
        self.events = self.ok = self.error_count = 0
        self.errors: list[str] = []
        self.path = args.checkpoint
        self.source = args.events
        self.last_write = time.monotonic()

    def done(self, lines: int, ok: int, errors: list[str]) -> None:
        self.events += lines
        self.ok += ok
        self.error_count += len(errors)
        for e in errors:
            self.progress.error(e)
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(e)

    def checkpoint(self, resume_from: int, *, force: bool = False) -> None:
        if self.path is None or not (force or time.monotonic() - self.last_write >= CHECKPOINT_EVERY_S):
            return
        self.last_write = time.monotonic()
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"events": self.source, "resume_from": resume_from, "ok": self.ok,
                       "errors": self.error_count}, fh)
        os.replace(tmp, self.path)   # never a half-written checkpoint, whenever the crash comes


def _resume_line(text: str | None) -> int:
    if text is None:
        return 1
    if is_digits(text):
        return max(1, int(text))
    try:
        with open(text, encoding="utf-8") as fh:
            line = json.load(fh)["resume_from"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CliError(f"--resume-from takes a line number or a checkpoint file; {text!r}: {exc}", EXIT_USAGE) \
            from None
    if type(line) is not int or line < 1:
        raise CliError(f"checkpoint {text!r} holds no line number", EXIT_USAGE)
    return line


def _open_events(path: str) -> TextIO:
    """The input as UTF-8 text that cannot fail to decode: a byte that is not UTF-8 becomes a
    lone surrogate that :func:`_parse` reports as that line's error. A strict decode would
    raise out of the line iterator, losing the lines after it and the checkpoint."""
    if path != "-":
        return open(path, encoding="utf-8", errors="surrogateescape")
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:   # already text (an embedding program's stream): nothing to decode
        return sys.stdin
    return io.TextIOWrapper(buffer, encoding="utf-8", errors="surrogateescape")


def _count_lines(path: str) -> int | None:
    if path == "-":
        return None
    n = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
    return n


# --------------------------------------------------------------------------- running


def _lines(fh: TextIO, start: int) -> Iterator[tuple[int, str]]:
    for lineno, line in enumerate(fh, 1):
        if lineno >= start:
            yield lineno, line


def _drive_inline(args: argparse.Namespace, lines: Iterator[tuple[int, str]], run: _Run, start: int) -> int:
    host, store = _open_host(args.store, history_keep(args))
    next_line = start
    pending: list[Item] = []     # applied BATCH at a time: a group commit each
    seen = 0                     # lines read since the last flush, for the progress bar

    def flush() -> None:
        nonlocal seen
        if pending:
            run.done(len(pending), *_apply_batch(host, pending))
            pending.clear()
        run.progress.update(seen)
        seen = 0
        run.checkpoint(next_line)    # every line before next_line is done

    try:
        for lineno, line in lines:
            if line.strip():
                item, error = _parse(lineno, line)
                if item is None:
                    flush()              # errors come out in file order
                    run.done(1, 0, [error or ""])
                else:
                    pending.append((lineno, item))
            seen += 1
            next_line = lineno + 1
            if len(pending) >= BATCH:
                flush()
        flush()
    finally:
        _close(store)
    return next_line


def _worker(location: str, history: int, inbox: Any, outbox: Any, wid: int) -> None:
    """A worker process: apply each batch it is given, report what happened."""
    try:
        host, store = _open_host(location, history)
    except BaseException as exc:
        outbox.put(("fatal", wid, _one_line(exc)))
        return
    try:
        while (batch := inbox.get()) is not None:
            ok, errors = _apply_batch(host, batch)
            outbox.put(("done", wid, len(batch), ok, errors))
    finally:
        _close(store)
        outbox.put(("exit", wid))


def _drive_workers(args: argparse.Namespace, lines: Iterator[tuple[int, str]], run: _Run, start: int,
                   workers: int) -> int:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue(maxsize=8) for _ in range(workers)]
    keep = history_keep(args)
    procs = [ctx.Process(target=_worker, args=(args.store, keep, inboxes[w], outbox, w), daemon=True)
             for w in range(workers)]
    for p in procs:
        p.start()
    buffers: list[list[Item]] = [[] for _ in range(workers)]
    inflight: list[deque[int]] = [deque() for _ in range(workers)]   # first line of each unfinished batch
    exited: set[int] = set()
    next_line = start

    def resume_point() -> int:
        heads = [d[0] for d in inflight if d] + [b[0][0] for b in buffers if b]
        return min([*heads, next_line])

    def handle(msg: tuple[Any, ...]) -> None:
        if msg[0] == "done":
            _, w, n, ok, errors = msg
            inflight[w].popleft()
            run.done(n, ok, errors)
            run.progress.update(n)
        elif msg[0] == "exit":
            exited.add(msg[1])
        else:
            raise CliError(f"worker {msg[1]} could not start: {msg[2]}")

    def drain(timeout: float | None) -> None:
        try:
            msg = outbox.get(timeout=timeout) if timeout else outbox.get_nowait()
        except queue.Empty:
            dead = [p for w, p in enumerate(procs) if w not in exited and p.exitcode is not None]
            if dead and outbox.empty():
                raise CliError(f"a drive worker died (exit code {dead[0].exitcode}); resume from line "
                               f"{resume_point()}") from None
            return
        handle(msg)
        while True:
            try:
                handle(outbox.get_nowait())
            except queue.Empty:
                break
        run.checkpoint(resume_point())

    def dispatch(w: int) -> None:
        batch, buffers[w] = buffers[w], []
        inflight[w].append(batch[0][0])
        while True:
            try:
                inboxes[w].put(batch, timeout=0.05)
                return
            except queue.Full:
                drain(None)

    try:
        for lineno, line in lines:
            next_line = lineno + 1
            if not line.strip():
                run.progress.update(1)
                continue
            item, error = _parse(lineno, line)
            if item is None:
                run.done(1, 0, [error or ""])
                run.progress.update(1)
                continue
            w = zlib.crc32(item["instance"].encode()) % workers
            buffers[w].append((lineno, item))
            if len(buffers[w]) >= BATCH:
                dispatch(w)
                drain(None)
        for w in range(workers):
            if buffers[w]:
                dispatch(w)
        for box in inboxes:
            box.put(None)
        while len(exited) < workers:
            drain(0.1)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return next_line


def cmd_drive(args: argparse.Namespace) -> int:
    workers = max(1, args.workers)
    start = _resume_line(args.resume_from)
    try:
        fh = _open_events(args.events)
        total = _count_lines(args.events)
    except OSError as exc:
        raise CliError(f"cannot read {args.events!r}: {exc.strerror or exc}") from None
    show = (not args.json and sys.stderr.isatty()) or args.progress
    progress = Progress(show, total, min(start - 1, total) if total is not None else start - 1)
    run = _Run(args, progress)
    started = time.perf_counter()
    try:
        with fh:
            lines = _lines(fh, start)
            if workers == 1:
                end = _drive_inline(args, lines, run, start)
            else:
                end = _drive_workers(args, lines, run, start, workers)
    finally:
        progress.close()
    run.checkpoint(end, force=True)
    elapsed = time.perf_counter() - started
    data = {"events": run.events, "ok": run.ok, "errors": run.errors, "error_count": run.error_count,
            "resumed_from": start, "resume_from": end, "seconds": round(elapsed, 3),
            "events_per_s": round(run.events / elapsed) if elapsed else None}
    tail = f"; {run.error_count} line(s) failed (above)" if run.error_count else ""
    emit(args, data, f"drove {run.ok}/{run.events} events in {elapsed:.2f}s "
                     f"({run.events / elapsed if elapsed else 0:,.0f}/s, {workers} worker(s)){tail}")
    return 0 if not run.error_count else EXIT_ERROR


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("drive", help="drive events from a JSON-lines file or stdin, on any store")
    s.add_argument("events", help='file of {"instance": ..., "event": ..., "data": ...} lines, or -')
    s.add_argument("--workers", type=int, default=1, help="processes, events of one instance stay in order")
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a tty")
    s.add_argument("--checkpoint", metavar="FILE", help="record the line to resume from, about once a second")
    s.add_argument("--resume-from", metavar="LINE|FILE", help="skip the lines before LINE (or a checkpoint's)")
    s.set_defaults(fn=cmd_drive)
