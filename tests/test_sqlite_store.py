"""SQLiteStore specifics: pragmas, schema versioning, durability, error mapping, crash
injection, equivalence with MemoryStore, and several processes on one file.

The backend-agnostic behaviour is in ``store_contract.py`` (run by ``test_store_contract.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statebound.host.sqlite as sqlite_mod
from statebound.exceptions import (ConflictError, SerializationError, StoreError,
                                   StoreUnavailable)
from statebound.host.memory import MemoryStore
from statebound.host.sqlite import SCHEMA_VERSION, SQLiteStore
from statebound.host.store import (CLAIMED, DEAD, DONE, PENDING, Commit, KeyRecord, PositionWrite,
                                   TimerCompletion, TimerRef, TimerRow)
from store_contract import create, timer, update


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "store.db"


def raw(path):
    """A plain sqlite3 connection, to look at the file behind the store's back."""
    return sqlite3.connect(path, isolation_level=None)


def query(path, sql, params=()):
    """One statement on a throwaway plain connection; returns the first row."""
    conn = raw(path)
    try:
        return conn.execute(sql, params).fetchone()
    finally:
        conn.close()


# --------------------------------------------------------------------------- pragmas, schema


def test_file_is_in_wal_mode_with_full_sync(db_path):
    with SQLiteStore(db_path) as store:
        assert store.journal_mode == "wal"
        assert store._execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert query(db_path, "PRAGMA journal_mode") == ("wal",)


def test_memory_database_is_private_to_the_store_object():
    with SQLiteStore(":memory:") as one, SQLiteStore(":memory:") as two:
        create(one, "a")
        assert one.load("a").version == 1
        assert two.load("a") is None


def test_schema_version_is_recorded(db_path):
    with SQLiteStore(db_path) as store:
        assert store.schema_version == SCHEMA_VERSION
    row = query(db_path, "SELECT value FROM meta WHERE key = 'schema_version'")
    assert row == (SCHEMA_VERSION,)


def test_newer_schema_is_refused_and_left_alone(db_path):
    SQLiteStore(db_path).close()
    query(db_path, "UPDATE meta SET value = ? WHERE key = 'schema_version'",
          (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer than this statebound supports") as err:
        SQLiteStore(db_path)
    assert not isinstance(err.value, StoreUnavailable)
    row = query(db_path, "SELECT value FROM meta WHERE key = 'schema_version'")
    assert row == (SCHEMA_VERSION + 1,)


def test_a_schema_version_that_is_not_a_number_is_a_store_error(db_path):
    """It was a bare ValueError (invalid literal for int()) out of the constructor."""
    SQLiteStore(db_path).close()
    query(db_path, "UPDATE meta SET value = 'three' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="not a version number"):
        SQLiteStore(db_path)


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), 2_147_484, -1, True, "5"])
def test_a_busy_timeout_sqlite_cannot_keep_is_refused(tmp_path, timeout_s):
    """SQLite keeps the busy timeout as int32 milliseconds: 2,147,484 s or more, and NaN,
    wrapped, and the store answered "locked" at once instead of waiting."""
    from statebound import InvalidArgument
    with pytest.raises(InvalidArgument, match="timeout_s"):
        SQLiteStore(tmp_path / "t.db", timeout_s=timeout_s)
    assert not (tmp_path / "t.db").exists()
    SQLiteStore(tmp_path / "t.db", timeout_s=sqlite_mod.MAX_TIMEOUT_S).close()


@pytest.mark.parametrize("name", ["a\x00b.db", "a\ud800.db"])
def test_a_path_sqlite_cannot_open_is_invalid_argument(tmp_path, name):
    """A NUL or a lone surrogate escaped as a bare ValueError or UnicodeEncodeError."""
    from statebound import InvalidArgument
    with pytest.raises(InvalidArgument, match="SQLite path"):
        SQLiteStore(str(tmp_path / name))


def test_older_schema_is_migrated_forward_keeping_data(db_path, monkeypatch):
    with SQLiteStore(db_path) as store:
        create(store, "a", timers_put=[timer("a", 1, 10)])
    monkeypatch.setattr(sqlite_mod, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(sqlite_mod._MIGRATIONS, SCHEMA_VERSION + 1,
                        ("ALTER TABLE positions ADD COLUMN note TEXT",))
    with SQLiteStore(db_path) as store:
        assert store.schema_version == SCHEMA_VERSION + 1
        assert store.load("a").version == 1
        assert store.get_timer(("a", 1)) is not None
    assert query(db_path, "SELECT count(*) FROM pragma_table_info('positions') "
                          "WHERE name = 'note'") == (1,)


def test_a_version_1_file_gains_the_outbox_and_key_columns(db_path):
    """A file written before the outbox existed opens at the current schema (outbox and key
    columns, the history table, then tombstones) and reads the same."""
    conn = raw(db_path)
    for sql in sqlite_mod._MIGRATIONS[1]:
        conn.execute(sql)
    conn.execute("INSERT INTO meta VALUES ('schema_version', 1)")
    conn.execute("INSERT INTO positions VALUES ('a', 'chart', 3, x'00ff', 'running', ?, NULL)",
                 (sqlite_mod._pack_refs([TimerRef(1, "send-1")]),))
    params = sqlite_mod._timer_params(timer("a", 1, 10))
    conn.execute("INSERT INTO timers (instance_id, ordinal, target_id, due_at_ms, send_id, event, name, "
                 "dedup, caller_context, state, attempts, next_attempt_at_ms, claimed_by, claim_expires_ms, "
                 "last_error, outcome, reason, ready_at_ms) VALUES "
                 "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", params[:17] + params[18:])
    conn.close()
    with SQLiteStore(db_path) as store:
        assert store.schema_version == SCHEMA_VERSION == 4
        assert store.history("a") == []
        rec = store.load("a")
        assert (rec.version, rec.blob, rec.timers, rec.idempotency) == (3, b"\x00\xff", (TimerRef(1, "send-1"),), ())
        assert store.get_timer(("a", 1)) == timer("a", 1, 10)       # kind defaults to timer
        store.commit(Commit(writes=(PositionWrite("a", "chart", 3, b"x", "running",
                                                  idempotency=(KeyRecord("k", b"f" * 16),)),)))
        assert store.load("a").idempotency == (KeyRecord("k", b"f" * 16),)


def test_opening_twice_does_not_rerun_migrations(db_path):
    with SQLiteStore(db_path) as store:
        create(store, "a")
    with SQLiteStore(db_path) as store:
        assert store.load("a").version == 1


# --------------------------------------------------------------------------- durability


def test_reopened_file_has_everything(db_path):
    row = timer("a", 1, 10, name="t", caller_context={"c": 1}, dedup={"owner": "S"})
    with SQLiteStore(db_path) as store:
        create(store, "a", blob=b"\x00blob", timers=(TimerRef(1, "send-1", "t"),),
               timers_put=[row], parent="p")
        before = store.load("a")
    with SQLiteStore(db_path) as store:
        assert store.load("a") == before
        assert store.get_timer(("a", 1)) == row
        assert store.next_due() == 10


def test_two_store_objects_on_one_file_see_each_others_commits(db_path):
    with SQLiteStore(db_path) as one, SQLiteStore(db_path) as two:
        create(one, "a")
        two.commit(Commit(writes=(update("a", 1, blob=b"by-two"),)))
        assert one.load("a").blob == b"by-two"
        with pytest.raises(ConflictError):
            one.commit(Commit(writes=(update("a", 1),)))


def test_readers_are_not_blocked_by_a_writer(db_path):
    with SQLiteStore(db_path, timeout_s=0.2) as store:
        create(store, "a")
        other = raw(db_path)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE positions SET blob = x'00' WHERE instance_id = 'a'")
        t0 = time.monotonic()
        assert store.load("a").blob == b"blob-1"   # WAL: the committed snapshot, at once
        assert time.monotonic() - t0 < 0.1
        other.execute("ROLLBACK")
        other.close()


# --------------------------------------------------------------------------- errors


def test_locked_database_raises_store_unavailable_then_recovers(db_path):
    with SQLiteStore(db_path, timeout_s=0.2) as store:
        create(store, "a")
        other = raw(db_path)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked") as err:
            store.commit(Commit(writes=(update("a", 1),)))
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(StoreUnavailable):
            store.claim_due(100, 10, "n1", 100)
        other.execute("ROLLBACK")
        other.close()
        store.commit(Commit(writes=(update("a", 1),)))
        assert store.load("a").version == 2


def test_file_that_is_not_a_database_raises_store_unavailable(db_path):
    db_path.write_bytes(b"this is not a database, just text " * 100)
    with pytest.raises(StoreUnavailable):
        SQLiteStore(db_path)


def test_closed_store_raises_store_unavailable(db_path):
    store = SQLiteStore(db_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreUnavailable, match="closed"):
        store.load("a")
    with pytest.raises(StoreUnavailable, match="closed"):
        store.commit(Commit(writes=(update("a", 1),)))
    assert "closed" in repr(store)


def test_unencodable_timer_value_raises_serialization_error_and_writes_nothing(db_path):
    with SQLiteStore(db_path) as store:
        bad = timer("a", 1, 10, caller_context=object())
        with pytest.raises(SerializationError):
            store.commit(Commit(writes=(PositionWrite("a", "c", None, b"x", "running"),),
                                timers_put=(bad,)))
        assert store.load("a") is None


def test_out_of_range_integer_raises_store_error(db_path):
    with SQLiteStore(db_path) as store:
        with pytest.raises(StoreError):
            store.commit(Commit(timers_put=(timer("a", 2**70, 10, event={"name": "x"}),)))
        assert store.pending_timers("a") == []


def test_group_commit_keeps_a_commit_sqlite_refuses_to_its_own_slot(db_path):
    """A row key past 64 bits fails in SQLite mid-commit, after its position was written:
    its savepoint undoes that write, the group's other commits land, one fsync for all."""
    with SQLiteStore(db_path) as store:
        begins = []
        orig = store._execute
        store._execute = lambda sql, params=(): (begins.append(1) if sql.startswith("BEGIN") else None,
                                                 orig(sql, params))[1]
        out = store.commit_many([
            Commit(writes=(PositionWrite("a", "c", None, b"a", "running"),)),
            Commit(writes=(PositionWrite("b", "c", None, b"b", "running"),),
                   timers_put=(timer("b", 2**70, 10, event={"name": "x"}),)),
            Commit(writes=(PositionWrite("c", "c", None, b"c", "running"),), timers_put=(timer("c", 1, 10),)),
        ])
        assert out[0] is None and out[2] is None and isinstance(out[1], StoreError)
        assert store.load("b") is None and store.pending_timers("b") == []
        assert store.load("a").blob == b"a" and [r.key for r in store.pending_timers("c")] == [("c", 1)]
        assert len(begins) == 1


def test_group_commit_takes_a_savepoint_only_for_commits_that_can_fail_after_a_write(db_path):
    """A plain event's commit is one UPDATE, a fire's a completion check, an UPDATE and the
    completion: whatever refuses them does so before their first write (SQLite undoes a
    failed statement by itself), so they run without a savepoint, and a refused one still
    leaves nothing behind. A commit with timer rows after its write keeps its savepoint."""
    with SQLiteStore(db_path) as store:
        create(store, "a")
        create(store, "b")
        create(store, "c")
        create(store, "d")
        create(store, "e", timers_put=[timer("e", 1, 10)])
        create(store, "f", timers_put=[timer("f", 1, 10)])
        store.commit(Commit(complete=TimerCompletion(("e", 1), "fired")))      # fired elsewhere
        store.commit(Commit(writes=(update("b", 1, blob=b"b2"),)))       # b moves on elsewhere
        statements = []
        orig = store._execute
        store._execute = lambda sql, params=(): (statements.append(sql.split()[0]), orig(sql, params))[1]
        out = store.commit_many([
            Commit(writes=(update("a", 1, blob=b"a2"),)),
            Commit(writes=(update("b", 1, blob=b"stale"),)),
            Commit(writes=(update("c", 1, blob=b"c2"),), timers_put=(timer("c", 1, 10),)),
            Commit(writes=(PositionWrite("d", "c", None, b"again", "running"),)),   # d exists
            Commit(writes=(update("e", 1, blob=b"e2"),), complete=TimerCompletion(("e", 1), "fired")),
            Commit(writes=(update("f", 1, blob=b"f2"),), complete=TimerCompletion(("f", 1), "fired")),
        ])
        assert out[0] is None and out[2] is None and out[5] is None
        assert isinstance(out[1], ConflictError) and out[1].instance_id == "b"
        assert isinstance(out[3], ConflictError) and out[3].instance_id == "d"
        assert isinstance(out[4], ConflictError)
        assert [store.load(i).blob for i in "abcdef"] == [b"a2", b"b2", b"c2", b"blob-1", b"blob-1", b"f2"]
        assert [r.key for r in store.pending_timers("c")] == [("c", 1)]
        assert store.get_timer(("f", 1)) is None or store.get_timer(("f", 1)).state == DONE
        # one savepoint around the plain updates (a, b, f) tried as one statement and rolled
        # back on b's stale version, then one for c's timer rows
        assert statements.count("SAVEPOINT") == 2 and statements.count("BEGIN") == 1


@pytest.mark.parametrize("keep_done", [True, False])
def test_group_commit_checks_and_completes_its_fired_rows_in_one_statement_each(db_path, keep_done):
    """A group of fires reads every row it completes in one statement and completes them in
    one more (per kind of completion), instead of two statements per fire; a row claimed
    by another node, gone or already done is still refused alone, and nothing of its
    commit is written."""
    with SQLiteStore(db_path, keep_done=keep_done) as store:
        for i in range(6):
            create(store, f"i{i}", timers_put=[timer(f"i{i}", 1, 10)])
        store.claim_due(10, 6, "n1", 10_000)
        store.commit(Commit(complete=TimerCompletion(("i1", 1), "fired")))   # done elsewhere
        store.commit(Commit(writes=(update("i4", 1, blob=b"moved"),)))        # a stale fire below
        statements = []
        orig = store._execute
        store._execute = lambda sql, params=(): (statements.append(sql.split()[0]), orig(sql, params))[1]
        commits = [Commit(writes=(update(f"i{i}", 1, blob=b"fired"),),
                          complete=TimerCompletion((f"i{i}", 1), "fired", node_id="n1" if i != 2 else "n2"))
                   for i in range(5)]
        commits.append(Commit(writes=(update("i5", 1, blob=b"discarded"),),
                              complete=TimerCompletion(("i5", 1), "discarded", "gone", node_id="n1")))
        out = store.commit_many(commits)
        assert [o is None for o in out] == [True, False, False, True, False, True]
        assert all(isinstance(o, ConflictError) for o in out if o is not None)
        # one SELECT checks the six rows, one reads i4's version for its ConflictError;
        # the four position updates tried as one statement (rolled back on i4's), then one
        # each (i4's refused), then one statement per kind of completion (kept: fired and
        # discarded; not kept: every done row is deleted)
        assert statements.count("SELECT") == 2
        assert statements.count("UPDATE") == 1 + 4 + (2 if keep_done else 0)
        assert statements.count("DELETE") == (0 if keep_done else 1)
        assert [store.load(f"i{i}").blob for i in range(6)] == [b"fired", b"blob-1", b"blob-1", b"fired",
                                                                 b"moved", b"discarded"]
        rows = [store.get_timer((f"i{i}", 1)) for i in range(6)]
        assert rows[2].state == CLAIMED and rows[4].state == CLAIMED   # refused: still claimed
        for i, outcome in ((0, "fired"), (3, "fired"), (5, "discarded")):
            if keep_done:
                assert rows[i].state == DONE and rows[i].outcome == outcome and rows[i].claimed_by is None
            else:
                assert rows[i] is None


# --------------------------------------------------------------------------- crash injection


def _seed(store):
    create(store, "a", timers_put=[timer("a", 1, 10), timer("a", 2, 20)])
    store.claim_due(10, 1, "n1", 10_000)


_FULL_COMMIT = Commit(
    writes=(update("a", 1, blob=b"after", timers=(TimerRef(3, "send-3"),)),),
    timers_put=(timer("a", 3, 30),), timers_delete=(("a", 2),),
    complete=TimerCompletion(("a", 1), "fired", node_id="n1"))


def _snapshot(path):
    with SQLiteStore(path) as store:
        return (store.load("a"), [store.get_timer(("a", i)) for i in (1, 2, 3)], store.next_due())


def _inject(monkeypatch, store, fail_at, when):
    real = store._execute
    calls = []

    def seam(sql, params=()):
        calls.append(sql)
        if when == "before" and len(calls) == fail_at:
            raise sqlite3.OperationalError("disk I/O error (injected)")
        cursor = real(sql, params)
        if when == "after" and len(calls) == fail_at:
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return cursor

    monkeypatch.setattr(store, "_execute", seam)
    return calls


def test_commit_statements_go_through_the_seam(tmp_path, monkeypatch):
    with SQLiteStore(tmp_path / "count.db") as store:
        _seed(store)
        calls = _inject(monkeypatch, store, 0, "never")
        store.commit(_FULL_COMMIT)
    assert calls[0] == "BEGIN IMMEDIATE" and calls[-1] == "COMMIT"
    assert len(calls) == 7


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_at_any_statement_applies_all_or_nothing(tmp_path, monkeypatch, when):
    for fail_at in range(1, 8):
        path = tmp_path / f"crash-{when}-{fail_at}.db"
        with SQLiteStore(path) as store:
            _seed(store)
            old = _snapshot(path)
            _inject(monkeypatch, store, fail_at, when)
            with pytest.raises(StoreUnavailable, match="injected"):
                store.commit(_FULL_COMMIT)
            monkeypatch.undo()
            committed = when == "after" and fail_at == 7   # failed only after COMMIT ran
            now = _snapshot(path)
            if committed:
                assert now[0].version == 2 and now[0].blob == b"after"
                assert now[1][0].state == DONE and now[1][1] is None
            else:
                assert now == old, (when, fail_at)
            # the same store object is still usable, its connection not stuck in a transaction
            assert not store._db.in_transaction
            if committed:
                with pytest.raises(ConflictError):
                    store.commit(_FULL_COMMIT)
            else:
                store.commit(_FULL_COMMIT)
            assert store.load("a").version == 2


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_during_a_claim_claims_all_or_nothing(tmp_path, monkeypatch, when):
    for fail_at in range(1, 5):   # BEGIN, SELECT, UPDATE, COMMIT
        path = tmp_path / f"claim-{when}-{fail_at}.db"
        with SQLiteStore(path) as store:
            put_rows = tuple(timer("a", i, i) for i in range(3))
            store.commit(Commit(timers_put=put_rows))
            _inject(monkeypatch, store, fail_at, when)
            with pytest.raises(StoreUnavailable, match="injected"):
                store.claim_due(100, 10, "n1", 1000)
            monkeypatch.undo()
            states = {store.get_timer(r.key).state for r in put_rows}
            assert states == ({CLAIMED} if (when, fail_at) == ("after", 4) else {PENDING})
            assert len(store.claim_due(100, 10, "n2", 1000)) == (
                0 if (when, fail_at) == ("after", 4) else 3)


def _commit_levels(monkeypatch, store):
    """The connection's ``synchronous`` level at every COMMIT the store sends."""
    real = store._execute
    levels = []

    def seam(sql, params=()):
        if sql == "COMMIT":
            levels.append(store._db.execute("PRAGMA synchronous").fetchone()[0])
        return real(sql, params)

    monkeypatch.setattr(store, "_execute", seam)
    return levels


def test_a_claim_commits_without_an_fsync_and_everything_else_with_one(tmp_path, monkeypatch):
    # ADR 0025: a claim is a lease that acknowledges nothing, so it commits at NORMAL (no
    # fsync of its own; the next FULL commit's fsync covers it); every other commit is FULL.
    with SQLiteStore(tmp_path / "sync.db") as store:
        levels = _commit_levels(monkeypatch, store)
        store.commit(Commit(timers_put=tuple(timer("a", i, i) for i in range(3))))
        claimed = store.claim_due(100, 10, "n1", 1000)
        store.commit(Commit(complete=TimerCompletion(claimed[0].key, "fired", None, "n1")))
        assert levels == [2, 1, 2]                        # FULL, NORMAL (the claim), FULL
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_a_store_set_below_full_stays_there_across_a_claim(tmp_path, monkeypatch):
    with SQLiteStore(tmp_path / "off.db") as store:
        store._db.execute("PRAGMA synchronous=OFF")       # e.g. a bench or a throwaway store
        levels = _commit_levels(monkeypatch, store)
        store.commit(Commit(timers_put=(timer("a", 1, 1),)))
        store.claim_due(100, 10, "n1", 1000)
        assert levels == [0, 0]
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 0


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])   # BEGIN, SELECT, UPDATE, COMMIT
def test_a_failed_claim_still_restores_full_sync(tmp_path, monkeypatch, fail_at):
    with SQLiteStore(tmp_path / f"restore-{fail_at}.db") as store:
        store.commit(Commit(timers_put=(timer("a", 1, 1),)))
        _inject(monkeypatch, store, fail_at, "before")
        with pytest.raises(StoreUnavailable, match="injected"):
            store.claim_due(100, 10, "n1", 1000)
        monkeypatch.undo()
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2
        levels = _commit_levels(monkeypatch, store)
        store.commit(Commit(timers_put=(timer("b", 1, 1),)))
        assert levels == [2]


def test_an_interrupt_just_after_the_switch_to_normal_still_restores_full_sync(tmp_path):
    # Ctrl-C between the PRAGMA and the level being kept left the connection at NORMAL for
    # good: every later commit of the store skipped its fsync, silently
    class Interrupted:
        def __init__(self, db):
            self.db = db

        def __getattr__(self, name):
            return getattr(self.db, name)

        def execute(self, sql, *args):
            cur = self.db.execute(sql, *args)
            if sql == "PRAGMA synchronous=NORMAL":
                raise KeyboardInterrupt
            return cur

    with SQLiteStore(tmp_path / "interrupt.db") as store:
        store.commit(Commit(timers_put=(timer("a", 1, 1),)))
        real = store._db
        store._db = Interrupted(real)
        with pytest.raises(KeyboardInterrupt):
            store.claim_due(100, 10, "n1", 1000)
        store._db = real
        assert real.execute("PRAGMA synchronous").fetchone()[0] == 2


# --------------------------------------------------------------------------- equivalence


_iids = st.sampled_from(["a", "b", "c"])
_ords = st.integers(0, 3)
_keys = st.tuples(_iids, _ords)
_nodes = st.sampled_from(["n1", "n2"])
_times = st.integers(0, 100)
_ints = st.integers(-2**63, 2**63 - 1)   # what msgpack and SQLite can hold

_writes = st.builds(
    PositionWrite, instance_id=_iids, chart=st.just("chart"),
    expected_version=st.none() | st.integers(1, 4),
    blob=st.none() | st.binary(max_size=4), status=st.sampled_from(["running", "done"]),
    timers=st.lists(st.builds(TimerRef, _ords, st.text(max_size=2),
                              st.none() | st.text(max_size=2)), max_size=2).map(tuple),
    parent=st.none() | _iids)

_rows = st.builds(
    TimerRow, instance_id=_iids, ordinal=_ords, target_id=_iids, due_at_ms=_times,
    send_id=st.sampled_from(["s1", "s2"]),
    event=st.fixed_dictionaries({"name": st.text(max_size=3), "data": st.none() | _ints}),
    name=st.none() | st.text(max_size=2),
    dedup=st.dictionaries(st.text(max_size=2), _ints, max_size=2),
    caller_context=st.none() | _ints | st.text(max_size=3),
    state=st.sampled_from([PENDING, PENDING, PENDING, CLAIMED, DEAD, DONE]),
    attempts=st.integers(0, 3), next_attempt_at_ms=st.none() | _times,
    claimed_by=st.none() | _nodes, claim_expires_ms=st.none() | _times,
    last_error=st.none() | st.text(max_size=2), outcome=st.none(), reason=st.none())

_commits = st.builds(
    Commit,
    writes=st.lists(_writes, max_size=2, unique_by=lambda w: w.instance_id).map(tuple),
    timers_put=st.lists(_rows, max_size=3).map(tuple),
    timers_delete=st.lists(_keys, max_size=2).map(tuple),
    complete=st.none() | st.builds(TimerCompletion, _keys,
                                   st.sampled_from(["fired", "discarded", "stale"]),
                                   st.none() | st.text(max_size=2), st.none() | _nodes))

_ops = st.one_of(
    st.tuples(st.just("commit"), _commits),
    st.tuples(st.just("claim"), _times, st.integers(0, 4), _nodes, st.integers(0, 50)),
    st.tuples(st.just("release"), _keys, _nodes, st.text(max_size=2), _times, st.booleans()),
    st.tuples(st.just("retry"), _keys, _times),
)


def _apply(store, op):
    try:
        kind = op[0]
        if kind == "commit":
            return store.commit(op[1])
        if kind == "claim":
            return store.claim_due(op[1], op[2], op[3], op[4])
        if kind == "release":
            return store.release(op[1], op[2], error=op[3], next_attempt_at_ms=op[4],
                                 dead=op[5])
        return store.retry_timer(op[1], op[2])
    except ConflictError:
        return "ConflictError"


def _state(store):
    return ([store.load(i) for i in "abc"],
            [store.get_timer((i, o)) for i in "abc" for o in range(4)],
            [store.pending_timers(i) for i in "abc"],
            list(store.dead_timers()), list(store.dead_timers(limit=1)), store.next_due())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_ops, max_size=25), keep_done=st.booleans())
def test_sqlite_behaves_exactly_like_memory_store(ops, keep_done):
    memory = MemoryStore(keep_done=keep_done)
    with SQLiteStore(":memory:", keep_done=keep_done) as sqlite:
        for op in ops:
            assert _apply(sqlite, op) == _apply(memory, op), op
            assert _state(sqlite) == _state(memory), op


# --------------------------------------------------------------------------- concurrency


def test_one_store_object_shared_by_threads(db_path):
    with SQLiteStore(db_path) as store:
        store.commit(Commit(writes=(PositionWrite("n", "c", None, b"0", "running"),)))
        errors = []

        def work():
            try:
                done = 0
                while done < 50:
                    rec = store.load("n")
                    try:
                        store.commit(Commit(writes=(update("n", rec.version,
                                                           blob=b"%d" % (int(rec.blob) + 1)),)))
                    except ConflictError:
                        continue
                    done += 1
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        rec = store.load("n")
        assert (rec.version, rec.blob) == (201, b"200")


# Workers run as fresh interpreters (like separate hosts), each with its own store object.
# Each pauses outside its transactions, as a host does while it drives or delivers: SQLite's
# busy handler is not fair, so without a pause one tight-looping process takes the write
# lock again and again and the others only get in once it is finished.
# They print "ready", read a start time on stdin and sleep until it, so that they really
# run at the same time (a plain "go" lets the first one finish before the last has read it),
# then print JSON.
_CLAIM_WORKER = r"""
import json, sys, time
from statebound.host.sqlite import SQLiteStore
path, node = sys.argv[1], sys.argv[2]
store = SQLiteStore(path)
print("ready", flush=True)
time.sleep(max(0.0, float(sys.stdin.readline()) - time.time()))
got = []
while True:
    rows = store.claim_due(10**6, 2, node, 10**9)   # the lease outlives the test
    if not rows:
        break
    got += [[r.instance_id, r.ordinal, r.claimed_by] for r in rows]
    time.sleep(0.001)   # "deliver": lets the other sweeper in, as a real batch would
store.close()
print(json.dumps(got), flush=True)
"""

_COUNTER_WORKER = r"""
import json, sys, time
from statebound.exceptions import ConflictError
from statebound.host.sqlite import SQLiteStore
from statebound.host.store import Commit, PositionWrite
path, n = sys.argv[1], int(sys.argv[2])
store = SQLiteStore(path)
print("ready", flush=True)
time.sleep(max(0.0, float(sys.stdin.readline()) - time.time()))
done = conflicts = 0
while done < n:
    rec = store.load("counter")
    blob = b"%d" % (int(rec.blob) + 1)
    time.sleep(0.0005)  # "drive": the window in which another process commits first
    try:
        store.commit(Commit(writes=(PositionWrite("counter", "c", rec.version, blob, "running"),)))
    except ConflictError:
        conflicts += 1
        continue
    done += 1
store.close()
print(json.dumps({"done": done, "conflicts": conflicts}), flush=True)
"""


def _run_together(code, argvs, timeout=60):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [subprocess.Popen([sys.executable, "-c", code, *argv], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for argv in argvs]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read()
        start = time.time() + 0.2
        for p in procs:
            p.stdin.write(f"{start}\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            results.append(json.loads(out))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_processes_claim_each_row_exactly_once(db_path):
    with SQLiteStore(db_path) as store:
        rows = [timer(f"i{i % 50}", i, i) for i in range(500)]
        store.commit(Commit(timers_put=tuple(rows)))
    results = _run_together(_CLAIM_WORKER, [[str(db_path), "n1"], [str(db_path), "n2"]])
    claimed = [(iid, o) for got in results for iid, o, _ in got]
    assert all(got for got in results), "the two sweepers did not overlap; nothing was tested"
    assert len(claimed) == 500
    assert set(claimed) == {r.key for r in rows}
    with SQLiteStore(db_path) as store:
        for got, node in zip(results, ["n1", "n2"], strict=True):
            for iid, o, by in got:
                assert by == node
                assert store.get_timer((iid, o)).claimed_by == node


def test_processes_racing_conditional_commits_lose_no_update(db_path):
    with SQLiteStore(db_path) as store:
        store.commit(Commit(writes=(PositionWrite("counter", "c", None, b"0", "running"),)))
    results = _run_together(_COUNTER_WORKER, [[str(db_path), "250"]] * 4)
    assert [r["done"] for r in results] == [250] * 4
    assert sum(r["conflicts"] for r in results) > 0, "no contention; nothing was tested"
    with SQLiteStore(db_path) as store:
        rec = store.load("counter")
    assert rec.version == 1001
    assert rec.blob == b"1000"


_ENDLESS_WRITER = r"""
import sys
from statebound.host.sqlite import SQLiteStore
from statebound.host.store import Commit, PositionWrite, TimerRow
store = SQLiteStore(sys.argv[1])
print("ready", flush=True)
while True:
    rec = store.load("k")
    n = int(rec.blob) + 1
    row = TimerRow("k", n, "k", n, f"s{n}", {"name": "t"})
    store.commit(Commit(writes=(PositionWrite("k", "c", rec.version, b"%d" % n, "running"),),
                        timers_put=(row,)))
"""


def test_killed_writer_leaves_a_consistent_file(db_path):
    with SQLiteStore(db_path) as store:
        store.commit(Commit(writes=(PositionWrite("k", "c", None, b"0", "running"),)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", _ENDLESS_WRITER, str(db_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)   # mid-commit, most likely: no cleanup at all
        proc.communicate()
    with SQLiteStore(db_path) as store:
        rec = store.load("k")
        n = int(rec.blob)
        assert n > 0, "the writer never committed"
        assert rec.version == n + 1
        assert [r.ordinal for r in store.pending_timers("k")] == list(range(1, n + 1))
    assert query(db_path, "PRAGMA integrity_check") == ("ok",)


_OPENER = r"""
import json, sys, time
print("ready", flush=True)
time.sleep(max(0.0, float(sys.stdin.readline()) - time.time()))
from statebound.host.sqlite import SQLiteStore
with SQLiteStore(sys.argv[1]) as store:
    print(json.dumps([store.journal_mode, store.schema_version]), flush=True)
"""


def test_processes_opening_a_new_file_together_all_succeed(tmp_path):
    # The WAL switch gets SQLITE_BUSY without waiting; the store must retry it.
    for trial in range(3):
        path = str(tmp_path / f"fresh-{trial}.db")
        results = _run_together(_OPENER, [[path]] * 4)
        assert results == [["wal", SCHEMA_VERSION]] * 4


@pytest.mark.parametrize("group", [False, True])
def test_an_update_stores_null_for_no_parent_and_no_keys_and_the_values_as_written(db_path, group):
    # _update_params binds bytes as bytearray and None as sentinels the statement maps back to
    # NULL (Python's sqlite3 adapts every other type the slow way): the file must not tell.
    store = SQLiteStore(db_path)
    for iid in ("a", "b"):
        create(store, iid, parent="p" if iid == "b" else None)
    keys = (KeyRecord("k-1", b"\x01\x02"),)
    writes = [PositionWrite("a", "chart", 1, b"blob-a", "running", (), None, ()),
              PositionWrite("b", "chart", 1, b"blob-b", "running", (TimerRef(3, "s", None),), "p", keys)]
    if group:
        assert store.commit_many([Commit(writes=(w,)) for w in writes]) == [None, None]
    else:
        for w in writes:
            store.commit(Commit(writes=(w,)))
    raw = sqlite3.connect(db_path)
    rows = raw.execute("SELECT instance_id, typeof(blob), typeof(timers), typeof(parent), parent, "
                       "typeof(idempotency) FROM positions ORDER BY instance_id").fetchall()
    assert rows == [("a", "blob", "blob", "null", None, "null"), ("b", "blob", "blob", "text", "p", "blob")]
    a, b = store.load("a"), store.load("b")
    assert (a.blob, a.parent, a.idempotency, a.timers, a.version) == (b"blob-a", None, (), (), 2)
    assert (b.blob, b.parent, b.idempotency, b.timers) == (b"blob-b", "p", keys, (TimerRef(3, "s", None),))
    assert type(a.blob) is bytes and type(b.blob) is bytes


def test_an_empty_parent_written_through_the_store_reads_back_empty_not_null(db_path):
    # the store does not police parent ids; whatever a write names, a load returns
    store = SQLiteStore(db_path)
    create(store, "a", parent="p")
    store.commit(Commit(writes=(PositionWrite("a", "chart", 1, b"blob-a", "running", (), "", ()),)))
    assert store.load("a").parent == ""


@pytest.mark.parametrize("column", ["event", "dedup", "caller_context"])
def test_a_row_that_cannot_be_read_is_parked_dead_and_the_claim_goes_on(db_path, column, caplog):
    """A damaged row (bytes no longer msgpack) used to fail every claim it was in: the
    sweeper died with a StoreError naming no row, the healthy rows claimed with it waited
    out their lease, and the next sweeper claimed it again and died the same way. It is now
    parked as dead in the claim's own transaction, with the reason, and the rest fire."""
    import statebound as sb
    chart = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="t" '
        'initial="s"><datamodel><data id="n" expr="0"/></datamodel><state id="s">'
        '<onentry><send event="tick" delay="1s"/></onentry>'
        '<transition event="tick"><assign location="n" expr="n + 1"/></transition></state></scxml>')
    clock = sb.ManualClock(0)
    host = sb.Host([chart], store=SQLiteStore(db_path), clock=clock)
    for iid in ("a", "b", "c"):
        host.start("t", iid)
    query(db_path, f"UPDATE timers SET {column} = x'c1' WHERE instance_id = 'b'")
    clock.advance(1_000)
    report = sb.Sweeper(host, batch=10).run_once()
    assert report.fired == 2
    assert [host.get(i).datamodel["n"] for i in "abc"] == [1, 0, 1]
    state, attempts, error, claimed_by = query(
        db_path, "SELECT state, attempts, last_error, claimed_by FROM timers WHERE instance_id = 'b'")
    assert (state, attempts, claimed_by) == (DEAD, 1, None)
    assert "cannot be read" in error and f"timer {column}" in error
    assert "('b', 1)" in caplog.text
    assert sb.Sweeper(host, batch=10).run_once().total == 0   # never claimed again
    # and the operator still sees it, to revive or delete it
    [dead] = host.store.dead_timers()
    assert (dead.key, dead.state, dead.event) == (("b", 1), DEAD, {}) and "cannot be read" in dead.last_error
    assert [r.key for r in host.pending_timers("b")] == [("b", 1)] and host.store.get_timer(("b", 1)).state == DEAD
    host.delete("b")
    assert host.store.dead_timers() == []
