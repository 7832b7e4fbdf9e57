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
from statebound.host.processors import Pending
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


def _statements_per_step(store, steps, *args) -> list[int]:
    """Run each step with ``args``, counting the SQL statements it makes: its crash points."""
    orig = store._execute
    n = [0]

    def counting(sql, params=()):
        n[0] += 1
        return orig(sql, params)
    store._execute = counting
    counts = []
    for _name, run in steps:
        n[0] = 0
        run(*args)
        counts.append(n[0])
    return counts


def _count_statements(path) -> list[int]:
    clock = sb.ManualClock(T0)
    store, host = _open(path, clock)
    counts = _statements_per_step(store, STEPS, host, clock)
    store.close()
    return counts


def _crash_points(tmp_path, steps, counts, tag):
    """Every crash point: ``(step, name, run, statement, "before"|"after", fresh db path)``."""
    for s, (name, run) in enumerate(steps):
        for i in range(counts[s]):
            for where in ("before", "after"):
                yield s, name, run, i, where, tmp_path / f"{tag}-{s}-{i}-{where}.db"


def _crash(store, at: int, where: str, name: str, run, *args) -> dict:
    """Run a step that crashes at statement ``at`` (``where`` before or after it), and close
    the store as the dead process leaves it. Returns what ``_arm_crash`` recorded."""
    st = _arm_crash(store, at, where)
    with pytest.raises(SimulatedCrash):
        run(*args)
    assert st["crashed"], f"{name}: statement {at} was never reached"
    store.close()
    return st


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
    for s, name, run, i, where, path in _crash_points(tmp_path, STEPS, counts, "crash"):
        clock = sb.ManualClock(T0)
        store, host = _open(path, clock)
        for _n, earlier in STEPS[:s]:
            earlier(host, clock)
        before = _probe(store, s)
        st = _crash(store, i, where, name, run, host, clock)
        kinds.add(st["sql"].split()[0].upper())
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


# ----------------------------------------------------------------------------- the outbox
#
# The same white-box crash injection, on an order that charges through an invoke handler
# and sends a receipt through a processor. Both run after the commit that asked for them,
# inside the same host call, so the crash points include every statement of those
# deliveries too. The caller retries every interrupted call with its idempotency key (the
# point of the keys: no "did it land?" probe), then a sweeper drains what the crash left.
# The outside world (gateway, receipt inbox) survives the crash, as it would.

class _Gateway:
    """Charges once per idempotency key; A's charge answers at once, B's answers later."""

    def __init__(self):
        self.calls: list[str] = []
        self.charges: dict[str, dict] = {}
        self.tokens: dict[str, str] = {}

    def start(self, request):
        self.calls.append(request.idempotency_key)
        self.tokens[request.instance_id] = request.token
        charge = self.charges.setdefault(request.idempotency_key,
                                         {"id": f"ch-{request.instance_id}", "amount": request.data["amount"]})
        return charge if request.instance_id == "A" else Pending("bank transfer")


class _Inbox:
    """Keeps one receipt per idempotency key, however many times it is delivered."""

    def __init__(self):
        self.calls: list[str] = []
        self.receipts: dict[str, tuple] = {}

    def deliver(self, d):
        self.calls.append(d.idempotency_key)
        self.receipts.setdefault(d.idempotency_key, (d.instance_id, d.event, d.data))


def _bank_answers(h, clock, world):
    """The bank confirms B's transfer, with the token the gateway was given. If a crash kept
    the charge from starting, nothing can answer it until a sweeper has started it."""
    for _ in range(3):
        token = world[0].tokens.get("B")
        if token is not None:
            return h.complete_invoke("B", "charge", {"id": "ch-B", "amount": 40}, token=token)
        clock.advance(LEASE_MS + 60_000)
        h.fire_due()
    raise AssertionError("B's charge never started")


OUTBOX_STEPS = [
    ("start A", lambda h, c, w: h.start("order", "A", {"amount": 25}, idempotency_key="start-A")),
    ("A StartPayment", lambda h, c, w: h.send("A", "StartPayment", {"card": "4242"}, idempotency_key="pay-A")),
    ("start B", lambda h, c, w: h.start("order", "B", {"amount": 40}, idempotency_key="start-B")),
    ("B StartPayment", lambda h, c, w: h.send("B", "StartPayment", {"card": "5555"}, idempotency_key="pay-B")),
    ("B charge completes", _bank_answers),
]


def _open_outbox(path, clock, world):
    store = sb.SQLiteStore(path)
    host = sb.Host([sb.Chart.from_file(ORDER)], store=store, clock=clock, on_log=lambda *a: None,
                   invokers={"payment": world[0]}, processors={"receipts": world[1]})
    return store, host


def _drain(host, clock):
    """The safety net: sweep until nothing is left, past leases and backoffs."""
    for _ in range(20):
        if host.next_due() is None:
            return
        clock.advance(LEASE_MS + 60_000)
        host.fire_due()
    raise AssertionError("rows never drained")


def _outcome(path, host):
    con = sqlite3.connect(path)
    try:
        positions = con.execute("SELECT instance_id, version, blob, status, timers, idempotency FROM positions "
                                "ORDER BY instance_id").fetchall()
        rows = con.execute("SELECT instance_id, ordinal, kind, state, outcome FROM timers "
                           "ORDER BY instance_id, ordinal").fetchall()
    finally:
        con.close()
    return positions, rows


def _world():
    return _Gateway(), _Inbox()


def _run_outbox_clean(path):
    world = _world()
    clock = sb.ManualClock(T0)
    store, host = _open_outbox(path, clock, world)
    counts = _statements_per_step(store, OUTBOX_STEPS, host, clock, world)
    _drain(host, clock)
    out = _outcome(path, host)
    store.close()
    return counts, world, out


def test_outbox_crash_before_and_after_every_statement(tmp_path, capsys):
    counts, clean_world, clean = _run_outbox_clean(tmp_path / "clean.db")
    gateway, inbox = clean_world
    assert set(gateway.calls) == set(gateway.charges) and len(gateway.charges) == 2
    assert len(inbox.receipts) == 2 and len(inbox.calls) == 2          # no crash: each once
    assert all(row[3] == DONE for row in clean[1])
    covered = redelivered = 0
    for s, name, run, i, where, path in _crash_points(tmp_path, OUTBOX_STEPS, counts, "outbox"):
        world = _world()
        clock = sb.ManualClock(T0)
        store, host = _open_outbox(path, clock, world)
        for _n, earlier in OUTBOX_STEPS[:s]:
            earlier(host, clock, world)
        st = _crash(store, i, where, name, run, host, clock, world)
        store, host = _open_outbox(path, clock, world)      # the restarted process
        run(host, clock, world)                             # the caller's retry, same key
        for _n, later in OUTBOX_STEPS[s + 1:]:
            later(host, clock, world)
        _drain(host, clock)
        where_ = f"crash {where} statement {i} of {name!r} ({st['sql'].split()[0]})"
        gw, ib = world
        # every delivery reached its receiver, with the clean run's keys, and acted once
        assert gw.charges == clean_world[0].charges, where_
        assert ib.receipts == clean_world[1].receipts, where_
        assert set(gw.calls) == set(gw.charges) and set(ib.calls) == set(ib.receipts), where_
        redelivered += (len(gw.calls) - 2) + (len(ib.calls) - 2)
        # nothing lost, nothing applied twice: positions byte for byte, rows by outcome
        assert _outcome(path, host) == clean, where_
        assert host.get("A").configuration == {"Done"} and host.get("B").configuration == {"Done"}
        assert host.dead_timers() == []
        store.close()
        path.unlink()
        covered += 1
    assert covered == 2 * sum(counts)
    assert redelivered > 0          # some crashes fell between a delivery and its acknowledgement
    with capsys.disabled():
        print(f"\noutbox crash points covered: {covered} (statements per step {counts}); "
              f"{redelivered} deliveries repeated to idempotent receivers")


# ----------------------------------------------------------------------------- group commit
#
# The same white-box crash injection on batches: one send_many that carries five events for
# four orders (B twice, so the batch splits into two group commits), then one fire_due whose
# three timeouts commit together. The caller re-sends an unacknowledged batch blindly, with
# its idempotency keys; a crashed sweep is re-run (past the dead sweeper's lease). Nothing may
# be lost or applied twice: the file must end row for row as a clean run's.

PAY_BATCH = [("A", "StartPayment", {"card": "4242"}, "pay-A"), ("B", "StartPayment", None, "pay-B"),
             ("C", "StartPayment", None, "pay-C"), ("B", "Complete", None, "done-B"),
             ("D", "StartPayment", None, "pay-D")]


def _send_batch(h, c):
    results = h.send_many(PAY_BATCH)
    assert all(r.ok for r in results), [r.error for r in results]


def _fire_batch(h, c):
    c.set(max(c.now_ms(), T0 + 3000))
    results = h.fire_due()
    assert len(results) <= 3 and {r.outcome for r in results} <= {"fired"}


BATCH_STEPS = [("send_many", _send_batch), ("fire_due", _fire_batch)]


def _start_orders(host):
    for iid in "ABCD":
        host.start("order", iid, DATA)


def _batch_fired(store):
    return all((row := store.get_timer((iid, 1))) is not None and row.state == DONE for iid in "ACD")


def test_batch_crash_before_and_after_every_statement(tmp_path, capsys):
    clean_path = tmp_path / "clean.db"
    clock = sb.ManualClock(T0)
    store, host = _open(clean_path, clock)
    _start_orders(host)
    begins = [0]
    orig = store._execute

    def counting(sql, params=()):
        begins[0] += sql.startswith("BEGIN")
        return orig(sql, params)
    store._execute = counting
    counts = _statements_per_step(store, BATCH_STEPS, host, clock)
    # five events in two group commits (B came twice), then a claim and one group commit
    assert begins[0] == 2 + 2 and host.metrics["fired"] == 3
    store.close()
    store, host = _open(clean_path, clock)
    clean = {k: (p.configuration, p.macrostep) for k in "ABCD" for p in [host.get(k)]}
    clean_dump = _table_dump(clean_path)
    store.close()
    assert clean["B"][0] == {"Done"} and all(clean[k][0] == {"Cancelled"} for k in "ACD")
    assert clean_dump[2] == "ok"

    covered = 0
    kinds = set()
    for s, name, run, i, where, path in _crash_points(tmp_path, BATCH_STEPS, counts, "batch"):
        clock = sb.ManualClock(T0)
        store, host = _open(path, clock)
        _start_orders(host)
        for _n, earlier in BATCH_STEPS[:s]:
            earlier(host, clock)
        st = _crash(store, i, where, name, run, host, clock)
        kinds.add(st["sql"].split()[0].upper())
        store, host = _open(path, clock)          # the restarted process
        run(host, clock)                          # blind retry: same batch, same keys
        if s == 1 and not _batch_fired(store):
            clock.advance(LEASE_MS)               # the crashed sweeper's claims lapse
            run(host, clock)
        for _n, later in BATCH_STEPS[s + 1:]:
            later(host, clock)
        where_ = f"crash {where} statement {i} of {name!r} ({st['sql'].split()[0]})"
        assert {k: (p.configuration, p.macrostep) for k in "ABCD" for p in [host.get(k)]} == clean, where_
        assert host.get("A").datamodel["card"] == "4242", where_
        assert _table_dump(path) == clean_dump, where_
        store.close()
        path.unlink()
        covered += 1
    assert covered == 2 * sum(counts)
    assert {"BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "SELECT", "UPDATE", "INSERT"} <= kinds
    with capsys.disabled():
        print(f"\nbatch crash points covered: {covered} (statements per step {counts})")


def test_batch_outbox_crash_before_and_after_every_statement(tmp_path, capsys):
    """A send_many whose two events each start a charge (invoke rows written by the group
    commit, handed over after it); A's answers at once and sends a receipt."""
    def setup(h, c, w):
        h.start("order", "A", {"amount": 25}, idempotency_key="start-A")
        h.start("order", "B", {"amount": 40}, idempotency_key="start-B")

    def pay(h, c, w):
        results = h.send_many([("A", "StartPayment", {"card": "4242"}, "pay-A"),
                               ("B", "StartPayment", {"card": "5555"}, "pay-B")])
        assert all(r.ok for r in results), [r.error for r in results]

    world = _world()
    clock = sb.ManualClock(T0)
    store, host = _open_outbox(tmp_path / "clean.db", clock, world)
    setup(host, clock, world)
    [count] = _statements_per_step(store, [("pay", pay)], host, clock, world)
    _bank_answers(host, clock, world)
    _drain(host, clock)
    clean = _outcome(tmp_path / "clean.db", host)
    store.close()
    assert world[0].calls and len(world[1].receipts) == 2
    covered = redelivered = 0
    for _s, _name, _run, i, where, path in _crash_points(tmp_path, [("pay", pay)], [count], "bo"):
        w = _world()
        clock = sb.ManualClock(T0)
        store, host = _open_outbox(path, clock, w)
        setup(host, clock, w)
        st = _crash(store, i, where, "pay", pay, host, clock, w)
        store, host = _open_outbox(path, clock, w)
        pay(host, clock, w)                            # the caller's blind retry
        _bank_answers(host, clock, w)
        _drain(host, clock)
        where_ = f"crash {where} statement {i} ({st['sql'].split()[0]})"
        assert w[0].charges == world[0].charges and w[1].receipts == world[1].receipts, where_
        assert _outcome(path, host) == clean, where_
        assert host.dead_timers() == []
        redelivered += (len(w[0].calls) - len(world[0].calls)) + (len(w[1].calls) - len(world[1].calls))
        store.close()
        path.unlink()
        covered += 1
    assert redelivered > 0
    with capsys.disabled():
        print(f"\nbatch outbox crash points covered: {covered}; {redelivered} deliveries repeated")
