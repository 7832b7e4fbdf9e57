"""SQLiteStore group commit: a group's plain position updates go as one statement
(``executemany``), and a refusal among them still lands on its own commit alone."""

from __future__ import annotations

import sqlite3

import pytest

from statebound.exceptions import ConflictError, StoreError
from statebound.host.sqlite import SQLiteStore
from statebound.host.store import DONE, Commit, TimerCompletion
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
    assert out == [None] * 5
    assert [store.load(f"p{i}").blob for i in range(5)] == [f"new{i}".encode() for i in range(5)]
    assert [store.load(f"p{i}").version for i in range(5)] == [2] * 5
    assert store.get_timer(("p1", 1)).state == DONE and store.get_timer(("p3", 1)).state == DONE
    updates = [c for c in calls if c[0] == "UPDATE"]
    assert updates[0] == ("UPDATE", 5)                      # the five positions at once
    assert len(updates) == 2                                # and the two completions in one
    assert [c[0] for c in calls].count("BEGIN") == 1


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
