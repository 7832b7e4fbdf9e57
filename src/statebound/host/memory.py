"""MemoryStore: the in-process reference backend (tests, examples, the conformance suite).

It implements :class:`~statebound.host.store.Store` exactly as the durable backends must,
so a test written against it holds for SQLite and DynamoDB too. A lock makes each call
atomic across threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from ..exceptions import ConflictError, StateboundError
from .store import (CLAIMED, DEAD, DELETED, DONE, PENDING, SUSPENDED, Commit, HistoryRecord, check_ints, check_text, PositionRecord, TimerCompletion,
                    TimerKey, TimerRow, check_instance_id, commit_instance_ids, purges)

__all__ = ["MemoryStore"]


class MemoryStore:
    """A dict-backed :class:`~statebound.host.store.Store`. Nothing survives the process.

    :param keep_done: keep completed timer rows (for inspection); default ``True``.
    """

    def __init__(self, *, keep_done: bool = True) -> None:
        self._lock = threading.RLock()
        self._positions: dict[str, PositionRecord] = {}
        self._timers: dict[TimerKey, TimerRow] = {}
        self._history: dict[str, dict[int, HistoryRecord]] = {}
        self._keep_done = keep_done
        #: how many commits were applied (handy in tests)
        self.commits = 0
        #: how many ``commit_many`` calls were made (each one "transaction")
        self.group_commits = 0

    # -- positions -------------------------------------------------------------
    def load(self, instance_id: str) -> PositionRecord | None:
        """Return the record or ``None``."""
        check_instance_id(instance_id)
        with self._lock:
            return self._positions.get(instance_id)

    def load_many(self, instance_ids: Sequence[str]) -> dict[str, PositionRecord]:
        """The records of the ids that exist, by id."""
        for iid in instance_ids:
            check_instance_id(iid)
        with self._lock:
            return {iid: rec for iid in instance_ids if (rec := self._positions.get(iid)) is not None}

    def commit(self, commit: Commit) -> None:
        """Check every condition first, then apply everything; all or nothing."""
        for iid in commit_instance_ids(commit):
            check_instance_id(iid)
        with self._lock:
            self._check(commit)
            self._apply(commit)

    def commit_many(self, commits: Sequence[Commit]) -> list[StateboundError | None]:
        """Each commit all or nothing, under one lock; a failed one gets its error in its slot."""
        out: list[StateboundError | None] = []
        with self._lock:
            for commit in commits:
                try:
                    for iid in commit_instance_ids(commit):
                        check_instance_id(iid)
                    self._check(commit)
                except StateboundError as exc:
                    out.append(exc)
                    continue
                self._apply(commit)
                out.append(None)
            self.group_commits += 1
        return out

    def _check(self, commit: Commit) -> None:
        for key, states in commit.timers_expect:
            row = self._timers.get(key)
            if row is None or row.state not in states:
                raise ConflictError(f"timer row {key} changed state")
        for w in commit.writes:
            cur = self._positions.get(w.instance_id)
            if w.expected_version is None:
                if cur is not None:
                    raise ConflictError(f"instance {w.instance_id!r} already exists",
                                        w.instance_id, cur.version)
            elif cur is None or cur.version != w.expected_version:
                raise ConflictError(f"version of {w.instance_id!r} moved", w.instance_id,
                                    None if cur is None else cur.version)
        if commit.complete is not None:
            row = self._timers.get(commit.complete.key)
            node = commit.complete.node_id
            if row is None or row.state in (DONE, DEAD) or (
                    node is not None and row.state == CLAIMED and row.claimed_by != node):
                raise ConflictError(f"timer {commit.complete.key} is no longer claimable")

    def _apply(self, commit: Commit) -> None:
        for w in commit.writes:
            if purges(w):
                self._history.pop(w.instance_id, None)
                for k in [k for k in self._timers if k[0] == w.instance_id]:
                    del self._timers[k]
            if w.blob is None:
                self._positions.pop(w.instance_id, None)
                continue
            version = 1 if w.expected_version is None else w.expected_version + 1
            self._positions[w.instance_id] = PositionRecord(
                w.instance_id, w.chart, version, w.blob, w.status, tuple(w.timers), w.parent,
                tuple(w.idempotency))
        for k in commit.timers_delete:
            self._timers.pop(k, None)
        for row in commit.timers_put:
            self._timers[row.key] = row
        if commit.complete is not None:
            self._complete(commit.complete)
        for h in commit.history:
            self._append_history(h, commit.history_keep)
        self.commits += 1

    def _append_history(self, h: HistoryRecord, keep: int | None) -> None:
        records = self._history.setdefault(h.instance_id, {})
        records[h.version] = h
        # records arrive oldest first, so whatever is past a bound is at the front
        while records:
            v, first = next(iter(records.items()))
            if (keep is not None and v <= h.version - keep) or (
                    first.expires_at_ms is not None and first.expires_at_ms < h.at_ms):
                del records[v]
            else:
                break

    def history(self, instance_id: str, *, after_version: int = 0, limit: int = 1_000) -> Sequence[HistoryRecord]:
        """The instance's history records after ``after_version``, oldest first."""
        check_ints(after_version=after_version, limit=limit)
        with self._lock:
            records = self._history.get(instance_id, {})
            return [records[v] for v in sorted(records) if v > after_version][:max(limit, 0)]

    def _complete(self, c: TimerCompletion) -> None:
        row = self._timers.get(c.key)
        if row is None:
            return
        if c.state == DONE and not self._keep_done:
            del self._timers[c.key]
            return
        if c.state == DEAD:
            row = replace(row, attempts=row.attempts + 1, last_error=c.error)
        self._timers[c.key] = replace(row, state=c.state, outcome=c.outcome, reason=c.reason,
                                      claimed_by=None, claim_expires_ms=None)

    # -- timers ----------------------------------------------------------------
    def _ready(self, row: TimerRow, now_ms: int) -> bool:
        if row.state == PENDING:
            return row.ready_at_ms <= now_ms
        if row.state == CLAIMED:
            return (row.claim_expires_ms or 0) <= now_ms
        return False

    def claim_due(self, now_ms: int, limit: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim the earliest ready rows for ``node_id``."""
        check_ints(now_ms=now_ms, limit=limit, lease_ms=lease_ms)
        if limit <= 0:
            return []
        with self._lock:
            ready = sorted((r for r in self._timers.values() if self._ready(r, now_ms)),
                           key=lambda r: (r.ready_at_ms, r.instance_id, r.ordinal))[:limit]
            out = []
            for r in ready:
                claimed = replace(r, state=CLAIMED, claimed_by=node_id,
                                  claim_expires_ms=now_ms + lease_ms)
                self._timers[r.key] = claimed
                out.append(claimed)
            return out

    def claim_rows(self, keys: Sequence[TimerKey], now_ms: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim the named rows that are ready, lapsed or already ``node_id``'s (see
        :meth:`~statebound.host.store.RowClaimStore.claim_rows`)."""
        check_ints(now_ms=now_ms, lease_ms=lease_ms)
        for key in keys:
            check_instance_id(key[0])
        out = []
        with self._lock:
            for key in dict.fromkeys(keys):
                row = self._timers.get(key)
                if row is None or not (self._ready(row, now_ms) or (
                        row.state == CLAIMED and row.claimed_by == node_id)):
                    continue
                claimed = replace(row, state=CLAIMED, claimed_by=node_id, claim_expires_ms=now_ms + lease_ms)
                self._timers[key] = claimed
                out.append(claimed)
        return out

    def release(self, key: TimerKey, node_id: str, *, error: str, next_attempt_at_ms: int | None,
                dead: bool, attempt: bool = True) -> None:
        """Return a claimed row after a failure (attempts counted, backoff or dead); a row
        suspended meanwhile stays suspended, and one done, dead or waiting is left alone."""
        with self._lock:
            row = self._timers.get(key)
            if row is None or row.state not in (PENDING, CLAIMED, SUSPENDED):
                return
            if row.state == CLAIMED and row.claimed_by not in (None, node_id):
                return
            state = SUSPENDED if row.state == SUSPENDED else DEAD if dead else PENDING
            self._timers[key] = replace(row, state=state, attempts=row.attempts + attempt,
                                        last_error=error if attempt else row.last_error,
                                        next_attempt_at_ms=next_attempt_at_ms,
                                        claimed_by=None, claim_expires_ms=None)

    def next_due(self) -> int | None:
        """Earliest time at which some row becomes ready."""
        with self._lock:
            times = [r.ready_at_ms if r.state == PENDING else (r.claim_expires_ms or 0)
                     for r in self._timers.values() if r.state in (PENDING, CLAIMED)]
            return min(times) if times else None

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """Rows scheduled by ``instance_id`` that are not done."""
        check_instance_id(instance_id)
        with self._lock:
            return sorted((r for r in self._timers.values()
                           if r.instance_id == instance_id and r.state != DONE),
                          key=lambda r: r.ordinal)

    def dead_timers(self, limit: int = 100) -> Sequence[TimerRow]:
        """Rows parked as dead."""
        check_ints(limit=limit)
        with self._lock:
            return sorted((r for r in self._timers.values() if r.state == DEAD),
                          key=lambda r: r.key)[:limit]

    def due_timers(self, due_before_ms: int, limit: int = 1_000) -> Sequence[TimerRow]:
        """Pending or claimed rows ready by ``due_before_ms``, earliest first."""
        check_ints(due_before_ms=due_before_ms, limit=limit)
        if limit <= 0:
            return []
        with self._lock:
            return sorted((r for r in self._timers.values()
                           if r.state in (PENDING, CLAIMED) and r.ready_at_ms <= due_before_ms),
                          key=lambda r: (r.ready_at_ms, r.instance_id, r.ordinal))[:limit]

    def retry_timer(self, key: TimerKey, now_ms: int) -> bool:
        """Revive a dead row, due now."""
        check_instance_id(key[0])
        with self._lock:
            row = self._timers.get(key)
            if row is None or row.state != DEAD:
                return False
            self._timers[key] = replace(row, state=PENDING, attempts=0, due_at_ms=now_ms,
                                        next_attempt_at_ms=None, last_error=None)
            return True

    def get_timer(self, key: TimerKey) -> TimerRow | None:
        """One row by key."""
        check_instance_id(key[0])
        with self._lock:
            return self._timers.get(key)

    def purge_done(self, due_before_ms: int, limit: int = 10_000) -> int:
        """Delete up to ``limit`` completed rows that were due before ``due_before_ms``."""
        check_ints(due_before_ms=due_before_ms, limit=limit)
        with self._lock:
            keys = [k for k, r in self._timers.items() if r.state == DONE and r.due_at_ms < due_before_ms][:limit]
            for k in keys:
                del self._timers[k]
            return len(keys)

    def list_positions(self, chart: str | None = None, *, after: str | None = None,
                       limit: int = 1_000) -> Sequence[PositionRecord]:
        """Stored instances by id, after ``after``, optionally of one chart."""
        check_text("chart", chart)
        check_text("after", after)
        check_ints(limit=limit)
        if limit <= 0:
            return []
        with self._lock:
            ids = sorted(i for i, r in self._positions.items()
                         if (after is None or i > after) and (chart is None or r.chart == chart)
                         and r.status != DELETED)
            return [self._positions[i] for i in ids[:limit]]

    def instance_ids(self) -> list[str]:
        """All stored instance ids (MemoryStore extra, for tests)."""
        with self._lock:
            return sorted(self._positions)
