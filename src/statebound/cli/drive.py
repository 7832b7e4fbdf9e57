"""``statebound drive``: feed JSON-lines events to instances, at scale, on any store.

Each line is one object, from a file, a pipe or a FIFO (``<(...)``), or from stdin (``-``);
blank lines are skipped, and lines are counted at ``\n`` alone, as ``wc -l`` counts them::

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

**The store unavailable.** A line that fails only because the store is unavailable (SQLite
locked past its busy timeout, an I/O error, DynamoDB throttling past its retries:
``StoreUnavailable``), or because other writers moved its instance under every one of the
host's retries (``ConflictError``), is not the line's fault: it is tried again, ``len(RETRY_BACKOFF_S)``
more times with growing waits (about 1.5 s in all, plus the store's own timeout per try). If
it still fails, the run stops there: no later line of its instance is applied (the other
workers stop after their batch in flight), the checkpoint is written **at** that line (or
at an earlier one another worker had not finished), and the command prints the summary,
then ``statebound: error: stopped at line N: ...; resume with --resume-from ...`` and exits
1. ``--resume-from`` the checkpoint sends it again.

**Resuming.** ``--checkpoint FILE`` records the first line not yet known to be done: when the
run starts, after a batch (at most every ``CHECKPOINT_EVERY_S``, 50 ms), whenever the bound
below needs it, and at the end. After a crash, ``--resume-from FILE`` (or a
line number) skips everything before it (a checkpoint names its input: it is refused for
another file). Lines are applied in batches of 100 per worker (a worker whose lines lag far
behind is handed them sooner); a live feed (a pipe, a FIFO or a terminal, as in ``tail -f
... | statebound drive -``) also has what it gave applied whenever it pauses, so each line
is applied as it comes, not when 100 have. Lines handled after the last checkpoint are sent
again, so across a resume delivery is at least once; a line that carries an
``idempotency_key`` is applied once (``Host.send``/``Host.start`` with that key: a repeat
returns the instance as it is, and a start sent again is not an "already exists" error).

That holds because the host keeps the last ``--idempotency-retention`` keys of each instance
(100 by default, ``Host(idempotency_retention=N)``), and the drive never lets an instance get
more keyed lines past the checkpoint than that: before it hands out the line that would
exceed it, it waits for the lines before it to be done and writes the checkpoint (with
``--workers``, a short pause of the pipeline; without, an early group commit). A resumed run
therefore finds the key of every line it sends again. The bound assumes the drive is what
sends keyed events to those instances: another writer's keys, or a host with a smaller
retention committing to them meanwhile, push the drive's keys out sooner. A larger
retention makes every position that many keys bigger (keys ride in the position record).
The checkpoint is written to a temporary file, fsynced, renamed over the old one, and the
directory fsynced: after a crash or a power loss it is the old checkpoint or the new one,
and never ahead of the commits it vouches for (each batch commits before its checkpoint).

**Stopping.** SIGTERM or Ctrl-C (SIGINT) stops the reading (also while it waits on stdin).
Without workers the batch in flight is finished; with them, every line already read is
finished (each worker holds at most 8 batches). The checkpoint is then exact, so a resume
applies even lines without a key once; the summary is printed, then ``statebound: error:
stopped by SIGTERM; resume with ...``, and the command exits 143 (SIGTERM) or 130 (SIGINT).
A second SIGTERM stops the workers after their batch in flight (the checkpoint is then the
first line some worker had not done); a second Ctrl-C interrupts at once. The workers
ignore both signals, which a terminal or a service manager sends to the whole group: the
drive alone stops them. A worker whose drive is gone (killed with SIGKILL) notices within
``POLL_S`` (0.5 s) or at its next batch, and exits, so no worker outlives the drive.

**Progress.** A bar on stderr (``tqdm``, the ``cli`` extra) when stderr is a terminal, or
with ``--progress``; without tqdm the command runs the same, without a bar.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import select
import signal
import stat
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .. import Event, Host, SystemClock, jsonio
from ..exceptions import ConflictError, StoreUnavailable
from ._base import EXIT_ERROR, EXIT_USAGE, CliError, emit
from ._progress import Progress
from ._store import history_keep, is_digits, open_location

__all__ = ["register"]

BATCH = 100                     # lines per message to a worker, and per group commit
CHECKPOINT_EVERY_S = 0.05       # at most this often after a batch (a write and its two fsyncs, ~1 ms); the key bound forces more
MAX_ERRORS_KEPT = 1_000         # in the summary; every error is printed as it happens
DEFAULT_RETENTION = 100         # Host(idempotency_retention=) by default
RETRY_BACKOFF_S = (0.1, 0.2, 0.4, 0.8)   # waits before each new try of a line the store could not take
POLL_S = 0.5                    # how often an idle worker looks for its parent
MAX_TRACKED = 100_000           # instances the key bound follows before it writes a checkpoint anyway

_SHAPE = 'expected {"instance": ID, "event": NAME} or {"instance": ID, "start": CHART}'

Item = tuple[int, dict[str, Any]]
Stalled = tuple[int, str]       # the first line the store could not take, and why


class _Interrupted(BaseException):
    """Raised by the signal handler only while the reader waits for input (stdin)."""


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


#: What a line may fail with and still apply if sent again: the store was unavailable, or
#: other writers moved the instance under every one of the host's retries. Such a line is
#: retried, then stops the run at it; reported as refused, the checkpoint went past it and a
#: resume never sent it again, while the instance's later lines were applied without it.
_TRANSIENT = (StoreUnavailable, ConflictError)


def _apply_batch(host: Host, batch: list[Item],
                 stopping: Callable[[], bool] = lambda: False) -> tuple[int, list[str], Stalled | None]:
    """Apply lines in order: runs of events to distinct instances with ``send_many`` (group
    commit), each start on its own (it ends a run, so the events after it see the instance
    it created).

    Returns the lines applied, the errors to report, and the line the store could not take
    after every retry (``None`` when there is none): the caller must apply nothing after it.
    """
    ok = 0
    errors: list[tuple[int, str]] = []
    run: list[Item] = []
    ids: set[str] = set()

    def send(items: list[Item]) -> list[tuple[Item, Exception]]:
        nonlocal ok
        results = host.send_many([(item["instance"], Event(item["event"], item.get("data")), None,
                                   item.get("idempotency_key")) for _, item in items])
        unavailable: list[tuple[Item, Exception]] = []
        for (lineno, item), res in zip(items, results, strict=True):
            if res.error is None:
                ok += 1
            elif isinstance(res.error, _TRANSIENT):
                unavailable.append(((lineno, item), res.error))
            else:   # a refused event is reported, and the run goes on
                errors.append((lineno, f"line {lineno}: {_one_line(res.error)}"))
        return unavailable

    def start(items: list[Item]) -> list[tuple[Item, Exception]]:
        nonlocal ok
        try:
            _apply(host, items[0][1])
        except _TRANSIENT as exc:
            return [(items[0], exc)]
        except Exception as exc:  # a refused start is reported, and the run goes on
            errors.append((items[0][0], f"line {items[0][0]}: {_one_line(exc)}"))
        else:
            ok += 1
        return []

    def retrying(fn: Callable[[list[Item]], list[tuple[Item, Exception]]], items: list[Item]) -> Stalled | None:
        # A group the store could not take wrote nothing of it (docs/batch.md), and a run
        # holds one line per instance, so trying its failed lines again keeps every
        # instance's order.
        failed = fn(items)
        for wait in RETRY_BACKOFF_S:
            if not failed or stopping():
                break
            time.sleep(wait)
            failed = fn([item for item, _ in failed])
        if not failed:
            return None
        (lineno, _), exc = failed[0]
        if isinstance(exc, ConflictError):
            return lineno, f"other writers kept moving its instance ({_one_line(exc)})"
        return lineno, f"the store was unavailable ({_one_line(exc)})"

    stalled: Stalled | None = None
    for lineno, item in batch:
        if "start" in item or item["instance"] in ids:
            if run:
                stalled = retrying(send, run)
                run, ids = [], set()
                if stalled:
                    break
            if "start" in item:
                stalled = retrying(start, [(lineno, item)])
                if stalled:
                    break
                continue
        run.append((lineno, item))
        ids.add(item["instance"])
    if run and not stalled:
        stalled = retrying(send, run)
    errors.sort()   # retried lines report after the others: back in file order
    return ok, [e for _, e in errors], stalled


def _open_host(location: str, history: int, retention: int) -> tuple[Host, Any]:
    store, reg = open_location(location)
    return Host(reg.load_all(), store=store, clock=SystemClock(), on_log=lambda *a: None,
                history=history or False, idempotency_retention=retention), store


def _close(store: Any) -> None:
    close = getattr(store, "close", None)   # DynamoStore holds no connection to close
    if close is not None:
        close()


# --------------------------------------------------------------------------- progress and checkpoints


class _KeyWindow:
    """How many keyed lines each instance has been handed since the checkpoint on disk, or
    more (never fewer): the drive keeps that at most ``retention``, so a resumed run finds
    every key it sends again (see the module docstring).

    Two generations: ``new`` counts the lines handed out from ``mark`` on, ``old`` those
    from the mark before. A checkpoint at or past ``mark`` leaves no line of ``old`` after
    it, so ``old`` is dropped and ``new`` becomes it.
    """

    def __init__(self, retention: int | None, start: int) -> None:
        self.retention = retention      # None: no checkpoint file, nothing to bound
        self.old: dict[str, int] = {}
        self.new: dict[str, int] = {}
        self.mark = start

    def full(self, instance: str) -> bool:
        """Handing out one more keyed line of ``instance`` needs a checkpoint first."""
        if self.retention is None:
            return False
        return self.old.get(instance, 0) + self.new.get(instance, 0) >= self.retention or \
            len(self.new) >= MAX_TRACKED

    def add(self, instance: str) -> None:
        if self.retention is not None:
            self.new[instance] = self.new.get(instance, 0) + 1

    def written(self, resume_from: int, next_line: int) -> None:
        """A checkpoint at ``resume_from`` was written; ``next_line`` is the next line to read."""
        if resume_from >= next_line:        # every line handed out is done
            self.old, self.new = {}, {}
            self.mark = next_line
        elif resume_from >= self.mark:
            self.old, self.new = self.new, {}
            self.mark = next_line


class _Run:
    """Totals of one drive, and its checkpoint file."""

    def __init__(self, args: argparse.Namespace, progress: Progress, start: int) -> None:
        self.progress = progress
        self.events = self.ok = self.error_count = 0
        self.errors: list[str] = []
        self.path = args.checkpoint
        self.source = args.events
        self.last_write = 0.0
        self.window = _KeyWindow(args.idempotency_retention if self.path else None, start)

    def done(self, lines: int, ok: int, errors: list[str]) -> None:
        self.events += lines
        self.ok += ok
        self.error_count += len(errors)
        for e in errors:
            self.progress.error(e)
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(e)

    def checkpoint(self, resume_from: int, next_line: int, *, force: bool = False) -> None:
        """Record ``resume_from`` (every line before it is done; ``next_line`` is the next to read)."""
        if self.path is None or not (force or time.monotonic() - self.last_write >= CHECKPOINT_EVERY_S):
            return
        self.last_write = time.monotonic()
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"events": self.source, "resume_from": resume_from, "ok": self.ok,
                                     "errors": self.error_count}))
                fh.flush()
                # on disk before it replaces the old one: a power loss then leaves the old
                # checkpoint or this one, never an empty file where the rename got ahead
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)   # never a half-written checkpoint, whenever the crash comes
            _fsync_dir(self.path)
        except OSError as exc:
            raise CliError(f"cannot write the checkpoint {self.path!r}: {exc.strerror or exc}") from None
        self.window.written(resume_from, next_line)


def _fsync_dir(path: str) -> None:
    """Make a rename into ``path``'s directory durable (POSIX; a no-op where a directory
    cannot be opened, as on Windows)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:   # some filesystems refuse an fsync of a directory: the rename stands anyway
        pass
    finally:
        os.close(fd)


def _resume_line(text: str | None, events: str) -> int:
    if text is None:
        return 1
    if is_digits(text):
        return max(1, int(text))
    try:
        with open(text, encoding="utf-8") as fh:
            saved = json.load(fh)
        line, source = saved["resume_from"], saved.get("events")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CliError(f"--resume-from takes a line number or a checkpoint file; {text!r}: {exc}", EXIT_USAGE) \
            from None
    if type(line) is not int or line < 1:
        raise CliError(f"checkpoint {text!r} holds no line number", EXIT_USAGE)
    if isinstance(source, str) and source != "-" and events != "-" and \
            os.path.abspath(source) != os.path.abspath(events):
        # another input's line number skips lines of this one, silently
        raise CliError(f"checkpoint {text!r} is of {source!r}, not {events!r}: give that input, or a line "
                       "number", EXIT_USAGE)
    return line


def _open_events(path: str) -> TextIO:
    """The input as UTF-8 text that cannot fail to decode: a byte that is not UTF-8 becomes a
    lone surrogate that :func:`_parse` reports as that line's error. A strict decode would
    raise out of the line iterator, losing the lines after it and the checkpoint."""
    if path != "-":
        # newline="\n": a stray CR is part of its line, as wc -l and the line numbers the
        # checkpoint and the errors name count them (universal newlines split it in two)
        return open(path, encoding="utf-8", errors="surrogateescape", newline="\n")
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:   # already text (an embedding program's stream): nothing to decode
        return sys.stdin
    return io.TextIOWrapper(buffer, encoding="utf-8", errors="surrogateescape", newline="\n")


def _count_lines(path: str) -> int | None:
    """The lines of a regular file, to size the progress bar; ``None`` for anything else: a
    pipe or a FIFO (``<(...)``) read here to count would leave nothing for the run."""
    if path == "-" or not stat.S_ISREG(os.stat(path).st_mode):
        return None
    n = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
    return n


# --------------------------------------------------------------------------- signals


class _Signals:
    """SIGTERM and SIGINT stop the drive: the handler only records the signal (a flag, no
    lock the interrupted code might hold). While the reader waits for input it raises
    :class:`_Interrupted` instead, since a read from a pipe may never return."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0          # a second SIGTERM hurries the workers (see _drive_workers)
        self.reading = False

    def handler(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1
        signal.signal(signal.SIGINT, signal.default_int_handler)   # a second Ctrl-C: at once
        if self.reading:
            self.reading = False
            raise _Interrupted

    @contextmanager
    def installed(self) -> Iterator[_Signals]:
        if threading.current_thread() is not threading.main_thread():
            yield self   # only the main thread may set handlers; an embedding caller keeps its own
            return
        previous = {sig: signal.signal(sig, self.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                if old is not None:   # None: a handler installed from C, which Python cannot restore
                    signal.signal(sig, old)

    def message(self) -> str:
        assert self.signum is not None
        return f"stopped by {signal.Signals(self.signum).name}"


#: what :func:`_lines` yields, instead of a line, when the input has nothing more for now:
#: the lines read so far are applied, and the checkpoint written, before the read that waits
IDLE = (0, "")
IDLE_AFTER_S = 0.01             # a live input quiet this long is idle


def _lines(fh: TextIO, start: int, signals: _Signals) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the input from line ``start`` on; ``IDLE`` between them
    when a pipe, FIFO or terminal has no more for now."""
    fd = _pipe_fd(fh)
    if fd is not None:
        yield from _pipe_lines(fd, start, signals)
        return
    lineno = 0
    while signals.signum is None:
        signals.reading = True
        try:
            line = fh.readline()
        finally:
            signals.reading = False
        if not line:
            return
        lineno += 1
        if lineno >= start:
            yield lineno, line


def _pipe_fd(fh: TextIO) -> int | None:
    """The descriptor to read a live input from directly (a pipe, FIFO, terminal or socket
    whose readiness ``select`` reports), or ``None`` to read ``fh`` by lines: a regular file
    never waits, and a stream without a descriptor (an embedding program's) has no other way."""
    try:
        fd = fh.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        select.select([fd], [], [], 0)
    except (OSError, ValueError, io.UnsupportedOperation):   # no descriptor, or select cannot wait on it
        return None
    return fd


def _pipe_lines(fd: int, start: int, signals: _Signals) -> Iterator[tuple[int, str]]:
    """:func:`_lines` of a live input, read from its descriptor so that it is known when the
    next read would wait: a ``tail -f`` feeding the drive then has each line applied when it
    comes, not when a batch of 100 fills or the input ends. The bytes are decoded per line
    as ``_open_events`` does (a byte that is not UTF-8 becomes that line's error); a line
    ends at ``\n`` only."""
    lineno = 0
    rest = b""
    while signals.signum is None:
        # idle only after a short quiet spell: a steady stream still fills its batches
        if not select.select([fd], [], [], IDLE_AFTER_S)[0]:
            yield IDLE
            if signals.signum is not None:
                return
        signals.reading = True
        try:
            chunk = os.read(fd, 1 << 16)
        finally:
            signals.reading = False
        if not chunk:
            if rest:
                lineno += 1
                if lineno >= start:
                    yield lineno, rest.decode("utf-8", "surrogateescape")
            return
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for raw in parts:
            lineno += 1
            if lineno >= start:
                yield lineno, raw.decode("utf-8", "surrogateescape") + "\n"
            if signals.signum is not None:
                return


# --------------------------------------------------------------------------- running


class _Stop:
    """Why a drive ended before its input did: the message and the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        self.message = message
        self.code = code


def _drive_inline(args: argparse.Namespace, lines: Iterator[tuple[int, str]], run: _Run, start: int,
                  signals: _Signals) -> tuple[int, _Stop | None]:
    host, store = _open_host(args.store, history_keep(args), args.idempotency_retention)
    next_line = start
    pending: list[Item] = []     # applied BATCH at a time: a group commit each
    seen = 0                     # lines read since the last flush, for the progress bar
    stalled: Stalled | None = None

    def flush(force: bool = False) -> None:
        nonlocal seen, stalled
        applied = bool(pending)
        if pending:
            ok, errors, stalled = _apply_batch(host, pending, lambda: signals.signum is not None)
            run.done(ok + len(errors) if stalled else len(pending), ok, errors)
            pending.clear()
        run.progress.update(seen)
        seen = 0
        if (applied or force) and not stalled:
            run.checkpoint(next_line, next_line, force=force)    # every line before next_line is done

    read_all = False
    try:
        try:
            for lineno, line in lines:
                if not line:                 # IDLE: the input waits, so apply what it gave
                    flush(force=True)
                    if stalled:
                        break
                    continue
                if line.strip():
                    item, error = _parse(lineno, line)
                    if item is None:
                        flush()              # errors come out in file order
                        if stalled:
                            break
                        run.done(1, 0, [error or ""])
                    else:
                        if item.get("idempotency_key") is not None:
                            if run.window.full(item["instance"]):
                                flush(force=True)
                            run.window.add(item["instance"])
                        pending.append((lineno, item))
                seen += 1
                next_line = lineno + 1
                if len(pending) >= BATCH:
                    flush()
                if stalled or signals.signum is not None:
                    break
            else:
                read_all = signals.signum is None   # the reader stops early on a signal, too
        except _Interrupted:
            pass    # a signal while waiting for input: stop as between two lines
        if read_all and not stalled:
            flush()
        if signals.signum is not None and (stalled or pending or not read_all):
            # a signal may have cut a retry short: the run stopped at that line, or before
            # the lines not yet applied
            end = stalled[0] if stalled else pending[0][0] if pending else next_line
            return end, _Stop(signals.message(), 128 + signals.signum)
        if stalled:
            return stalled[0], _Stop(f"stopped at line {stalled[0]}: {stalled[1]}")
        return next_line, None
    finally:
        _close(store)


def _worker(location: str, history: int, retention: int, inbox: Any, outbox: Any, stop: Any, wid: int) -> None:
    """A worker process: apply each batch it is given, report what happened.

    It stops, after the batch in flight, at the end (``None``), when the parent sets
    ``stop``, after a line the store could not take (every later line of its instances must
    wait behind it), or when its parent is gone.
    """
    import multiprocessing as mp
    # Ctrl-C reaches the whole process group, and a service manager may SIGTERM every
    # process of the service at once: the parent alone decides when the workers stop, so
    # that it can let them finish what they were handed and checkpoint exactly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = mp.parent_process()
    ppid = os.getppid()

    def orphaned() -> bool:
        return os.getppid() != ppid or (parent is not None and not parent.is_alive())

    def stopping() -> bool:
        return stop.is_set() or orphaned()

    try:
        host, store = _open_host(location, history, retention)
    except BaseException as exc:
        outbox.put(("fatal", wid, _one_line(exc)))
        return
    try:
        while not stopping():
            try:
                batch = inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if batch is None or stopping():
                break
            ok, errors, stalled = _apply_batch(host, batch, stopping)
            outbox.put(("done", wid, ok + len(errors) if stalled else len(batch), ok, errors, stalled))
            if stalled:
                break
    finally:
        _close(store)
        if orphaned():
            # Nobody reads the queue any more: exit without waiting to flush it into a
            # pipe that may be full.
            outbox.cancel_join_thread()
        else:
            outbox.put(("exit", wid))


def _drive_workers(args: argparse.Namespace, lines: Iterator[tuple[int, str]], run: _Run, start: int,
                   workers: int, signals: _Signals) -> tuple[int, _Stop | None]:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    stop_event = ctx.Event()
    inboxes = [ctx.Queue(maxsize=8) for _ in range(workers)]
    keep = history_keep(args)
    procs = [ctx.Process(target=_worker, args=(args.store, keep, args.idempotency_retention, inboxes[w], outbox,
                                               stop_event, w), daemon=True)
             for w in range(workers)]
    # A terminal or a service manager signals the whole group: a worker ignores both signals,
    # and must from its first instruction (set in _worker, that came after the interpreter's
    # start-up, and a Ctrl-C then printed the workers' tracebacks). Blocked while they start,
    # the two are blocked in the workers from the start (a mask survives exec), and one sent
    # meanwhile waits for this process instead of being lost.
    blocking = hasattr(signal, "pthread_sigmask")
    if blocking:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for p in procs:
            p.start()
    finally:
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    buffers: list[list[Item]] = [[] for _ in range(workers)]
    inflight: list[deque[int]] = [deque() for _ in range(workers)]   # first line not done of each unfinished batch
    exited: set[int] = set()
    closing = False               # the workers were told to finish: their exits are expected
    stops: list[_Stop] = []       # why the run must end early, first reason first
    stalled: list[Stalled] = []
    next_line = start
    read_all = False

    def resume_point() -> int:
        heads = [d[0] for d in inflight if d] + [b[0][0] for b in buffers if b]
        return min([*heads, next_line])

    def hurry() -> bool:
        # Stop handing out work: a worker stalled or died, or a second SIGTERM came. A
        # first signal only stops the reading: what the workers were handed is finished.
        return bool(stops) or signals.count >= 2

    def handle(msg: tuple[Any, ...]) -> None:
        if msg[0] == "done":
            _, w, n, ok, errors, stall = msg
            if stall is None:
                inflight[w].popleft()
            else:   # the batch is done up to that line; the worker applies nothing after it
                inflight[w][0] = stall[0]
                stalled.append(stall)
                stops.append(_Stop(f"stopped at line {stall[0]}: {stall[1]}"))
            run.done(n, ok, errors)
            run.progress.update(n)
        elif msg[0] == "exit":
            exited.add(msg[1])
            if not closing and not hurry():
                stops.append(_Stop(f"drive worker {msg[1]} stopped before the end"))
        else:
            exited.add(msg[1])
            stops.append(_Stop(f"drive worker {msg[1]} could not start: {msg[2]}"))

    def drain(timeout: float | None) -> None:
        try:
            msg = outbox.get(timeout=timeout) if timeout else outbox.get_nowait()
        except queue.Empty:
            for w, p in enumerate(procs):
                if w not in exited and p.exitcode is not None and outbox.empty():
                    exited.add(w)
                    stops.append(_Stop(f"a drive worker died (exit code {p.exitcode})"))
            return
        handle(msg)
        while True:
            try:
                handle(outbox.get_nowait())
            except queue.Empty:
                break
        run.checkpoint(resume_point(), next_line)

    def dispatch(w: int) -> None:
        batch, buffers[w] = buffers[w], []
        inflight[w].append(batch[0][0])   # from now on the batch holds the resume point back
        while not hurry():
            try:
                inboxes[w].put(batch, timeout=0.05)
                return
            except queue.Full:
                drain(None)

    def advance(instance: str) -> None:
        # Hand out every buffered line and wait for batches to finish until a checkpoint
        # leaves room for one more keyed line of ``instance``.
        for w in range(workers):
            if buffers[w]:
                dispatch(w)
        while not hurry():
            run.checkpoint(resume_point(), next_line, force=True)
            if not run.window.full(instance):
                return
            drain(0.1)

    def settle() -> None:
        # The input is idle: hand out every buffered line and wait for the workers to be
        # done with them, so that the checkpoint covers all of it while the read waits.
        for w in range(workers):
            if buffers[w]:
                dispatch(w)
        while not hurry() and any(inflight[w] for w in range(workers) if w not in exited):
            drain(0.1)
        if not hurry():
            run.checkpoint(resume_point(), next_line, force=True)

    def finish() -> None:
        # Every line read is handed out, then the end; the workers exit when they reach
        # it, or as soon as their batch in flight is done once hurry() says so.
        nonlocal closing
        closing = True
        for w in range(workers):
            if buffers[w]:
                dispatch(w)
        for w, box in enumerate(inboxes):
            while not hurry() and w not in exited:
                try:
                    box.put(None, timeout=0.05)
                    break
                except queue.Full:
                    drain(None)
        while len(exited) < workers:
            if hurry():
                stop_event.set()
            drain(0.1)

    try:
        try:
            for lineno, line in lines:
                if not line:                 # IDLE: the input waits, so hand out what it gave
                    settle()
                    if hurry():
                        break
                    continue
                if line.strip():
                    item, error = _parse(lineno, line)
                    if item is None:
                        run.done(1, 0, [error or ""])
                        run.progress.update(1)
                    else:
                        iid = item["instance"]
                        if item.get("idempotency_key") is not None:
                            if run.window.full(iid):
                                advance(iid)
                            run.window.add(iid)
                        w = zlib.crc32(iid.encode()) % workers
                        buffers[w].append((lineno, item))
                        if len(buffers[w]) >= BATCH:
                            dispatch(w)
                            drain(None)
                else:
                    run.progress.update(1)
                next_line = lineno + 1
                if lineno % BATCH == 0:
                    # A worker whose instances are quiet fills its buffer slowly: held back,
                    # its first line held the checkpoint (and its own lines) back for the run,
                    # and a resume applied everything after it again. Handed out once it lags.
                    lag = lineno - BATCH * workers
                    for v in range(workers):
                        if buffers[v] and buffers[v][0][0] < lag:
                            dispatch(v)
                if hurry() or signals.signum is not None:
                    break
            else:
                read_all = signals.signum is None   # the reader stops early on a signal, too
        except _Interrupted:
            pass    # a signal while waiting for input: stop as between two lines
        finish()
    finally:
        stop_event.set()
        for box in inboxes:
            box.cancel_join_thread()   # batches nobody will take must not hold up our exit
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()    # a worker ignores SIGTERM (see _worker)
    end = resume_point()
    if signals.signum is not None and not (read_all and end == next_line):   # not if it all got done anyway
        return end, _Stop(signals.message(), 128 + signals.signum)
    if stalled:
        first, why = min(stalled)
        return end, _Stop(f"stopped at line {first}: {why}")
    if stops:
        return end, stops[0]
    return end, None


def cmd_drive(args: argparse.Namespace) -> int:
    workers = max(1, args.workers)
    if args.idempotency_retention < 1:
        raise CliError("--idempotency-retention takes a number of keys, at least 1", EXIT_USAGE)
    start = _resume_line(args.resume_from, args.events)
    try:
        fh = _open_events(args.events)
        total = _count_lines(args.events)
    except OSError as exc:
        raise CliError(f"cannot read {args.events!r}: {exc.strerror or exc}") from None
    show = (not args.json and sys.stderr.isatty()) or args.progress
    progress = Progress(show, total, min(start - 1, total) if total is not None else start - 1)
    run = _Run(args, progress, start)
    started = time.perf_counter()
    try:
        with fh, _Signals().installed() as signals:
            # a file left by another run must not send a crash back further than this one started
            run.checkpoint(start, start, force=True)
            lines = _lines(fh, start, signals)
            if workers == 1:
                end, stop = _drive_inline(args, lines, run, start, signals)
            else:
                end, stop = _drive_workers(args, lines, run, start, workers, signals)
            run.checkpoint(end, end, force=True)
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    data = {"events": run.events, "ok": run.ok, "errors": run.errors, "error_count": run.error_count,
            "resumed_from": start, "resume_from": end, "seconds": round(elapsed, 3),
            "events_per_s": round(run.events / elapsed) if elapsed else None,
            "stopped": stop.message if stop else None}
    tail = f"; {run.error_count} line(s) failed (above)" if run.error_count else ""
    emit(args, data, f"drove {run.ok}/{run.events} events in {elapsed:.2f}s "
                     f"({run.events / elapsed if elapsed else 0:,.0f}/s, {workers} worker(s)){tail}")
    if stop is not None:
        where = f"--resume-from {args.checkpoint}" if args.checkpoint else f"--resume-from {end}"
        print(f"statebound: error: {stop.message}; resume with {where}", file=sys.stderr)
        return stop.code
    return 0 if not run.error_count else EXIT_ERROR


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("drive", help="drive events from a JSON-lines file or stdin, on any store")
    s.add_argument("events", help='file of {"instance": ..., "event": ..., "data": ...} lines, or -')
    s.add_argument("--workers", type=int, default=1, help="processes, events of one instance stay in order")
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a tty")
    s.add_argument("--checkpoint", metavar="FILE", help="record the line to resume from (several times a second)")
    s.add_argument("--resume-from", metavar="LINE|FILE", help="skip the lines before LINE (or a checkpoint's)")
    s.add_argument("--idempotency-retention", type=int, metavar="N", default=DEFAULT_RETENTION,
                   help=f"idempotency keys each instance keeps (default {DEFAULT_RETENTION}); the checkpoint "
                        "never falls more than N keyed lines of an instance behind")
    s.set_defaults(fn=cmd_drive)
