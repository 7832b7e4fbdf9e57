"""The Host: load, drive, turn effects into timer rows and routed events, commit once.

One public call (``start``, ``send``, ``fire``, ``delete``, ``complete_invoke``) is one
unit of work:

1. load the records it needs (the instance, and any instance an event is routed to);
2. drive: the event, then every immediate send it causes (to itself, its parent, its
   children, other sessions), FIFO, within a delivery budget;
3. commit everything in **one** :meth:`Store.commit`: each position conditional on the
   version loaded (with its idempotency keys), the new timer and outbox rows, the
   cancelled rows and the completed fired row;
4. hand the outbox rows just written to their send processors and invoke handlers
   (``outbox.py``), outside the transaction; the sweeper retries whatever fails.

``send_many`` and ``fire_many`` (so ``fire_due``) run the same units for many items and
write the commits of disjoint instances together, one store transaction per group
(``batch.py``).

This module holds the public calls and what each one's unit checks; the jobs they share
live one per module: ``runner.py`` (run a unit, build and write its commit, retry a
conflict), ``delivery.py`` (drive the queue, apply effects), ``routing.py`` (send targets,
Basic HTTP, what a session may reach), ``children.py`` (start and delete sessions,
``<invoke>``) and ``firing.py`` (the unit that fires a timer row).

A crash before the commit applies nothing; after it, everything. A version conflict
reloads and re-runs the whole unit (the interpreter is deterministic, so re-running is
safe). Nothing is written when a call is refused (unknown instance, halted, exists).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from ..chart.compiler import compile_src_child
from ..chart.model import Chart
from ..datamodel.budget import DEFAULT_CPU_MS, DEFAULT_MEMORY_BYTES, Budget
from ..events import Event
from ..exceptions import (ConflictError, IdempotencyKeyReused, InstanceExists, InstanceNotFound, InstanceSuspended,
                          InvalidArgument, InvalidBatchItem, InvalidEvent, InvalidInstanceId, NotRunning, PositionError,
                          StateboundError, StoreUnavailable, UnknownChart)
from ..interpreter import Interpreter, Position
from ..interpreter.state import RUNNING
from ..position import read_header
from . import delivery, firing, migration, runner
from . import history as history_mod
from .batch import FireJob, GroupCommit, SendJob, SendResult
from .children import MAX_INVOKE_DEPTH, delete_instance, inherit_limits, start_instance
from .clock import Clock, SystemClock
from .counters import Counters
from .decoded import DecodedPositions
from .idempotency import check_key, event_fingerprint, find_key, remember_key, start_fingerprint
from .memory import MemoryStore
from .migration import MigrationResult
from .outbox import Outbox, check_invokers, check_processors
from .processors import InvokeHandler, SendProcessor
from .routing import child_instance_id
from .store import CLAIMED, PENDING, SUSPENDED, TIMER, KeyRecord, Store, TimerRow, check_instance_id, live
from .unit import AlreadyDone as _AlreadyDone
from .unit import Entry as _Entry
from .unit import FireResult
from .unit import Unit as _Unit
from .wakeup import Wakeup

__all__ = ["Host", "FireResult", "SendResult", "child_instance_id", "MAX_INVOKE_DEPTH"]

log = logging.getLogger("statebound")


class Host:
    """Runs chart instances against a :class:`~statebound.host.store.Store`.

    :param charts: charts this host can run (by name; invoked sub-charts register too).
    :param store: the backend; a fresh :class:`MemoryStore` by default.
    :param clock: time source for timer due dates; :class:`SystemClock` by default.
    :param max_rounds: the interpreter's microstep budget per drive.
    :param max_cpu_ms: CPU budget of one call (``start``, ``send``, a fire), shared by every
        drive it makes; when it runs out, the drive at work ends with ``BudgetExhausted``
        (position unchanged) and the call's undelivered events are kept as timer rows due
        now. ``None`` for none.
    :param max_memory_bytes: bytes of values one call's drives may bring out of their
        datamodels, and the ECMAScript heap cap (``None`` for none).
    :param max_deliveries: events one host call may process (its own plus routed ones);
        any left over are written as timer rows due now, so nothing is lost. It also bounds
        the sessions one call may start by ``<invoke>`` (past it, ``error.execution``).
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
    :param processors: send processors by type name: ``<send type="NAME">`` becomes an
        outbox row handed to ``processors[NAME]`` (a :class:`SendProcessor` or a plain
        callable taking a :class:`~statebound.host.processors.Delivery`). See ``docs/effects.md``.
    :param invokers: invoke handlers by type name: ``<invoke type="NAME">`` becomes an outbox
        row whose handler's ``start`` runs at least once (an :class:`InvokeHandler`).
    :param outbox_lease_ms: how long an outbox row this host hands over itself, right after
        its commit, is hidden from sweepers (they take it over if the host died meanwhile).
    :param deliver_after_commit: hand new outbox rows over in the calling thread right after
        the commit (the default); ``False`` leaves every row to the sweeper.
    :param idempotency_retention: how many inbound idempotency keys each instance keeps (the
        most recent); a repeat of an older key is applied again.
    :param history: record an execution history (``host/history.py``): ``True`` keeps the
        last 1,000 records of each instance, a number keeps that many; ``False`` (the default)
        records nothing. Read it with ``store.history(id)``, check it with :meth:`replay`.
    :param history_ttl_s: also let each record expire this many seconds after it is written
        (DynamoDB's TTL deletes it; the only bound DynamoDB applies). Turns history on.
    :param tracer: an OpenTelemetry ``Tracer`` (or ``True`` for the global one): every host
        call becomes a span, and its traceparent rides in ``caller_context`` to the rows it
        arms, whose fire links back to it (``host/tracing.py``, the ``otel`` extra). ``None``
        (the default) never imports OpenTelemetry.
    :param max_batch: the most units one group commit carries (``send_many``,
        ``fire_many``, ``fire_due``): on SQLite, one transaction and one fsync for them all.
        ``1`` commits every unit on its own. See ``docs/batch.md``.
    :param untrusted_may_use: the processor and invoke-handler type names that charts loaded
        with ``trust="untrusted"`` may use. By default they may use none, and may send events
        only to themselves, their parent and their own children, never to other instances
        (``#_scxml_<id>`` or a Basic HTTP URL naming one). See ``docs/security.md``.
    :param wakeup: a :class:`~statebound.host.wakeup.Wakeup` backend: after each commit the
        host asks it to fire the pending rows the commit wrote (timers, outbox rows it does
        not hand over itself) that are due within its horizon, so a sweeper in another
        process fires them on time. ``None``: sweepers find rows by reading the store.
    :param find_revision: called as ``find_revision(name, identity)`` when a stored position
        names a revision of chart ``name`` this host does not hold (a migration registered
        it after this host started): returns that revision, which is then kept beside the
        others (new instances still start on the latest registered), or ``None``. Without
        it, or when it finds nothing, the load fails with ``ChartIdentityMismatch``.
    """

    def __init__(self, charts: Iterable[Chart] = (), store: Store | None = None, clock: Clock | None = None, *,
                 max_rounds: int = 10_000, max_cpu_ms: int | None = DEFAULT_CPU_MS,
                 max_memory_bytes: int | None = DEFAULT_MEMORY_BYTES,
                 max_deliveries: int = 1_000, max_conflict_retries: int = 12,
                 conflict_backoff_s: float = 0.001,
                 max_attempts: int = 5, backoff_ms: int = 1_000, codec: str = "msgpack",
                 on_log: Any = None, node_id: str | None = None,
                 http_base: str | None = "http://statebound.invalid",
                 processors: Mapping[str, SendProcessor | Any] | None = None,
                 invokers: Mapping[str, InvokeHandler] | None = None, outbox_lease_ms: int = 30_000,
                 deliver_after_commit: bool = True, idempotency_retention: int = 100,
                 history: bool | int = False, history_ttl_s: int | None = None, tracer: Any = None,
                 max_batch: int = 100, untrusted_may_use: Iterable[str] = (),
                 wakeup: Wakeup | None = None,
                 find_revision: Callable[[str, str], Chart | None] | None = None) -> None:
        self.store: Store = store if store is not None else MemoryStore()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.max_rounds = max_rounds
        Budget(max_cpu_ms, max_memory_bytes)  # refuse bad limits at construction
        self.max_cpu_ms = max_cpu_ms
        self.max_memory_bytes = max_memory_bytes
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
        self._locations: dict[str, tuple[str | None, str]] = {}
        if outbox_lease_ms < 0 or idempotency_retention < 1 or max_batch < 1:
            raise InvalidArgument("outbox_lease_ms must be >= 0, idempotency_retention and max_batch >= 1")
        self.max_batch = max_batch
        self.wakeup = wakeup
        self.find_revision = find_revision
        #: send processors by type name (see ``processors=``)
        self.processors: dict[str, Any] = check_processors(processors)
        #: invoke handlers by type name (see ``invokers=``)
        self.invokers: dict[str, Any] = check_invokers(invokers)
        self.outbox_lease_ms = outbox_lease_ms
        self.deliver_after_commit = deliver_after_commit
        self.idempotency_retention = idempotency_retention
        self._invoker_types = frozenset(self.invokers) or None
        #: processor and handler types offered to untrusted charts (see ``untrusted_may_use=``)
        self.untrusted_may_use: frozenset[str] = frozenset(untrusted_may_use)
        self._untrusted_invoker_types = frozenset(self.invokers).intersection(self.untrusted_may_use) or None
        #: the history this host records, or ``None`` (see ``history=``)
        self.history = history_mod.policy(history, history_ttl_s)
        self._tracing: Any = None
        if tracer is not None and tracer is not False:
            from .tracing import Tracing   # only now: a host without a tracer never imports opentelemetry
            self._tracing = Tracing(tracer)
        self._outbox = Outbox(self)
        self._group = GroupCommit(self)
        self._charts: dict[str, Chart] = {}
        self._revisions: dict[str, dict[str, Chart]] = {}
        # by chart name and identity: one document under two names (a tenant's chart, and
        # another's run-time child built to match it) runs on two interpreters, each under
        # its own chart's ECMAScript limits
        self._interpreters: dict[tuple[str, str], Interpreter] = {}
        self._decoded = DecodedPositions()
        #: counters a user can read: commits, conflicts, fired, discarded, stale, failed...
        #: (a dict; the host's threads add to it atomically, see ``counters.py``)
        self.metrics = Counters({"commits": 0, "group_commits": 0, "conflicts": 0, "drives": 0,
                                 "budget_exhausted": 0})
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
            raise InvalidArgument(f"register() takes a Chart, not {type(chart).__name__}")
        self._add_revision(chart, latest=True)

    def _add_revision(self, chart: Chart, *, latest: bool) -> None:
        # the revision and its interpreter first, the name last: a thread loading a blob
        # meanwhile (_chart_for_blob's one-revision fast path) must never see the new
        # latest without the revision table that says which revision its blob needs
        if (chart.name, chart.identity) not in self._interpreters:
            self._interpreters[chart.name, chart.identity] = Interpreter(chart, max_rounds=self.max_rounds)
        self._revisions.setdefault(chart.name, {})[chart.identity] = chart
        if latest or chart.name not in self._charts:
            self._charts[chart.name] = chart
        for sub in chart.subcharts:
            self._add_revision(sub, latest=latest)

    def _chart_for_blob(self, name: str, blob: bytes) -> Chart:
        """The registered revision of chart ``name`` that this blob was written for."""
        revisions = self._revisions.get(name)
        if revisions is not None and len(revisions) == 1:   # every load asks: the common case first
            return self._charts[name]
        latest = self.chart(name)
        revisions = self._revisions.get(name, {})
        if len(revisions) > 1:
            try:
                return revisions.get(read_header(blob).identity, latest)
            except PositionError:
                pass  # from_bytes will report the damage precisely
        return latest

    def _found_revision(self, name: str, identity: str) -> Chart | None:
        """The revision ``find_revision`` gives for a blob this host holds no chart for,
        kept as a revision (never as the latest), or ``None``."""
        if self.find_revision is None:
            return None
        chart = self.find_revision(name, identity)
        if not isinstance(chart, Chart) or chart.name != name or chart.identity != identity:
            return None
        # kept as a revision: what new instances start on does not change behind the caller's back
        self._add_revision(chart, latest=False)
        return chart

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
            child = compile_src_child(parent, src, name)
        except StateboundError:
            return None
        # and under its limits, as the invoke that made it gave them (children.invoke):
        # reloaded without, it ran under the defaults in every other process, a sweeper's too
        inherit_limits(parent, child)
        return child

    @property
    def charts(self) -> Mapping[str, Chart]:
        """The registered charts by name (the latest revision of each)."""
        return dict(self._charts)

    def revisions(self, name: str) -> list[Chart]:
        """Every registered revision of chart ``name``, in the order each was first
        registered; empty if no chart has that name. :attr:`charts` names the latest."""
        return list(self._revisions.get(name, {}).values())

    # ------------------------------------------------------------------ public calls
    def start(self, chart: Chart | str, instance_id: str, data: Mapping[str, Any] | None = None, *,
              caller_context: Any = None, idempotency_key: str | None = None) -> Position:
        """Create instance ``instance_id`` running ``chart`` (a Chart or a registered name).

        :param idempotency_key: makes a retried start safe: when the instance already
            exists because of a start with this key, chart and data, nothing is written and
            its current position is returned instead of raising ``InstanceExists``.
        :raises InstanceExists: if the id is taken (nothing is written).
        :raises IdempotencyKeyReused: the key started it with another chart or data.
        :raises UnknownChart: if the chart name is not registered.
        :raises SerializationError: ``caller_context`` cannot be stored (as for :meth:`send`).
        """
        _check_context(caller_context)
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("start", instance_id, None, lambda ctx: self.start(
                chart, instance_id, data, caller_context=ctx, idempotency_key=idempotency_key), caller_context)
        if isinstance(chart, Chart):
            if self._revisions.get(chart.name, {}).get(chart.identity) is None:
                self.register(chart)
            target = chart
        else:
            target = self.chart(chart)
        _check_id(instance_id)
        key = None if idempotency_key is None else check_key(idempotency_key)
        if data is not None and not isinstance(data, Mapping):
            raise InvalidArgument(f"start data must be a mapping, not {type(data).__name__}")
        fingerprint = b"" if key is None else start_fingerprint(target.name, dict(data) if data else None)

        def unit(u: _Unit) -> Position:
            u.call = {"op": "start", "instance": instance_id, "idempotency_key": key, "caller_context": caller_context}
            e = runner.load(self, u, instance_id)
            if e is not None:
                if key is not None and self._seen(e, instance_id, key, fingerprint, "chart or start data"):
                    return runner.result(u, instance_id)
                raise InstanceExists(instance_id)
            start_instance(self, u, instance_id, target, data, None, None, caller_context)
            if key is not None:
                u.entries[instance_id].keys.append(KeyRecord(key, fingerprint))
            self._drain(u)
            return runner.result(u, instance_id)
        # with a key, a create that lost a race re-runs and finds the winner's key
        return runner.run(self, unit, creating=instance_id, retry_create=key is not None)

    def send(self, instance_id: str, event: Event | str, data: Any = None, *, caller_context: Any = None,
             idempotency_key: str | None = None) -> Position:
        """Deliver an external event and everything it causes; returns the new position.

        The position returned is the one this call's commit wrote. Outbox rows that commit
        wrote are handed over right after it, in this call; what a handler answers then (a
        result delivered to the chart) is a commit of its own, which :meth:`get` shows.

        :param idempotency_key: apply the event once per key (``Event(idempotency_key=...)``
            does the same). The key is recorded in the same commit as the event; a repeat
            with the same event and data writes nothing and returns the instance's current
            position, even when the first one halted it. Each instance keeps its last
            ``idempotency_retention`` keys.
        :raises InstanceNotFound: no such instance (nothing written).
        :raises NotRunning: the instance has halted (nothing written).
        :raises IdempotencyKeyReused: the key was applied with another event or data.
        :raises InvalidEvent: ``event`` has no name (nothing written).
        :raises SerializationError: ``caller_context`` cannot be stored and read back
            (msgpack data whose map keys are strings, numbers, bytes, booleans or None).
        """
        _check_context(caller_context)
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("send", instance_id, event.name if isinstance(event, Event) else event,
                                      lambda ctx: self.send(instance_id, event, data, caller_context=ctx,
                                                            idempotency_key=idempotency_key), caller_context)
        ev, key, fingerprint = self._prepare_event(event, data, idempotency_key)
        return runner.run(self, lambda u: self._send_step(u, instance_id, ev, key, fingerprint, caller_context))

    def send_many(self, items: Iterable[Any], *, caller_context: Any = None) -> list[SendResult]:
        """Deliver many external events with group commit: each item is applied exactly as
        :meth:`send` would apply it, and the commits of up to ``max_batch`` items are
        written together (on SQLite, one transaction and one fsync for the lot).

        ``host.send_many([("order-1", "Pay"), ("order-2", "Pay", {"card": "x"}, "req-17")])``

        :param items: tuples ``(instance_id, event[, data[, idempotency_key]])``; ``event``
            is an :class:`Event` or a name, as for :meth:`send`. An instance may appear more
            than once: its items are applied in input order.
        :param caller_context: handed to every item's drive, as for :meth:`send`.
        :return: one :class:`SendResult` per item, in input order: the position, or the
            error :meth:`send` would have raised for that item (nothing of it written).
            One item's error never fails or holds back another; a crash before the return
            may have applied any prefix of the groups, so re-send with idempotency keys.
            With a ``tracer``, every item still has its own ``statebound.send`` span, as a
            :meth:`send` would, open from its unit's run until its group's commit landed.
        """
        _check_context(caller_context)
        results: list[SendResult | None] = []
        jobs = []
        if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
            raise InvalidArgument(f"send_many() takes an iterable of (instance_id, event, ...) items, "
                                  f"not {type(items).__name__}")
        for index, item in enumerate(items):
            results.append(None)
            try:
                iid, event, data, key = _batch_item(index, item)
                check_instance_id(iid)
                ev, key, fingerprint = self._prepare_event(event, data, key)
            except (StateboundError, ValueError, TypeError) as exc:
                named = item[0] if isinstance(item, (tuple, list)) and item and isinstance(item[0], str) else None
                results[index] = SendResult(index, named, None, exc)
                continue
            jobs.append(SendJob(self, results, index, iid, ev, key, fingerprint, caller_context))
        try:
            self._group.run(jobs)
            return [r for r in results if r is not None]
        finally:
            # A failed item keeps its traceback, whose frames keep this call's locals: emptied,
            # they no longer lead back to the results, so a batch is freed by reference
            # counting, not left for the cycle collector with every position it returned.
            results.clear()
            jobs.clear()

    @staticmethod
    def _prepare_event(event: Event | str, data: Any, idempotency_key: str | None) -> tuple[Event, str | None, bytes]:
        """The event as the chart will see it, its idempotency key and the key's fingerprint."""
        ev = event if isinstance(event, Event) else Event(event, data)
        if type(ev.name) is not str or not ev.name:
            raise InvalidEvent(f"an event needs a non-empty name, not {ev.name!r}")
        if isinstance(event, Event) and data is not None:
            raise InvalidArgument("pass data inside the Event, or pass an event name with data=")
        key = idempotency_key if idempotency_key is not None else ev.idempotency_key
        if idempotency_key is not None and ev.idempotency_key not in (None, idempotency_key):
            raise InvalidArgument("the Event carries another idempotency key than idempotency_key=")
        if key is not None:
            check_key(key)
            ev = replace(ev, idempotency_key=None)   # the chart never sees it
        fingerprint = b"" if key is None else event_fingerprint(ev)
        return ev, key, fingerprint

    def _send_step(self, u: _Unit, instance_id: str, ev: Event, key: str | None, fingerprint: bytes,
                   caller_context: Any) -> Position:
        """The unit of work of one external event (``runner.py``), for ``send`` and ``send_many``."""
        u.call = {"op": "send", "instance": instance_id, "idempotency_key": key, "caller_context": caller_context}
        e = runner.load(self, u, instance_id)
        if e is None:
            raise InstanceNotFound(instance_id)
        assert e.position is not None
        if key is not None and self._seen(e, instance_id, key, fingerprint, "event or data"):
            return runner.result(u, instance_id)
        if e.position.status != RUNNING:
            raise NotRunning(f"instance {instance_id!r} is {e.position.status}", e.position.status)
        if e.suspended:
            raise InstanceSuspended(instance_id)
        if key is not None:
            remember_key(e.keys, KeyRecord(key, fingerprint), self.idempotency_retention)
            e.dirty = True
        u.queue.append((instance_id, ev, caller_context))
        self._drain(u)
        return runner.result(u, instance_id)

    def _seen(self, e: _Entry, instance_id: str, key: str, fingerprint: bytes, what: str) -> bool:
        """Whether ``key`` was applied already (then the call is a repeat and writes nothing)."""
        seen = find_key(e.keys, key)
        if seen is None:
            return False
        if seen.fingerprint != fingerprint:
            raise IdempotencyKeyReused(instance_id, key, what)
        self.metrics.add("duplicates")
        return True

    def complete_invoke(self, instance_id: str, invokeid: str, data: Any = None, *, token: str | None = None,
                        caller_context: Any = None) -> FireResult:
        """Finish an invocation whose handler returned :class:`Pending`: the chart gets
        ``done.invoke.<invokeid>`` with ``data`` (the task-token pattern).

        Delivered only while the invocation is live: its state has not been exited since the
        handler started it. A late or stale result is discarded, never delivered, and the
        reason is written on the invocation's row (outcome ``discarded``).

        :param token: the request's ``token``; with it a result meant for an earlier entry of
            the state is recognised as stale, and a late result is recorded on its own row.
        :return: outcome ``fired`` (delivered) or ``discarded``, with the reason.
        :raises InstanceNotFound: no such instance.
        :raises InstanceSuspended: the instance is suspended: nothing is written; answer
            again after ``resume`` (the generation is checked then).
        :raises SerializationError: ``data`` cannot be stored (nothing is written).
        """
        _check_storable(data, f"the result of invoke {invokeid!r}")
        _check_context(caller_context)
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("complete_invoke", instance_id, f"done.invoke.{invokeid}", lambda ctx: (
                self.complete_invoke(instance_id, invokeid, data, token=token, caller_context=ctx)),
                caller_context, invoke=invokeid, fired=True)
        event = Event(f"done.invoke.{invokeid}", data, "external", invokeid=invokeid)
        return self._outbox.finish_invoke(instance_id, invokeid, token, event, caller_context)

    def fail_invoke(self, instance_id: str, invokeid: str, error: str = "error", cause: Any = None, *,
                    token: str | None = None, caller_context: Any = None) -> FireResult:
        """Finish an invocation with a failure: the chart gets ``error.execution`` with
        ``_event.invokeid`` set and data ``{"invokeid", "error", "cause", "message"}``.
        Liveness, token, return value and errors (a suspended instance included) as for
        :meth:`complete_invoke`."""
        _check_storable(cause, f"the failure cause of invoke {invokeid!r}")
        _check_context(caller_context)
        if not isinstance(error, str):
            raise InvalidArgument(f"fail_invoke()'s error must be a string (a short code), not {type(error).__name__}")
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("fail_invoke", instance_id, "error.execution", lambda ctx: (
                self.fail_invoke(instance_id, invokeid, error, cause, token=token, caller_context=ctx)),
                caller_context, invoke=invokeid, fired=True)
        data = {"message": f"invoke {invokeid!r} failed: {error}", "invokeid": invokeid, "error": error,
                "cause": cause}
        event = Event("error.execution", data, "platform", invokeid=invokeid)
        return self._outbox.finish_invoke(instance_id, invokeid, token, event, caller_context)

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
        rec = live(self.store.load(instance_id))
        if rec is None:
            raise InstanceNotFound(instance_id)
        return runner.decode(self, instance_id, rec.blob, rec.chart)

    def exists(self, instance_id: str) -> bool:
        """Whether the instance exists."""
        return live(self.store.load(instance_id)) is not None

    def delete(self, instance_id: str) -> None:
        """Purge the instance, its timer rows and (recursively) its invoked children.

        A delete that found the instance and, retrying after a conflict, finds it gone
        returns normally: the instance is gone either way, whether this call's own write
        landed and its answer was lost (a timeout on the wire) or another caller deleted it.

        :raises InstanceNotFound: no such instance.
        """
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("delete", instance_id, None, lambda _: self.delete(instance_id))
        found = False

        def unit(u: _Unit) -> None:
            nonlocal found
            if runner.load(self, u, instance_id) is None:
                if found:
                    return
                raise InstanceNotFound(instance_id)
            found = True
            delete_instance(self, u, instance_id)
        runner.run(self, unit)

    def migrate(self, instance_id: str, chart: Chart | str, *, mapping: Mapping[str, str] | None = None,
                dry_run: bool = False) -> MigrationResult:
        """Move a stored instance onto revision ``chart`` (a Chart, registered here if it is not
        yet, or the name of a registered one: its latest revision).

        The position is carried across by state id (``export``/``import_``, with ``mapping``
        renaming old ids) if :func:`~statebound.diff` allows its revision to move, and is
        committed on its own, conditional on the version loaded: a concurrent event is
        never lost, a conflict reloads and tries again. Timer rows and named timeouts
        survive. Nothing raises for an instance that cannot move: the result says why.
        See :mod:`statebound.host.migration`.

        :param dry_run: decide, write nothing (outcome ``would-move`` instead of ``moved``).
        """
        if isinstance(chart, str):
            chart = self.chart(chart)   # a registered name, as start takes
        elif not isinstance(chart, Chart):
            raise InvalidArgument(f"migrate() takes a Chart or a registered chart name, not {type(chart).__name__}")
        if mapping is not None and not isinstance(mapping, Mapping):
            raise InvalidArgument(f"mapping must be a mapping of old state ids to new, not {type(mapping).__name__}")
        for old, new in (mapping or {}).items():
            if not isinstance(old, str) or not isinstance(new, str):
                raise InvalidArgument(f"mapping takes state ids (strings) to state ids, not {old!r} to {new!r}")
        if self._revisions.get(chart.name, {}).get(chart.identity) is None:
            self.register(chart)
        return migration.migrate(self, instance_id, chart, mapping=mapping, dry_run=dry_run)

    def replay(self, instance_id: str) -> history_mod.ReplayReport:
        """Re-drive the instance's recorded history from its start and check that it reaches
        the stored position byte for byte (``history=`` must have kept every record, and every
        chart revision they name must be registered here). Writes nothing.
        See :func:`statebound.host.history.replay`."""
        return history_mod.replay(self, instance_id)

    def suspend(self, instance_id: str) -> None:
        """Suspend a running instance: it takes no events (``send`` raises
        :class:`~statebound.InstanceSuspended`) and its pending timer rows are parked, out of
        every sweep, until :meth:`resume`. Events other instances route to it are kept as
        parked rows too. Suspending a suspended instance does nothing.

        :raises InstanceNotFound: no such instance.
        :raises NotRunning: it has halted.
        """
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("suspend", instance_id, None, lambda _: self.suspend(instance_id))

        def unit(u: _Unit) -> None:
            u.call = {"op": "suspend", "instance": instance_id}
            e = runner.load(self, u, instance_id)
            if e is None:
                raise InstanceNotFound(instance_id)
            assert e.position is not None
            if e.position.status != RUNNING:
                raise NotRunning(f"instance {instance_id!r} is {e.position.status}", e.position.status)
            if e.suspended:
                return
            e.suspended = e.dirty = True
            u.expect = {}
            for row in self.store.pending_timers(instance_id):
                if row.state in (PENDING, CLAIMED):
                    u.puts[row.key] = replace(row, state=SUSPENDED, claimed_by=None, claim_expires_ms=None)
                    u.expect[row.key] = (PENDING, CLAIMED)   # not one a sweeper completed meanwhile
        runner.run(self, unit)

    def resume(self, instance_id: str) -> None:
        """Resume a suspended instance: it takes events again, and its parked rows are
        pending again at their own due times (those already past are due now, in ordinal
        order). Resuming an instance that is not suspended does nothing.

        :raises InstanceNotFound: no such instance.
        """
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("resume", instance_id, None, lambda _: self.resume(instance_id))

        def unit(u: _Unit) -> None:
            u.call = {"op": "resume", "instance": instance_id}
            e = runner.load(self, u, instance_id)
            if e is None:
                raise InstanceNotFound(instance_id)
            if not e.suspended:
                return
            e.suspended, e.dirty = False, True
            now = self.clock.now_ms()
            u.expect = {}
            for row in self.store.pending_timers(instance_id):
                if row.state == SUSPENDED:
                    # overdue rows become ready now, not at their old due time: a sweep only
                    # looks for rows from about now on (the DynamoDB due index is bucketed)
                    later = now if row.ready_at_ms < now else row.next_attempt_at_ms
                    u.puts[row.key] = replace(row, state=PENDING, next_attempt_at_ms=later)
                    u.expect[row.key] = (SUSPENDED,)
        runner.run(self, unit)

    def is_suspended(self, instance_id: str) -> bool:
        """Whether the instance is suspended (``False`` if it does not exist)."""
        rec = self.store.load(instance_id)
        return rec is not None and rec.status == SUSPENDED   # (a tombstone's status is DELETED)

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The instance's timer and outbox rows that have not completed (pending, claimed,
        waiting, suspended or dead)."""
        return self.store.pending_timers(instance_id)

    def dead_timers(self, limit: int = 100) -> list[TimerRow]:
        """Rows parked after ``max_attempts`` failed deliveries."""
        return list(self.store.dead_timers(_check_count("limit", limit)))

    def retry_timer(self, instance_id: str, ordinal: int) -> bool:
        """Revive a dead row so the next sweep delivers it again: ``True`` if a dead row was
        revived, ``False`` if there is none by that key.

        :raises InvalidArgument: the row must not be revived: a dead invoke row whose
            invocation was ended with ``error.execution`` (entering the state again invokes
            afresh), a dead cancel row (its hook is best effort), or a row of a suspended
            instance (resume it first). A dead invoke row the chart was never told of (one
            the sweep could not read) may be revived.
        """
        _check_count("ordinal", ordinal)
        if ordinal >= 1 << 63:
            return False   # no row has one: SQLite could not even look it up
        why = firing.redrive_refusal(self.store, (instance_id, ordinal))
        if why is not None:
            raise InvalidArgument(why)
        now = self.clock.now_ms()
        revived = self.store.retry_timer((instance_id, ordinal), now)
        if revived:
            runner.wake(self, [((instance_id, ordinal), now)])
        return revived

    def next_due(self) -> int | None:
        """Epoch ms of the earliest pending timer, or ``None``."""
        return self.store.next_due()

    def fire_due(self, limit: int = 100, *, node_id: str | None = None, lease_ms: int = 30_000) -> list[FireResult]:
        """Claim and fire up to ``limit`` rows that are due at ``clock.now_ms()``, with group
        commit (see :meth:`fire_many`).

        :raises InvalidArgument: ``lease_ms`` under 1 (a claim that lapses as it is taken
            would let another sweeper hand the same outbox row over at once, as
            ``Sweeper(lease_s=0)`` is refused for), or a ``limit`` that is no count."""
        node = node_id or self.node_id
        now = self.clock.now_ms()
        if _check_count("lease_ms", lease_ms) < 1:
            raise InvalidArgument("lease_ms must be at least 1: a claim that lapses as it is taken protects nothing")
        rows = self.store.claim_due(now, _check_count("limit", limit), node, lease_ms)
        return self.fire_many(rows, node_id=node)

    def fire_many(self, rows: Iterable[TimerRow], *, node_id: str | None = None) -> list[FireResult]:
        """Fire claimed rows as :meth:`fire` would, one result per row in order, committing
        the timer fires of up to ``max_batch`` independent instances together (on SQLite,
        one transaction and one fsync). Rows of one instance fire in the given order;
        outbox rows, which call the outside world first, fire on their own in their place.

        A host whose ``fire`` is overridden (a subclass or wrapper that logs or counts every
        fire) fires every row through ``fire``, one commit each, as before group commit. A
        host with a ``tracer`` keeps group commit and gives every row its own span, linked
        to the one that armed it, as :meth:`fire` does.
        """
        node = node_id or self.node_id
        rows = list(rows)
        for row in rows:
            if not isinstance(row, TimerRow):
                raise InvalidArgument(f"fire_many() takes claimed TimerRows, not {type(row).__name__}")
        if type(self).fire is not Host.fire or "fire" in vars(self):
            return [self.fire(row, node_id=node) for row in rows]
        results: list[FireResult | None] = [None] * len(rows)
        self._group.run([FireJob(self, results, i, row, node) for i, row in enumerate(rows)])
        return [r for r in results if r is not None]

    # ------------------------------------------------------------------ firing
    def fire(self, row: TimerRow, *, node_id: str | None = None) -> FireResult:
        """Fire one claimed row: liveness check, deliver, complete -- in one commit.

        A delivery failure releases the row with backoff (or parks it as dead) and
        returns outcome ``failed``; a row already completed elsewhere returns ``skipped``.
        An outbox row is handed to its processor or handler (see ``outbox.py``); one whose
        type this host was not given is ``skipped`` and its claim left to lapse.
        """
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.fire(row, lambda r: self.fire(r, node_id=node_id))
        node = node_id or self.node_id
        lag = max(0, self.clock.now_ms() - row.ready_at_ms)
        if row.kind != TIMER:
            try:
                res = self._outbox.fire(row, node, lag)
            except (ConflictError, StoreUnavailable) as exc:
                # its completion lost every retry to other writers, or the store went away
                # (the processor may have been called: it is called again, at least once);
                # raised, it stopped the sweeper's run_forever
                res = firing.fire_failed(self, row, node, exc, lag)
            handed = runner.handing_over.get()
            if handed is not None:   # handed over after a sweep's commit: its report counts it
                handed.append(res)
            return res
        try:
            outcome, reason = runner.run(self, lambda u: firing.fire_step(self, row, u),
                                         completion=lambda o: firing.fire_completion(row, node, o))
        except _AlreadyDone:
            firing.count(self, "skipped")
            return FireResult(row.key, "skipped", "completed elsewhere", lag)
        except Exception as exc:  # a delivery failure must not lose the row
            return firing.fire_failed(self, row, node, exc, lag)
        firing.count(self, outcome)
        return FireResult(row.key, outcome, reason, lag)

    def http_location(self, instance_id: str) -> str:
        """The Basic HTTP location of an instance (``POST`` events there)."""
        # Every load offers it: kept per instance (with the base it was made from, which a
        # caller may change), in a table emptied when full.
        kept = self._locations.get(instance_id)
        if kept is not None and kept[0] == self.http_base:
            return kept[1]
        loc = f"{self.http_base}/instances/{_location_id(instance_id)}/events"
        if len(self._locations) >= _LOCATIONS_KEPT:
            self._locations.clear()
        self._locations[instance_id] = (self.http_base, loc)
        return loc

    # ------------------------------------------------------------------ seams between the jobs
    # The unit closures, the outbox, routing and children reach each other through these,
    # so that no two of those modules import each other (and a test can stub a delivery).
    def _load(self, u: _Unit, instance_id: str) -> _Entry | None:
        return runner.load(self, u, instance_id)

    def _drain(self, u: _Unit) -> None:
        delivery.drain(self, u)

    def _apply(self, u: _Unit, iid: str, effects: tuple[Any, ...], ctx: Any) -> None:
        delivery.apply(self, u, iid, effects, ctx)


#: how many instances' Basic HTTP locations a host keeps
_LOCATIONS_KEPT = 4096

#: ids that quote() leaves as they are (RFC 3986 unreserved characters)
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+").fullmatch


def _location_id(instance_id: str) -> str:
    # plain ids skip quote(); Host.http_location keeps the result for the hot ones
    return instance_id if _UNRESERVED(instance_id) else quote(instance_id, safe="")


def _batch_item(index: int, item: Any) -> tuple[str, Any, Any, Any]:
    """``(instance_id, event[, data[, idempotency_key]])`` of a ``send_many`` item."""
    if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 4:
        raise InvalidBatchItem(index, f"expected (instance_id, event[, data[, idempotency_key]]), got {item!r:.80}")
    iid, event, data, key = (*item, None, None)[:4]
    if not isinstance(iid, str):
        raise InvalidBatchItem(index, f"the instance id must be a string, not {type(iid).__name__}")
    if not isinstance(event, (str, Event)):
        raise InvalidBatchItem(index, f"the event must be a name or an Event, not {type(event).__name__}")
    return iid, event, data, key


def _check_count(name: str, value: Any) -> int:
    """A count or a duration argument: a whole number >= 0 (bool is no number here)."""
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"{name} must be a whole number >= 0, not {value!r}")
    return value


def _check_storable(value: Any, what: str) -> None:
    from .store import check_field
    check_field(value, what)


def _check_context(caller_context: Any) -> None:
    if caller_context is not None:
        _check_storable(caller_context, "caller_context")


def _check_id(instance_id: str) -> None:
    if not isinstance(instance_id, str) or not instance_id:
        raise InvalidInstanceId(instance_id, "an instance id must be a non-empty string")
    if len(instance_id) > 512:
        raise InvalidInstanceId(instance_id, "an instance id may be at most 512 characters")
    if "::" in instance_id:
        raise InvalidInstanceId(instance_id, "'::' is reserved for invoked child ids")

