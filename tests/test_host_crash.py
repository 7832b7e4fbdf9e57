"""Crash safety of the SQLite host.

White box: the order scenario is run with a simulated crash before and after *every* SQL
statement the store executes during each step (``SQLiteStore._execute`` is the seam). After
the crash the "process" restarts (new SQLiteStore and Host on the same file), re-runs the
interrupted step if its effect is not visible (as a caller would retry an unacknowledged
call), finishes the scenario, and the end state must equal a clean run's, row for row.

Black box: a child process sends numbered increments to a counter and is SIGKILLed at
random moments; the stored counter must always equal the acknowledged sends, or one more.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import statebound as sb
from statebound.host.store import DONE

HERE = Path(__file__).resolve().parent
ORDER = HERE.parent / "examples" / "order" / "order.scxml"
T0 = 1_700_000_000_000
DATA = {"payment_timeout": "3s"}
LEASE_MS = 30_000


class SimulatedCrash(BaseException):
    """Not an Exception: the host's delivery-failure handler must not swallow a crash."""


def _fire(host: sb.Host, clock: sb.ManualClock) -> None:
    clock.set(max(clock.now_ms(), T0 + 3000))
    host.fire_due()


# (name, run(host, clock), committed(store, before) -> bool, probe(store) -> state before)
STEPS = [
    ("start A", lambda h, c: h.start("order", "A", DATA)),
    ("A StartPayment", lambda h, c: h.send("A", "StartPayment", {"card": "4242"})),
    ("start B", lambda h, c: h.start("order", "B", DATA)),
    ("B StartPayment", lambda h, c: h.send("B", "StartPayment")),
    ("B Complete", lambda h, c: h.send("B", "Complete")),
    ("fire A timeout", _fire),
]


def _version(store, iid):
    rec = store.load(iid)
    return None if rec is None else rec.version


def _probe(store, step: int):
    """What 'committed' is judged against, read before the step runs."""
    if step in (0, 2):
        return None
    if step == 5:
        return None
    return _version(store, "A" if step == 1 else "B")


def _committed(store, step: int, before) -> bool:
    """Whether the step's effect is visible in the store (its commit landed)."""
    if step in (0, 2):
        return store.load("A" if step == 0 else "B") is not None
    if step == 5:
        row = store.get_timer(("A", 1))
        return row is not None and row.state == DONE
    return _version(store, "A" if step == 1 else "B") != before


def _open(path, clock):
    store = sb.SQLiteStore(path)
    host = sb.Host([sb.Chart.from_file(ORDER)], store=store, clock=clock, on_log=lambda *a: None)
    return store, host


def _table_dump(path):
    con = sqlite3.connect(path)
    try:
        pos = con.execute("SELECT instance_id, chart, version, blob, status, timers, parent "
                          "FROM positions ORDER BY instance_id").fetchall()
        tim = con.execute("SELECT instance_id, ordinal, target_id, due_at_ms, send_id, name, event, "
                          "state, attempts, next_attempt_at_ms, ready_at_ms, claimed_by, "
                          "claim_expires_ms, last_error, outcome, reason FROM timers "
                          "ORDER BY instance_id, ordinal").fetchall()
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()
    return pos, tim, integrity


def _count_statements(path) -> list[int]:
    clock = sb.ManualClock(T0)
    store, host = _open(path, clock)
    counts = []
    orig = store._execute
    n = {"k": 0}

    def counting(sql, params=()):
        n["k"] += 1
        return orig(sql, params)
    store._execute = counting
    for _name, run in STEPS:
        n["k"] = 0
        run(host, clock)
        counts.append(n["k"])
    store.close()
    return counts


def _arm_crash(store, at: int, where: str) -> dict:
    """Make ``store`` crash at its ``at``-th statement from now; once crashed, it stays dead."""
    orig = store._execute
    st = {"k": 0, "crashed": False, "sql": None}

    def execute(sql, params=()):
        if st["crashed"]:
            raise SimulatedCrash("the process is dead")
        i = st["k"]
        st["k"] += 1
        if i == at and where == "before":
            st["crashed"], st["sql"] = True, sql
            raise SimulatedCrash(f"crash before statement {i}: {sql.split()[0]}")
        cur = orig(sql, params)
        if i == at and where == "after":
            st["crashed"], st["sql"] = True, sql
            raise SimulatedCrash(f"crash after statement {i}: {sql.split()[0]}")
        return cur
    store._execute = execute
    return st


def _end_state_checks(path, clean, store, host):
    a, b = host.get("A"), host.get("B")
    assert a.configuration == frozenset({"Cancelled"}) and a.status == "done"
    assert b.configuration == frozenset({"Done"}) and b.status == "done"
    assert a.datamodel["card"] == "4242"                           # no lost event
    assert (a.macrostep, b.macrostep) == clean["macrosteps"]       # no double application
    assert host.pending_timers("B") == [] and host.pending_timers("A") == []           # B's cancel kept, A's row done
    con = sqlite3.connect(path)
    try:
        fired = con.execute("SELECT instance_id, ordinal, outcome FROM timers WHERE state = 'done'").fetchall()
        all_rows = con.execute("SELECT count(*) FROM timers").fetchone()[0]
    finally:
        con.close()
    assert fired == [("A", 1, "fired")]                            # exactly one fired completion
    assert all_rows == 1                                           # B's row deleted, nothing extra
    assert _table_dump(path) == clean["dump"]                      # row for row as a clean run


def test_crash_before_and_after_every_statement(tmp_path, capsys):
    clean_path = tmp_path / "clean.db"
    counts = _count_statements(clean_path)
    assert all(c >= 3 for c in counts), counts         # each step writes: at least BEGIN/...COMMIT
    store, host = _open(clean_path, sb.ManualClock(T0 + 3000))
    clean = {"macrosteps": (host.get("A").macrostep, host.get("B").macrostep),
             "dump": _table_dump(clean_path)}
    store.close()
    assert clean["dump"][2] == "ok"

    covered = 0
    retried = 0
    kinds = set()
    for s, (name, run) in enumerate(STEPS):
        for i in range(counts[s]):
            for where in ("before", "after"):
                path = tmp_path / f"crash-{s}-{i}-{where}.db"
                clock = sb.ManualClock(T0)
                store, host = _open(path, clock)
                for _n, earlier in STEPS[:s]:
                    earlier(host, clock)
                before = _probe(store, s)
                st = _arm_crash(store, i, where)
                with pytest.raises(SimulatedCrash):
                    run(host, clock)
                assert st["crashed"], f"{name}: statement {i} was never reached"
                kinds.add(st["sql"].split()[0].upper())
                store.close()
                # restart
                store, host = _open(path, clock)
                if not _committed(store, s, before):
                    retried += 1
                    run(host, clock)
                    if s == 5 and not _committed(store, s, before):
                        # the crashed sweeper's claim holds until its lease runs out
                        clock.advance(LEASE_MS)
                        host.fire_due()
                    assert _committed(store, s, before), f"{name} did not commit on retry"
                for _n, later in STEPS[s + 1:]:
                    later(host, clock)
                try:
                    _end_state_checks(path, clean, store, host)
                except AssertionError as exc:
                    raise AssertionError(f"crash {where} statement {i} of step {name!r} "
                                         f"({st['sql'].split()[0]}): {exc}") from exc
                store.close()
                path.unlink()
                covered += 1
    assert covered == 2 * sum(counts)
    assert {"BEGIN", "COMMIT", "SELECT", "UPDATE", "INSERT"} <= kinds
    assert 0 < retried < covered      # some crashes lost the step (retried), some came after COMMIT
    with capsys.disabled():
        print(f"\ncrash points covered: {covered} (statements per step {counts}; "
              f"{retried} interrupted steps retried)")


# ----------------------------------------------------------------------------- black box

COUNTER = HERE / "_crash_child.py"


def _read_counter(db) -> int:
    store = sb.SQLiteStore(db)
    try:
        rec = store.load("c")
        if rec is None:
            return 0
        from _crash_child import chart
        return int(sb.Position.from_bytes(rec.blob, chart()).datamodel["n"])
    finally:
        store.close()


def test_sigkill_never_loses_or_doubles_an_acked_send(tmp_path):
    sys.path.insert(0, str(HERE))
    db = str(tmp_path / "kill.db")
    rng = random.Random(20240611)
    acked = 0
    kills = 0
    extra = 0
    started = time.monotonic()
    while kills < 24 and time.monotonic() - started < 25:
        proc = subprocess.Popen([sys.executable, "-u", str(COUNTER), db, str(acked), "100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        first = threading.Event()

        def reader(p=proc, out=lines, ev=first):
            for line in p.stdout:
                out.append(line.strip())
                ev.set()
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        assert first.wait(20), f"child never acked: {proc.stderr.read() if proc.poll() is not None else ''}"
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        th.join(5)
        kills += 1
        acks = [int(x.split()[1]) for x in lines if x.startswith("ack ")]
        assert acks == list(range(acked + 1, acked + 1 + len(acks)))
        if acks:
            acked = acks[-1]
        n = _read_counter(db)
        assert n in (acked, acked + 1), f"kill {kills}: counter {n}, acknowledged {acked}"
        extra += n - acked
        acked = n   # the parent has now seen the unacknowledged send land; continue from it
    assert kills >= 20, f"only {kills} kills in the time budget"
    assert acked > kills       # the children made progress between kills
    # a last child runs to a target without being killed: the count is exact
    target = acked + 25
    done = subprocess.run([sys.executable, "-u", str(COUNTER), db, str(acked), str(target)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _read_counter(db) == target
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()
    print(f"\n{kills} SIGKILLs, {acked} acked sends, {extra} unacked sends found applied")
