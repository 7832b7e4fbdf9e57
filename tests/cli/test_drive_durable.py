"""``statebound drive`` across crashes, signals and an unavailable store.

The crash and signal tests run the command as a real process reading a pipe: it blocks
reading once it has applied what it was given, so "killed after N lines" is a state the
test waits for (polling the store, with a timeout so a regression fails instead of
hanging), never a moment it guesses. Nothing here asserts how long anything took.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

import statebound as sb
from statebound.cli import drive, main

LOG = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="log" initial="s" datamodel="python">
  <datamodel><data id="seen" expr="[]"/><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="e"><assign location="seen" expr="seen + [_event.data]"/></transition>
    <transition event="bump"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>'''

TIMEOUT = 120   # seconds any one wait may take before the test fails instead of hanging


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A SQLite file with the ``log`` chart remembered; returns (db path, chart)."""
    monkeypatch.delenv("STATEBOUND_STORE", raising=False)
    monkeypatch.delenv("STATEBOUND_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "log.scxml"
    path.write_text(LOG)
    db = tmp_path / "d.db"
    assert main(["--store", str(db), "start", str(path), "seed"]) == 0
    return db, sb.Chart.from_scxml(LOG)


def _start(db, *ids):
    host = sb.Host([sb.Chart.from_scxml(LOG)], store=sb.SQLiteStore(str(db)))
    for iid in ids:
        host.start("log", iid)
    host.store.close()


def _on_worker(w, workers=2, prefix="i"):
    """An instance id that ``--workers`` sends to worker ``w``."""
    return next(f"{prefix}{n}" for n in range(1000) if zlib.crc32(f"{prefix}{n}".encode()) % workers == w)


def _event(iid, n, *, key=True, name="e"):
    line = {"instance": iid, "event": name, "data": n}
    if key:
        line["idempotency_key"] = f"{iid}-{n}"
    return json.dumps(line) + "\n"


class Reader:
    """The store, read while a drive writes it."""

    def __init__(self, db, chart):
        self.host = sb.Host([chart], store=sb.SQLiteStore(str(db)))

    def seen(self, iid):
        return list(self.host.get(iid).datamodel["seen"])

    def n(self, iid):
        return self.host.get(iid).datamodel["n"]

    def close(self):
        self.host.store.close()


def _wait_for(predicate, what):
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _spawn(db, *argv, store=None):
    # its own session: a signal to its process group reaches it and its workers only
    return subprocess.Popen([sys.executable, "-m", "statebound.cli", "--store", store or str(db), "drive", *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _feed(proc, lines):
    proc.stdin.write("".join(lines))
    proc.stdin.flush()


def _children(pid):
    """Processes whose parent is ``pid`` (the workers, and multiprocessing's resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _reap(proc):
    """End the drive and whatever it left in its process group (the workers of a regression)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=TIMEOUT)


def _resume_line(ckpt):
    return json.loads(Path(ckpt).read_text())["resume_from"]


# ----------------------------------------------------------------------------- 1. resume never applies a keyed line twice


@pytest.mark.parametrize("workers, retention", [("1", None), ("2", None), ("2", "10")])
def test_drive_killed_and_resumed_applies_every_keyed_line_once(setup, tmp_path, workers, retention):
    """The checkpoint never falls more keyed lines of an instance behind than the host keeps
    keys for. It used to be written once a second, and with ``--workers`` it stayed at the
    first line of a batch still filling for a quiet instance: a resume re-applied every line
    of a busy instance whose key had been dropped (hundreds, in the report)."""
    db, chart = setup
    quiet, busy = _on_worker(0, prefix="q"), _on_worker(1, prefix="b")
    _start(db, quiet, busy)
    lines = [_event(quiet, 0)] + [_event(busy, n) for n in range(400)]   # 400: whole batches, all sent
    events = tmp_path / "events.jsonl"
    events.write_text("".join(lines))
    ckpt = tmp_path / "ck"
    extra = ["--idempotency-retention", retention] if retention else []
    proc = _spawn(db, "-", "--workers", workers, "--checkpoint", str(ckpt), *extra)
    reader = Reader(db, chart)
    try:
        _feed(proc, lines)
        # any moment is a fair crash; with a retention of 10, the last 10 lines wait in a buffer
        _wait_for(lambda: len(reader.seen(busy)) >= 390, "the busy instance's lines")
        proc.kill()                                       # SIGKILL while it waits for more input
        proc.wait(timeout=TIMEOUT)
        resume = str(ckpt) if ckpt.exists() else "1"      # no checkpoint: all a user can do is start over
        code = main(["--store", str(db), "drive", str(events), "--workers", workers, "--resume-from", resume,
                     *extra])
        assert code == 0
        assert reader.seen(busy) == list(range(400))      # each line once, in order
        assert reader.seen(quiet) == [0]
    finally:
        reader.close()
        _reap(proc)


def test_drive_checkpoint_keeps_up_with_a_fast_store(setup, tmp_path, capsys, monkeypatch):
    """However far apart the timed checkpoints are (a second used to be hundreds of lines of
    one instance on a fast store), a crash leaves at most the retention of keyed lines past
    the last one."""
    db, chart = setup
    _start(db, "x")
    events = tmp_path / "events.jsonl"
    events.write_text("".join(_event("x", n) for n in range(400)))
    ckpt = tmp_path / "ck"
    monkeypatch.setattr(drive, "CHECKPOINT_EVERY_S", 3600.0)            # as if the store were that fast
    real_send_many = sb.Host.send_many
    sent = []

    def crash_after_250(host, items, **kw):
        room = 250 - len(sent)
        sent.extend(items[:room])
        if len(items) > room:                             # the process "dies" after line 250
            real_send_many(host, items[:room], **kw)
            raise KeyboardInterrupt
        return real_send_many(host, items, **kw)
    monkeypatch.setattr(sb.Host, "send_many", crash_after_250)
    assert main(["--store", str(db), "drive", str(events), "--checkpoint", str(ckpt)]) == 130
    monkeypatch.setattr(sb.Host, "send_many", real_send_many)
    reader = Reader(db, chart)
    try:
        assert len(reader.seen("x")) == 250
        resume = str(ckpt) if ckpt.exists() else "1"      # no checkpoint: all a user can do is start over
        assert main(["--store", str(db), "drive", str(events), "--resume-from", resume]) == 0
        assert reader.seen("x") == list(range(400))       # each keyed line once
    finally:
        reader.close()


def test_drive_checkpoints_within_a_small_retention(setup, tmp_path, capsys, monkeypatch):
    """With ``--idempotency-retention 10`` a batch of 100 lines of one instance would hold
    ten times the keys the host keeps: the drive commits and checkpoints every 10 keyed
    lines of it instead, so a crash in the middle leaves every re-sent line's key known."""
    db, chart = setup
    _start(db, "x")
    events = tmp_path / "events.jsonl"
    events.write_text("".join(_event("x", n) for n in range(100)))
    ckpt = tmp_path / "ck"
    real_send_many = sb.Host.send_many
    sent = []

    def crash_after_55(host, items, **kw):
        room = 55 - len(sent)
        sent.extend(items[:room])
        if len(items) > room:                             # the process "dies" after line 55
            real_send_many(host, items[:room], **kw)
            raise KeyboardInterrupt
        return real_send_many(host, items, **kw)
    monkeypatch.setattr(sb.Host, "send_many", crash_after_55)
    assert main(["--store", str(db), "drive", str(events), "--checkpoint", str(ckpt),
                 "--idempotency-retention", "10"]) == 130
    monkeypatch.setattr(sb.Host, "send_many", real_send_many)
    reader = Reader(db, chart)
    try:
        assert reader.seen("x") == list(range(55))
        assert 55 - (_resume_line(ckpt) - 1) <= 10        # at most the retention past the checkpoint
        # the resumed run keeps the default retention: it finds the keys the first run kept
        assert main(["--store", str(db), "drive", str(events), "--resume-from", str(ckpt)]) == 0
        assert reader.seen("x") == list(range(100))
    finally:
        reader.close()
    capsys.readouterr()
    assert main(["--store", str(db), "drive", str(events), "--idempotency-retention", "0"]) == 2
    assert "--idempotency-retention" in capsys.readouterr().err
    # the option's default is the host's, which is what the keys were kept under before it existed
    assert inspect.signature(sb.Host).parameters["idempotency_retention"].default == drive.DEFAULT_RETENTION


# ----------------------------------------------------------------------------- 3. signals and orphans


def test_drive_workers_exit_when_the_drive_is_killed(setup):
    """``kill -9`` of the drive used to leave its workers blocked on their queues forever."""
    db, chart = setup
    a, b = _on_worker(0, prefix="a"), _on_worker(1, prefix="b")
    _start(db, a, b)
    proc = _spawn(db, "-", "--workers", "2")
    reader = Reader(db, chart)
    try:
        _feed(proc, [_event(a, n) for n in range(100)] + [_event(b, n) for n in range(100)])
        _wait_for(lambda: len(reader.seen(a)) == len(reader.seen(b)) == 100, "both workers' batches")
        kids = _children(proc.pid)
        assert len(kids) >= 2
        proc.kill()
        proc.wait(timeout=TIMEOUT)   # not its pipes: a worker left behind would hold them open
        _wait_for(lambda: not any(_alive(k) for k in kids), "the workers to exit after their parent died")
    finally:
        reader.close()
        _reap(proc)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_drive_sigterm_stops_cleanly_with_an_exact_checkpoint(setup, tmp_path, workers):
    """SIGTERM while the drive waits for input: the workers stop, the checkpoint names the
    next line exactly, the exit code is 143; resuming applies even unkeyed lines once."""
    db, chart = setup
    a, b = _on_worker(0, prefix="a"), _on_worker(1, prefix="b")
    _start(db, a, b)
    lines = [_event(a, n, key=False) for n in range(100)] + [_event(b, n, key=False) for n in range(100)]
    more = [_event(a, n, key=False) for n in range(100, 150)] + [_event(b, n, key=False) for n in range(100, 150)]
    ckpt = tmp_path / "ck"
    proc = _spawn(db, "-", "--workers", workers, "--checkpoint", str(ckpt))
    reader = Reader(db, chart)
    try:
        _feed(proc, lines)
        _wait_for(lambda: len(reader.seen(a)) == len(reader.seen(b)) == 100, "the first 200 lines")
        kids = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 143, err
        assert "statebound: error: stopped by SIGTERM; resume with --resume-from" in err
        assert "Traceback" not in err and "drove 200/200" in out
        assert _resume_line(ckpt) == 201
        _wait_for(lambda: not any(_alive(k) for k in kids), "the workers to exit")
        events = tmp_path / "events.jsonl"
        events.write_text("".join(lines + more))
        assert main(["--store", str(db), "drive", str(events), "--workers", workers,
                     "--resume-from", str(ckpt)]) == 0
        assert reader.seen(a) == reader.seen(b) == list(range(150))
    finally:
        reader.close()
        _reap(proc)


@pytest.mark.parametrize("to_group", [False, True], ids=["drive", "process-group"])
def test_drive_sigterm_in_the_middle_of_a_file_resumes_exactly(setup, tmp_path, to_group):
    """SIGTERM while the workers are busy, to the drive or (as a service manager does) to
    every process of it: the workers finish what they were handed, the checkpoint is exact,
    so a resume applies each unkeyed line once."""
    db, chart = setup
    ids = [_on_worker(w % 2, prefix=f"m{w}") for w in range(4)]
    _start(db, *ids)
    total = 20_000
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"instance": ids[k % 4], "event": "bump"}) + "\n" for k in range(total)))
    ckpt = tmp_path / "ck"
    proc = _spawn(db, str(events), "--workers", "2", "--checkpoint", str(ckpt))
    reader = Reader(db, chart)
    try:
        _wait_for(lambda: sum(reader.n(i) for i in ids) >= 1_000, "the first thousand lines")
        kids = _children(proc.pid)
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
        if proc.returncode == 0:          # the machine was fast enough to finish first: nothing to stop
            assert sum(reader.n(i) for i in ids) == total
            return
        assert proc.returncode == 143, err
        stopped_at = _resume_line(ckpt)
        assert 1 < stopped_at <= total
        _wait_for(lambda: not any(_alive(k) for k in kids), "the workers to exit")
        assert main(["--store", str(db), "drive", str(events), "--workers", "2", "--resume-from", str(ckpt)]) == 0
        assert [reader.n(i) for i in ids] == [total // 4] * 4
    finally:
        reader.close()
        _reap(proc)


# ----------------------------------------------------------------------------- 4. the store unavailable


def _unavailable(iid):
    return sb.host.SendResult(0, iid, None, sb.StoreUnavailable("SQLite database is locked (test)"))


def test_drive_retries_lines_the_store_could_not_take(setup, tmp_path, capsys, monkeypatch):
    """A line refused only because the store was unavailable is tried again; it is not a
    failed line, and nothing is reported."""
    db, chart = setup
    _start(db, "x", "y")
    monkeypatch.setattr(drive, "RETRY_BACKOFF_S", (0.0, 0.0, 0.0, 0.0), raising=False)
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"instance": "z", "start": "log", "idempotency_key": "z"}) + "\n"
                      + "".join(_event(i, n) for n in range(30) for i in ("x", "y", "z")))
    real_send_many, real_start = sb.Host.send_many, sb.Host.start
    refusals = {"send_many": 3, "start": 2}

    def flaky_send_many(host, items, **kw):
        if refusals["send_many"]:
            refusals["send_many"] -= 1
            return [_unavailable(item[0]) for item in items]
        return real_send_many(host, items, **kw)

    def flaky_start(host, *args, **kw):
        if refusals["start"]:
            refusals["start"] -= 1
            raise sb.StoreUnavailable("SQLite database is locked (test)")
        return real_start(host, *args, **kw)
    monkeypatch.setattr(sb.Host, "send_many", flaky_send_many)
    monkeypatch.setattr(sb.Host, "start", flaky_start)
    code = main(["--json", "--store", str(db), "drive", str(events)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["error_count"] == 0 and err == ""
    reader = Reader(db, chart)
    try:
        assert [reader.seen(i) for i in ("x", "y", "z")] == [list(range(30))] * 3
    finally:
        reader.close()


def test_drive_stops_at_a_line_the_store_keeps_refusing(setup, tmp_path, capsys, monkeypatch):
    """After its retries the run stops at that line, checkpointed there; no later line of
    its instance is applied, so the resume keeps every instance's order."""
    db, chart = setup
    _start(db, "x", "y")
    monkeypatch.setattr(drive, "RETRY_BACKOFF_S", (0.0, 0.0), raising=False)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(_event(i, n) for n in range(100) for i in ("x", "y")))   # line 2n+1: x's n
    ckpt = tmp_path / "ck"
    real_send_many = sb.Host.send_many
    tries = []

    def refuse_x_40(host, items, **kw):
        if any(item[3] == "x-40" for item in items):
            tries.append(1)
            return [_unavailable(item[0]) for item in items]
        return real_send_many(host, items, **kw)
    monkeypatch.setattr(sb.Host, "send_many", refuse_x_40)
    code = main(["--json", "--store", str(db), "drive", str(events), "--checkpoint", str(ckpt)])
    out, err = capsys.readouterr()
    assert code == 1 and len(tries) == 3                                    # the first try and two more
    assert err.splitlines() == [f"statebound: error: stopped at line 81: the store was unavailable "
                                f"(SQLite database is locked (test)); resume with --resume-from {ckpt}"]
    d = json.loads(out)
    assert (d["resume_from"], d["error_count"]) == (81, 0) and d["stopped"].startswith("stopped at line 81")
    assert _resume_line(ckpt) == 81
    reader = Reader(db, chart)
    try:
        assert reader.seen("x") == list(range(40))
        assert reader.seen("y")[:40] == list(range(40)) and len(reader.seen("y")) <= 41
        monkeypatch.setattr(sb.Host, "send_many", real_send_many)           # the store is back
        assert main(["--store", str(db), "drive", str(events), "--resume-from", str(ckpt)]) == 0
        assert reader.seen("x") == reader.seen("y") == list(range(100))
    finally:
        reader.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_drive_stops_while_sqlite_stays_locked_and_resumes_after(setup, tmp_path, workers):
    """Another connection holds SQLite's write lock past the store's busy timeout: the lines
    used to be reported failed and the checkpoint moved past them, so a resume never sent
    them. Now the run stops at the first of them, and the resume applies each line once."""
    db, chart = setup
    a, b = _on_worker(0, prefix="a"), _on_worker(1, prefix="b")
    _start(db, a, b)
    first = [_event(a, n) for n in range(100)] + [_event(b, n) for n in range(100)]
    then = [_event(a, n) for n in range(100, 200)] + [_event(b, n) for n in range(100, 200)]
    ckpt = tmp_path / "ck"
    proc = _spawn(db, "-", "--workers", workers, "--checkpoint", str(ckpt), store=f"sqlite:///{db}?timeout_s=0.05")
    reader = Reader(db, chart)
    locker = sqlite3.connect(str(db), isolation_level=None, timeout=TIMEOUT)
    try:
        _feed(proc, first)
        _wait_for(lambda: len(reader.seen(a)) == len(reader.seen(b)) == 100, "the first 200 lines")
        locker.execute("BEGIN IMMEDIATE")
        _, err = proc.communicate("".join(then), timeout=TIMEOUT)     # and the end of the input
        locker.execute("COMMIT")
        assert proc.returncode == 1, err
        assert err.splitlines()[-1].startswith("statebound: error: stopped at line 201: the store was unavailable")
        assert "database is locked" in err and "Traceback" not in err
        assert _resume_line(ckpt) == 201
        events = tmp_path / "events.jsonl"
        events.write_text("".join(first + then))
        assert main(["--store", str(db), "drive", str(events), "--workers", workers,
                     "--resume-from", str(ckpt)]) == 0
        assert reader.seen(a) == reader.seen(b) == list(range(200))
    finally:
        if locker.in_transaction:
            locker.execute("ROLLBACK")
        locker.close()
        reader.close()
        _reap(proc)


def test_a_pipe_given_as_the_input_is_read_by_the_run(setup, tmp_path, capsys):
    # counting the lines for the progress bar read a FIFO (or <(...)) to its end first: the
    # run then drove 0 of 0 lines and exited 0, every line lost
    import threading
    db, chart = setup
    _start(db, "p")
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "w") as fh:
            fh.writelines(_event("p", n, key=False) for n in range(11))
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    # in a process of its own, so that a regression (which may block on the pipe) fails here
    result = subprocess.run([sys.executable, "-m", "statebound.cli", "--store", str(db), "drive", str(fifo)],
                            capture_output=True, text=True, timeout=TIMEOUT)
    writer.join(TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert Reader(db, chart).seen("p") == list(range(11))


def test_a_checkpoint_of_another_input_is_refused(setup, tmp_path, capsys):
    # its line number skipped lines of this input, silently
    db, _chart = setup
    _start(db, "q")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(_event("q", n) for n in range(20)))
    b.write_text("".join(_event("q", 100 + n) for n in range(5)))
    assert main(["--store", str(db), "drive", str(a), "--checkpoint", "ck.json"]) == 0
    assert main(["--store", str(db), "drive", str(b), "--resume-from", "ck.json"]) == 2
    assert "is of" in capsys.readouterr().err
    assert main(["--store", str(db), "drive", str(a), "--resume-from", "ck.json"]) == 0   # its own input: fine


def test_line_numbers_are_the_files_own_with_a_stray_carriage_return(setup, tmp_path, capsys):
    # universal newlines split a line at a lone CR: both halves were applied, and every later
    # error was numbered one past the file's line (wc -l, sed -n Np)
    db, chart = setup
    _start(db, "r")
    lines = [_event("r", n, key=False) for n in range(3)]
    lines[1] = lines[1].rstrip("\n") + "\r" + _event("r", 99, key=False)
    lines.append(json.dumps({"instance": "nope", "event": "e"}) + "\r\n")   # a CRLF line too
    path = tmp_path / "cr.jsonl"
    path.write_text("".join(lines), newline="")
    assert main(["--store", str(db), "drive", str(path)]) == 1
    err = capsys.readouterr().err
    assert "line 2:" in err and "line 4: instance 'nope' not found" in err
    assert Reader(db, chart).seen("r") == [0, 2]


def test_a_quiet_workers_line_does_not_hold_the_checkpoint_back(setup, tmp_path):
    # one line for an instance of worker 1, then thousands for worker 0's: worker 1's buffer
    # never filled, so its line pinned the checkpoint (and stayed unapplied) for the whole run,
    # and a resume after a crash applied everything after it again
    db, chart = setup
    busy = [_on_worker(0, prefix=f"b{k}-") for k in range(20)]
    quiet = _on_worker(1, prefix="q")
    _start(db, *busy, quiet)
    events = tmp_path / "ev.jsonl"
    n = 6000
    events.write_text(_event(quiet, -1, key=False) + "".join(_event(busy[k % 20], k, key=False) for k in range(n)))
    proc = _spawn(db, str(events), "--checkpoint", "ck.json", "--workers", "2")
    reader = Reader(db, chart)
    _wait_for(lambda: sum(len(reader.seen(i)) for i in busy) > n // 2, "half the lines applied")
    resume_from = json.loads((tmp_path / "ck.json").read_text())["resume_from"]
    proc.kill()
    proc.wait(TIMEOUT)
    assert reader.seen(quiet) == [-1]          # handed out, not held for a batch that never filled
    assert resume_from > 1 + n // 4             # the checkpoint follows the run


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fsynced descriptor through /proc")
def test_drive_checkpoint_is_fsynced_before_and_after_it_replaces_the_old_one(setup, tmp_path, capsys, monkeypatch):
    """A power loss must leave the old checkpoint or the new one: the new file's bytes reach
    the disk before the rename, and the rename before the next batch is read."""
    db, _chart = setup
    _start(db, "x")
    events = tmp_path / "events.jsonl"
    events.write_text("".join(_event("x", n) for n in range(30)))
    ckpt = tmp_path / "ck"
    log: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        log.append(("replace", str(dst)))
        return real_replace(src, dst)
    monkeypatch.setattr(drive.os, "fsync", fsync)
    monkeypatch.setattr(drive.os, "replace", replace)
    assert main(["--store", str(db), "drive", str(events), "--checkpoint", str(ckpt)]) == 0
    replaced = [i for i, (op, path) in enumerate(log) if op == "replace" and path == str(ckpt)]
    assert replaced, log
    for i in replaced:
        assert log[i - 1] == ("fsync", f"{ckpt}.tmp"), log
        assert log[i + 1] == ("fsync", str(tmp_path)), log
    assert json.loads(ckpt.read_text())["resume_from"] == 31


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_live_feed_has_each_line_applied_when_it_pauses(setup, tmp_path, workers):
    """``tail -f ... | statebound drive -``: the lines used to wait until a batch of 100
    filled or the input ended, so a live feed of a few events a minute applied none."""
    db, chart = setup
    _start(db, "live", "other")
    proc = _spawn(db, "-", "--workers", workers, "--checkpoint", str(tmp_path / "ck"))
    reader = Reader(db, chart)
    try:
        _feed(proc, [_event("live", 0), _event("other", 0, key=False), _event("live", 1)])
        _wait_for(lambda: reader.seen("live") == [0, 1] and reader.seen("other") == [0], "the first lines")
        _feed(proc, [_event("live", 2)])
        _wait_for(lambda: reader.seen("live") == [0, 1, 2], "a line fed after a pause")
        _wait_for(lambda: _resume_line(tmp_path / "ck") == 5, "the checkpoint past the applied lines")
        proc.stdin.close()
        assert proc.wait(timeout=TIMEOUT) == 0, proc.stderr.read()
        assert reader.seen("live") == [0, 1, 2]
    finally:
        reader.close()
        _reap(proc)


def test_a_live_feed_keeps_line_numbers_and_undecodable_bytes_per_line(setup, tmp_path):
    db, chart = setup
    _start(db, "b")
    proc = subprocess.Popen([sys.executable, "-m", "statebound.cli", "--store", str(db), "drive", "-", "--json"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        # a line split across two writes, a bad byte on line 2, no newline after the last
        first = _event("b", 0).encode()
        proc.stdin.write(first[:7])
        proc.stdin.flush()
        out, _err = proc.communicate(
            first[7:] + b'{"instance": "b", "event": "e", "data": "\xff"}\n' + _event("b", 2).encode().rstrip(),
            timeout=TIMEOUT)
        report = json.loads(out)
        assert report["events"] == 3 and report["ok"] == 2, report
        assert report["errors"][0].startswith("line 2"), report
        assert Reader(db, chart).seen("b") == [0, 2]
    finally:
        _reap(proc)


def test_a_line_whose_instance_other_writers_keep_moving_is_retried_not_skipped(setup, tmp_path, capsys,
                                                                                monkeypatch):
    """A line that lost all of the host's conflict retries (another process writing the same
    instance each time) was reported as refused and checkpointed past: a resume never sent
    it, and the instance's later lines were applied without it."""
    from statebound.host import sqlite as sq
    db, chart = setup
    _start(db, "h")
    events = tmp_path / "events.jsonl"
    events.write_text("".join(_event("h", n, key=False) for n in range(1, 11)))
    other = sb.Host([chart], store=sb.SQLiteStore(str(db)))
    real_many, real_one = sq.SQLiteStore.commit_many, sq.SQLiteStore.commit
    groups = {"n": 0}

    def contended_many(self, commits):
        if self is not other.store:
            groups["n"] += 1
            if groups["n"] == 5:                  # line 5's group: another writer gets in first
                other.send("h", "bump")
        return real_many(self, commits)

    def contended_one(self, commit):
        if self is not other.store and groups["n"] == 5:
            other.send("h", "bump")                # ... and before each of the host's retries
        return real_one(self, commit)
    monkeypatch.setattr(sq.SQLiteStore, "commit_many", contended_many)
    monkeypatch.setattr(sq.SQLiteStore, "commit", contended_one)
    monkeypatch.setattr(drive, "RETRY_BACKOFF_S", (0.0, 0.0))
    try:
        assert main(["--store", str(db), "drive", str(events), "--checkpoint", str(tmp_path / "ck")]) == 0
        assert other.get("h").datamodel["seen"] == list(range(1, 11))      # every line, in order
        assert _resume_line(tmp_path / "ck") == 11
    finally:
        other.store.close()
