"""SQLiteStore group commit: a group's plain position updates go as one statement
(``executemany``), and a refusal among them still lands on its own commit alone."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from statebound.exceptions import ConflictError, InvalidInstanceId, StoreError
from statebound.host.memory import MemoryStore
import statebound.host.sqlite as sqlite_mod
from statebound.host.sqlite import SQLiteStore
from statebound.host.store import (CLAIMED, DONE, Commit, KeyRecord, PositionRecord, PositionWrite,
                                   TimerCompletion, TimerRef)
from store_contract import create, timer, update


@pytest.fixture
def store(tmp_path):
    with SQLiteStore(tmp_path / "group.db") as s:
        yield s


def _record(store):
    """Record every call of the seam: (first word of the SQL, number of parameter rows)."""
    calls = []
    orig = store._execute

    def seam(sql, params=()):
        many = type(params).__name__ == "_Many"
        calls.append((sql.split()[0], len(params) if many else None))
        return orig(sql, params)
    store._execute = seam
    return calls


def test_plain_updates_of_a_group_go_in_one_statement(store):
    for i in range(5):
        create(store, f"p{i}", timers_put=[timer(f"p{i}", 1, 10)] if i % 2 else [])
    store.claim_due(10, 5, "n1", 10_000)
    calls = _record(store)
    out = store.commit_many([
        Commit(writes=(update(f"p{i}", 1, blob=f"new{i}".encode()),),
               complete=TimerCompletion((f"p{i}", 1), "fired", node_id="n1") if i % 2 else None)
        for i in range(5)])
    calls = list(calls)
    assert out == [None] * 5
    assert [store.load(f"p{i}").blob for i in range(5)] == [f"new{i}".encode() for i in range(5)]
    assert [store.load(f"p{i}").version for i in range(5)] == [2] * 5
    assert store.get_timer(("p1", 1)).state == DONE and store.get_timer(("p3", 1)).state == DONE
    # the fired rows checked in one statement, the five positions at once, then the two
    # completions in one
    assert [c[0] for c in calls] == ["BEGIN", "SELECT", "SAVEPOINT", "UPDATE", "RELEASE", "UPDATE", "COMMIT"]
    assert [c for c in calls if c[0] == "UPDATE"] == [("UPDATE", 5), ("UPDATE", None)]


def test_a_conflict_inside_a_group_refuses_that_commit_alone(store):
    for i in range(5):
        create(store, f"q{i}")
    store.commit(Commit(writes=(update("q2", 1, blob=b"moved"),)))        # q2 moves on elsewhere
    calls = _record(store)
    out = store.commit_many([Commit(writes=(update(f"q{i}", 1, blob=b"mine"),)) for i in range(5)])
    assert [o is None for o in out] == [True, True, False, True, True]
    err = out[2]
    assert isinstance(err, ConflictError) and err.instance_id == "q2" and err.current == 2
    # the others landed exactly once: the rolled-back attempt left no version bump behind
    assert [store.load(f"q{i}").version for i in range(5)] == [2, 2, 2, 2, 2]
    assert [store.load(f"q{i}").blob for i in range(5)] == [b"mine", b"mine", b"moved", b"mine", b"mine"]
    words = [c[0] for c in calls]
    assert words.count("SAVEPOINT") == 1 and words.count("ROLLBACK") == 1 and words.count("BEGIN") == 1


@pytest.mark.parametrize("row", ["done", "dead", "gone", "other node", "no owner"])
def test_a_fire_whose_row_cannot_be_completed_is_refused_alone_in_a_group(store, row):
    for i in range(3):
        create(store, f"f{i}", timers_put=[timer(f"f{i}", 1, 10)])
    store.claim_due(10, 3, "n1", 10_000)
    if row == "done":
        store.commit(Commit(complete=TimerCompletion(("f1", 1), "fired")))
    elif row == "gone":
        store._execute("DELETE FROM timers WHERE instance_id = 'f1'")
    else:
        state, owner = {"dead": ("dead", None), "other node": ("claimed", "n2"), "no owner": ("claimed", None)}[row]
        store._execute("UPDATE timers SET state = ?, claimed_by = ? WHERE instance_id = 'f1'", (state, owner))
    out = store.commit_many([Commit(writes=(update(f"f{i}", 1, blob=b"fired"),),
                                    complete=TimerCompletion((f"f{i}", 1), "fired", node_id="n1"))
                             for i in range(3)])
    assert out[0] is None and out[2] is None and isinstance(out[1], ConflictError)
    assert [store.load(f"f{i}").blob for i in range(3)] == [b"fired", b"blob-1", b"fired"]
    assert store.get_timer(("f0", 1)).state == DONE and store.get_timer(("f2", 1)).state == DONE


def test_a_value_sqlite_refuses_inside_a_group_refuses_that_commit_alone(store):
    """An expected version past 64 bits fails the whole ``executemany``; the group is then
    applied one by one, and only that commit gets an error."""
    for i in range(3):
        create(store, f"r{i}")
    out = store.commit_many([Commit(writes=(update("r0", 1, blob=b"x"),)),
                             Commit(writes=(update("r1", 2**70, blob=b"x"),)),
                             Commit(writes=(update("r2", 1, blob=b"x"),))])
    assert out[0] is None and out[2] is None and isinstance(out[1], StoreError)
    assert [store.load(f"r{i}").version for i in range(3)] == [2, 1, 2]


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_crash_at_the_grouped_update_applies_none_of_the_group(tmp_path, where):
    path = tmp_path / "crash.db"
    with SQLiteStore(path) as store:
        for i in range(3):
            create(store, f"s{i}")
        orig = store._execute

        def seam(sql, params=()):
            grouped = type(params).__name__ == "_Many"
            if grouped and where == "before":
                raise sqlite3.OperationalError("disk I/O error (injected)")
            cur = orig(sql, params)
            if grouped and where == "after":
                raise sqlite3.OperationalError("disk I/O error (injected)")
            return cur
        store._execute = seam
        with pytest.raises(StoreError):
            store.commit_many([Commit(writes=(update(f"s{i}", 1, blob=b"x"),)) for i in range(3)])
    with SQLiteStore(path) as store:
        assert [store.load(f"s{i}").version for i in range(3)] == [1, 1, 1]
        assert store.commit_many([Commit(writes=(update(f"s{i}", 1, blob=b"y"),)) for i in range(3)]) == [None] * 3


# ----------------------------------------------------------------------------- decoding


def test_loaded_records_equal_the_ones_written(store):
    """Records are built past the dataclass __init__ and refs come from a cache: every field
    must still be set, and equal to what was written."""
    refs = (TimerRef(1, "send.1"), TimerRef(2, "send.2", "t"))
    keys = (KeyRecord("k1", b"\x01\x02"),)
    store.commit(Commit(writes=(PositionWrite("u1", "chart", None, b"one", "running", refs, "p", keys),)))
    store.commit(Commit(writes=(PositionWrite("u2", "chart", None, b"two", "done", refs),)))
    want = {"u1": PositionRecord("u1", "chart", 1, b"one", "running", refs, "p", keys),
            "u2": PositionRecord("u2", "chart", 1, b"two", "done", refs, None, ())}
    assert store.load_many(["u1", "u2"]) == want
    assert store.load("u1") == want["u1"] and store.list_positions() == [want["u1"], want["u2"]]


def test_corrupt_refs_are_a_store_error_even_after_good_ones_were_cached(store, tmp_path):
    store.commit(Commit(writes=(PositionWrite("v1", "chart", None, b"x", "running", (TimerRef(1, "s"),)),)))
    store.commit(Commit(writes=(PositionWrite("v2", "chart", None, b"x", "running", (TimerRef(1, "s"),)),)))
    assert store.load("v1").timers == (TimerRef(1, "s"),)
    store._execute("UPDATE positions SET timers = ? WHERE instance_id = 'v2'", (b"\x91\x01",))
    with pytest.raises(StoreError):
        store.load_many(["v2"])


def test_claimed_rows_equal_the_rows_stored_with_the_claim(store):
    ctx = {"trace": "abc"}
    rows = [timer("w1", 1, 10), timer("w2", 1, 10, caller_context=ctx, name="t1"),
            timer("w3", 1, 10, dedup={"macrostep": 3, "owner": 1}),
            timer("w4", 1, 10, dedup={"nested": {"a": 1}})]
    for r in rows:
        create(store, r.instance_id, timers_put=[r])
    claimed = store.claim_due(10, 10, "n1", 500)
    assert claimed == [replace(r, state=CLAIMED, claimed_by="n1", claim_expires_ms=510) for r in rows]
    assert claimed == [store.get_timer(r.key) for r in rows]
    # each row's dedup dict is its own, even where their bytes are the same
    claimed[2].dedup["macrostep"] = 99
    create(store, "w5", timers_put=[timer("w5", 1, 10, dedup={"macrostep": 3, "owner": 1})])
    assert store.claim_due(10, 10, "n1", 500)[0].dedup == {"macrostep": 3, "owner": 1}


def test_a_damaged_claimed_row_is_parked_dead_naming_the_field(store):
    """It used to fail the whole claim with a StoreError (test_sqlite_store has the sweep)."""
    create(store, "x1", timers_put=[timer("x1", 1, 10)])
    create(store, "x2", timers_put=[timer("x2", 1, 10)])
    store._execute("UPDATE timers SET event = ? WHERE instance_id = 'x1'", (b"\xc1",))
    assert [r.key for r in store.claim_due(10, 10, "n1", 500)] == [("x2", 1)]
    state, error = store._execute("SELECT state, last_error FROM timers WHERE instance_id = 'x1'").fetchone()
    assert state == "dead" and "timer event" in error


# ----------------------------------------------------------------------------- claims


def test_a_claim_merges_pending_and_lapsed_rows_in_ready_order_as_memory_does(tmp_path):
    """A claim reads ready rows and lapsed claims apart and merges them: the rows it takes,
    and their order, are the MemoryStore's, also when the limit cuts across both kinds."""
    stores = [SQLiteStore(tmp_path / "m.db"), MemoryStore()]
    got = []
    for s in stores:
        # lapsed claims due at 10, 30, 50; pending rows due at 10 (ties broken by key), 20, 40, 60
        for iid, due in (("b", 10), ("d", 30), ("f", 50)):
            create(s, iid, timers_put=[timer(iid, 1, due)])
        s.claim_due(50, 10, "dead-node", 5)                  # their leases lapse at 55
        for iid, due in (("a", 10), ("c", 20), ("e", 40), ("g", 60), ("h", 1_000)):
            create(s, iid, timers_put=[timer(iid, 1, due)])
        first = s.claim_due(100, 4, "n1", 1_000)
        rest = s.claim_due(100, 10, "n1", 1_000)
        got.append(([r.instance_id for r in first], [r.instance_id for r in rest]))
    stores[0].close()
    assert got[0] == got[1] == (["a", "b", "c", "d"], ["e", "f", "g"])


@pytest.mark.parametrize("bad", ["", 7])
def test_every_id_of_an_event_or_fire_commit_is_checked(store, bad):
    """An event's or fire's commit (one position, maybe a row) is checked on its short path:
    a bad id in its write or in the row it completes refuses it before anything is written."""
    create(store, "y1")
    out = store.commit_many([Commit(writes=(update("y1", 1, blob=b"z"),), complete=TimerCompletion((bad, 1), "fired")),
                             Commit(writes=(update(bad, 1, blob=b"z"),)),
                             Commit(writes=(update("y1", 1, blob=b"ok"),))])
    assert isinstance(out[0], InvalidInstanceId) and isinstance(out[1], InvalidInstanceId) and out[2] is None
    assert store.load("y1").blob == b"ok"
    with pytest.raises(InvalidInstanceId):
        store.commit(Commit(writes=(update("y1", 2, blob=b"z"),), complete=TimerCompletion((bad, 1), "fired")))
    assert store.load("y1").version == 2


def test_the_refs_cache_stays_bounded(store, monkeypatch):
    """Decoded refs are kept only when short, and the cache is emptied when full."""
    monkeypatch.setattr(sqlite_mod, "_SEEN_MAX", 2)
    monkeypatch.setattr(sqlite_mod, "_REFS_SEEN", {})
    many = tuple(TimerRef(i, f"send.{i}") for i in range(1, 100))
    for n, refs in enumerate([many, (TimerRef(1, "a"),), (TimerRef(1, "b"),), (TimerRef(1, "c"),)]):
        store.commit(Commit(writes=(PositionWrite(f"z{n}", "chart", None, b"x", "running", refs),)))
        assert store.load(f"z{n}").timers == refs
    assert list(sqlite_mod._REFS_SEEN.values()) == [(TimerRef(1, "c"),)]   # 'many' never, a and b cleared


def test_a_claim_with_only_lapsed_claims_takes_them_in_ready_order(store):
    for iid, due in (("c", 30), ("a", 10), ("b", 20)):
        create(store, iid, timers_put=[timer(iid, 1, due)])
    assert len(store.claim_due(30, 10, "dead-node", 5)) == 3        # leases lapse at 35
    assert store.claim_due(34, 10, "n1", 1_000) == []
    calls = _record(store)
    got = store.claim_due(40, 2, "n1", 1_000)
    assert [(r.instance_id, r.claimed_by, r.claim_expires_ms) for r in got] == [("a", "n1", 1_040), ("b", "n1", 1_040)]
    assert [c[0] for c in calls] == ["BEGIN", "SELECT", "SELECT", "UPDATE", "COMMIT"]


def test_a_claim_with_no_lapsed_claim_reads_the_ready_rows_once(store):
    for iid in "abc":
        create(store, iid, timers_put=[timer(iid, 1, 10)])
    store.claim_due(10, 1, "n1", 1_000)                            # a: claimed, lease live
    calls = _record(store)
    assert [r.instance_id for r in store.claim_due(10, 10, "n2", 1_000)] == ["b", "c"]
    assert [c[0] for c in calls] == ["BEGIN", "SELECT", "UPDATE", "COMMIT"]
