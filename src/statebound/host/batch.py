"""Group commit: many independent host calls, one store transaction.

``host.send_many`` and ``host.fire_many`` (and so ``fire_due`` and the sweeper) run one
unit of work per item, exactly the one ``send`` or ``fire`` would run, but hand the commits
of up to ``Host(max_batch=...)`` units to ``store.commit_many`` together: on SQLite that is
one transaction and one fsync for the lot, instead of one each. The records the items
name are read first with one ``store.load_many`` (SQLite: one ``SELECT ... IN``;
DynamoDB: ``BatchGetItem``).

What keeps a batch equal to the same calls made one after another:

* **Disjoint units.** The units of one group touch disjoint instances. An item whose
  instance an earlier unit of the group touched (the same instance twice, or a send that
  is routed to a parent or a child the group drives) closes the group: the group commits,
  then the item runs on what it wrote. The items of one instance are therefore applied in
  input order, and an idempotency key repeated within a batch is found like one repeated
  across calls.
* **Each commit all or nothing.** The store applies each commit of the group on its own
  terms (SQLite: a savepoint each). A commit that conflicts writes nothing and its item
  runs again **alone**, reloading, with the usual retries; one that cannot be stored
  (too large, unserializable) fails alone. No item waits on, or fails with, another's error.
* **Crashes.** Until the group's transaction commits nothing of it is written; after, all
  of it. A caller that re-sends an unacknowledged batch with idempotency keys applies each
  item once; a sweeper's claims lapse and the rows fire again.
* **Outbox rows** the group wrote are handed to their processors and handlers after the
  group's commit, as a single call's are after its own.

Each unit of a group has the CPU and memory budget of one host call (``Host(max_cpu_ms=...)``);
a unit re-run alone after a conflict starts a fresh one, since a budget counts this thread's
CPU from its start and the group ran other units in between.

Outbox rows in ``fire_many`` (sends, invokes, cancels) call the outside world before they
commit, so each is fired on its own, in its place in the claimed order.

A store without ``commit_many`` (a wrapper, an older backend) gets one commit per item.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._fastinit import fast_init
from ..exceptions import ConflictError, StateboundError
from ..interpreter import Position
from . import firing, runner
from ..events import Event
from .store import TIMER, Commit, PositionRecord, TimerCompletion, TimerKey, TimerRow, commit_instance_ids
from .unit import FireResult, Unit

if TYPE_CHECKING:
    from .host import Host
    from .tracing import Tracing

__all__ = ["SendResult", "GroupCommit", "Job", "SendJob", "FireJob"]

log = logging.getLogger("statebound")


@fast_init
@dataclass(frozen=True, slots=True)
class SendResult:
    """What ``host.send_many`` did with one item.

    Exactly one of ``position`` and ``error`` is set.

    :ivar index: the item's position in the input.
    :ivar instance_id: the instance it was addressed to (``None`` if the item had none).
    :ivar position: the instance's position after the event and everything it caused
        (for a repeated idempotency key, its current position), as ``host.send`` returns it.
    :ivar error: what ``host.send`` would have raised for this item, with nothing of the
        item written: ``InstanceNotFound``, ``NotRunning``, ``IdempotencyKeyReused``,
        ``InvalidBatchItem``, a ``StoreError``...
    """

    index: int
    instance_id: str | None
    position: Position | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        """Whether the item was applied (or was a repeat of an applied key)."""
        return self.error is None

    def unwrap(self) -> Position:
        """The position, or raise the item's error."""
        if self.error is not None:
            raise self.error
        assert self.position is not None
        return self.position


class Job:
    """One item of a batch: :meth:`unit` runs it in a group, :meth:`alone` on its own;
    an item with ``grouped`` false only ever runs alone.

    Slotted, and its unit a method rather than a closure kept beside it: a batch holds
    every job until it returns, and each closure (its cells, its tuple) or instance
    ``__dict__`` would be that many more objects for the cycle collector to walk.
    """

    __slots__ = ("grouped", "ids", "span")

    #: the instances the item is addressed to, known before it runs
    ids: tuple[str, ...]
    grouped: bool
    #: the item's span, on a host with a tracer, from when its unit first runs until its
    #: outcome is known (``tracing.py``)
    span: Any

    def __init__(self, ids: tuple[str, ...] = (), grouped: bool = False) -> None:
        self.ids = ids
        self.grouped = grouped
        self.span = None

    def trace(self, tracing: Tracing) -> None:
        """Open the item's span and carry its traceparent in what the unit hands on."""

    def end_span(self, tracing: Tracing | None, outcome: str, error: BaseException | None = None) -> None:
        """Finish the item's span, if it has one."""
        if self.span is not None:
            assert tracing is not None
            span, self.span = self.span, None
            tracing.end(span, outcome, error)

    def unit(self, u: Unit) -> Any:
        """The item's unit of work (``runner.py``), run in a group when ``grouped``."""
        raise NotImplementedError

    def completion(self, result: Any) -> TimerCompletion | None:
        """The row completion the unit's commit carries, if any."""
        return None

    def done(self, result: Any) -> None:
        """The unit's commit landed (or it had nothing to write)."""

    def outcome(self, result: Any) -> str | None:
        """The ``host.metrics`` total a landed unit adds one to, if any (counted per group)."""
        return None

    def failed(self, exc: Exception) -> None:
        """The item failed with nothing of it written."""

    def alone(self) -> None:
        """Run the whole call on its own, with its own reloads and retries."""


class SendJob(Job):
    """An item of ``send_many``: the event as ``host.send`` would deliver it."""

    __slots__ = ("caller_context", "event", "fingerprint", "host", "index", "key", "results")

    def __init__(self, host: Host, results: list[SendResult | None], index: int, instance_id: str,
                 event: Event, key: str | None, fingerprint: bytes, caller_context: Any) -> None:
        super().__init__((instance_id,), True)
        self.host, self.results, self.index = host, results, index
        self.event, self.key, self.fingerprint, self.caller_context = event, key, fingerprint, caller_context

    def trace(self, tracing: Tracing) -> None:
        self.span, self.caller_context = tracing.open("send", self.ids[0], self.event.name, self.caller_context)

    def unit(self, u: Unit) -> Position:
        return self.host._send_step(u, self.ids[0], self.event, self.key, self.fingerprint, self.caller_context)

    def done(self, result: Any) -> None:
        self.results[self.index] = SendResult(self.index, self.ids[0], result)
        self.end_span(self.host._tracing, "ok")

    def failed(self, exc: Exception) -> None:
        self.results[self.index] = SendResult(self.index, self.ids[0], None, exc)
        self.end_span(self.host._tracing, "", exc)

    def alone(self) -> None:
        tracing = self.host._tracing
        if tracing is not None and self.span is None:
            self.trace(tracing)
        try:
            if self.span is None:
                result = runner.run(self.host, self.unit)
            else:
                with tracing.within(self.span, self.ids[0]):
                    result = runner.run(self.host, self.unit)
        except Exception as exc:  # the item's own error, reported in its slot
            self.failed(exc)
            return
        self.done(result)


class FireJob(Job):
    """A claimed row of ``fire_many``: a timer runs in the group, an outbox row alone."""

    __slots__ = ("host", "index", "lag", "node", "results", "row")

    def __init__(self, host: Host, results: list[FireResult | None], index: int, row: TimerRow, node: str) -> None:
        self.host, self.results, self.index, self.row, self.node = host, results, index, row, node
        self.lag = max(0, host.clock.now_ms() - row.ready_at_ms)
        super().__init__((row.instance_id,) if row.target_id == row.instance_id else (row.instance_id, row.target_id),
                         row.kind == TIMER)

    def trace(self, tracing: Tracing) -> None:
        self.span, self.row = tracing.open_fire(self.row)

    def unit(self, u: Unit) -> tuple[str, str | None]:
        return firing.fire_step(self.host, self.row, u)

    def completion(self, result: Any) -> TimerCompletion | None:
        return firing.fire_completion(self.row, self.node, result)

    def done(self, result: Any) -> None:
        self.results[self.index] = FireResult(self.row.key, result[0], result[1], self.lag)
        self.end_span(self.host._tracing, result[0])

    def outcome(self, result: Any) -> str | None:
        return result[0]

    def failed(self, exc: Exception) -> None:
        # a delivery failure is the row's outcome, as in a traced fire
        self._settle(lambda: firing.fire_failed(self.host, self.row, self.node, exc, self.lag))

    def alone(self) -> None:
        if self.span is None:   # never ran in the group (an outbox row): a traced fire of its own
            self.results[self.index] = self.host.fire(self.row, node_id=self.node)
            return
        with self.host._tracing.within(self.span, self.row.target_id, body=True):
            self._settle(lambda: self.host.fire(self.row, node_id=self.node))

    def _settle(self, result: Callable[[], FireResult]) -> None:
        """Keep the row's result and end its span with its outcome, or with the error that
        kept it from having one (the store is down)."""
        try:
            res = self.results[self.index] = result()
        except BaseException as exc:
            self.end_span(self.host._tracing, "", exc)
            raise
        self.end_span(self.host._tracing, res.outcome)


class GroupCommit:
    """Runs jobs in groups of disjoint units, one ``commit_many`` per group.

    Private to :class:`~statebound.Host`, which owns one.
    """

    def __init__(self, host: Host) -> None:
        self.host = host

    def run(self, jobs: Sequence[Job]) -> None:
        """Run every job; each reports its own result through ``done``/``failed``.

        An error no job can take as its own (``commit_many`` raising something that is no
        ``StateboundError``: a driver bug) propagates, and ends the spans still open with it.
        """
        tracing = self.host._tracing
        if tracing is None:
            self._run(jobs)
            return
        try:
            self._run(jobs)
        except BaseException as exc:
            for job in jobs:
                job.end_span(tracing, "", exc)
            raise

    def _run(self, jobs: Sequence[Job]) -> None:
        h = self.host
        commit_many = getattr(h.store, "commit_many", None)
        if commit_many is None or h.max_batch <= 1:
            for job in jobs:
                job.alone()
            return
        cache: dict[str, PositionRecord | None] = {}
        tracing = h._tracing   # a span per item, open from its unit's run to its outcome
        i = 0
        while i < len(jobs):
            window = jobs[i:i + h.max_batch]
            self._prefetch(window, cache)
            # a unit's outbox rows to hand over are all the group keeps of it: the unit itself
            # (a dozen containers) is freed as soon as its commit is built
            group: list[tuple[Job, set[TimerKey], Any, Commit]] = []
            touched: set[str] = set()
            # what the group adds to host.metrics, added once for all its units (the
            # counters take a lock): the units' drives, then the commits and outcomes
            counts: dict[str, int] = {}
            for job in window:
                if not touched.isdisjoint(job.ids):
                    break               # the group commits first; this job then sees its writes
                if not job.grouped:
                    job.alone()
                    for iid in job.ids:
                        cache.pop(iid, None)
                    i += 1
                    continue
                try:
                    if tracing is None:
                        u, result, commit = runner.attempt(h, job.unit, job.completion, cache, counts=counts)
                    else:
                        if job.span is None:
                            job.trace(tracing)
                        # (on the instance its unit is called for: a fire's target, last of its ids)
                        with tracing.within(job.span, job.ids[-1]):
                            u, result, commit = runner.attempt(h, job.unit, job.completion, cache, counts=counts)
                except Exception as exc:  # refused (unknown instance, halted...) or a drive failure
                    job.failed(exc)
                    i += 1
                    continue
                mine = commit_instance_ids(commit)   # a fresh set: add the rest to it
                mine.update(u.entries)
                runner.forget_entries(u)
                if u.missing:
                    mine |= u.missing
                if not touched.isdisjoint(mine):
                    break               # routed into the group's instances: run it again after
                touched |= mine
                group.append((job, u.deliver, result, commit))
                i += 1
            self._flush(group, commit_many, counts)
            if counts:
                h.metrics.add_many(counts)
            for iid in touched:
                cache.pop(iid, None)

    def _prefetch(self, window: Sequence[Job], cache: dict[str, PositionRecord | None]) -> None:
        load_many = getattr(self.host.store, "load_many", None)
        if load_many is None:
            return
        want = list(dict.fromkeys(iid for job in window if job.grouped for iid in job.ids
                                  if iid not in cache))
        if not want:
            return
        try:
            found = load_many(want)
        except StateboundError as exc:  # e.g. an id this store cannot key: each unit loads, and fails, alone
            log.debug("batch load of %d instance(s) failed (%s); loading one by one", len(want), exc)
            return
        for iid in want:
            cache[iid] = found.get(iid)

    def _flush(self, group: list[tuple[Job, set[TimerKey], Any, Commit]], commit_many: Any,
               tally: dict[str, int]) -> None:
        if not group:
            return
        h = self.host
        commits = [c for _, _, _, c in group]
        outcomes: list[Exception | None]
        if all(c.empty for c in commits):
            outcomes = [None] * len(group)
        else:
            try:
                outcomes = list(commit_many(commits))
            except StateboundError as exc:  # the store wrote none of them: the error is everyone's
                for job, *_ in group:
                    job.failed(exc)
                return
            tally["group_commits"] = 1
        deliver: list[TimerRow] = []
        landed = 0
        for (job, handover, result, commit), err in zip(group, outcomes, strict=True):
            if err is None:
                if not commit.empty:
                    landed += 1
                deliver.extend(runner.landed(h, handover, commit))
                job.done(result)
                name = job.outcome(result)
                if name is not None:
                    tally[name] = tally.get(name, 0) + 1
            elif isinstance(err, ConflictError):
                h.metrics.add("conflicts")
                job.alone()             # reload and retry on its own, as a single call would
            else:
                job.failed(err)
        if landed:
            tally["commits"] = landed
        if deliver:
            runner.hand_over(h, deliver)
