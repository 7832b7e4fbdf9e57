"""The Sweeper: fires due timer rows back into their positions, exactly once.

It runs anywhere a loop can: ``run_once()`` from a batch job or a Lambda function,
``run_until_idle()`` to drain, ``run_forever(stop)`` as a long-running process. Several
sweepers may share one store: rows are claimed under a lease (``lease_s``), so a sweeper
that dies mid-claim loses the claim when the lease runs out, and the completion in the
fire's commit is conditional, so a row is applied at most once.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..exceptions import StoreUnavailable
from .host import FireResult, Host

log = logging.getLogger("statebound")

__all__ = ["Sweeper", "SweepReport", "SweeperMetrics"]


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one ``run_once`` did.

    :ivar lag_ms: for each fired row, how late it fired relative to its due time.
    :ivar delivered: outbox sends handed to their processors.
    :ivar waiting: invocations whose handler will answer later.
    :ivar cancelled: invocations cancelled (their cancel hooks called).
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

    @property
    def total(self) -> int:
        """Rows handled in this sweep."""
        return (self.fired + self.discarded + self.stale + self.failed + self.skipped + self.delivered
                + self.waiting + self.cancelled)

    @property
    def max_lag_ms(self) -> int:
        """The worst lag in this sweep (0 when nothing fired)."""
        return max(self.lag_ms, default=0)


@dataclass
class SweeperMetrics:
    """Running totals a user can read (``sweeper.metrics``)."""

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

    def add(self, report: SweepReport) -> None:
        """Fold one sweep's report in."""
        self.sweeps += 1
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
    """

    def __init__(self, host: Host, interval_s: float = 1.0, jitter: float = 0.2, batch: int = 100,
                 node_id: str | None = None, *, lease_s: float = 30.0) -> None:
        if interval_s <= 0 or batch < 1 or not 0 <= jitter <= 1 or lease_s <= 0:
            raise ValueError("interval_s and lease_s must be > 0, batch >= 1 and 0 <= jitter <= 1")
        self.host = host
        self.interval_s = interval_s
        self.jitter = jitter
        self.batch = batch
        self.node_id = node_id or f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"
        self.lease_ms = int(lease_s * 1000)
        self.metrics = SweeperMetrics()
        self._random = random.Random()

    def run_once(self) -> SweepReport:
        """Claim up to ``batch`` due rows and fire each; returns what happened."""
        results = self.host.fire_due(self.batch, node_id=self.node_id, lease_ms=self.lease_ms)
        report = _report(results)
        self.metrics.add(report)
        return report

    def run_until_idle(self, max_sweeps: int = 10_000) -> SweepReport:
        """Sweep until nothing is due now; returns the totals."""
        reports = []
        for _ in range(max_sweeps):
            r = self.run_once()
            reports.append(r)
            if r.total == 0:
                break
        return _merge(reports)

    def sleep_time(self) -> float:
        """Seconds until the next due row or the interval (plus jitter), whichever is sooner."""
        base = self.interval_s * (1 + self._random.uniform(0, self.jitter))
        nd = self.host.next_due()
        if nd is None:
            return base
        return max(0.0, min(base, (nd - self.host.clock.now_ms()) / 1000))

    def run_forever(self, stop: threading.Event | Callable[[], bool] | None = None) -> SweeperMetrics:
        """Sweep until ``stop`` is set (an Event) or returns true (a callable).

        Stops between sweeps, never mid-fire, so a stop loses nothing.
        """
        def stopped() -> bool:
            if stop is None:
                return False
            return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())

        failures = 0
        while not stopped():
            try:
                report = self.run_once()
                failures = 0
            except StoreUnavailable as exc:
                # A locked database or a throttled table is transient: back off and keep
                # going rather than letting one bad moment stop every timer.
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


#: The outcome counters of a report, one per :class:`FireResult` outcome.
_COUNTS = ("fired", "discarded", "stale", "failed", "skipped", "delivered", "waiting", "cancelled")


def _report(results: list[FireResult]) -> SweepReport:
    counts = dict.fromkeys(_COUNTS, 0)
    lags = []
    for r in results:
        if r.outcome in counts:
            counts[r.outcome] += 1
        if r.outcome in ("fired", "delivered"):
            lags.append(r.lag_ms)
    return SweepReport(lag_ms=tuple(lags), **counts)


def _merge(reports: list[SweepReport]) -> SweepReport:
    return SweepReport(lag_ms=tuple(x for r in reports for x in r.lag_ms),
                       **{name: sum(getattr(r, name) for r in reports) for name in _COUNTS})
