"""The unit of work: run one host call, build its commit, write it, retry on conflict.

A unit (``unit.py``) is a function of a fresh :class:`~statebound.host.unit.Unit`: it
loads what it needs through :func:`load`, delivers (``delivery.py``) and returns the
call's result. :func:`run` gives it one CPU and memory budget, builds the commit from
what it changed (:func:`build_commit`), writes it with one ``store.commit`` and, on a
``ConflictError``, reloads and re-runs the whole unit (the interpreter is deterministic,
so re-running is safe). After the commit lands it asks the wake-up backend to fire the
rows it wrote and hands new outbox rows over (``outbox.py``).

``batch.py`` runs the same units through :func:`attempt` and writes several commits in
one store transaction.

:func:`hand_over` is the one door of the hand-over for both: a sweep that wants to report
the rows its commits handed over (``Sweeper``) sets :data:`handed_over` around its fires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ..datamodel.budget import Budget
from ..exceptions import ChartIdentityMismatch, ConflictError, InstanceExists, InvalidInstanceId
from ..interpreter import Position
from . import history as history_mod
from .routing import offer, restamp
from . import tombstone
from .store import (CLAIMED, DEAD, DELETED, DONE, PENDING, SUSPENDED, Commit, PositionRecord, PositionWrite,
                    TimerCompletion, TimerKey, TimerRow)
from .unit import AlreadyDone, Entry, FireResult, Unit
from .wakeup import wakeups_for

if TYPE_CHECKING:
    from ..chart.model import Chart
    from .host import Host

__all__ = ["run", "attempt", "forget_entries", "landed", "hand_over", "handed_over", "build_commit", "load", "decode",
           "from_bytes", "fetch", "wake", "result", "bare"]

log = logging.getLogger("statebound")

#: Set by a sweep while it fires: a list that gets the ``FireResult`` of every outbox row its
#: commits hand over (``Host.fire`` adds them), which its report then counts. ``None``: nobody
#: counts them (every call that is no sweep's).
handed_over: ContextVar[list[FireResult] | None] = ContextVar("statebound_handed_over", default=None)
#: ``handed_over``'s list, set only while a hand-over runs: the rows a sweep fires itself
#: are in its results already, and must not be counted twice
handing_over: ContextVar[list[FireResult] | None] = ContextVar("statebound_handing_over", default=None)


def run(h: Host, fn: Any, *, creating: str | None = None, completion: Any = None,
        retry_create: bool = False) -> Any:
    """Run unit ``fn`` to a landed commit and return its result.

    :param creating: the instance a start creates: a conflict on it is ``InstanceExists``
        (unless ``retry_create``: a start with an idempotency key re-runs and finds it).
    :param completion: ``completion(result)``, the :class:`TimerCompletion` the commit carries.
    :raises AlreadyDone: the row being completed was finished by someone else.
    """
    last: ConflictError | None = None
    # one budget for the call, retries included: a retry re-runs the same drives
    budget = Budget(h.max_cpu_ms, h.max_memory_bytes).start()
    for n in range(h.max_conflict_retries):
        if n:
            # Writers that collided retry at once and collide again; a random pause,
            # growing with each attempt, spreads them out (full jitter).
            time.sleep(h._random.uniform(0, min(h.conflict_backoff_s * (2 ** n), 0.25)))
        u, res, commit = attempt(h, fn, completion, None, budget)
        forget_entries(u)
        try:
            if not commit.empty:
                h.store.commit(commit)
                h.metrics.add("commits")
        except ConflictError as exc:
            h.metrics.add("conflicts")
            last = exc
            if creating is not None and exc.instance_id == creating and not retry_create:
                raise InstanceExists(creating) from None
            c = commit.complete
            if c is not None:
                # a row finished by someone else cannot be finished by a retry
                cur = h.store.get_timer(c.key)
                if cur is None or cur.state in (DONE, DEAD) or (
                        c.node_id is not None and cur.state == CLAIMED and cur.claimed_by not in (None, c.node_id)) or (
                        c.state == SUSPENDED and cur.state == SUSPENDED):   # parking a row the suspend parked
                    raise AlreadyDone() from None
            continue
        deliver = landed(h, u.deliver, commit)
        if deliver:
            hand_over(h, deliver)
        return res
    assert last is not None
    raise last


def attempt(h: Host, fn: Any, completion: Any, cache: dict[str, PositionRecord | None] | None = None,
            budget: Budget | None = None, counts: dict[str, int] | None = None) -> tuple[Unit, Any, Commit]:
    """Run a unit once, from fresh loads (or ``cache``, in a batch), and build its commit.

    ``budget`` is the call's (``run`` shares one across retries); a unit of a group gets
    its own, started now, since a budget counts this thread's CPU from its start.
    The unit's drives (its deliveries and starts) are added to ``host.metrics`` once it
    ends, or to ``counts`` (a group adds those to the metrics once for all its units)."""
    if budget is None:
        budget = Budget(h.max_cpu_ms, h.max_memory_bytes).start()
    u = Unit(cache=cache, budget=budget)
    try:
        res = fn(u)
        return u, res, build_commit(h, u, completion(res) if completion else None)
    except BaseException:
        forget_entries(u)   # a failed unit is dropped too: free it now, not at the next full collection
        raise
    finally:
        drives = u.deliveries + u.starts
        if drives:
            if counts is None:
                h.metrics.add("drives", drives)
            else:
                counts["drives"] = counts.get("drives", 0) + drives


def forget_entries(u: Unit) -> None:
    """Drop the unit's entries once its commit is built (nothing reads them after).

    An entry's ``routes`` (in its ``driver``, or a stamped position's) closes over its
    unit, so unit -> entry -> routes -> unit is a reference cycle: left alone, every unit
    and what it loaded would wait for the cycle collector, which a group of a hundred units
    keeps busy. Clearing the entries breaks the cycle and lets reference counting free them
    at once."""
    u.entries.clear()


def landed(h: Host, deliver: set[TimerKey], commit: Commit) -> list[TimerRow]:
    """A unit's commit landed: ask the wake-up backend to fire the pending rows it wrote,
    and return the outbox rows to hand over now: ``deliver``, the unit's own
    (``Unit.deliver``; those are not woken, they are handed over)."""
    if commit.timers_put and h.wakeup is not None:
        wake(h, ((r.key, r.ready_at_ms) for r in commit.timers_put if r.state == PENDING and r.key not in deliver))
    if not deliver:
        return []
    rows = [r for r in commit.timers_put if r.key in deliver]
    if h._tracing is not None:
        h._tracing.handed(rows, commit.writes)
    return rows


def hand_over(h: Host, rows: list[TimerRow]) -> None:
    """Hand landed outbox rows over (``Outbox.after_commit``), their results counted for the
    sweep that wants them (:data:`handed_over`)."""
    sink = handed_over.get()
    tracing = h._tracing
    if sink is None and tracing is None:
        h._outbox.after_commit(rows)
        return
    token = handing_over.set(sink)
    try:
        if tracing is None:
            h._outbox.after_commit(rows)
        else:
            with tracing.handing_over():
                h._outbox.after_commit(rows)
    finally:
        handing_over.reset(token)


def wake(h: Host, due: Iterable[tuple[TimerKey, int]]) -> None:
    """Ask the wake-up backend to fire these rows ``(key, ready_at_ms)`` on time. Runs
    after a commit landed, so a failure is logged, never raised: the rows are the truth."""
    if h.wakeup is None:
        return
    now = h.clock.now_ms()
    requests = wakeups_for(due, now, h.wakeup.horizon_ms)
    if requests:
        try:
            h.wakeup.request(requests, now)
        except Exception as exc:  # the sweeper's fallback read will find the rows
            log.warning("wake-up request for %d row(s) failed: %s", len(requests), exc)


def build_commit(h: Host, u: Unit, completion: TimerCompletion | None) -> Commit:
    """Everything unit ``u`` changed, as one :class:`Commit`."""
    writes = []
    deleted: set[str] = set()
    codec = h.codec
    for iid, e in u.entries.items():
        if e.deleted:
            deleted.add(iid)
            rec = e.record
            if rec is not None and rec.status != DELETED:   # (a tombstone loaded stays as it is)
                # a tombstone, not an erasure: the id's next instance goes on from this
                # version and ordinal (tombstone.py)
                last = e.position.ordinal if e.position is not None else 0
                writes.append(PositionWrite(iid, e.chart_name, rec.version, tombstone.blob(last), DELETED))
            continue
        if not e.dirty:
            if e.decoded and e.record is not None:   # kept now, not at the load: most loads are rewritten
                h._decoded.put(iid, e.record.blob, bare(e))
            continue
        assert e.position is not None
        blob = e.position.to_bytes(codec)
        if codec == "msgpack":   # the next load of these bytes, if nobody writes in between, is this position
            h._decoded.put(iid, blob, bare(e))
        writes.append(PositionWrite(iid, e.chart_name, None if e.record is None else e.record.version, blob,
                                    SUSPENDED if e.suspended else e.position.status, tuple(e.refs), e.parent,
                                    tuple(e.keys)))
    if h._tracing is not None:
        iid = u.call.get("instance", "")
        called = u.entries.get(iid)
        if called is not None and called.position is not None:
            h._tracing.note(iid, called.chart_name, called.position.chart.identity)
    puts = tuple(r for r in u.puts.values() if r.instance_id not in deleted) if deleted else tuple(u.puts.values())
    dels = tuple(k for k in dict.fromkeys(u.deletes) if k[0] not in deleted and k != u.protected) \
        if u.deletes else ()
    expect = tuple(u.expect.items()) if u.expect else ()
    if h.history is None:
        return Commit(tuple(writes), puts, dels, completion, timers_expect=expect)
    return Commit(tuple(writes), puts, dels, completion,
                  history_mod.records(h.history, u, writes, h.clock.now_ms()), h.history.keep, True, expect)


def load(h: Host, u: Unit, instance_id: str) -> Entry | None:
    """The instance as unit ``u`` sees it (loaded once per unit), or ``None`` if it does not exist."""
    e = u.entries.get(instance_id)
    if e is not None:
        return None if e.deleted else e
    rec = fetch(h, u, instance_id)
    if rec is None or rec.status == DELETED:
        u.missing.add(instance_id)
        if rec is not None:   # a deleted instance's tombstone: kept for a start on its id
            u.entries[instance_id] = Entry(rec, None, rec.chart, [], None, deleted=True)
        return None
    chart = h._chart_for_blob(rec.chart, rec.blob)
    pos = h._decoded.get(instance_id, rec.blob, chart)
    decoded = pos is None
    if pos is None:
        pos = from_bytes(h, rec.chart, rec.blob, chart)
    # the position stays as decoded: its drives get this host's per-driver fields beside it
    e = Entry(rec, pos, rec.chart, list(rec.timers), rec.parent, keys=list(rec.idempotency),
              suspended=rec.status == SUSPENDED, bare=(pos, pos), decoded=decoded, driver=offer(h, u, pos))
    if h.history is not None:
        e.steps = []
    u.entries[instance_id] = e
    return e


def decode(h: Host, instance_id: str, blob: bytes, chart_name: str) -> Position:
    """The position in a stored blob: the one this host kept for exactly these bytes
    (``decoded.py``), else decoded and checked against its chart, and kept."""
    chart = h._chart_for_blob(chart_name, blob)
    pos = h._decoded.get(instance_id, blob, chart)
    if pos is None:
        pos = from_bytes(h, chart_name, blob, chart)
        h._decoded.put(instance_id, blob, pos)
    return pos


def from_bytes(h: Host, chart_name: str, blob: bytes, chart: Chart) -> Position:
    """Decode a stored blob against ``chart``; a blob of a revision this host does not hold
    is decoded against the one ``Host(find_revision=...)`` finds, if it finds one."""
    try:
        return Position.from_bytes(blob, chart)
    except ChartIdentityMismatch as exc:
        found = h._found_revision(chart_name, exc.found[0])
        if found is None:
            raise
    return Position.from_bytes(blob, found)


def fetch(h: Host, u: Unit, instance_id: str) -> PositionRecord | None:
    """An instance's stored record: read ahead by a batch, else loaded now."""
    cache = u.cache
    if cache is not None and instance_id in cache:
        return cache[instance_id]
    try:
        return h.store.load(instance_id)
    except InvalidInstanceId:
        # an invoked child's id (parent::invokeid) past the store's key limit: the host
        # never starts such a child (children.invoke), so it does not exist
        if "::" in instance_id:
            return None
        raise


def result(u: Unit, instance_id: str) -> Position:
    """The position a call returns: the instance's, without the unit's per-driver fields."""
    return bare(u.entries[instance_id])


def bare(e: Entry) -> Position:
    """The entry's position without the unit's per-driver fields (made once per position)."""
    pos = e.position
    assert pos is not None
    done = e.bare
    if done is not None and done[0] is pos:
        return done[1]
    out = restamp(pos)
    e.bare = (pos, out)
    return out
