"""The Sweeper: fires due timer rows back into their positions, exactly once.

It runs anywhere a loop can: ``run_once()`` from a batch job or a Lambda function,
``run_until_idle()`` to drain, ``run_forever(stop)`` as a long-running process, and
``handle_wakeups(requests)`` for wake-ups (``host/wakeup.py``) that name rows by key.
``run_once`` and ``handle_wakeups`` take a ``stop`` (a deadline, such as a Lambda
invocation's: ``statebound.dynamodb.lambda_handlers.Deadline``) checked before every row,
so a sweep behind slow fires ends when it must rather than when its batch is done.
Several sweepers may share one store: rows are claimed under a lease (``lease_s``), so a
sweeper that dies mid-claim loses the claim when the lease runs out, and the completion in
the fire's commit is conditional, so a row is applied at most once.

With ``workers > 1`` the rows of one sweep are fired by a bounded thread pool: rows of
different instances at once, the rows of one instance one after another in due order (two
fires into one position would only conflict and retry). Exactly-once does not depend on
it: each fire's commit still completes its row conditionally. Each fire runs in a copy of
the sweeping thread's context, so its span is a child of the caller's, as with one worker.

A sweep's report counts, beside the rows it fired, the outbox rows its commits handed over
(a timer whose transition sends to a processor): those are handed over right after the
commit, in the sweep, and no later sweep sees them.
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..exceptions import ConflictError, InvalidArgument, StoreUnavailable
from .host import FireResult, Host
from .runner import handed_over, wake
from .store import CLAIMED, PENDING, TIMER, TimerKey, TimerRow
from .wakeup import WakeupRequest, WakeupSource, wakeups_for

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("statebound")

__all__ = ["Sweeper", "SweepReport", "SweeperMetrics", "MAX_SECONDS", "MAX_BATCH", "MAX_WORKERS"]

#: The longest ``interval_s`` and ``lease_s`` a Sweeper takes (a week). Far past any useful
#: value, and far short of what breaks: a sleep past ``threading.TIMEOUT_MAX`` raises, and a
#: lease's expiry must stay a 64-bit count of milliseconds in every store.
MAX_SECONDS = 7 * 86_400
#: The largest ``batch`` (rows claimed per sweep): one claim is one query or transaction,
#: whose size every store bounds.
MAX_BATCH = 100_000
#: The most ``workers`` (threads firing at once) a Sweeper starts.
MAX_WORKERS = 1_024


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one ``run_once`` did: the outcomes of the rows it fired, and of the outbox rows
    their commits handed over right after (a timer whose transition sends to a processor
    counts one ``fired`` and one ``delivered``).

    :ivar lag_ms: for each fired row, how late it fired relative to its due time.
    :ivar delivered: outbox sends handed to their processors (claimed by the sweep, or
        handed over after its commits).
    :ivar waiting: invocations whose handler will answer later.
    :ivar cancelled: invocations cancelled (their cancel hooks called).
    :ivar empty: wake-ups whose row was already fired, cancelled or gone (one read each).
    :ivar parked: rows claimed before their instance was suspended, parked with it (they
        fire after ``resume``).
    :ivar more: the sweep's ``stop`` cut it short: rows may still be due (sweep again).
    :ivar unreached: the rows the sweep took (claimed, or named by a wake-up) but did not
        fire because ``stop`` said so, none of them fired or counted as an attempt (see
        :meth:`Sweeper.run_once` and :meth:`Sweeper.handle_wakeups` for where they go).
    """

    fired: int = 0
    discarded: int = 0
    stale: int = 0
    failed: int = 0
    skipped: int = 0
    lag_ms: tuple[int, ...] = ()
    delivered: int = 0
    waiting: int = 0
    cancelled: int = 0
    empty: int = 0
    more: bool = False
    unreached: tuple[TimerKey, ...] = ()
    parked: int = 0

    @property
    def total(self) -> int:
        """Rows handled in this sweep."""
        # parked rows count: a sweep of nothing but a suspended instance's rows handled a
        # batch, and run_until_idle took its total of 0 for "nothing more is due"
        return (self.fired + self.discarded + self.stale + self.failed + self.skipped + self.delivered
                + self.waiting + self.cancelled + self.parked)

    @property
    def max_lag_ms(self) -> int:
        """The worst lag in this sweep (0 when nothing fired)."""
        return max(self.lag_ms, default=0)


#: One lock for every SweeperMetrics: a fold is a few additions once per sweep, and a lock
#: kept outside the dataclass leaves it a plain value (asdict, copy, pickle).
_FOLD_LOCK = threading.Lock()


@dataclass
class SweeperMetrics:
    """Running totals a user can read (``sweeper.metrics``). Threads sharing one sweeper
    (wake-up batches handled at once) fold their reports in under a lock."""

    sweeps: int = 0
    fired: int = 0
    discarded: int = 0
    stale: int = 0
    failed: int = 0
    skipped: int = 0
    max_lag_ms: int = 0
    last_lag_ms: list[int] = field(default_factory=list)
    delivered: int = 0
    waiting: int = 0
    cancelled: int = 0
    empty: int = 0
    parked: int = 0

    def add(self, report: SweepReport) -> None:
        """Fold one sweep's report in."""
        with _FOLD_LOCK:
            self.sweeps += 1
            self.empty += report.empty
            for name in _COUNTS:
                setattr(self, name, getattr(self, name) + getattr(report, name))
            self.max_lag_ms = max(self.max_lag_ms, report.max_lag_ms)
            self.last_lag_ms = list(report.lag_ms)


class Sweeper:
    """Fires due timers through a :class:`Host`.

    :param host: the host (its store and clock are used).
    :param interval_s: the longest sleep between sweeps when nothing is due sooner.
    :param jitter: fraction of ``interval_s`` added at random, so many sweepers spread out.
    :param batch: rows claimed per sweep.
    :param node_id: this sweeper's claim owner id; defaults to ``host:pid:random``.
    :param lease_s: how long a claim holds before another sweeper may take the row.
    :param workers: fires in flight at once (a thread pool when above 1). The store must be
        safe to share between threads (Memory, SQLite and DynamoDB stores are).
    :param wakeups: an in-process :class:`~statebound.host.wakeup.WakeupSource` (such as
        :class:`~statebound.host.memory_wakeup.MemoryWakeup`) drained at every sweep.
    :raises InvalidArgument: ``interval_s`` or ``lease_s`` not a finite number of seconds
        above 0 and at most :data:`MAX_SECONDS`, ``jitter`` not from 0 to 1, ``batch`` or
        ``workers`` not a whole number from 1 to :data:`MAX_BATCH` or :data:`MAX_WORKERS`.
    """

    def __init__(self, host: Host, interval_s: float = 1.0, jitter: float = 0.2, batch: int = 100,
                 node_id: str | None = None, *, lease_s: float = 30.0, workers: int = 1,
                 wakeups: WakeupSource | None = None) -> None:
        _seconds("interval_s", interval_s)
        _seconds("lease_s", lease_s)
        if not _is_number(jitter) or not 0 <= jitter <= 1:   # nan fails the range test too
            raise InvalidArgument(f"Sweeper jitter must be a number from 0 to 1, not {jitter!r}")
        _count("batch", batch, MAX_BATCH)
        _count("workers", workers, MAX_WORKERS)
        self.host = host
        self.interval_s = interval_s
        self.jitter = jitter
        self.batch = batch
        if node_id is None:
            import socket   # only for a default node id: a sweeper given one never loads it
            node_id = f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"
        self.node_id = node_id
        self.lease_ms = int(lease_s * 1000)
        if self.lease_ms < 1:
            # a 0 ms lease lapses as it is taken: another sweeper could claim, and hand over,
            # the same outbox row at once
            raise InvalidArgument(f"Sweeper lease_s must be at least 0.001 (one millisecond), not {lease_s!r}")
        self.workers = workers
        self.wakeups = wakeups
        self.metrics = SweeperMetrics()
        self._random = random.Random()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: rows a failed sweep claimed and could not give back yet (``_give_back_held``)
        self._stranded: list[TimerRow] = []

    def run_once(self, *, stop: threading.Event | Callable[[], bool] | None = None) -> SweepReport:
        """Fire the rows of due in-process wake-ups, then claim up to ``batch`` due rows and
        fire them; returns what happened.

        :param stop: a deadline: set (an Event) or returning true (a callable) when the sweep
            must start nothing more. It is checked before the claim and before every row, so
            the sweep overruns it by one row at most (by one row per worker with ``workers >
            1``), and the report says ``more``. Rows claimed and not reached are given back
            at once, no attempt counted (``store.release(..., attempt=False)``), so that the
            next sweep takes them before any later row of their instance; one the store does
            not take back keeps the claim until ``lease_s`` lapses. In-process wake-ups taken
            and not reached are handed back to ``wakeups``. With a ``stop``, rows fire one commit each (``workers`` at a time),
            so that the sweep can end between any two; without one, one worker fires them
            with the host's group commit.
        """
        if stop is not None:
            return self._run_until(_stopper(stop))
        empty = 0
        results: list[FireResult] = []
        with _handovers() as handed:
            if self.wakeups is not None:
                due = self.wakeups.take_due(self.host.clock.now_ms())
                if due:
                    woken, empty, _ = self._woken_rows(due)
                    results += self.fire_rows(woken)
            with self._claimed() as rows:
                results += self.fire_rows(rows)
        report = _report(results + handed, empty)
        self.metrics.add(report)
        return report

    def handle_wakeups(self, requests: Iterable[WakeupRequest], *,
                       stop: threading.Event | Callable[[], bool] | None = None) -> SweepReport:
        """Fire the rows these wake-ups name, if they are still pending and ready.

        Each row is read by its key (``store.get_timer``: one consistent read, no index),
        so a stale or duplicated wake-up costs that read and nothing else; a row not due
        yet (released with backoff, or the message came early) is asked for again through
        the host's wake-up backend. Returns what happened.

        :param stop: a deadline, as for :meth:`run_once`, checked before every read and
            every fire. The rows it kept the sweep from are in the report's ``unreached``
            (and ``more`` is set), untouched: getting their wake-ups delivered again is the
            caller's part (``handle_wakeup_event`` reports their SQS messages failed), or
            the fallback fires them.
        """
        if stop is None:
            with _handovers() as handed:
                rows, empty, _ = self._woken_rows(list(requests))
                try:
                    results = self.fire_rows(rows)
                except BaseException:
                    self._give_back_held(_claimed_outbox(rows, self.node_id))   # (woken timers hold no claim)
                    raise
            report = _report(results + handed, empty)
        else:
            stopped = _stopper(stop)
            with _handovers() as handed:
                rows, empty, unread = self._woken_rows(list(requests), stopped)
                try:
                    results, unfired = self._fire_until(rows, stopped)
                except BaseException:
                    self._give_back_held(_claimed_outbox(rows, self.node_id))
                    raise
            # claimed and not fired: given back at once, so that the wake-up's redelivery,
            # to whichever sweeper, finds them claimable instead of waiting out the lease
            self._unclaim(_claimed_outbox(unfired, self.node_id))
            unreached = (*unread, *(r.key for r in unfired))
            report = _report(results + handed, empty, more=bool(unreached), unreached=unreached)
        self.metrics.add(report)
        return report

    def _run_until(self, stopped: Callable[[], bool]) -> SweepReport:
        """``run_once`` with a deadline (see there): the same steps, checked before each."""
        empty = 0
        results: list[FireResult] = []
        unreached: list[TimerKey] = []
        with _handovers() as handed:
            if self.wakeups is not None and not stopped():
                now = self.host.clock.now_ms()
                due = self.wakeups.take_due(now)
                if due:
                    woken, empty, unread = self._woken_rows(due, stopped)
                    fired, unfired = self._fire_until(woken, stopped)
                    self._unclaim(_claimed_outbox(unfired, self.node_id))
                    results += fired
                    if unread or unfired:
                        # taken from the source and not fired: give them back, or they would
                        # wait until a claim finds them (for a DynamoStore written by another
                        # process, its next fallback read of their shards)
                        wanted = {r.key: r.due_at_ms for r in due}
                        back = [(k, wanted[k]) for k in unread] + [(r.key, r.ready_at_ms) for r in unfired]
                        self._give_back(back, now)
                        unreached += [k for k, _ in back]
            if unreached or stopped():
                report = _report(results + handed, empty, more=True, unreached=tuple(unreached))
            else:
                with self._claimed() as rows:
                    fired, unfired = self._fire_until(rows, stopped)
                results += fired
                unreached += [r.key for r in unfired]
                self._unclaim(unfired)
                report = _report(results + handed, empty, more=bool(unfired), unreached=tuple(unreached))
        self.metrics.add(report)
        return report

    def _unclaim(self, rows: Sequence[TimerRow]) -> None:
        """Give claimed rows the sweep did not reach back at once, no attempt counted: left
        claimed until the lease lapsed, a later row of the same instance (due meanwhile, and
        claimed by the next sweep) fired before them. A row that cannot be given back keeps
        the claim, and is taken when it lapses."""
        store = self.host.store
        for row in rows:
            try:
                store.release(row.key, self.node_id, error="", next_attempt_at_ms=row.next_attempt_at_ms,
                              dead=False, attempt=False)
            except StoreUnavailable as exc:
                log.warning("row %s was not reached before the sweep's deadline and could not be given back "
                            "(%s): it is taken again when its claim lapses", row.key, exc)
                return

    @contextmanager
    def _claimed(self) -> Iterator[list[TimerRow]]:
        """A sweep's claim of up to ``batch`` due rows, for the block to fire; rows an earlier
        failed sweep could not give back are given back first, and the block's own, should
        the store fail it part way, after it."""
        if self._stranded:
            self._give_back_held(self._stranded)
        rows = self.host.store.claim_due(self.host.clock.now_ms(), self.batch, self.node_id, self.lease_ms)
        try:
            yield rows
        except BaseException:
            self._give_back_held(rows)
            raise

    def _give_back_held(self, rows: Sequence[TimerRow]) -> None:
        """A sweep failed part way (the store went away mid-group): give back, no attempt
        counted, the claimed rows it did not get to. Left claimed for the lease, a later row
        of the same instance, claimed by the next sweep, fired before them. Each is read
        first: a row that fired is done, and one released with backoff keeps its backoff.
        When the store cannot answer, the rest keep their claims until the lease lapses."""
        store = self.host.store
        for i, row in enumerate(rows):
            try:
                cur = store.get_timer(row.key)
                if cur is None or cur.state not in (PENDING, CLAIMED) or cur.claimed_by not in (None, self.node_id):
                    continue
                store.release(row.key, self.node_id, error="", next_attempt_at_ms=cur.next_attempt_at_ms,
                              dead=False, attempt=False)
            except StoreUnavailable as exc:
                # still busy: the next sweep tries again before it claims anything
                self._stranded = list(rows[i:])
                log.warning("a sweep failed and %d claimed row(s) could not be given back yet (%s)",
                            len(self._stranded), exc)
                return
        self._stranded = []

    def _give_back(self, due: list[tuple[TimerKey, int]], now: int) -> None:
        request = getattr(self.wakeups, "request", None)
        if request is not None:
            request(wakeups_for(due, now, None), now)

    def _woken_rows(self, requests: Sequence[WakeupRequest], stopped: Callable[[], bool] | None = None
                    ) -> tuple[list[TimerRow], int, list[TimerKey]]:
        """The rows the wake-ups name that are ready to fire, how many were empty, and the
        keys not read because ``stopped`` said so."""
        now = self.host.clock.now_ms()
        store = self.host.store
        # An outbox row calls out before its conditional completion, so a woken one is
        # claimed first, or two sweepers given one wake-up (SQS redelivers), or a wake-up
        # and a claim_due, could both hand it over. A timer needs no claim: its fire commits
        # conditionally before anything leaves the process. A store without claim_rows
        # fires woken outbox rows unclaimed, at least once (ADR 0022).
        claim_rows = getattr(store, "claim_rows", None)
        rows: list[TimerRow] = []
        outbox: list[TimerKey] = []
        later: list[tuple[TimerKey, int]] = []
        unread: list[TimerKey] = []
        empty = 0
        keys = list(dict.fromkeys(r.key for r in requests))
        for i, key in enumerate(keys):
            if stopped is not None and stopped():
                unread = keys[i:]   # one read each: a slow store would carry a sweep past its deadline too
                break
            row = store.get_timer(key)
            if row is None or row.state not in (PENDING, CLAIMED):
                empty += 1   # fired, cancelled, waiting, dead or purged since the wake-up was sent
            elif row.state == CLAIMED and row.claimed_by != self.node_id and (row.claim_expires_ms or 0) > now:
                continue     # another sweeper is firing it
            elif row.ready_at_ms > now:
                later.append((key, row.ready_at_ms))
            elif row.kind != TIMER and claim_rows is not None:
                outbox.append(key)
            else:
                rows.append(row)
        if outbox and claim_rows is not None:
            # one left out was claimed by another sweeper since the read (or finished)
            rows += claim_rows(outbox, now, self.node_id, self.lease_ms)
        if later:
            self._ask_again(later, now)
        rows.sort(key=lambda r: (r.ready_at_ms, r.instance_id, r.ordinal))
        return rows, empty, unread

    def _ask_again(self, later: list[tuple[TimerKey, int]], now: int) -> None:
        if self.host.wakeup is not None:
            wake(self.host, later)   # a failure is logged: the fallback read finds them
        elif self.wakeups is not None and hasattr(self.wakeups, "request"):
            self.wakeups.request(wakeups_for(later, now, None), now)

    def fire_rows(self, rows: Sequence[TimerRow]) -> list[FireResult]:
        """Fire claimed (or woken) rows through the host, ``workers`` at a time; the rows of
        one instance in order, one after another. Results come back in ``rows`` order. With
        one worker, the host's group commit (:meth:`Host.fire_many`) takes them together."""
        if self.workers == 1 or len(rows) < 2:
            return self.host.fire_many(rows, node_id=self.node_id)
        return [r for r in self._pooled(rows) if r is not None]

    def _fire_until(self, rows: Sequence[TimerRow], stopped: Callable[[], bool]
                    ) -> tuple[list[FireResult], list[TimerRow]]:
        """``fire_rows`` that checks ``stopped`` before every row; returns the results, in
        ``rows`` order, and the rows not fired.

        Each row is its own commit (``host.fire``): group commit would hand a whole group to
        the store, and its outbox sends to their processors, before the next check, and one
        slow send (an SQS client timing out) is what a deadline has to stop behind."""
        if self.workers == 1 or len(rows) < 2:
            done: list[FireResult] = []
            for i, row in enumerate(rows):
                if stopped():
                    return done, list(rows[i:])
                done.append(self.host.fire(row, node_id=self.node_id))
            return done, []
        results = self._pooled(rows, stopped)
        return [r for r in results if r is not None], [rows[i] for i, r in enumerate(results) if r is None]

    def _pooled(self, rows: Sequence[TimerRow], stopped: Callable[[], bool] | None = None
                ) -> list[FireResult | None]:
        """Fire ``rows`` one commit each, ``workers`` at a time, the rows of one instance in
        order, one after another; each row's result in its place, ``None`` for a row not
        fired because ``stopped`` said so before it (an instance's later rows stop with it:
        they fire in due order)."""
        groups: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.instance_id, []).append(i)
        results: list[FireResult | None] = [None] * len(rows)

        def fire_group(indexes: list[int]) -> None:
            for i in indexes:
                if stopped is not None and stopped():
                    return
                results[i] = self.host.fire(rows[i], node_id=self.node_id)

        pool = self._executor()
        # each group in a copy of this thread's context: its fire spans are children of the
        # caller's span, and its hand-overs are counted in this sweep's report, as with one worker
        futures = [pool.submit(contextvars.copy_context().run, fire_group, idx) for idx in groups.values()]
        # Every group is waited for before any error is raised (a host.fire never raises for a
        # delivery; a store outage does): raised at the first, the sweep gave back rows other
        # workers were still firing, and the next claim called their processors a second time.
        from concurrent.futures import wait   # (loaded with the pool: one worker never needs it)
        wait(futures)
        for future in futures:
            future.result()
        return results

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor   # a sweeper with one worker never needs it
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=f"sweeper-{self.node_id}")
            return self._pool

    def close(self) -> None:
        """Stop the thread pool (a sweeper with ``workers > 1``); idempotent."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def run_until_idle(self, max_sweeps: int = 10_000,
                       stop: threading.Event | Callable[[], bool] | None = None) -> SweepReport:
        """Sweep until nothing is due now, or until ``stop`` is set (an Event) or returns
        true (a callable), checked between sweeps as :meth:`run_forever` does; returns the
        totals."""
        _count("max_sweeps", max_sweeps, 1 << 62)
        _check_stop(stop)
        reports = []
        for _ in range(max_sweeps):
            if stop is not None and (stop.is_set() if isinstance(stop, threading.Event) else stop()):
                break
            r = self.run_once()
            reports.append(r)
            if r.total == 0:
                break
        return _merge(reports)

    def sleep_time(self) -> float:
        """Seconds until the next due row (or in-process wake-up) or the interval (plus
        jitter), whichever is sooner."""
        base = self.interval_s * (1 + self._random.uniform(0, self.jitter))
        times = [self.host.next_due()]
        if self.wakeups is not None:
            times.append(self.wakeups.next_ms())
        known = [t for t in times if t is not None]
        if not known:
            return base
        return max(0.0, min(base, (min(known) - self.host.clock.now_ms()) / 1000))

    def run_forever(self, stop: threading.Event | Callable[[], bool] | None = None) -> SweeperMetrics:
        """Sweep until ``stop`` is set (an Event) or returns true (a callable).

        Stops between sweeps, never mid-fire, so a stop loses nothing.
        """
        _check_stop(stop)
        def stopped() -> bool:
            if stop is None:
                return False
            return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())

        failures = 0
        while not stopped():
            try:
                report = self.run_once()
                failures = 0
            except (StoreUnavailable, ConflictError) as exc:
                # A locked database, a throttled table, or other writers winning every retry
                # is transient: back off and keep going rather than letting one bad moment
                # stop every timer.
                failures += 1
                wait = min(self.interval_s * (2 ** min(failures, 6)), 60.0)
                log.warning("sweep failed (%s); retrying in %.1fs", exc, wait)
                self._wait(stop, wait)
                continue
            if report.total >= self.batch:
                continue  # more may be due: do not sleep
            self._wait(stop, self.sleep_time())
        return self.metrics

    def _wait(self, stop: threading.Event | Callable[[], bool] | None, seconds: float) -> None:
        if isinstance(stop, threading.Event):
            stop.wait(seconds)
        else:
            self.host.clock.sleep(seconds)


def _claimed_outbox(rows: Sequence[TimerRow], node_id: str) -> list[TimerRow]:
    """The outbox rows among ``rows`` that ``node_id`` holds claimed (``_woken_rows`` claims
    them; a woken timer is never claimed, and is left alone)."""
    return [r for r in rows if r.kind != TIMER and r.state == CLAIMED and r.claimed_by == node_id]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(name: str, value: object) -> None:
    # nan slips past `<= 0` (every comparison with it is false): the sweeper would busy-loop
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= MAX_SECONDS):
        raise InvalidArgument(f"Sweeper {name} must be a number of seconds above 0 and at most {MAX_SECONDS} "
                              f"(a week), not {value!r}")


def _count(name: str, value: object, most: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise InvalidArgument(f"Sweeper {name} must be a whole number from 1 to {most}, not {value!r}")


#: The outcome counters of a report, one per :class:`FireResult` outcome.
_COUNTS = ("fired", "discarded", "stale", "failed", "skipped", "delivered", "waiting", "cancelled", "parked")


@contextmanager
def _handovers() -> Iterator[list[FireResult]]:
    """A list that gets the results of the outbox rows the sweep's commits hand over while
    the block runs (``runner.handed_over``)."""
    handed: list[FireResult] = []
    token = handed_over.set(handed)
    try:
        yield handed
    finally:
        handed_over.reset(token)


def _report(results: list[FireResult], empty: int = 0, *, more: bool = False,
            unreached: tuple[TimerKey, ...] = ()) -> SweepReport:
    counts = dict.fromkeys(_COUNTS, 0)
    lags = []
    for r in results:
        if r.outcome in counts:
            counts[r.outcome] += 1
        if r.outcome in ("fired", "delivered"):
            lags.append(r.lag_ms)
    return SweepReport(fired=counts["fired"], discarded=counts["discarded"], stale=counts["stale"],
                       failed=counts["failed"], skipped=counts["skipped"], lag_ms=tuple(lags),
                       delivered=counts["delivered"], waiting=counts["waiting"], cancelled=counts["cancelled"],
                       empty=empty, more=more, unreached=unreached, parked=counts["parked"])


def _merge(reports: list[SweepReport]) -> SweepReport:
    return SweepReport(lag_ms=tuple(x for r in reports for x in r.lag_ms), empty=sum(r.empty for r in reports),
                       more=any(r.more for r in reports), unreached=tuple(k for r in reports for k in r.unreached),
                       **{name: sum(getattr(r, name) for r in reports) for name in _COUNTS})


def _stopper(stop: threading.Event | Callable[[], bool]) -> Callable[[], bool]:
    """``stop`` as a callable, an Event or not (as ``run_forever`` takes either)."""
    _check_stop(stop)
    if isinstance(stop, threading.Event):
        return stop.is_set
    return lambda: bool(stop())


def _check_stop(stop: object) -> None:
    # refused before the sweep claims anything: found at the first check, after the claim,
    # a wrong ``stop`` (a number of seconds, say) left the claimed rows to their lease
    if stop is not None and not isinstance(stop, threading.Event) and not callable(stop):
        raise InvalidArgument(f"stop must be a threading.Event or a callable returning true to stop, "
                              f"not {stop!r}")
