"""The Host: load, drive, turn effects into timer rows and routed events, commit once.

One public call (``start``, ``send``, ``fire``, ``delete``) is one unit of work:

1. load the records it needs (the instance, and any instance an event is routed to);
2. drive: the event, then every immediate send it causes (to itself, its parent, its
   children, other sessions), FIFO, within a delivery budget;
3. commit everything in **one** :meth:`Store.commit`: each position conditional on the
   version loaded, the new timer rows, the cancelled rows and the completed fired row.

A crash before the commit applies nothing; after it, everything. A version conflict
reloads and re-runs the whole unit (the interpreter is deterministic, so re-running is
safe). Nothing is written when a call is refused (unknown instance, halted, exists).
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..chart.compiler import compile_content_child, compile_src_child
from ..chart.model import Chart
from ..effects import (Autoforward, BudgetExhausted, Cancel, CancelInvoke, Done, Invoke, Log, Send,
                       SendDelayed)
from urllib.parse import quote, quote_plus, unquote, urlencode

from ..events import BASICHTTP_PROCESSOR, SCXML_PROCESSOR, Event
from ..exceptions import (ChartError, ConflictError, InstanceExists, InstanceNotFound, NotRunning,
                          PositionError, StateboundError, UnknownChart)
from ..interpreter import Interpreter, Position
from ..position import read_header
from ..interpreter.state import RUNNING
from .clock import Clock, SystemClock
from .memory import MemoryStore
from .store import (CLAIMED, DEAD, DONE, PENDING, Commit, PositionRecord, PositionWrite, Store,
                    TimerCompletion, TimerKey, TimerRef, TimerRow)

__all__ = ["Host", "FireResult", "child_instance_id"]

log = logging.getLogger("statebound")


def child_instance_id(parent_id: str, invokeid: str) -> str:
    """The instance id of the child session an ``<invoke>`` starts."""
    return f"{parent_id}::{invokeid}"


@dataclass(frozen=True, slots=True)
class FireResult:
    """What happened to one timer row: ``fired``, ``discarded``, ``stale``, ``skipped`` or ``failed``."""

    key: TimerKey
    outcome: str
    reason: str | None = None
    lag_ms: int = 0


@dataclass
class _Entry:
    record: PositionRecord | None
    position: Position | None
    chart_name: str
    refs: list[TimerRef]
    parent: str | None
    dirty: bool = False
    deleted: bool = False


@dataclass
class _Unit:
    """The working set of one host call."""

    entries: dict[str, _Entry] = field(default_factory=dict)
    queue: deque[tuple[str, Event, Any]] = field(default_factory=deque)
    puts: dict[TimerKey, TimerRow] = field(default_factory=dict)
    deletes: list[TimerKey] = field(default_factory=list)
    protected: TimerKey | None = None   # the row being fired: completed, never deleted
    deliveries: int = 0


class Host:
    """Runs chart instances against a :class:`~statebound.host.store.Store`.

    :param charts: charts this host can run (by name; invoked sub-charts register too).
    :param store: the backend; a fresh :class:`MemoryStore` by default.
    :param clock: time source for timer due dates; :class:`SystemClock` by default.
    :param max_rounds: the interpreter's microstep budget per drive.
    :param max_deliveries: events one host call may process (its own plus routed ones);
        any left over are written as timer rows due now, so nothing is lost.
    :param max_conflict_retries: reload-and-retry attempts on a version conflict.
    :param conflict_backoff_s: base of the random, growing pause between those attempts.
    :param max_attempts: failed deliveries of one timer row before it is parked as dead.
    :param backoff_ms: base of the exponential backoff between delivery attempts.
    :param codec: position blob codec, ``"msgpack"`` or ``"cbor"``.
    :param on_log: called as ``on_log(instance_id, label, value)`` for ``<log>``;
        defaults to the ``statebound`` logger at INFO.
    :param http_base: base URL of this host's Basic HTTP event I/O processor. Each instance
        is offered ``{http_base}/instances/{id}/events`` as its
        ``_ioprocessors['basichttp']['location']`` (the route the Lambda example serves).
        Basic HTTP sends to such a URL are delivered directly, without a network round trip;
        sends to other URLs get ``error.communication``. ``None`` disables the processor.
    """

    def __init__(self, charts: Iterable[Chart] = (), store: Store | None = None, clock: Clock | None = None, *,
                 max_rounds: int = 10_000, max_deliveries: int = 1_000, max_conflict_retries: int = 12,
                 conflict_backoff_s: float = 0.001,
                 max_attempts: int = 5, backoff_ms: int = 1_000, codec: str = "msgpack",
                 on_log: Any = None, node_id: str | None = None,
                 http_base: str | None = "http://statebound.invalid") -> None:
        self.store: Store = store if store is not None else MemoryStore()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.max_rounds = max_rounds
        self.max_deliveries = max_deliveries
        self.max_conflict_retries = max_conflict_retries
        self.conflict_backoff_s = conflict_backoff_s
        self._random = random.Random()
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.codec = codec
        self.on_log = on_log
        self.node_id = node_id or "host"
        self.http_base = http_base.rstrip("/") if http_base else None
        self._charts: dict[str, Chart] = {}
        self._revisions: dict[str, dict[str, Chart]] = {}
        self._interpreters: dict[str, Interpreter] = {}   # by chart identity
        #: counters a user can read: commits, conflicts, fired, discarded, stale, failed...
        self.metrics: dict[str, int] = {"commits": 0, "conflicts": 0, "drives": 0, "budget_exhausted": 0}
        for c in charts:
            self.register(c)

    # ------------------------------------------------------------------ charts
    def register(self, chart: Chart) -> None:
        """Make ``chart`` (and the charts it invokes) available by name.

        Registering a second chart under a name already taken adds a *revision*: new
        instances start on the chart registered last, and every stored position keeps
        running on the revision whose identity its blob carries. That is the "drain on the
        old chart" migration of ``docs/persistence.md``: keep the old revision registered
        until no position needs it.
        """
        if not isinstance(chart, Chart):
            raise TypeError(f"register() takes a Chart, not {type(chart).__name__}")
        self._charts[chart.name] = chart
        self._revisions.setdefault(chart.name, {})[chart.identity] = chart
        if chart.identity not in self._interpreters:
            self._interpreters[chart.identity] = Interpreter(chart, max_rounds=self.max_rounds)
        for sub in chart.subcharts:
            self.register(sub)

    def _chart_for_blob(self, name: str, blob: bytes) -> Chart:
        """The registered revision of chart ``name`` that this blob was written for."""
        latest = self.chart(name)
        revisions = self._revisions.get(name, {})
        if len(revisions) > 1:
            try:
                return revisions.get(read_header(blob).identity, latest)
            except PositionError:
                pass  # from_bytes will report the damage precisely
        return latest

    def chart(self, name: str) -> Chart:
        """The registered chart called ``name``."""
        try:
            return self._charts[name]
        except KeyError:
            pass
        chart = self._resolve_src_chart(name)
        if chart is None:
            raise UnknownChart(name)
        self.register(chart)
        return chart

    def _resolve_src_chart(self, name: str) -> Chart | None:
        """A chart that an ``<invoke src>``/``srcexpr`` loaded at run time is named
        ``{parent}/{state}.src:{src}`` and was registered only in the process that ran the
        invoke. Any other host on the store (a restarted process, a sweeper, the CLI) re-reads
        it from beside the parent chart; the blob's identity check catches a changed file."""
        head, sep, src = name.rpartition(".src:")
        if not sep or "/" not in head or not src:
            return None
        try:
            parent = self.chart(head.rsplit("/", 1)[0])
            # under the parent's policy (containment, trust) again: the identity check of the
            # blob then also proves the child was reloaded as trusted as it was written
            return compile_src_child(parent, src, name)
        except StateboundError:
            return None

    @property
    def charts(self) -> Mapping[str, Chart]:
        """The registered charts by name."""
        return dict(self._charts)

    # ------------------------------------------------------------------ public calls
    def start(self, chart: Chart | str, instance_id: str, data: Mapping[str, Any] | None = None, *,
              caller_context: Any = None) -> Position:
        """Create instance ``instance_id`` running ``chart`` (a Chart or a registered name).

        :raises InstanceExists: if the id is taken (nothing is written).
        :raises UnknownChart: if the chart name is not registered.
        """
        if isinstance(chart, Chart):
            if self._revisions.get(chart.name, {}).get(chart.identity) is None:
                self.register(chart)
            target = chart
        else:
            target = self.chart(chart)
        _check_id(instance_id)

        def unit(u: _Unit) -> Position:
            if self._load(u, instance_id) is not None:
                raise InstanceExists(instance_id)
            self._start_instance(u, instance_id, target, data, None, None, caller_context)
            self._drain(u)
            return self._result(u, instance_id)
        return self._run(unit, creating=instance_id)

    def send(self, instance_id: str, event: Event | str, data: Any = None, *, caller_context: Any = None) -> Position:
        """Deliver an external event and everything it causes; returns the new position.

        :raises InstanceNotFound: no such instance (nothing written).
        :raises NotRunning: the instance has halted (nothing written).
        """
        ev = event if isinstance(event, Event) else Event(event, data)
        if isinstance(event, Event) and data is not None:
            raise TypeError("pass data inside the Event, or pass an event name with data=")

        def unit(u: _Unit) -> Position:
            e = self._load(u, instance_id)
            if e is None:
                raise InstanceNotFound(instance_id)
            assert e.position is not None
            if e.position.status != RUNNING:
                raise NotRunning(f"instance {instance_id!r} is {e.position.status}", e.position.status)
            u.queue.append((instance_id, ev, caller_context))
            self._drain(u)
            return self._result(u, instance_id)
        return self._run(unit)

    def cancel(self, instance_id: str, *, caller_context: Any = None) -> Position:
        """Cancel a running instance: its states are exited (onexit runs, children are
        cancelled) and its status becomes ``cancelled``. Its pending timers are discarded
        when they come due.

        :raises InstanceNotFound: no such instance.
        :raises NotRunning: it has already halted.
        """
        return self.send(instance_id, Event.cancel(), caller_context=caller_context)

    def get(self, instance_id: str) -> Position:
        """The instance's current position.

        :raises InstanceNotFound: no such instance.
        """
        rec = self.store.load(instance_id)
        if rec is None:
            raise InstanceNotFound(instance_id)
        return Position.from_bytes(rec.blob, self._chart_for_blob(rec.chart, rec.blob))

    def exists(self, instance_id: str) -> bool:
        """Whether the instance exists."""
        return self.store.load(instance_id) is not None

    def delete(self, instance_id: str) -> None:
        """Purge the instance, its timer rows and (recursively) its invoked children.

        :raises InstanceNotFound: no such instance.
        """
        def unit(u: _Unit) -> None:
            if self._load(u, instance_id) is None:
                raise InstanceNotFound(instance_id)
            self._delete_instance(u, instance_id)
        self._run(unit)

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The instance's timer rows that have not completed (pending, claimed or dead)."""
        return self.store.pending_timers(instance_id)

    def dead_timers(self, limit: int = 100) -> list[TimerRow]:
        """Rows parked after ``max_attempts`` failed deliveries."""
        return list(self.store.dead_timers(limit))

    def retry_timer(self, instance_id: str, ordinal: int) -> bool:
        """Revive a dead row so the next sweep delivers it again."""
        return self.store.retry_timer((instance_id, ordinal), self.clock.now_ms())

    def next_due(self) -> int | None:
        """Epoch ms of the earliest pending timer, or ``None``."""
        return self.store.next_due()

    def fire_due(self, limit: int = 100, *, node_id: str | None = None, lease_ms: int = 30_000) -> list[FireResult]:
        """Claim and fire up to ``limit`` rows that are due at ``clock.now_ms()``."""
        node = node_id or self.node_id
        now = self.clock.now_ms()
        rows = self.store.claim_due(now, limit, node, lease_ms)
        return [self.fire(row, node_id=node) for row in rows]

    # ------------------------------------------------------------------ firing
    def fire(self, row: TimerRow, *, node_id: str | None = None) -> FireResult:
        """Fire one claimed row: liveness check, deliver, complete -- in one commit.

        A delivery failure releases the row with backoff (or parks it as dead) and
        returns outcome ``failed``; a row already completed elsewhere returns ``skipped``.
        """
        node = node_id or self.node_id
        lag = max(0, self.clock.now_ms() - row.ready_at_ms)

        def unit(u: _Unit) -> tuple[str, str | None]:
            u.protected = row.key
            sched = self._load(u, row.instance_id)
            target = sched if row.target_id == row.instance_id else self._load(u, row.target_id)
            outcome, reason = "fired", None
            if sched is not None:
                self._drop_ref(sched, row.ordinal)
            if target is None or target.position is None:
                outcome, reason = "discarded", f"instance {row.target_id!r} not found"
            elif target.position.status != RUNNING:
                outcome, reason = "discarded", f"instance {row.target_id!r} is {target.position.status}"
            elif sched is None or sched.position is None:
                outcome, reason = "discarded", f"scheduling instance {row.instance_id!r} not found"
            elif sched.position.status != RUNNING and row.target_id != row.instance_id:
                outcome, reason = "discarded", f"scheduling instance {row.instance_id!r} is {sched.position.status}"
            elif row.name is not None and not any(
                    t.name == row.name and t.ordinal == row.ordinal for t in sched.position.timeouts):
                outcome, reason = "stale", f"timeout {row.name!r} was re-armed or cancelled since ordinal {row.ordinal}"
            else:
                u.queue.append((row.target_id, Event.from_dict(row.event), row.caller_context))
                self._drain(u)
            return outcome, reason

        try:
            outcome, reason = self._run(unit, completion=lambda o: TimerCompletion(row.key, o[0], o[1], node),
                                        fired=row)
        except _AlreadyDone:
            return FireResult(row.key, "skipped", "completed elsewhere", lag)
        except Exception as exc:  # a delivery failure must not lose the row
            attempts = row.attempts + 1
            dead = attempts >= self.max_attempts
            delay = self.backoff_ms * (2 ** (attempts - 1))
            self.store.release(row.key, node, error=f"{type(exc).__name__}: {exc}",
                               next_attempt_at_ms=self.clock.now_ms() + delay, dead=dead)
            self.metrics["failed"] = self.metrics.get("failed", 0) + 1
            if dead:
                self.metrics["dead"] = self.metrics.get("dead", 0) + 1
            log.warning("timer %s delivery failed (attempt %d%s): %s", row.key, attempts,
                        ", parked as dead" if dead else "", exc)
            return FireResult(row.key, "failed", str(exc), lag)
        self.metrics[outcome] = self.metrics.get(outcome, 0) + 1
        return FireResult(row.key, outcome, reason, lag)

    # ------------------------------------------------------------------ the unit of work
    def _run(self, fn: Any, *, creating: str | None = None, completion: Any = None,
             fired: TimerRow | None = None) -> Any:
        last: ConflictError | None = None
        for attempt in range(self.max_conflict_retries):
            if attempt:
                # Writers that collided retry at once and collide again; a random pause,
                # growing with each attempt, spreads them out (full jitter).
                time.sleep(self._random.uniform(0, min(self.conflict_backoff_s * (2 ** attempt), 0.25)))
            u = _Unit()
            result = fn(u)
            commit = self._build_commit(u, completion(result) if completion else None)
            try:
                if not commit.empty:
                    self.store.commit(commit)
                    self.metrics["commits"] += 1
                return result
            except ConflictError as exc:
                self.metrics["conflicts"] += 1
                last = exc
                if creating is not None and exc.instance_id == creating:
                    raise InstanceExists(creating) from None
                if fired is not None:
                    cur = self.store.get_timer(fired.key)
                    if cur is None or cur.state in (DONE, DEAD) or (
                            cur.state == CLAIMED and cur.claimed_by not in (None, completion(result).node_id)):
                        raise _AlreadyDone() from None
        assert last is not None
        raise last

    def _build_commit(self, u: _Unit, completion: TimerCompletion | None) -> Commit:
        writes = []
        for iid, e in u.entries.items():
            if e.deleted:
                if e.record is not None:
                    writes.append(PositionWrite(iid, e.chart_name, e.record.version, None, "deleted"))
                continue
            if not e.dirty:
                continue
            assert e.position is not None
            blob = e.position.to_bytes(self.codec)
            writes.append(PositionWrite(iid, e.chart_name, None if e.record is None else e.record.version, blob,
                                        e.position.status, tuple(e.refs), e.parent))
        deleted = {iid for iid, e in u.entries.items() if e.deleted}
        puts = tuple(r for r in u.puts.values() if r.instance_id not in deleted)
        dels = tuple(k for k in dict.fromkeys(u.deletes) if k[0] not in deleted and k != u.protected)
        return Commit(tuple(writes), puts, dels, completion)

    def _load(self, u: _Unit, instance_id: str) -> _Entry | None:
        e = u.entries.get(instance_id)
        if e is not None:
            return None if e.deleted else e
        rec = self.store.load(instance_id)
        if rec is None:
            return None
        pos = Position.from_bytes(rec.blob, self._chart_for_blob(rec.chart, rec.blob))
        e = _Entry(rec, self._stamp(u, pos), rec.chart, list(rec.timers), rec.parent)
        u.entries[instance_id] = e
        return e

    def _stamp(self, u: _Unit, pos: Position) -> Position:
        def routes(session_id: str) -> bool:
            return self._load(u, session_id) is not None
        return pos.restamp(routes=routes, ioprocessors=self._ioprocessors(pos.session_id))

    def _ioprocessors(self, instance_id: str) -> dict[str, Any] | None:
        if self.http_base is None:
            return None
        loc = {"location": self.http_location(instance_id)}
        return {BASICHTTP_PROCESSOR: loc, "basichttp": loc}

    def http_location(self, instance_id: str) -> str:
        """The Basic HTTP location of an instance (``POST`` events there)."""
        return f"{self.http_base}/instances/{quote(instance_id, safe='')}/events"

    def _result(self, u: _Unit, instance_id: str) -> Position:
        e = u.entries[instance_id]
        assert e.position is not None
        return e.position.restamp()

    # ------------------------------------------------------------------ driving
    def _start_instance(self, u: _Unit, instance_id: str, chart: Chart, data: Mapping[str, Any] | None,
                        parent: str | None, invokeid: str | None, caller_context: Any) -> None:
        interp = self._interpreters[chart.identity]
        existing = u.entries.get(instance_id)
        record = existing.record if existing is not None else None
        if existing is None and parent is not None:
            record = self.store.load(instance_id)  # a leftover child is replaced, not duplicated
        e = _Entry(record, None, chart.name, [], parent)
        u.entries[instance_id] = e
        seed = self._stamp(u, Position(interp.chart, instance_id, RUNNING, ()))
        pos, effects = interp.start(instance_id, data, parent=parent, invokeid=invokeid, routes=seed.routes,
                                    ioprocessors=seed.ioprocessors, caller_context=caller_context,
                                    only_declared=parent is not None)
        e.position, e.dirty = pos, True
        self.metrics["drives"] += 1
        self._apply(u, instance_id, effects, caller_context)

    def _drain(self, u: _Unit) -> None:
        while u.queue:
            if u.deliveries >= self.max_deliveries:
                self._spill(u)
                return
            iid, ev, ctx = u.queue.popleft()
            e = self._load(u, iid)
            if e is None or e.position is None or e.position.status != RUNNING:
                continue  # the spec drops events for sessions that are gone
            u.deliveries += 1
            interp = self._interpreters[e.position.chart.identity]
            pos, effects = interp.drive(e.position, ev, caller_context=ctx)
            self.metrics["drives"] += 1
            if pos is not e.position:
                e.position, e.dirty = pos, True
            self._apply(u, iid, effects, ctx)

    def _spill(self, u: _Unit) -> None:
        """Over the delivery budget: keep the rest as timer rows due now (durable, FIFO)."""
        now = self.clock.now_ms()
        while u.queue:
            iid, ev, ctx = u.queue.popleft()
            e = self._load(u, iid)
            if e is None or e.position is None:
                continue
            pos = e.position
            ordinal = pos.ordinal + 1
            e.position = _bump_ordinal(pos)
            e.dirty = True
            row = TimerRow(iid, ordinal, iid, now, f"sb.spill.{ordinal}", ev.to_dict(), caller_context=ctx)
            u.puts[row.key] = row
            e.refs.append(TimerRef(ordinal, row.send_id))

    def _apply(self, u: _Unit, iid: str, effects: tuple[Any, ...], ctx: Any) -> None:
        e = u.entries[iid]
        pos = e.position
        assert pos is not None
        for eff in effects:
            t = type(eff)
            if t is Send:
                dest, ev = self._route(iid, pos, eff.target, eff)
                if dest is not None:
                    u.queue.append((dest, ev, ctx))
            elif t is SendDelayed:
                dest, ev = self._route(iid, pos, eff.target, eff)
                if dest is None:
                    continue
                due = eff.at_ms if eff.at_ms is not None else self.clock.now_ms() + (eff.delay_ms or 0)
                row = TimerRow(iid, eff.ordinal, dest, due, eff.send_id, ev.to_dict(), eff.name,
                               {"macrostep": eff.macrostep, "microstep": eff.microstep, "round": eff.round,
                                "c_index": eff.c_index, "owner": eff.owner, "id_from_author": eff.id_from_author},
                               eff.caller_context)
                u.puts[row.key] = row
                e.refs.append(TimerRef(eff.ordinal, eff.send_id, eff.name))
            elif t is Cancel:
                keep = []
                for ref in e.refs:
                    if ref.send_id == eff.send_id:
                        key = (iid, ref.ordinal)
                        if u.puts.pop(key, None) is None:
                            u.deletes.append(key)
                    else:
                        keep.append(ref)
                e.refs[:] = keep
            elif t is Invoke:
                self._invoke(u, iid, pos, eff, ctx)
            elif t is CancelInvoke:
                cid = child_instance_id(iid, eff.invokeid)
                if self._load(u, cid) is not None:
                    self._delete_instance(u, cid)
            elif t is Autoforward:
                u.queue.append((child_instance_id(iid, eff.invokeid), eff.event, ctx))
            elif t is Done:
                if pos.parent is not None and pos.invokeid is not None:
                    u.queue.append((pos.parent, Event(f"done.invoke.{pos.invokeid}", eff.donedata, "external",
                                                      None, f"#_scxml_{iid}", SCXML_PROCESSOR, pos.invokeid), ctx))
            elif t is Log:
                if self.on_log is not None:
                    self.on_log(iid, eff.label, eff.value)
                else:
                    log.info("[%s] %s: %r", iid, eff.label, eff.value)
            elif t is BudgetExhausted:
                self.metrics["budget_exhausted"] += 1
                log.warning("instance %r: event %r exhausted the %d-round budget; position unchanged",
                            iid, eff.event, eff.rounds)

    def _route(self, iid: str, pos: Position, target: str | None, eff: Any) -> tuple[str | None, Event]:
        """Resolve a send target to an instance id and the event it receives."""
        if eff.type == BASICHTTP_PROCESSOR:
            return self._route_http(iid, target, eff)
        invokeid = None
        if target is None:
            dest: str | None = iid
        elif target == "#_parent":
            dest, invokeid = pos.parent, pos.invokeid
        elif target.startswith("#_scxml_"):
            dest = target[8:]
        elif target.startswith("#_"):
            dest = child_instance_id(iid, target[2:])
        else:
            log.warning("instance %r: no route for send target %r (type %s); event %r dropped",
                        iid, target, eff.type, eff.event)
            dest = None
        ev = Event(eff.event, eff.data, "external", eff.send_id if eff.id_from_author else None, eff.origin,
                   SCXML_PROCESSOR, invokeid)
        return dest, ev

    def _route_http(self, iid: str, target: str | None, eff: Any) -> tuple[str | None, Event]:
        """Basic HTTP (SCXML C.2): a form POST; loop back when the URL is one of ours."""
        form = dict(eff.data) if isinstance(eff.data, dict) else {}
        if eff.event:
            form["_scxmleventname"] = eff.event
        body = quote_plus(str(eff.data)) if eff.data is not None and not isinstance(eff.data, dict) \
            else urlencode({k: str(v) for k, v in form.items()})
        prefix = f"{self.http_base}/instances/" if self.http_base else None
        dest = None
        if prefix and target and target.startswith(prefix) and target.endswith("/events"):
            dest = unquote(target[len(prefix):-len("/events")])
        if dest is None:
            return iid, Event("error.communication", {"message": f"Basic HTTP target {target!r} is not reachable"},
                              "platform", eff.send_id)
        assert target is not None  # dest was found in it
        raw = (f"POST {target[len(self.http_base or ''):]} HTTP/1.1\r\n"
               "Content-Type: application/x-www-form-urlencoded\r\n\r\n" + body)
        name = str(form.get("_scxmleventname") or "HTTP.POST")
        data = form if isinstance(eff.data, dict) or form else eff.data
        return dest, Event(name, data, "external", eff.send_id if eff.id_from_author else None,
                           self.http_location(iid), BASICHTTP_PROCESSOR, None, raw)

    def _invoke(self, u: _Unit, iid: str, pos: Position, eff: Invoke, ctx: Any) -> None:
        chart = eff.chart
        try:
            # Run-time children are loaded under the parent's policy: its src containment, and
            # an untrusted parent's children are untrusted too.
            if chart is None and eff.content is not None:
                name = f"{pos.chart.name}/{eff.state}.dyn{zlib.crc32(eff.content.encode('utf-8', 'replace'))}"
                chart = compile_content_child(pos.chart, eff.content, name)
            elif chart is None and eff.src:
                src = eff.src[5:] if eff.src.startswith("file:") else eff.src  # the name as it always was
                chart = compile_src_child(pos.chart, src, f"{pos.chart.name}/{eff.state}.src:{src}")
            if chart is None:
                raise ChartError("the <invoke> names no chart")
        except StateboundError as exc:
            u.queue.append((iid, Event("error.execution", {"message": f"invoke {eff.invokeid!r}: {exc}"},
                                       "platform"), ctx))
            return
        if self._revisions.get(chart.name, {}).get(chart.identity) is None:
            self.register(chart)
        self._start_instance(u, child_instance_id(iid, eff.invokeid), chart, eff.data, iid, eff.invokeid, ctx)

    def _delete_instance(self, u: _Unit, iid: str) -> None:
        e = self._load(u, iid)
        if e is None:
            return
        if e.position is not None:
            for inv in e.position.invocations:
                self._delete_instance(u, child_instance_id(iid, inv.invokeid))
        for key in [k for k in u.puts if k[0] == iid]:
            del u.puts[key]
        e.deleted = True
        u.queue = deque(q for q in u.queue if q[0] != iid)

    @staticmethod
    def _drop_ref(e: _Entry, ordinal: int) -> None:
        before = len(e.refs)
        e.refs[:] = [r for r in e.refs if r.ordinal != ordinal]
        if len(e.refs) != before:
            e.dirty = True


class _AlreadyDone(Exception):
    """Internal: the row being fired was completed by someone else."""


def _bump_ordinal(pos: Position) -> Position:
    from dataclasses import replace
    return replace(pos, ordinal=pos.ordinal + 1)


def _check_id(instance_id: str) -> None:
    if not isinstance(instance_id, str) or not instance_id:
        raise ValueError("an instance id must be a non-empty string")
    if len(instance_id) > 512:
        raise ValueError("an instance id may be at most 512 characters")
    if "::" in instance_id:
        raise ValueError("'::' is reserved for invoked child ids")


# keep these names importable for type checkers
_ = (PENDING,)
