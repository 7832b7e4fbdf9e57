"""SQLiteStore: the embedded durable backend, on the standard library's :mod:`sqlite3`.

It implements :class:`~statebound.host.store.Store` with exactly the semantics of the
reference :class:`~statebound.host.memory.MemoryStore`, on one SQLite file that several
processes may share.

Schema (version :data:`SCHEMA_VERSION`, recorded in the ``meta`` table):

* ``positions``: one row per instance (``instance_id`` primary key), with the blob, the
  integer ``version`` for optimistic concurrency, ``chart``, ``status``, ``parent``,
  ``timers`` (the pending timer refs, msgpack-encoded) and ``idempotency`` (the retained
  inbound idempotency keys, msgpack-encoded; ``NULL`` for none).
* ``history``: the execution history (schema 3), one msgpack ``record`` per instance
  written by a host with history on, primary key ``(instance_id, version)``; bounded per
  instance by the commit's ``history_keep`` and by ``expires_at_ms``.
* ``timers``: one row per durable timer or outbox entry (``kind``), primary key
  ``(instance_id, ordinal)``. The event, dedup fields and caller context are
  msgpack-encoded. ``ready_at_ms`` is
  ``max(due_at_ms, next_attempt_at_ms)``, kept by the store so that the index
  ``timers_ready(ready_at_ms, instance_id, ordinal) WHERE state = 'pending'`` hands out
  ready rows earliest first without a sort. Partial indexes ``timers_lease`` (claims by
  lease expiry) and ``timers_dead`` serve lapsed claims and the dead-letter listing; done
  rows are in no index, and neither are ``waiting`` rows (an invoke handler answers later).

Concurrency: every call that writes runs in one ``BEGIN IMMEDIATE`` transaction, which
takes SQLite's single write lock up front. A commit's version checks and its writes
therefore see the same state, and two processes can never both claim one timer row.
Reads are single statements, each a consistent snapshot (WAL readers never block writers).

Minimum SQLite: 3.24 (``INSERT ... ON CONFLICT DO NOTHING``), checked when a store opens.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgpack

from ..exceptions import ConflictError, InvalidArgument, StateboundError, StoreError, StoreUnavailable
from .store import (CLAIMED, DEAD, DELETED, DONE, PENDING, SUSPENDED, TIMER, Commit, HistoryRecord, check_ints, check_text, KeyRecord, PositionRecord,
                    PositionWrite, TimerCompletion, TimerKey, TimerRef, TimerRow, check_instance_id, commit_instance_ids,
                    make_timer_row, pack_field, pack_history, purges, unpack_field, unpack_history)

__all__ = ["SQLiteStore", "SCHEMA_VERSION", "MAX_TIMEOUT_S"]

log = logging.getLogger("statebound")

#: The longest busy timeout SQLite can keep (int32 milliseconds), in seconds.
MAX_TIMEOUT_S = (2 ** 31 - 1) // 1000

#: The schema this code writes. A database recording a newer one is refused.
SCHEMA_VERSION = 4

_MIN_SQLITE = (3, 24, 0)

#: ``_MIGRATIONS[v]`` takes a database from schema ``v - 1`` to ``v``; 0 is an empty file.
#: Add a step here (never edit an old one) and bump :data:`SCHEMA_VERSION`.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE IF NOT EXISTS meta (
               key   TEXT PRIMARY KEY,
               value NOT NULL
           )""",
        """CREATE TABLE IF NOT EXISTS positions (
               instance_id TEXT PRIMARY KEY,
               chart       TEXT    NOT NULL,
               version     INTEGER NOT NULL,
               blob        BLOB    NOT NULL,
               status      TEXT    NOT NULL,
               timers      BLOB    NOT NULL,
               parent      TEXT
           )""",
        """CREATE TABLE IF NOT EXISTS timers (
               instance_id        TEXT    NOT NULL,
               ordinal            INTEGER NOT NULL,
               target_id          TEXT    NOT NULL,
               due_at_ms          INTEGER NOT NULL,
               send_id            TEXT    NOT NULL,
               name               TEXT,
               event              BLOB    NOT NULL,
               dedup              BLOB    NOT NULL,
               caller_context     BLOB    NOT NULL,
               state              TEXT    NOT NULL,
               attempts           INTEGER NOT NULL,
               next_attempt_at_ms INTEGER,
               ready_at_ms        INTEGER NOT NULL,
               claimed_by         TEXT,
               claim_expires_ms   INTEGER,
               last_error         TEXT,
               outcome            TEXT,
               reason             TEXT,
               PRIMARY KEY (instance_id, ordinal)
           )""",
        # The three indexes are partial, one per state a query looks for: done rows pile
        # up under keep_done=True and belong in none of them, so each index stays as small
        # as the rows it serves. The key columns are in timers_ready so that the claim's
        # ORDER BY is the index order.
        f"""CREATE INDEX IF NOT EXISTS timers_ready
               ON timers (ready_at_ms, instance_id, ordinal) WHERE state = '{PENDING}'""",
        # ifnull: a claimed row without a lease counts as expired (MemoryStore's rule), and
        # indexing the expression keeps "expired claims" one index range.
        f"""CREATE INDEX IF NOT EXISTS timers_lease
               ON timers (ifnull(claim_expires_ms, 0)) WHERE state = '{CLAIMED}'""",
        f"""CREATE INDEX IF NOT EXISTS timers_dead
               ON timers (instance_id, ordinal) WHERE state = '{DEAD}'""",
    ),
    # The outbox (send, invoke and cancel rows beside the timers) and inbound idempotency
    # keys. Both columns have defaults, so a version-1 file upgrades in place.
    2: (
        f"ALTER TABLE timers ADD COLUMN kind TEXT NOT NULL DEFAULT '{TIMER}'",
        "ALTER TABLE positions ADD COLUMN idempotency BLOB",
    ),
    # Execution history (Host(history=...)): one record per instance written, keyed by the
    # version that commit wrote, so a record exists exactly when its commit does.
    3: (
        """CREATE TABLE IF NOT EXISTS history (
               instance_id   TEXT    NOT NULL,
               version       INTEGER NOT NULL,
               at_ms         INTEGER NOT NULL,
               expires_at_ms INTEGER,
               record        BLOB    NOT NULL,
               PRIMARY KEY (instance_id, version)
           )""",
    ),
    # A deleted instance leaves a tombstone, a position record with status 'deleted' (ADR
    # 0028). No table changes; the version moves so that a statebound that does not know
    # tombstones refuses the file instead of listing and decoding them as instances.
    4: (),
}

# Column order matches TimerRow's fields; _row_to_timer relies on it.
_TIMER_COLS = ("instance_id, ordinal, target_id, due_at_ms, send_id, event, name, dedup, "
               "caller_context, state, attempts, next_attempt_at_ms, claimed_by, "
               "claim_expires_ms, last_error, outcome, reason, kind")

# The state literals are spelled into the SQL, never bound: SQLite uses a partial index only
# when the query's WHERE clause names the index's own literal.
#
# A claim takes ready rows from two index ranges: pending rows, and claims whose lease has
# lapsed (a dead sweeper's, nearly always none). It reads the first range alone, each row
# carrying whether the second has any row (SQLite evaluates that once), and merges the two
# only when it has: merging them in every claim cost about a fifth more statement time.
_CLAIM_COLS = f"rowid, {_TIMER_COLS}, ready_at_ms"
_LAPSED = f"state = '{CLAIMED}' AND ifnull(claim_expires_ms, 0) <= ?"
_SQL_CLAIM_PENDING = f"""
    SELECT {_CLAIM_COLS}, EXISTS (SELECT 1 FROM timers WHERE {_LAPSED}) FROM timers
     WHERE state = '{PENDING}' AND ready_at_ms <= ?
     ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?"""
_SQL_CLAIM_LAPSED = f"""
    SELECT {_CLAIM_COLS}, 1 FROM timers WHERE {_LAPSED}
     ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?"""
# Both ranges: the outer ORDER BY merges at most 2 * limit keys, and the wide rows are read
# by rowid after (merging whole rows would copy their blobs through a sort b-tree). Those
# rows come in rowid order; the caller sorts them.
_SQL_CLAIM_BOTH = f"""
    SELECT {_CLAIM_COLS}, 1 FROM timers WHERE rowid IN (SELECT r FROM (
        SELECT * FROM (
            SELECT rowid AS r, ready_at_ms AS a, instance_id AS b, ordinal AS c FROM timers
             WHERE state = '{PENDING}' AND ready_at_ms <= ?
             ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?)
        UNION ALL
        SELECT * FROM (
            SELECT rowid, ready_at_ms, instance_id, ordinal FROM timers WHERE {_LAPSED}
             ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?)
        ORDER BY 2, 3, 4 LIMIT ?))"""


# claim_rows: one named row, if it is claimable by the given node (pending and ready, a
# lapsed claim, or that node's own claim); the trailing 0 fills _claimed_timers' "lapsed".
_SQL_CLAIM_KEY = f"""
    SELECT {_CLAIM_COLS}, 0 FROM timers
     WHERE instance_id = ? AND ordinal = ?
       AND ((state = '{PENDING}' AND ready_at_ms <= ?)
            OR (state = '{CLAIMED}' AND (ifnull(claim_expires_ms, 0) <= ? OR claimed_by = ?)))"""


def _claim_order(row: Sequence[Any]) -> tuple[int, str, int]:
    """A claim row's place in ``ORDER BY ready_at_ms, instance_id, ordinal`` (the key is
    unique, and Python orders str as SQLite's BINARY collation orders their UTF-8)."""
    return row[19], row[1], row[2]


# The same two index ranges as the claim, read-only: what fires by a given time.
_SQL_DUE_SELECT = f"""
    SELECT * FROM (
        SELECT {_TIMER_COLS}, ready_at_ms FROM timers
         WHERE state = '{PENDING}' AND ready_at_ms <= ?
         ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?)
    UNION ALL
    SELECT * FROM (
        SELECT {_TIMER_COLS}, ready_at_ms FROM timers
         WHERE state = '{CLAIMED}' AND ready_at_ms <= ?
         ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?)
    ORDER BY ready_at_ms, instance_id, ordinal LIMIT ?"""

_SQL_NEXT_DUE = f"""
    SELECT min(t) FROM (
        SELECT min(ready_at_ms) AS t FROM timers WHERE state = '{PENDING}'
        UNION ALL
        SELECT min(ifnull(claim_expires_ms, 0)) FROM timers WHERE state = '{CLAIMED}')"""

# A row suspended while it was being delivered stays suspended (resume brings it back);
# one finished, dead or waiting meanwhile is no longer the releaser's.
_SQL_RELEASE = f"""
    UPDATE timers
       SET state = CASE state WHEN '{SUSPENDED}' THEN '{SUSPENDED}' ELSE ? END,
           attempts = attempts + ?, last_error = ifnull(?, last_error), next_attempt_at_ms = ?,
           ready_at_ms = max(due_at_ms, ifnull(?, due_at_ms)),
           claimed_by = NULL, claim_expires_ms = NULL
     WHERE instance_id = ? AND ordinal = ? AND state IN ('{PENDING}', '{CLAIMED}', '{SUSPENDED}')
       AND NOT (state = '{CLAIMED}' AND claimed_by IS NOT NULL AND claimed_by != ?)"""

_SQL_PARK_UNREADABLE = f"""
    UPDATE timers SET state = '{DEAD}', attempts = attempts + 1, last_error = ?,
           claimed_by = NULL, claim_expires_ms = NULL
     WHERE rowid = ?"""

_SQL_RETRY = f"""
    UPDATE timers
       SET state = '{PENDING}', attempts = 0, due_at_ms = ?, next_attempt_at_ms = NULL,
           ready_at_ms = ?, last_error = NULL
     WHERE instance_id = ? AND ordinal = ? AND state = '{DEAD}'"""

_SQL_PUT_TIMER = f"""
    INSERT OR REPLACE INTO timers ({_TIMER_COLS}, ready_at_ms)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""

# One statement for every completion: done, waiting or dead (the last counts the attempt).
_SQL_COMPLETE_SET = f"""
    UPDATE timers
       SET state = ?, outcome = ?, reason = ?, claimed_by = NULL, claim_expires_ms = NULL,
           attempts = attempts + (? = '{DEAD}'), last_error = ifnull(?, last_error)
     WHERE """
_SQL_COMPLETE = _SQL_COMPLETE_SET + "instance_id = ? AND ordinal = ?"

# A position write conditional on the version loaded: the commit's only statement that can
# refuse it (rowcount 0) for a plain event or fire. Its parameters come from _update_params.
_SQL_UPDATE_POSITION = ("UPDATE positions SET chart = ?, version = version + 1, blob = ?, status = ?, "
                        "timers = ?, parent = nullif(?, x''), idempotency = nullif(?, x'') "
                        "WHERE instance_id = ? AND version = ?")


def _update_params(w: PositionWrite, refs: bytes, keys: bytes | None) -> tuple[Any, ...]:
    """The parameters of ``_SQL_UPDATE_POSITION`` (a write with a blob), in the types Python's
    sqlite3 binds as they are: it runs every other value (``bytes``, ``None``) through its
    adaptation protocol, two failed attribute lookups that build and drop an
    ``AttributeError`` each, about 3,300 instructions a value, four values on every position
    written. Bytes go as ``bytearray`` (the same BLOB), and ``None`` as the empty blob, which
    the statement turns back into NULL: no parent is text and no packed keys are empty, so
    nothing else compares equal to it."""
    assert w.blob is not None
    return (w.chart, bytearray(w.blob), w.status, bytearray(refs), _EMPTY if w.parent is None else w.parent,
            _EMPTY if keys is None else bytearray(keys), w.instance_id, w.expected_version)


#: the empty blob ``_update_params`` binds for NULL
_EMPTY = bytearray()


class _Many(list):
    """Parameter rows for one ``executemany``: passed to ``_execute`` as its ``params`` so
    that a statement run many times still goes through the one crash-injection seam."""


# Well under SQLite's smallest host-parameter limit (999 before 3.32).
_IN_CHUNK = 500
#: timer keys per statement: two parameters each
_KEY_CHUNK = _IN_CHUNK // 2



def _keys_table(n: int) -> str:
    """``n`` timer keys as a table ``k(column1, column2)``, joined to ``timers`` by its
    primary key (``(instance_id, ordinal) IN (VALUES ...)`` would scan the whole table)."""
    return f"(VALUES {', '.join(['(?, ?)'] * n)}) AS k"


# ----------------------------------------------------------------------------- boundary


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""  # Python 3.11+
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc)


@contextmanager
def _map_sqlite_errors() -> Iterator[None]:
    """Translate driver errors so that only :mod:`statebound.exceptions` errors escape.

    The host retries ``ConflictError`` and reports ``StoreUnavailable``; it must never need
    to import :mod:`sqlite3` to tell them apart.
    """
    try:
        yield
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise StoreUnavailable(
                "SQLite database is locked: another connection held the write lock "
                f"past the busy timeout ({exc})") from exc
        raise StoreUnavailable(f"SQLite operation failed: {exc}") from exc
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"SQLite error: {exc}") from exc
    except OverflowError as exc:
        # sqlite3 raises this (not an sqlite3.Error) for ints outside 64 bits.
        raise StoreError(f"value out of SQLite's 64-bit integer range: {exc}") from exc


def _pack(value: Any, what: str) -> bytes:
    return pack_field(value, f"{what} (SQLite)")


_unpackb = msgpack.unpackb

#: msgpack's nil: most rows have no caller context
_NIL = b"\xc0"


def _unpack(data: bytes, what: str) -> Any:
    if data == _NIL:
        return None
    return unpack_field(data, f"{what} in the SQLite database")


#: msgpack's empty array: most instances have no rows, and their refs go by on every write and load
_NO_REFS = b"\x90"


def _pack_refs(refs: Sequence[TimerRef]) -> bytes:
    # Arrays, not maps: the refs ride along on every position load.
    if not refs:
        return _NO_REFS
    return _pack([[r.ordinal, r.send_id, r.name] for r in refs], "timer refs")


#: Decoded refs by their bytes: many instances share the same few (a chart's timers get the
#: same ordinals and send ids), and refs are immutable, so one decode serves them all.
_REFS_SEEN: dict[bytes, tuple[TimerRef, ...]] = {}
#: bounds on ``_REFS_SEEN`` and ``_DEDUP_SEEN``: entries (cleared when full; a few distinct
#: values per chart in practice) and the bytes of one value kept (the common short ones)
_SEEN_MAX = 4096
_SEEN_MAX_BYTES = 256


def _unpack_refs(data: bytes) -> tuple[TimerRef, ...]:
    if data == _NO_REFS:
        return ()
    refs = _REFS_SEEN.get(data)
    if refs is not None:
        return refs
    try:
        refs = tuple(TimerRef(o, s, n) for o, s, n in _unpack(data, "timer refs"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"corrupt timer refs in SQLite database: {exc}") from exc
    if len(data) <= _SEEN_MAX_BYTES:
        if len(_REFS_SEEN) >= _SEEN_MAX:
            _REFS_SEEN.clear()
        _REFS_SEEN[data] = refs
    return refs


def _pack_keys(keys: Sequence[KeyRecord]) -> bytes | None:
    return _pack([[k.key, k.fingerprint] for k in keys], "idempotency keys") if keys else None


def _unpack_keys(data: bytes | None) -> tuple[KeyRecord, ...]:
    if data is None:
        return ()
    try:
        return tuple(KeyRecord(k, bytes(f)) for k, f in _unpack(data, "idempotency keys"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"corrupt idempotency keys in SQLite database: {exc}") from exc


def _timer_params(row: TimerRow) -> tuple[Any, ...]:
    return (row.instance_id, row.ordinal, row.target_id, row.due_at_ms, row.send_id,
            _pack(row.event, "timer event"), row.name, _pack(row.dedup, "timer dedup fields"),
            _pack(row.caller_context, "timer caller_context"), row.state, row.attempts,
            row.next_attempt_at_ms, row.claimed_by, row.claim_expires_ms, row.last_error,
            row.outcome, row.reason, row.kind, row.ready_at_ms)


#: A commit's values encoded for SQLite: position writes (with packed refs and keys), timer
#: row parameters, history records with their packed bytes.
_Encoded = tuple[list[tuple[PositionWrite, tuple[bytes, bytes | None] | None]], Sequence[tuple[Any, ...]],
                 Sequence[tuple[HistoryRecord, bytes]]]


def _encode(commit: Commit) -> _Encoded:
    """Check a commit's ids and encode its values, before any lock is taken.

    :raises InvalidInstanceId, SerializationError: nothing of the commit can be written.
    """
    ws = commit.writes
    if len(ws) == 1 and not (commit.timers_put or commit.timers_delete or commit.history):
        # an event's or a fire's commit (nearly all of them): one position, maybe its row
        w = ws[0]
        check_instance_id(w.instance_id)
        c = commit.complete
        if c is not None and c.key[0] != w.instance_id:
            check_instance_id(c.key[0])
        return ([(w, None if w.blob is None else (_pack_refs(w.timers), _pack_keys(w.idempotency)))], (), ())
    for instance_id in commit_instance_ids(commit):
        check_instance_id(instance_id)
    writes = [(w, None if w.blob is None else (_pack_refs(w.timers), _pack_keys(w.idempotency)))
              for w in ws]
    return (writes, [_timer_params(row) for row in commit.timers_put],
            [(h, pack_history(h)) for h in commit.history])


def _refused_before_writing(commit: Commit) -> bool:
    """Whether every statement of ``commit`` that can refuse it runs before its first write:
    a completion check (a read), then at most one position insert or update, which either
    writes or refuses (a delete also purges rows), then the completion, which cannot fail.
    Timer rows put or deleted and history records come after the position write and can
    fail (a key past 64 bits), so they need a savepoint."""
    writes = commit.writes
    return ((not writes or (len(writes) == 1 and not purges(writes[0])))
            and not commit.timers_put and not commit.timers_delete and not commit.history)


def _plain_update(commit: Commit) -> bool:
    """Whether ``commit`` writes nothing but one existing instance's position (and maybe
    completes its row, which ``commit_many`` checks before and does after): a plain event's
    or fire's, whose one statement either lands or refuses it."""
    writes = commit.writes
    return (len(writes) == 1 and not purges(writes[0]) and writes[0].expected_version is not None
            and not commit.timers_put and not commit.timers_delete and not commit.history)


def _first(item: tuple[int, Commit, _Encoded]) -> int:
    return item[0]


_POSITION_COLS = "instance_id, chart, version, blob, status, timers, parent, idempotency"


def _row_to_record(r: Sequence[Any]) -> PositionRecord:
    # a group loads one record per unit: the row's columns are _POSITION_COLS, in field order,
    # and most rows have no refs and no keys to decode
    iid, chart, version, blob, status, refs, parent, keys = r
    return PositionRecord(iid, chart, version, blob if type(blob) is bytes else bytes(blob), status,
                          () if refs == _NO_REFS else _unpack_refs(refs), parent,
                          () if keys is None else _unpack_keys(keys))


def _row_to_timer(r: Sequence[Any], claim: tuple[str, int] | None = None) -> TimerRow:
    """A stored row as a TimerRow; with ``claim`` ``(node, expiry)``, as just claimed by
    ``node`` (built in one go: a sweep builds one per row it claims)."""
    state, claimed_by, expires = (r[9], r[12], r[13]) if claim is None else (CLAIMED, *claim)
    return make_timer_row(r[0], r[1], r[2], r[3], r[4], _unpack(r[5], "timer event"), r[6],
                          _unpack(r[7], "timer dedup"), _unpack(r[8], "timer caller_context"), state, r[10],
                          r[11], claimed_by, expires, r[14], r[15], r[16], r[17] or TIMER)


def _listed(r: Sequence[Any]) -> TimerRow:
    """A stored row for a listing or a lookup. One whose event, dedup or caller context cannot
    be decoded (parked dead by the claim that found it) still shows, with an empty event and
    the reason in ``last_error``: an operator must be able to list, and delete or revive, it."""
    try:
        return _row_to_timer(r)
    except StoreError as exc:
        why = r[14] or f"the stored row cannot be read: {exc}"
        return make_timer_row(r[0], r[1], r[2], r[3], r[4], {}, r[6], {}, None, r[9], r[10], r[11], r[12], r[13],
                              why, r[15], r[16], r[17] or TIMER)


#: Decoded dedup fields by their bytes (copied out: a row's dict is its own). Rows of one
#: chart share a few shapes; only maps of immutable scalars are kept.
_DEDUP_SEEN: dict[bytes, dict[str, Any]] = {}
_SCALARS = (int, str, bool, float, type(None))


def _unpack_dedup(data: bytes) -> Any:
    seen = _DEDUP_SEEN.get(data)
    if seen is not None:
        return dict(seen)
    dedup = _unpack(data, "timer dedup")
    if (len(data) <= _SEEN_MAX_BYTES and type(dedup) is dict
            and all(type(v) in _SCALARS for v in dedup.values())):
        if len(_DEDUP_SEEN) >= _SEEN_MAX:
            _DEDUP_SEEN.clear()
        _DEDUP_SEEN[data] = dict(dedup)
    return dedup


def _claimed_timers(rows: Sequence[Sequence[Any]], node_id: str,
                    expires: int) -> tuple[list[TimerRow], list[tuple[int, TimerKey, str]]]:
    """The rows of a claim's select as TimerRows just claimed by ``node_id``: the
    claim's per-row work, so the fields are unpacked from the row at once and the event
    decoded without the per-field wrappers (a damaged one is decoded again by the wrapper,
    whose error names the field). Second, ``(rowid, key, why)`` of each row that cannot
    be read at all: one damaged row must not fail the claim of the others."""
    out = []
    unreadable = []
    for (rowid, iid, ordinal, target, due, send_id, event, name, dedup, context, _state, attempts,
         next_at, _by, _expires, error, outcome, reason, kind, _ready, _lapsed) in rows:
        try:
            try:
                decoded = _unpackb(event, raw=False, strict_map_key=False)
            except Exception:   # msgpack raises several unrelated types on bad input
                decoded = _unpack(event, "timer event")   # raises the StoreError naming the field
            out.append(make_timer_row(
                iid, ordinal, target, due, send_id, decoded, name, _unpack_dedup(dedup),
                None if context == _NIL else _unpack(context, "timer caller_context"),
                CLAIMED, attempts, next_at, node_id, expires, error, outcome, reason, kind or TIMER))
        except StoreError as exc:
            unreadable.append((rowid, (iid, ordinal), str(exc)))
    return out, unreadable


# ----------------------------------------------------------------------------- the store


class SQLiteStore:
    """A :class:`~statebound.host.store.Store` on one SQLite file.

    The file is created (and its schema migrated forward) on first open. It is put in WAL
    mode, so readers never block the writer. A store object holds one connection guarded
    by a lock, so **one store object may be shared by the threads of a process**. Each
    process opens its own store object on the same file (never carry one across
    ``fork``); SQLite's locking and the ``BEGIN IMMEDIATE`` transactions make that safe
    (atomic commits and claims).

    Errors: only :mod:`statebound.exceptions` errors escape. A failed version or completion
    check raises :class:`~statebound.ConflictError` and writes nothing. A write lock still
    held by another connection after ``timeout_s``, an I/O error, or a file that is not a
    database raises :class:`~statebound.StoreUnavailable`. A database written by a newer
    schema raises :class:`~statebound.StoreError`.

    Testing seam: every SQL statement the store runs, ``BEGIN IMMEDIATE`` and ``COMMIT``
    included, goes through the private method ``_execute(sql, params)`` (a statement run
    for many parameter rows at once is one call). A crash-injection
    test can monkeypatch it on an instance to raise before or after the N-th statement.
    ``ROLLBACK`` deliberately bypasses it so an injected failure still leaves the
    connection clean, as a real crash leaves the file.

    :param path: the database file, or ``":memory:"`` for a private in-memory database
        (tests; nothing is shared or kept).
    :param timeout_s: how long a call waits for another connection's write lock before
        raising ``StoreUnavailable``: 0 to :data:`MAX_TIMEOUT_S` (SQLite keeps it as int32
        milliseconds); anything else is :class:`~statebound.InvalidArgument`, as is a path
        with a NUL or a lone surrogate.
    :param keep_done: keep completed timer rows (state ``done``, for inspection); when
        ``False`` a completion deletes the row.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 30.0,
                 keep_done: bool = True) -> None:
        self.path = os.fspath(path)
        # SQLite keeps the busy timeout as int32 milliseconds: beyond it (and for NaN) the
        # value wraps, and the store would report "locked" at once instead of waiting
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
                not 0 <= timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(f"timeout_s must be a number of seconds from 0 to {MAX_TIMEOUT_S:,}, "
                                  f"not {timeout_s!r}")
        try:
            encoded = os.fsencode(self.path)
        except UnicodeEncodeError as exc:   # a lone surrogate
            raise InvalidArgument(f"the SQLite path {self.path!r} is not valid Unicode: {exc.reason}") from None
        if b"\x00" in encoded:
            raise InvalidArgument(f"a SQLite path cannot hold a NUL character: {self.path!r}")
        self.timeout_s = timeout_s
        self._keep_done = keep_done
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StoreError(f"SQLiteStore needs SQLite >= {'.'.join(map(str, _MIN_SQLITE))}, "
                             f"this Python links {sqlite3.sqlite_version}")
        with _map_sqlite_errors():
            # isolation_level=None: the driver never opens transactions behind our back;
            # every transaction is an explicit BEGIN IMMEDIATE below.
            # check_same_thread=False: our lock, not the driver, serialises the threads.
            self._db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None,
                                       check_same_thread=False)
        try:
            with self._lock, _map_sqlite_errors():
                self._configure()
                self._migrate()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection. Further calls raise ``StoreUnavailable``. Idempotent."""
        with self._lock:
            db, self._db = self._db, None
            if db is not None:
                with _map_sqlite_errors():
                    db.close()

    def __enter__(self) -> SQLiteStore:
        """Use the store as a context manager; it is closed on exit."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the store."""
        self.close()

    def __repr__(self) -> str:
        """Show the file and whether the store is open."""
        state = "open" if self._db is not None else "closed"
        return f"<SQLiteStore {self.path!r} {state}>"

    @property
    def journal_mode(self) -> str:
        """The journal mode in effect: ``"wal"`` for a file, ``"memory"`` for ``:memory:``."""
        with self._lock, _map_sqlite_errors():
            return str(self._execute("PRAGMA journal_mode").fetchone()[0]).lower()

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the database's ``meta`` table."""
        with self._lock, _map_sqlite_errors():
            return self._read_schema_version()

    # -- plumbing ----------------------------------------------------------------------
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one SQL statement: the single seam that crash-injection tests patch. With
        ``params`` a :class:`_Many`, the statement runs once per parameter row
        (``executemany``), as one call of the seam."""
        db = self._db
        if db is None:
            raise StoreUnavailable(f"SQLiteStore {self.path!r} is closed")
        if type(params) is _Many:
            return db.executemany(sql, params)
        return db.execute(sql, params)

    def _rollback(self) -> None:
        db = self._db
        if db is not None and db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                # The original error is the one worth reporting; SQLite has already
                # rolled back when ROLLBACK itself fails on a broken connection.
                pass

    @contextmanager
    def _write(self, *, lease_only: bool = False) -> Iterator[None]:
        """One write transaction: lock, ``BEGIN IMMEDIATE``, ``COMMIT`` or roll back.

        ``lease_only``: the transaction writes nothing but claims (leases), so it commits
        without its own fsync (``synchronous=NORMAL`` for this commit only, ADR 0025)."""
        with self._lock, _map_sqlite_errors():
            relaxed: list[int] = []   # filled before the switch: see _relax_sync
            try:
                if lease_only:
                    self._relax_sync(relaxed)
                # IMMEDIATE takes the write lock now, waiting up to the busy timeout; a
                # deferred transaction that upgrades later gets SQLITE_BUSY at once, with no
                # wait, if another process wrote in between. BEGIN is inside the try so
                # that any failure after it rolls back instead of leaving the connection
                # in a transaction that holds the write lock.
                self._execute("BEGIN IMMEDIATE")
                yield
                self._execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            finally:
                if relaxed:
                    self._restore_sync(relaxed[0])

    def _relax_sync(self, restore: list[int]) -> None:
        """Switch this connection to ``synchronous=NORMAL`` if it is stricter, putting the
        level to restore in ``restore`` first (left empty: already NORMAL or OFF). First,
        so that an interrupt (Ctrl-C) landing just after the switch still finds the level
        to restore: missed, every later commit of the connection skipped its fsync.

        The durability setting is the connection's, not a statement of the transaction, so it
        goes to the connection directly rather than through ``_execute`` (whose numbered
        statements the crash-injection tests count). The store's lock is held from here to
        the restore, so no other thread's commit runs at the relaxed level."""
        db = self._db
        if db is None:
            return
        level = int(db.execute("PRAGMA synchronous").fetchone()[0])
        if level <= 1:   # OFF (0) or NORMAL (1): a claim already commits without an fsync
            return
        restore.append(level)
        db.execute("PRAGMA synchronous=NORMAL")

    def _restore_sync(self, level: int) -> None:
        db = self._db
        if db is None:
            return
        try:
            db.execute(f"PRAGMA synchronous={int(level)}")
        except BaseException:
            # A connection that cannot be set back must not commit anything at the relaxed
            # level: close it, so every later call fails with StoreUnavailable instead.
            self._db = None
            db.close()
            raise

    @contextmanager
    def _read(self) -> Iterator[None]:
        with self._lock, _map_sqlite_errors():
            yield

    def _configure(self) -> None:
        # The journal mode is persistent in the file; only the first opener switches it. A
        # filesystem that cannot do WAL keeps its mode, which is still correct, only slower
        # (readers then block the writer at commit). The switch needs an exclusive lock and
        # SQLite does not run the busy handler for it, so processes opening a new file
        # together get SQLITE_BUSY at once: retry here, within the same timeout.
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                mode = str(self._execute("PRAGMA journal_mode").fetchone()[0]).lower()
                if mode not in ("wal", "memory"):
                    self._execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)
        # FULL, not NORMAL: in WAL mode NORMAL skips the fsync at each commit, so a power
        # cut or OS crash may drop the last few *acknowledged* commits (the file stays
        # consistent). A durable-timer store promises that an acknowledged send or fire
        # stays done, since effects outside the store may already have happened, so we
        # pay one WAL fsync per commit. The one exception is a claim, which acknowledges
        # nothing (ADR 0025: _write(lease_only=True)).
        self._execute("PRAGMA synchronous=FULL")

    def _read_schema_version(self) -> int:
        has_meta = self._execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()[0]
        if not has_meta:
            return 0
        row = self._execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            return 0
        try:
            return int(row[0])
        except (TypeError, ValueError):
            raise StoreError(f"{self.path}: meta.schema_version is {row[0]!r}, not a version number: "
                             "not a statebound database, or a damaged one") from None

    def _refuse_newer(self, found: int) -> None:
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: database schema version {found} is newer than this statebound "
                f"supports ({SCHEMA_VERSION}); upgrade statebound to open it")

    def _migrate(self) -> None:
        current = self._read_schema_version()
        self._refuse_newer(current)
        if current == SCHEMA_VERSION:
            return
        try:
            self._execute("BEGIN IMMEDIATE")
            # Re-read under the write lock: another process may have migrated meanwhile.
            current = self._read_schema_version()
            self._refuse_newer(current)
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for sql in _MIGRATIONS[version]:
                    self._execute(sql)
            self._execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (SCHEMA_VERSION,))
            self._execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _current_version(self, instance_id: str) -> int | None:
        row = self._execute("SELECT version FROM positions WHERE instance_id = ?",
                            (instance_id,)).fetchone()
        return None if row is None else row[0]

    # -- positions ---------------------------------------------------------------------
    def load(self, instance_id: str) -> PositionRecord | None:
        """Return the instance's record, or ``None``. Sees every commit acknowledged so far,
        by any process."""
        check_instance_id(instance_id)
        with self._read():
            r = self._execute(
                f"SELECT {_POSITION_COLS} FROM positions WHERE instance_id = ?", (instance_id,)).fetchone()
        return None if r is None else _row_to_record(r)

    def list_positions(self, chart: str | None = None, *, after: str | None = None,
                       limit: int = 1_000) -> Sequence[PositionRecord]:
        """Stored instances by id (the primary key's order), after ``after``, optionally of
        one chart (a filter on the key range: there is no index by chart)."""
        check_text("chart", chart)
        check_text("after", after)
        check_ints(limit=limit)
        if limit <= 0:
            return []
        where, params = ["instance_id > ?", f"status != '{DELETED}'"], [after if after is not None else ""]
        if chart is not None:
            where.append("chart = ?")
            params.append(chart)
        with self._read():
            rows = self._execute(f"SELECT {_POSITION_COLS} FROM positions WHERE {' AND '.join(where)} "
                                 "ORDER BY instance_id LIMIT ?", (*params, limit)).fetchall()
        return [_row_to_record(r) for r in rows]

    def load_many(self, instance_ids: Sequence[str]) -> dict[str, PositionRecord]:
        """The records of those ids that exist, by id: one ``SELECT ... IN`` per 500 ids."""
        ids = list(dict.fromkeys(check_instance_id(iid) for iid in instance_ids))
        out: dict[str, PositionRecord] = {}
        with self._read():
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i:i + _IN_CHUNK]
                for r in self._execute(
                        f"SELECT {_POSITION_COLS} FROM positions "
                        f"WHERE instance_id IN ({', '.join('?' * len(chunk))})", chunk):
                    rec = _row_to_record(r)
                    out[rec.instance_id] = rec
        return out

    def commit(self, commit: Commit) -> None:
        """Apply the commit in one transaction, or raise and write nothing.

        Order: the completion check, against the timer rows as they were before this
        commit; position writes, each conditional on its expected version; then purges of deleted instances' timers, ``timers_delete``,
        ``timers_put`` (an upsert) and the completion (to ``done``, ``waiting`` or
        ``dead``).

        :raises ConflictError: a stale version, a create of an existing instance, or a
            completion of a row that is gone, done, dead or claimed by another node.
        :raises SerializationError: a timer field msgpack cannot encode (before any write).
        """
        if commit.empty:
            return
        # Encode before taking the write lock, so a bad value costs other writers nothing.
        encoded = _encode(commit)
        with self._write():
            self._apply(commit, encoded)

    def _append_history(self, h: HistoryRecord, raw: bytes, keep: int | None) -> None:
        self._execute("INSERT OR REPLACE INTO history (instance_id, version, at_ms, expires_at_ms, record) "
                      "VALUES (?, ?, ?, ?, ?)", (h.instance_id, h.version, h.at_ms, h.expires_at_ms, raw))
        if keep is not None and h.version > keep:
            self._execute("DELETE FROM history WHERE instance_id = ? AND version <= ?",
                          (h.instance_id, h.version - keep))
        if h.expires_at_ms is not None:   # a host with a TTL stamps every record it writes
            self._execute("DELETE FROM history WHERE instance_id = ? AND expires_at_ms < ?",
                          (h.instance_id, h.at_ms))

    def history(self, instance_id: str, *, after_version: int = 0, limit: int = 1_000) -> Sequence[HistoryRecord]:
        """The instance's history records after ``after_version``, oldest first (the primary key's order)."""
        check_ints(after_version=after_version, limit=limit)
        check_instance_id(instance_id)
        if limit <= 0:
            return []
        with self._read():
            rows = self._execute("SELECT record FROM history WHERE instance_id = ? AND version > ? "
                                 "ORDER BY version LIMIT ?", (instance_id, after_version, limit)).fetchall()
        return [unpack_history(bytes(r[0])) for r in rows]

    def commit_many(self, commits: Sequence[Commit]) -> list[StateboundError | None]:
        """Group commit: apply many commits in **one** transaction (one fsync), each all or
        nothing on its own.

        The position updates of the plain commits (one existing position written, maybe
        its row completed: every event's and fire's) are tried first as one
        ``executemany``, in a savepoint. If any is refused, that attempt is rolled back
        and the group goes commit by commit: each commit runs inside a savepoint (unless
        every check that can refuse it runs before its first write); one whose condition
        fails (or whose values cannot be stored) is rolled back to it, gets its error in
        its slot, and the others go on. A crash anywhere before the final ``COMMIT``
        applies none of them.
        The rows the commits complete are checked in one ``SELECT`` before the first commit
        and completed after the last, one statement per kind of completion (the commits
        touch disjoint instances, so none changes a row another completes); a commit whose
        row cannot be completed is refused before it writes anything.

        :return: one slot per commit, ``None`` if it was applied, else its error.
        :raises StoreUnavailable: the transaction itself failed (locked past the busy
            timeout, I/O error); then nothing was written.
        """
        out: list[StateboundError | None] = [None] * len(commits)
        todo = []
        for i, commit in enumerate(commits):
            if commit.empty:
                continue
            try:
                todo.append((i, commit, _encode(commit)))
            except StateboundError as exc:
                out[i] = exc
        if not todo:
            return out
        with self._write():
            # The commits touch disjoint instances, so no commit of the group changes a row
            # another one completes: every completion check reads what it would have read
            # just before its own commit, in one statement for the group instead of one each.
            claimable = self._claimable([c.complete for _, c, _ in todo if c.complete is not None])
            finish: list[TimerCompletion] = []
            alone: list[tuple[int, Commit, _Encoded]] = []
            plain: list[tuple[int, Commit, _Encoded]] = []
            for item in todo:
                i, commit, encoded = item
                c = commit.complete
                if c is not None and not claimable.get(c.key, False):
                    out[i] = ConflictError(f"timer {c.key} is no longer claimable")
                elif _plain_update(commit):
                    plain.append(item)
                else:
                    alone.append(item)
            if len(plain) > 1 and self._update_plain(plain):
                finish.extend(c.complete for _, c, _ in plain if c.complete is not None)
            else:
                alone = sorted(alone + plain, key=_first) if alone else plain
            for i, commit, encoded in alone:
                c = commit.complete
                # A statement that fails leaves nothing behind (SQLite undoes a failed
                # statement on its own), so a commit refused before its first write (a
                # plain event's or a timer fire's) needs no savepoint: two statements
                # fewer per item.
                savepoint = not _refused_before_writing(commit)
                if savepoint:
                    self._execute("SAVEPOINT sb_one")
                try:
                    self._apply(commit, encoded, checked=True)
                except (ConflictError, OverflowError, sqlite3.IntegrityError) as exc:
                    if savepoint:
                        self._execute("ROLLBACK TO sb_one")
                        self._execute("RELEASE sb_one")
                    out[i] = exc if isinstance(exc, ConflictError) else StoreError(f"commit not stored: {exc}")
                    continue
                if savepoint:
                    self._execute("RELEASE sb_one")
                if c is not None:
                    finish.append(c)
            # The completions of the commits that landed, last as in a single commit, one
            # statement per kind of completion (a fire's is nearly always ``done``/``fired``)
            # instead of one each: they cannot fail, and touch rows no other commit does.
            self._complete_many(finish)
        return out

    def _update_plain(self, plain: Sequence[tuple[int, Commit, _Encoded]]) -> bool:
        """Try the position updates of many plain commits as one ``executemany``.

        All land, or (a version moved, a value SQLite refuses) none: the attempt runs in a
        savepoint and is rolled back, and the caller applies them one by one, which gives
        each refused commit its own error. Returns whether they landed.
        """
        params = _Many()
        for _i, commit, encoded in plain:
            packed = encoded[0][0][1]
            assert packed is not None
            params.append(_update_params(commit.writes[0], packed[0], packed[1]))
        self._execute("SAVEPOINT sb_many")
        try:
            landed = self._execute(_SQL_UPDATE_POSITION, params).rowcount == len(params)
        except (OverflowError, sqlite3.IntegrityError):
            landed = False
        if not landed:
            self._execute("ROLLBACK TO sb_many")
        self._execute("RELEASE sb_many")
        return landed

    def _claimable(self, completions: Sequence[TimerCompletion]) -> dict[TimerKey, bool]:
        """Whether each completion's row may be completed (``_check_completion`` for many)."""
        out: dict[TimerKey, bool] = {}
        nodes = {c.key: c.node_id for c in completions}
        keys = list(nodes)
        for k in range(0, len(keys), _KEY_CHUNK):
            chunk = keys[k:k + _KEY_CHUNK]
            rows = self._execute(
                f"SELECT t.instance_id, t.ordinal, t.state, t.claimed_by FROM {_keys_table(len(chunk))} "
                "CROSS JOIN timers AS t ON t.instance_id = k.column1 AND t.ordinal = k.column2",
                [x for key in chunk for x in key])
            for iid, ordinal, state, claimed_by in rows:
                node = nodes[(iid, ordinal)]
                out[(iid, ordinal)] = not (state in (DONE, DEAD) or (
                    node is not None and state == CLAIMED and claimed_by != node))
        return out

    def _complete_many(self, completions: Sequence[TimerCompletion]) -> None:
        """Complete rows (the last step of ``_apply`` for many commits), grouped by what is written."""
        kinds: dict[tuple[Any, ...] | None, list[TimerKey]] = {}   # None: deleted, not kept
        for c in completions:
            what = None if c.state == DONE and not self._keep_done else (c.state, c.outcome, c.reason, c.error)
            kinds.setdefault(what, []).append(c.key)
        for what, keys in kinds.items():
            for k in range(0, len(keys), _KEY_CHUNK):
                chunk = keys[k:k + _KEY_CHUNK]
                where = (f"rowid IN (SELECT t.rowid FROM {_keys_table(len(chunk))} CROSS JOIN timers AS t "
                         "ON t.instance_id = k.column1 AND t.ordinal = k.column2)")
                flat = [x for key in chunk for x in key]
                if what is None:
                    self._execute(f"DELETE FROM timers WHERE {where}", flat)
                else:
                    self._execute(_SQL_COMPLETE_SET + where, (what[0], what[1], what[2], what[0], what[3], *flat))

    def _apply(self, commit: Commit, encoded: _Encoded, *, checked: bool = False) -> None:
        """The statements of one commit, inside a transaction the caller holds. ``checked``:
        the caller checked the completion first and completes the row itself, afterwards."""
        writes, puts, history = encoded
        for key, states in commit.timers_expect:   # reads, before any write, like the completion check
            r = self._execute("SELECT state FROM timers WHERE instance_id = ? AND ordinal = ?", key).fetchone()
            if r is None or r[0] not in states:
                raise ConflictError(f"timer row {key} changed state")
        c = None if checked else commit.complete
        if c is not None:
            # First: it reads only timer rows, which the position writes leave alone, and a
            # refusal before any write leaves nothing to undo (see _refused_before_writing)
            self._check_completion(c.key, c.node_id)
        purged: list[str] = []
        for w, packed in writes:
            self._write_position(w, packed)
            if purges(w):
                purged.append(w.instance_id)
        for instance_id in purged:
            self._execute("DELETE FROM timers WHERE instance_id = ?", (instance_id,))
            self._execute("DELETE FROM history WHERE instance_id = ?", (instance_id,))
        for key in commit.timers_delete:
            self._execute("DELETE FROM timers WHERE instance_id = ? AND ordinal = ?", key)
        for params in puts:
            self._execute(_SQL_PUT_TIMER, params)
        if c is not None:
            if c.state == DONE and not self._keep_done:
                self._execute("DELETE FROM timers WHERE instance_id = ? AND ordinal = ?", c.key)
            else:
                self._execute(_SQL_COMPLETE, (c.state, c.outcome, c.reason, c.state, c.error, *c.key))
        for h, raw in history:
            self._append_history(h, raw, commit.history_keep)

    def _write_position(self, w: PositionWrite, packed: tuple[bytes, bytes | None] | None) -> None:
        iid = w.instance_id
        if w.blob is None:
            if w.expected_version is None:
                # A delete that expects no record: legal, and a no-op, only if there is none.
                if (cur := self._current_version(iid)) is not None:
                    raise ConflictError(f"instance {iid!r} already exists", iid, cur)
                return
            n = self._execute("DELETE FROM positions WHERE instance_id = ? AND version = ?",
                              (iid, w.expected_version)).rowcount
            if n != 1:
                raise ConflictError(f"version of {iid!r} moved", iid, self._current_version(iid))
            return
        assert packed is not None
        refs, keys = packed
        if w.expected_version is None:
            n = self._execute(
                "INSERT INTO positions (instance_id, chart, version, blob, status, timers, parent, "
                "idempotency) VALUES (?, ?, 1, ?, ?, ?, ?, ?) ON CONFLICT (instance_id) DO NOTHING",
                (iid, w.chart, w.blob, w.status, refs, w.parent, keys)).rowcount
            if n != 1:
                raise ConflictError(f"instance {iid!r} already exists", iid,
                                    self._current_version(iid))
            return
        n = self._execute(_SQL_UPDATE_POSITION, _update_params(w, refs, keys)).rowcount
        if n != 1:
            raise ConflictError(f"version of {iid!r} moved", iid, self._current_version(iid))

    def _check_completion(self, key: TimerKey, node_id: str | None) -> None:
        r = self._execute("SELECT state, claimed_by FROM timers WHERE instance_id = ? AND "
                          "ordinal = ?", key).fetchone()
        if r is None or r[0] in (DONE, DEAD) or (
                node_id is not None and r[0] == CLAIMED and r[1] != node_id):
            raise ConflictError(f"timer {key} is no longer claimable")

    # -- timers ------------------------------------------------------------------------
    def claim_due(self, now_ms: int, limit: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim up to ``limit`` ready rows for ``node_id``, earliest ``ready_at_ms`` first.

        Ready: ``pending`` with ``ready_at_ms <= now_ms``, or ``claimed`` with a lease that
        has run out (a dead sweeper's). The select and the update run under one write lock,
        so across every process sharing the file a row has one live claim at a time. The
        claim commits without its own fsync: it is a lease, not an acknowledgement, and the
        next commit's fsync makes it durable (``docs/adr/0025-sqlite-claims-commit-without-their-own-fsync.md``).
        """
        check_ints(now_ms=now_ms, limit=limit, lease_ms=lease_ms)
        if limit <= 0:
            return []
        expires = now_ms + lease_ms
        # A claim is a lease, not an acknowledgement: it commits without an fsync (ADR 0025)
        with self._write(lease_only=True):
            rows = self._execute(_SQL_CLAIM_PENDING, (now_ms, now_ms, limit)).fetchall()
            if not rows:
                rows = self._execute(_SQL_CLAIM_LAPSED, (now_ms, limit)).fetchall()
            elif rows[0][20]:   # lapsed claims too: merge the two ranges
                rows = self._execute(_SQL_CLAIM_BOTH, (now_ms, limit, now_ms, limit, limit)).fetchall()
                rows.sort(key=_claim_order)
            claimed, unreadable = self._claim_selected(rows, node_id, expires)
        for _rowid, key, why in unreadable:
            log.error("timer row %s cannot be read; parked as dead: %s", key, why)
        return claimed

    def _claim_selected(self, rows: list[Any], node_id: str, expires: int,
                        ) -> tuple[list[TimerRow], list[tuple[int, TimerKey, str]]]:
        """Claim the selected timer rows (full rows of a claim's select) for ``node_id``,
        inside the caller's write transaction; returns them as TimerRows, and the rows that
        cannot be read, as ``(rowid, key, why)``.

        A row that cannot be read cannot fire, now or on any retry: parked as dead in the
        claim's own transaction, it stops being claimed (and failing) again, and the operator
        finds it, with the reason, in dead_timers. Before, it failed every claim it was in,
        so every sweeper died on it and its batch's rows waited."""
        rowids = [r[0] for r in rows]
        for i in range(0, len(rowids), _IN_CHUNK):
            chunk = rowids[i:i + _IN_CHUNK]
            self._execute(
                f"UPDATE timers SET state = '{CLAIMED}', claimed_by = ?, "
                f"claim_expires_ms = ? WHERE rowid IN ({', '.join('?' * len(chunk))})",
                (node_id, expires, *chunk))
        claimed, unreadable = _claimed_timers(rows, node_id, expires)
        for rowid, _key, why in unreadable:
            self._execute(_SQL_PARK_UNREADABLE, (f"the stored row cannot be read: {why}", rowid))
        return claimed, unreadable

    def claim_rows(self, keys: Sequence[TimerKey], now_ms: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim the named rows that are ready, lapsed or already ``node_id``'s (see
        :meth:`~statebound.host.store.RowClaimStore.claim_rows`), in one write transaction.

        Like ``claim_due``'s, the claim commits without its own fsync (ADR 0025), and a row
        that cannot be read is parked dead in it (ADR 0027)."""
        check_ints(now_ms=now_ms, lease_ms=lease_ms)
        for key in keys:
            check_instance_id(key[0])
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []
        expires = now_ms + lease_ms
        with self._write(lease_only=True):
            rows = []
            for iid, ordinal in wanted:
                found = self._execute(_SQL_CLAIM_KEY, (iid, ordinal, now_ms, now_ms, node_id)).fetchone()
                if found is not None:
                    rows.append(found)
            claimed, unreadable = self._claim_selected(rows, node_id, expires)
        for _rowid, key, why in unreadable:
            log.error("timer row %s cannot be read; parked as dead: %s", key, why)
        return claimed

    def release(self, key: TimerKey, node_id: str, *, error: str, next_attempt_at_ms: int | None,
                dead: bool, attempt: bool = True) -> None:
        """Give a row back after a failed delivery: ``attempts += 1``, the error and backoff
        recorded, or the row parked as ``dead``; a row suspended meanwhile stays suspended.
        A no-op if the row is gone, done, dead or waiting, or if another node holds the claim."""
        with self._write():
            self._execute(_SQL_RELEASE, (DEAD if dead else PENDING, int(attempt), error if attempt else None,
                                         next_attempt_at_ms, next_attempt_at_ms, key[0], key[1], node_id))

    def next_due(self) -> int | None:
        """The earliest time some row becomes ready: a pending row's ``ready_at_ms`` or a
        claimed row's lease expiry. ``None`` when there is none."""
        with self._read():
            return self._execute(_SQL_NEXT_DUE).fetchone()[0]

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The rows scheduled by ``instance_id`` that are not done (pending, claimed,
        waiting or dead), by ordinal."""
        check_instance_id(instance_id)
        with self._read():
            rows = self._execute(
                f"SELECT {_TIMER_COLS} FROM timers WHERE instance_id = ? AND state != '{DONE}' "
                "ORDER BY ordinal", (instance_id,)).fetchall()
        return [_listed(r) for r in rows]

    def dead_timers(self, limit: int = 100) -> Sequence[TimerRow]:
        """Up to ``limit`` rows parked as dead, by key."""
        check_ints(limit=limit)
        if limit <= 0:
            return []
        with self._read():
            rows = self._execute(
                f"SELECT {_TIMER_COLS} FROM timers WHERE state = '{DEAD}' "
                "ORDER BY instance_id, ordinal LIMIT ?", (limit,)).fetchall()
        return [_listed(r) for r in rows]

    def due_timers(self, due_before_ms: int, limit: int = 1_000) -> Sequence[TimerRow]:
        """Pending or claimed rows ready by ``due_before_ms``, earliest first: the
        ``timers_ready`` index range (claimed rows, few at any time, are read beside it)."""
        check_ints(due_before_ms=due_before_ms, limit=limit)
        if limit <= 0:
            return []
        with self._read():
            rows = self._execute(_SQL_DUE_SELECT, (due_before_ms, limit, due_before_ms, limit, limit)).fetchall()
        return [_listed(r) for r in rows]

    def retry_timer(self, key: TimerKey, now_ms: int) -> bool:
        """Revive a dead row: pending, attempts reset, due at ``now_ms``. Returns whether a
        dead row was found."""
        check_instance_id(key[0])
        with self._write():
            n = self._execute(_SQL_RETRY, (now_ms, now_ms, key[0], key[1])).rowcount
        return n == 1

    def get_timer(self, key: TimerKey) -> TimerRow | None:
        """One row by key, in any state (done rows included while they are kept)."""
        check_instance_id(key[0])
        with self._read():
            r = self._execute(f"SELECT {_TIMER_COLS} FROM timers WHERE instance_id = ? AND "
                              "ordinal = ?", key).fetchone()
        return None if r is None else _listed(r)


    def purge_done(self, due_before_ms: int, limit: int = 10_000) -> int:
        """Delete up to ``limit`` completed rows that were due before ``due_before_ms``.

        Completed rows are kept for inspection (``keep_done=True``); run this from a batch
        job (``statebound purge``) so the table does not grow without bound. Returns how
        many rows were deleted.
        """
        check_ints(due_before_ms=due_before_ms, limit=limit)
        with self._write():
            n = self._execute(
                f"DELETE FROM timers WHERE rowid IN (SELECT rowid FROM timers WHERE state = '{DONE}' "
                "AND due_at_ms < ? LIMIT ?)", (due_before_ms, limit)).rowcount
        return n
