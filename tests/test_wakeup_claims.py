"""A woken outbox row is handed to the outside world once, however many sweepers are woken.

SQS delivers a wake-up at least once, and a row released with backoff is both woken and
left for the fallback's ``claim_due``. An outbox row calls out before its conditional
completion, so the sweeper claims the woken outbox rows (``store.claim_rows``) before it
fires them. Each race here is forced, not timed: the first sweeper's processor call blocks
until the second sweeper has done all it will do, so on the old code (woken rows fired
unclaimed) the processor was called twice every time.

Memory and SQLite run in this process. DynamoDB runs on the serialised moto server
(``moto_endpoint``: one request at a time, so each conditional write is atomic as on
DynamoDB), with two ``DynamoStore`` objects on two clients standing for two processes.
"""

from __future__ import annotations

import threading

import pytest

import statebound as sb
from dynamo.conftest import moto_endpoint, server_table  # noqa: F401  (the shared moto server)
from dynamo.helpers import make_store, server_client
from statebound.host.memory_wakeup import MemoryWakeup
from statebound.host.store import CLAIMED, DONE, SEND, Commit, TimerRow

T0 = 1_700_000_000_000
WAIT_S = 20   # the longest any step here may block before the test fails instead of hanging

NOTIFY = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="shop"
       initial="Idle">
  <state id="Idle">
    <transition event="Notify"><send type="app" event="Notified" target="ops"/></transition>
  </state>
</scxml>"""


class Gate:
    """A send processor whose first successful call blocks until :meth:`open`; it records
    every call (sweeper thread name, idempotency key)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.inside = threading.Event()
        self._open = threading.Event()
        self._fail = False
        self._lock = threading.Lock()

    def fail_next(self) -> None:
        """The next call raises instead (a delivery to retry with backoff)."""
        self._fail = True

    def __call__(self, delivery) -> None:
        with self._lock:
            if self._fail:
                self._fail = False
                raise ConnectionError("queue unavailable")
            self.calls.append((threading.current_thread().name, delivery.idempotency_key))
            first = not self.inside.is_set()
            self.inside.set()
        if first:
            assert self._open.wait(WAIT_S), "the gate was never opened"

    def open(self) -> None:
        self._open.set()


@pytest.fixture
def gate():
    """A :class:`Gate`, opened at teardown, so a failed assertion never leaves a sweeper
    thread blocked in it."""
    made = Gate()
    yield made
    made.open()


def make_host(store, gate: Gate, clock: sb.ManualClock, wakeup: MemoryWakeup | None = None) -> sb.Host:
    # deliver_after_commit=False: the send is left to the sweepers, as on the wake-up path
    return sb.Host([sb.Chart.from_scxml(NOTIFY)], store=store, clock=clock, processors={"app": gate},
                   deliver_after_commit=False, wakeup=wakeup)


def in_thread(name: str, fn) -> tuple[threading.Thread, list]:
    """Run ``fn`` in a named thread (the name is the sweeper's, in ``Gate.calls``)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), name=name, daemon=True)
    thread.start()
    return thread, out


def finish(gate: Gate, thread: threading.Thread) -> None:
    gate.open()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def notified(host: sb.Host, wk: MemoryWakeup) -> list:
    """Start an instance and make it send once; the wake-up requests the commit asked for."""
    host.start("shop", "o1")
    before = len(wk.requested)
    host.send("o1", "Notify")
    reqs = wk.requested[before:]
    assert [(r.instance_id, r.ordinal) for r in reqs] == [("o1", 1)]
    return reqs


# ----------------------------------------------------------------------------- memory, SQLite


def test_a_duplicated_wake_up_hands_the_outbox_row_over_once(store, gate):
    wk, clock = MemoryWakeup(), sb.ManualClock(T0)
    host = make_host(store, gate, clock, wk)
    reqs = notified(host, wk)
    first, second = sb.Sweeper(host, node_id="lambda-0"), sb.Sweeper(host, node_id="lambda-1")

    thread, first_report = in_thread("lambda-0", lambda: first.handle_wakeups(reqs))
    assert gate.inside.wait(WAIT_S)           # lambda-0 is calling out for the row
    again = second.handle_wakeups(reqs)       # SQS delivers the same message to lambda-1
    finish(gate, thread)

    assert gate.calls == [("lambda-0", "o1:1")]
    assert (again.delivered, again.total) == (0, 0)
    assert first_report[0].delivered == 1
    row = store.get_timer(("o1", 1))
    assert (row.state, row.outcome, row.claimed_by) == (DONE, "delivered", None)


def test_a_wake_up_and_the_fallback_claim_hand_the_row_over_once(store, gate):
    wk, clock = MemoryWakeup(), sb.ManualClock(T0)
    host = make_host(store, gate, clock, wk)
    reqs = notified(host, wk)
    woken, fallback = sb.Sweeper(host, node_id="woken"), sb.Sweeper(host, node_id="fallback")

    thread, _ = in_thread("woken", lambda: woken.handle_wakeups(reqs))
    assert gate.inside.wait(WAIT_S)
    held = store.get_timer(("o1", 1))
    swept = fallback.run_once()               # the scheduled fallback's claim_due
    finish(gate, thread)

    assert gate.calls == [("woken", "o1:1")]
    assert swept.total == 0
    assert (held.state, held.claimed_by) == (CLAIMED, "woken")   # claimed before it was handed over
    assert store.get_timer(("o1", 1)).state == DONE


def test_a_row_released_with_backoff_is_woken_and_claimed_and_handed_over_once(store, gate):
    gate.fail_next()                          # the first delivery fails: released with backoff
    wk, clock = MemoryWakeup(), sb.ManualClock(T0)
    host = make_host(store, gate, clock, wk)
    notified(host, wk)
    failed = sb.Sweeper(host, node_id="first").run_once()
    assert failed.failed == 1
    row = store.get_timer(("o1", 1))
    assert (row.state, row.attempts) == ("pending", 1)
    # the release asked for a wake-up at the retry time, and left the row to claim_due too
    [retry] = [r for r in wk.requested if r.due_at_ms == row.ready_at_ms]
    clock.advance(row.ready_at_ms - clock.now_ms())
    woken, fallback = sb.Sweeper(host, node_id="woken"), sb.Sweeper(host, node_id="fallback")

    thread, _ = in_thread("woken", lambda: woken.handle_wakeups([retry]))
    assert gate.inside.wait(WAIT_S)
    swept = fallback.run_once()
    finish(gate, thread)

    assert gate.calls == [("woken", "o1:1")]
    assert swept.total == 0
    assert store.get_timer(("o1", 1)).outcome == "delivered"


def test_a_woken_row_the_deadline_kept_from_firing_is_given_back_claimable(store, gate):
    wk, clock = MemoryWakeup(), sb.ManualClock(T0)
    host = make_host(store, gate, clock, wk)
    reqs = notified(host, wk)
    checks = iter([False])                    # the read goes ahead; the fire finds the deadline passed
    report = sb.Sweeper(host, node_id="late").handle_wakeups(reqs, stop=lambda: next(checks, True))
    assert report.unreached == (("o1", 1),) and gate.calls == []
    row = store.get_timer(("o1", 1))
    assert (row.state, row.claimed_by, row.attempts) == ("pending", None, 0)
    # the redelivered message, to another sweeper, fires it at once, not after the lease
    gate.open()
    assert sb.Sweeper(host, node_id="next").handle_wakeups(reqs).delivered == 1
    assert gate.calls == [("MainThread", "o1:1")]


def test_an_in_process_wake_up_the_deadline_kept_from_firing_is_given_back_claimable(store, gate):
    wk, clock = MemoryWakeup(), sb.ManualClock(T0)
    host = make_host(store, gate, clock, wk)
    notified(host, wk)
    sweeper = sb.Sweeper(host, node_id="late", wakeups=wk)
    checks = iter([False, False])             # take the wake-up, read its row; then the deadline
    report = sweeper.run_once(stop=lambda: next(checks, True))
    assert report.unreached == (("o1", 1),) and gate.calls == []
    row = store.get_timer(("o1", 1))
    assert (row.state, row.claimed_by) == ("pending", None)
    assert len(wk) == 1                       # and its wake-up handed back to the source
    gate.open()
    assert sb.Sweeper(host, node_id="next", wakeups=wk).run_once().delivered == 1


def test_woken_timers_are_not_claimed(store):
    """A timer's fire commits conditionally before anything leaves the process: no claim
    write is spent on it."""
    chart = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="t"
       initial="A"><state id="A"><onentry><send event="go" delay="1s"/></onentry>
       <transition event="go" target="B"/></state><state id="B"/></scxml>"""
    wk, clock = MemoryWakeup(), sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(chart)], store=store, clock=clock, wakeup=wk)
    host.start("t", "t1")
    clock.advance(1_000)
    seen: list = []
    real = store.claim_rows
    store.claim_rows = lambda keys, *args: seen.append(list(keys)) or real(keys, *args)
    try:
        assert sb.Sweeper(host, node_id="n").handle_wakeups(wk.requested).fired == 1
    finally:
        del store.claim_rows
    assert seen == []
    assert host.get("t1").configuration == {"B"}


# ----------------------------------------------------------------------------- DynamoDB (moto server)


@pytest.fixture
def two_processes(moto_endpoint, server_table):  # noqa: F811
    """Two DynamoStore objects on two clients, as two processes (Lambda containers) have."""
    return [make_store(server_client(moto_endpoint), server_table) for _ in range(2)]


def dynamo_hosts(stores, gate, clock):
    wk = MemoryWakeup()
    return make_host(stores[0], gate, clock, wk), make_host(stores[1], gate, clock), wk


def test_dynamo_a_duplicated_wake_up_in_two_processes_hands_the_row_over_once(two_processes, gate):
    clock = sb.ManualClock(T0)
    host_a, host_b, wk = dynamo_hosts(two_processes, gate, clock)
    reqs = notified(host_a, wk)

    thread, _ = in_thread("lambda-a", lambda: sb.Sweeper(host_a, node_id="lambda-a").handle_wakeups(reqs))
    assert gate.inside.wait(WAIT_S)
    held = two_processes[1].get_timer(("o1", 1))       # as the other process reads it
    again = sb.Sweeper(host_b, node_id="lambda-b").handle_wakeups(reqs)
    finish(gate, thread)

    assert gate.calls == [("lambda-a", "o1:1")]
    assert again.total == 0
    assert (held.state, held.claimed_by) == (CLAIMED, "lambda-a")
    row = two_processes[1].get_timer(("o1", 1))
    assert (row.state, row.outcome, row.claimed_by, row.claim_expires_ms) == (DONE, "delivered", None, None)


def test_dynamo_a_wake_up_then_the_other_process_s_sweep_hands_the_row_over_once(two_processes, gate):
    clock = sb.ManualClock(T0)
    host_a, host_b, wk = dynamo_hosts(two_processes, gate, clock)
    reqs = notified(host_a, wk)

    thread, _ = in_thread("woken", lambda: sb.Sweeper(host_a, node_id="woken").handle_wakeups(reqs))
    assert gate.inside.wait(WAIT_S)
    swept = sb.Sweeper(host_b, node_id="fallback").run_once()   # a fresh store object: reads every shard
    finish(gate, thread)

    assert gate.calls == [("woken", "o1:1")]
    assert swept.total == 0


def test_dynamo_a_sweep_then_the_other_process_s_wake_up_hands_the_row_over_once(two_processes, gate):
    """claim_due's claim of an outbox row is written, not kept in memory only: the other
    process's wake-up finds the row claimed."""
    clock = sb.ManualClock(T0)
    host_a, host_b, wk = dynamo_hosts(two_processes, gate, clock)
    reqs = notified(host_a, wk)

    thread, _ = in_thread("fallback", lambda: sb.Sweeper(host_b, node_id="fallback").run_once())
    assert gate.inside.wait(WAIT_S)
    held = two_processes[0].get_timer(("o1", 1))
    woken = sb.Sweeper(host_a, node_id="woken").handle_wakeups(reqs)
    finish(gate, thread)

    assert gate.calls == [("fallback", "o1:1")]
    assert woken.total == 0
    assert (held.state, held.claimed_by) == (CLAIMED, "fallback")
    assert two_processes[0].get_timer(("o1", 1)).outcome == "delivered"


def test_dynamo_a_claim_whose_holder_died_is_taken_by_the_sweep_once_it_lapses(two_processes):
    dead, alive = two_processes
    dead.commit(Commit(timers_put=(TimerRow(
        "o1", 1, "o1", T0, "s1", {"type": "app"}, kind=SEND),)))
    [claimed] = dead.claim_rows([("o1", 1)], T0, "dead-node", 30_000)   # then the process dies
    assert alive.claim_due(T0 + 29_999, 10, "alive", 30_000) == []
    assert alive.next_due() == T0 + 30_000                               # the lease's lapse
    [taken] = alive.claim_due(T0 + 30_000, 10, "alive", 30_000)
    assert (taken.key, taken.claimed_by) == (claimed.key, "alive")
    assert dead.get_timer(("o1", 1)).claimed_by == "alive"               # stored, for every process


def test_dynamo_processes_racing_to_claim_a_row_one_wins(moto_endpoint, server_table):  # noqa: F811
    stores = [make_store(server_client(moto_endpoint), server_table) for _ in range(4)]
    keys = [(f"r{i}", 1) for i in range(5)]
    stores[0].commit(Commit(timers_put=tuple(
        TimerRow(k[0], 1, k[0], T0, "s", {"type": "app"}, kind=SEND) for k in keys)))
    for key in keys:
        start = threading.Barrier(len(stores), timeout=WAIT_S)
        won: list = []

        def claim(store, node, key=key, start=start, won=won):
            start.wait()
            won.append((node, store.claim_rows([key], T0, node, 60_000)))
        threads = [threading.Thread(target=claim, args=(s, f"p{i}"), daemon=True) for i, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert len(won) == len(stores)
        winners = [node for node, got in won if got]
        assert len(winners) == 1
        assert stores[-1].get_timer(key).claimed_by == winners[0]
