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
from dataclasses import replace
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlencode

from ..chart.compiler import compile_content_child, compile_src_child
from ..chart.model import Chart
from ..chart.trust import UNTRUSTED
from ..datamodel.budget import DEFAULT_CPU_MS, DEFAULT_MEMORY_BYTES, Budget
from ..effects import (Autoforward, BudgetExhausted, Cancel, CancelInvoke, Done, Invoke, Log, Send,
                       SendDelayed)
from ..events import BASICHTTP_PROCESSOR, SCXML_PROCESSOR, Event
from ..exceptions import (BudgetExceeded, ChartError, ConflictError, IdempotencyKeyReused, InstanceExists,
                          InstanceNotFound, InstanceSuspended, InvalidBatchItem, InvalidEvent, NotRunning,
                          PositionError, SerializationError, StateboundError, UnknownChart)
from ..interpreter import Interpreter, Position
from ..interpreter.state import RUNNING, make_position
from ..position import read_header
from .batch import FireJob, GroupCommit, SendJob, SendResult
from .clock import Clock, SystemClock
from .counters import Counters
from . import migration
from . import history as history_mod
from .idempotency import check_key, event_fingerprint, find_key, remember_key, start_fingerprint
from .memory import MemoryStore
from .migration import MigrationResult
from .outbox import Outbox, check_invokers, check_processors
from .processors import InvokeHandler, SendProcessor
from .store import (CLAIMED, DEAD, DONE, PENDING, SUSPENDED, TIMER, Commit, KeyRecord, PositionRecord, PositionWrite,
                    Store, TimerCompletion, TimerKey, TimerRef, TimerRow, check_instance_id)
from .unit import AlreadyDone as _AlreadyDone
from .unit import Entry as _Entry
from .unit import FireResult
from .unit import Unit as _Unit
from .wakeup import Wakeup, wakeups_for

__all__ = ["Host", "FireResult", "SendResult", "child_instance_id", "MAX_INVOKE_DEPTH"]

log = logging.getLogger("statebound")


#: How deep invoked sessions may nest (a child's child's ...). Inline and src children nest at
#: most 8 deep when a chart loads; srcexpr and <content expr> could otherwise recurse for ever.
MAX_INVOKE_DEPTH = 16


def child_instance_id(parent_id: str, invokeid: str) -> str:
    """The instance id of the child session an ``<invoke>`` starts."""
    return f"{parent_id}::{invokeid}"


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
                 wakeup: Wakeup | None = None) -> None:
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
        if outbox_lease_ms < 0 or idempotency_retention < 1 or max_batch < 1:
            raise ValueError("outbox_lease_ms must be >= 0, idempotency_retention and max_batch >= 1")
        self.max_batch = max_batch
        self.wakeup = wakeup
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
        self._interpreters: dict[str, Interpreter] = {}   # by chart identity
        #: counters a user can read: commits, conflicts, fired, discarded, stale, failed...
        #: (a dict; the host's threads add to it atomically, see ``counters.py``)
        self.metrics = Counters({"commits": 0, "conflicts": 0, "drives": 0, "budget_exhausted": 0})
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
              caller_context: Any = None, idempotency_key: str | None = None) -> Position:
        """Create instance ``instance_id`` running ``chart`` (a Chart or a registered name).

        :param idempotency_key: makes a retried start safe: when the instance already
            exists because of a start with this key, chart and data, nothing is written and
            its current position is returned instead of raising ``InstanceExists``.
        :raises InstanceExists: if the id is taken (nothing is written).
        :raises IdempotencyKeyReused: the key started it with another chart or data.
        :raises UnknownChart: if the chart name is not registered.
        """
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
        fingerprint = b"" if key is None else start_fingerprint(target.name, dict(data) if data else None)

        def unit(u: _Unit) -> Position:
            u.call = {"op": "start", "instance": instance_id, "idempotency_key": key, "caller_context": caller_context}
            e = self._load(u, instance_id)
            if e is not None:
                if key is not None and self._seen(e, instance_id, key, fingerprint, "chart or start data"):
                    return self._result(u, instance_id)
                raise InstanceExists(instance_id)
            self._start_instance(u, instance_id, target, data, None, None, caller_context)
            if key is not None:
                u.entries[instance_id].keys.append(KeyRecord(key, fingerprint))
            self._drain(u)
            return self._result(u, instance_id)
        # with a key, a create that lost a race re-runs and finds the winner's key
        return self._run(unit, creating=instance_id, retry_create=key is not None)

    def send(self, instance_id: str, event: Event | str, data: Any = None, *, caller_context: Any = None,
             idempotency_key: str | None = None) -> Position:
        """Deliver an external event and everything it causes; returns the new position.

        :param idempotency_key: apply the event once per key (``Event(idempotency_key=...)``
            does the same). The key is recorded in the same commit as the event; a repeat
            with the same event and data writes nothing and returns the instance's current
            position, even when the first one halted it. Each instance keeps its last
            ``idempotency_retention`` keys.
        :raises InstanceNotFound: no such instance (nothing written).
        :raises NotRunning: the instance has halted (nothing written).
        :raises IdempotencyKeyReused: the key was applied with another event or data.
        :raises InvalidEvent: ``event`` has no name (nothing written).
        """
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("send", instance_id, event.name if isinstance(event, Event) else event,
                                      lambda ctx: self.send(instance_id, event, data, caller_context=ctx,
                                                            idempotency_key=idempotency_key), caller_context)
        ev, key, fingerprint = self._prepare_event(event, data, idempotency_key)
        return self._run(self._send_unit(instance_id, ev, key, fingerprint, caller_context))

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
            With a ``tracer``, every item is a traced :meth:`send` of its own (a span and a
            commit each).
        """
        results: list[SendResult | None] = []
        jobs = []
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
            if self._tracing is not None:   # a span per item: each is its own traced send
                try:
                    results[index] = SendResult(index, iid, self.send(iid, ev, caller_context=caller_context,
                                                                      idempotency_key=key))
                except Exception as exc:  # the item's own error, reported in its slot
                    results[index] = SendResult(index, iid, None, exc)
                continue
            jobs.append(SendJob(self, results, index, iid, self._send_unit(iid, ev, key, fingerprint, caller_context)))
        self._group.run(jobs)
        return [r for r in results if r is not None]

    @staticmethod
    def _prepare_event(event: Event | str, data: Any, idempotency_key: str | None) -> tuple[Event, str | None, bytes]:
        """The event as the chart will see it, its idempotency key and the key's fingerprint."""
        ev = event if isinstance(event, Event) else Event(event, data)
        if type(ev.name) is not str or not ev.name:
            raise InvalidEvent(f"an event needs a non-empty name, not {ev.name!r}")
        if isinstance(event, Event) and data is not None:
            raise TypeError("pass data inside the Event, or pass an event name with data=")
        key = idempotency_key if idempotency_key is not None else ev.idempotency_key
        if idempotency_key is not None and ev.idempotency_key not in (None, idempotency_key):
            raise ValueError("the Event carries another idempotency key than idempotency_key=")
        if key is not None:
            check_key(key)
            ev = replace(ev, idempotency_key=None)   # the chart never sees it
        fingerprint = b"" if key is None else event_fingerprint(ev)
        return ev, key, fingerprint

    def _send_unit(self, instance_id: str, ev: Event, key: str | None, fingerprint: bytes,
                   caller_context: Any) -> Any:
        """The unit of work of one external event (shared by ``send`` and ``send_many``)."""
        def unit(u: _Unit) -> Position:
            u.call = {"op": "send", "instance": instance_id, "idempotency_key": key, "caller_context": caller_context}
            e = self._load(u, instance_id)
            if e is None:
                raise InstanceNotFound(instance_id)
            assert e.position is not None
            if key is not None and self._seen(e, instance_id, key, fingerprint, "event or data"):
                return self._result(u, instance_id)
            if e.position.status != RUNNING:
                raise NotRunning(f"instance {instance_id!r} is {e.position.status}", e.position.status)
            if e.suspended:
                raise InstanceSuspended(instance_id)
            if key is not None:
                remember_key(e.keys, KeyRecord(key, fingerprint), self.idempotency_retention)
                e.dirty = True
            u.queue.append((instance_id, ev, caller_context))
            self._drain(u)
            return self._result(u, instance_id)
        return unit

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
        :raises SerializationError: ``data`` cannot be stored (nothing is written).
        """
        _check_storable(data, f"the result of invoke {invokeid!r}")
        event = Event(f"done.invoke.{invokeid}", data, "external", invokeid=invokeid)
        return self._outbox.finish_invoke(instance_id, invokeid, token, event, caller_context)

    def fail_invoke(self, instance_id: str, invokeid: str, error: str = "error", cause: Any = None, *,
                    token: str | None = None, caller_context: Any = None) -> FireResult:
        """Finish an invocation with a failure: the chart gets ``error.execution`` with
        ``_event.invokeid`` set and data ``{"invokeid", "error", "cause", "message"}``.
        Liveness, token and return value as for :meth:`complete_invoke`."""
        _check_storable(cause, f"the failure cause of invoke {invokeid!r}")
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
        if self._tracing is not None and not self._tracing.inside():
            return self._tracing.call("delete", instance_id, None, lambda _: self.delete(instance_id))

        def unit(u: _Unit) -> None:
            if self._load(u, instance_id) is None:
                raise InstanceNotFound(instance_id)
            self._delete_instance(u, instance_id)
        self._run(unit)

    def migrate(self, instance_id: str, chart: Chart, *, mapping: Mapping[str, str] | None = None,
                dry_run: bool = False) -> MigrationResult:
        """Move a stored instance onto revision ``chart`` (registered here if it is not yet).

        The position is carried across by state id (``export``/``import_``, with ``mapping``
        renaming old ids) if :func:`~statebound.diff` allows its revision to move, and is
        committed on its own, conditional on the version loaded: a concurrent event is
        never lost, a conflict reloads and tries again. Timer rows and named timeouts
        survive. Nothing raises for an instance that cannot move: the result says why.
        See :mod:`statebound.host.migration`.

        :param dry_run: decide, write nothing (outcome ``would-move`` instead of ``moved``).
        """
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
            e = self._load(u, instance_id)
            if e is None:
                raise InstanceNotFound(instance_id)
            assert e.position is not None
            if e.position.status != RUNNING:
                raise NotRunning(f"instance {instance_id!r} is {e.position.status}", e.position.status)
            if e.suspended:
                return
            e.suspended = e.dirty = True
            for row in self.store.pending_timers(instance_id):
                if row.state in (PENDING, CLAIMED):
                    u.puts[row.key] = replace(row, state=SUSPENDED, claimed_by=None, claim_expires_ms=None)
        self._run(unit)

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
            e = self._load(u, instance_id)
            if e is None:
                raise InstanceNotFound(instance_id)
            if not e.suspended:
                return
            e.suspended, e.dirty = False, True
            now = self.clock.now_ms()
            for row in self.store.pending_timers(instance_id):
                if row.state == SUSPENDED:
                    # overdue rows become ready now, not at their old due time: a sweep only
                    # looks for rows from about now on (the DynamoDB due index is bucketed)
                    later = now if row.ready_at_ms < now else row.next_attempt_at_ms
                    u.puts[row.key] = replace(row, state=PENDING, next_attempt_at_ms=later)
        self._run(unit)

    def is_suspended(self, instance_id: str) -> bool:
        """Whether the instance is suspended (``False`` if it does not exist)."""
        rec = self.store.load(instance_id)
        return rec is not None and rec.status == SUSPENDED

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The instance's timer and outbox rows that have not completed (pending, claimed,
        waiting, suspended or dead)."""
        return self.store.pending_timers(instance_id)

    def dead_timers(self, limit: int = 100) -> list[TimerRow]:
        """Rows parked after ``max_attempts`` failed deliveries."""
        return list(self.store.dead_timers(limit))

    def retry_timer(self, instance_id: str, ordinal: int) -> bool:
        """Revive a dead row so the next sweep delivers it again."""
        now = self.clock.now_ms()
        revived = self.store.retry_timer((instance_id, ordinal), now)
        if revived:
            self._wake([((instance_id, ordinal), now)])
        return revived

    def next_due(self) -> int | None:
        """Epoch ms of the earliest pending timer, or ``None``."""
        return self.store.next_due()

    def fire_due(self, limit: int = 100, *, node_id: str | None = None, lease_ms: int = 30_000) -> list[FireResult]:
        """Claim and fire up to ``limit`` rows that are due at ``clock.now_ms()``, with group
        commit (see :meth:`fire_many`)."""
        node = node_id or self.node_id
        now = self.clock.now_ms()
        rows = self.store.claim_due(now, limit, node, lease_ms)
        return self.fire_many(rows, node_id=node)

    def fire_many(self, rows: Iterable[TimerRow], *, node_id: str | None = None) -> list[FireResult]:
        """Fire claimed rows as :meth:`fire` would, one result per row in order, committing
        the timer fires of up to ``max_batch`` independent instances together (on SQLite,
        one transaction and one fsync). Rows of one instance fire in the given order;
        outbox rows, which call the outside world first, fire on their own in their place.

        A host whose ``fire`` is overridden (a subclass or wrapper that logs or counts every
        fire), or that has a ``tracer`` (a span per fire, linked to the one that armed the
        row), fires every row through ``fire``, one commit each, as before group commit.
        """
        node = node_id or self.node_id
        rows = list(rows)
        if type(self).fire is not Host.fire or "fire" in vars(self) or self._tracing is not None:
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
        unit = self._fire_unit(row)
        if unit is None:
            return self._outbox.fire(row, node, lag)
        try:
            outcome, reason = self._run(unit, completion=lambda o: self._fire_completion(row, node, o))
        except _AlreadyDone:
            return FireResult(row.key, "skipped", "completed elsewhere", lag)
        except Exception as exc:  # a delivery failure must not lose the row
            return self._fire_failed(row, node, exc, lag)
        self._count(outcome)
        return FireResult(row.key, outcome, reason, lag)

    def _fire_unit(self, row: TimerRow) -> Any:
        """The unit of work that fires a timer row (``None`` for an outbox row): returns
        ``(outcome, reason)`` for the row's completion."""
        if row.kind != TIMER:
            return None

        def unit(u: _Unit) -> tuple[str, str | None]:
            u.protected = row.key
            u.call = {"op": "fire", "instance": row.target_id, "timer": [row.instance_id, row.ordinal],
                      "caller_context": row.caller_context}
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
            elif sched.suspended:
                # claimed before the suspend parked it: park it now, in place, name and all
                sched.refs.append(TimerRef(row.ordinal, row.send_id, row.name))
                sched.dirty = True   # the position write makes this conditional on the suspend
                u.puts[row.key] = replace(row, state=SUSPENDED, claimed_by=None, claim_expires_ms=None)
                outcome, reason = "parked", f"instance {row.instance_id!r} is suspended"
            else:
                u.queue.append((row.target_id, Event.from_dict(row.event), row.caller_context))
                self._drain(u)
            return outcome, reason
        return unit

    @staticmethod
    def _fire_completion(row: TimerRow, node: str, result: tuple[str, str | None]) -> TimerCompletion | None:
        """How a fire's commit finishes its row (a row parked for a suspended instance is
        rewritten in place instead)."""
        return None if result[0] == "parked" else TimerCompletion(row.key, result[0], result[1], node)

    def _fire_failed(self, row: TimerRow, node: str, exc: Exception, lag: int) -> FireResult:
        """A timer's delivery failed: release the row with backoff, or park it as dead."""
        self._release(row, node, f"{type(exc).__name__}: {exc}", row.attempts + 1)
        return FireResult(row.key, "failed", str(exc), lag)

    def _release(self, row: TimerRow, node: str, error: str, attempts: int) -> None:
        """A failed delivery: back off exponentially, or park the row after ``max_attempts``."""
        dead = attempts >= self.max_attempts
        delay = self.backoff_ms * (2 ** (attempts - 1))
        retry_at = self.clock.now_ms() + delay
        self.store.release(row.key, node, error=error, next_attempt_at_ms=retry_at, dead=dead)
        if not dead:
            self._wake([(row.key, max(retry_at, row.due_at_ms))])
        self._count("failed")
        if dead:
            self._count("dead")
        log.warning("row %s delivery failed (attempt %d%s): %s", row.key, attempts,
                    ", parked as dead" if dead else "", error)

    def _count(self, outcome: str) -> None:
        self.metrics.add(outcome)

    # ------------------------------------------------------------------ the unit of work
    def _run(self, fn: Any, *, creating: str | None = None, completion: Any = None,
             retry_create: bool = False) -> Any:
        last: ConflictError | None = None
        # one budget for the call, retries included: a retry re-runs the same drives
        budget = Budget(self.max_cpu_ms, self.max_memory_bytes).start()
        for attempt in range(self.max_conflict_retries):
            if attempt:
                # Writers that collided retry at once and collide again; a random pause,
                # growing with each attempt, spreads them out (full jitter).
                time.sleep(self._random.uniform(0, min(self.conflict_backoff_s * (2 ** attempt), 0.25)))
            u, result, commit = self._attempt(fn, completion, None, budget)
            try:
                if not commit.empty:
                    self.store.commit(commit)
                    self.metrics.add("commits")
            except ConflictError as exc:
                self.metrics.add("conflicts")
                last = exc
                if creating is not None and exc.instance_id == creating and not retry_create:
                    raise InstanceExists(creating) from None
                c = commit.complete
                if c is not None:
                    # a row finished by someone else cannot be finished by a retry
                    cur = self.store.get_timer(c.key)
                    if cur is None or cur.state in (DONE, DEAD) or (
                            c.node_id is not None and cur.state == CLAIMED and cur.claimed_by not in (None, c.node_id)):
                        raise _AlreadyDone() from None
                continue
            self._wake((r.key, r.ready_at_ms) for r in commit.timers_put
                       if r.state == PENDING and r.key not in u.deliver)   # handed over below instead
            if u.deliver:
                self._outbox.after_commit([r for r in commit.timers_put if r.key in u.deliver])
            return result
        assert last is not None
        raise last

    def _attempt(self, fn: Any, completion: Any, cache: dict[str, PositionRecord | None] | None = None,
                 budget: Budget | None = None) -> tuple[_Unit, Any, Commit]:
        """Run a unit once, from fresh loads (or ``cache``, in a batch), and build its commit.

        ``budget`` is the call's (``_run`` shares one across retries); a unit of a group gets
        its own, started now, since a budget counts this thread's CPU from its start."""
        if budget is None:
            budget = Budget(self.max_cpu_ms, self.max_memory_bytes).start()
        u = _Unit(cache=cache, budget=budget)
        result = fn(u)
        return u, result, self._build_commit(u, completion(result) if completion else None)
    def _wake(self, due: Iterable[tuple[TimerKey, int]]) -> None:
        """Ask the wake-up backend to fire these rows ``(key, ready_at_ms)`` on time. Runs
        after a commit landed, so a failure is logged, never raised: the rows are the truth."""
        if self.wakeup is None:
            return
        now = self.clock.now_ms()
        requests = wakeups_for(due, now, self.wakeup.horizon_ms)
        if requests:
            try:
                self.wakeup.request(requests, now)
            except Exception as exc:  # the sweeper's fallback read will find the rows
                log.warning("wake-up request for %d row(s) failed: %s", len(requests), exc)

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
                                        SUSPENDED if e.suspended else e.position.status, tuple(e.refs), e.parent,
                                        tuple(e.keys)))
        if self._tracing is not None:
            called = u.entries.get(u.call.get("instance", ""))
            if called is not None and called.position is not None:
                self._tracing.note(called.chart_name, called.position.chart.identity)
        deleted = {iid for iid, e in u.entries.items() if e.deleted}
        puts = tuple(r for r in u.puts.values() if r.instance_id not in deleted)
        dels = tuple(k for k in dict.fromkeys(u.deletes) if k[0] not in deleted and k != u.protected)
        if self.history is None:
            return Commit(tuple(writes), puts, dels, completion)
        return Commit(tuple(writes), puts, dels, completion,
                      history_mod.records(self.history, u, writes, self.clock.now_ms()), self.history.keep, True)

    def _load(self, u: _Unit, instance_id: str) -> _Entry | None:
        e = u.entries.get(instance_id)
        if e is not None:
            return None if e.deleted else e
        rec = self._fetch(u, instance_id)
        if rec is None:
            u.missing.add(instance_id)
            return None
        pos = Position.from_bytes(rec.blob, self._chart_for_blob(rec.chart, rec.blob))
        e = _Entry(rec, self._stamp(u, pos), rec.chart, list(rec.timers), rec.parent, keys=list(rec.idempotency),
                   suspended=rec.status == SUSPENDED)
        if self.history is not None:
            e.steps = []
        u.entries[instance_id] = e
        return e

    def _fetch(self, u: _Unit, instance_id: str) -> PositionRecord | None:
        """An instance's stored record: read ahead by a batch, else loaded now."""
        cache = u.cache
        if cache is not None and instance_id in cache:
            return cache[instance_id]
        return self.store.load(instance_id)

    def _stamp(self, u: _Unit, pos: Position) -> Position:
        if pos.chart.trust == UNTRUSTED:
            # An untrusted chart sees only its own family, and only the processors and handlers
            # offered to it: everything else is, to it, an unknown target or type (the spec's
            # error.communication / error.execution), so it cannot steer other instances.
            me = pos.session_id

            def related(session_id: str) -> bool:
                return _related(me, pos.parent, session_id) and self._load(u, session_id) is not None
            return _restamp(pos, related, self._ioprocessors(me, trusted=False), self._untrusted_invoker_types)

        def routes(session_id: str) -> bool:
            return self._load(u, session_id) is not None
        return _restamp(pos, routes, self._ioprocessors(pos.session_id), self._invoker_types)

    def _ioprocessors(self, instance_id: str, *, trusted: bool = True) -> dict[str, Any] | None:
        # every send processor is an I/O processor the chart may name (SCXML 5.10's _ioprocessors)
        iop: dict[str, Any] = {name: {} for name in self.processors
                               if trusted or name in self.untrusted_may_use}
        if self.http_base is not None:
            loc = {"location": self.http_location(instance_id)}
            iop.update({BASICHTTP_PROCESSOR: loc, "basichttp": loc})
        return iop or None

    def http_location(self, instance_id: str) -> str:
        """The Basic HTTP location of an instance (``POST`` events there)."""
        return f"{self.http_base}/instances/{quote(instance_id, safe='')}/events"

    def _result(self, u: _Unit, instance_id: str) -> Position:
        e = u.entries[instance_id]
        assert e.position is not None
        return _restamp(e.position)

    # ------------------------------------------------------------------ driving
    def _start_instance(self, u: _Unit, instance_id: str, chart: Chart, data: Mapping[str, Any] | None,
                        parent: str | None, invokeid: str | None, caller_context: Any) -> None:
        interp = self._interpreters[chart.identity]
        existing = u.entries.get(instance_id)
        record = existing.record if existing is not None else None
        if existing is None and parent is not None:
            record = self._fetch(u, instance_id)  # a leftover child is replaced, not duplicated
        e = _Entry(record, None, chart.name, [], parent)
        if self.history is not None:
            e.steps, e.started = [], {"data": dict(data) if data is not None else None, "parent": parent,
                                      "invokeid": invokeid}
        u.entries[instance_id] = e
        seed = self._stamp(u, Position(interp.chart, instance_id, RUNNING, ()))
        u.starts += 1
        pos, effects = interp.start(instance_id, data, parent=parent, invokeid=invokeid, routes=seed.routes,
                                    ioprocessors=seed.ioprocessors, caller_context=caller_context,
                                    only_declared=parent is not None, invokers=seed.invokers,
                                    budget=u.budget)
        e.position, e.dirty = pos, True
        self.metrics.add("drives")
        self._apply(u, instance_id, effects, caller_context)

    def _drain(self, u: _Unit) -> None:
        while u.queue:
            if u.deliveries >= self.max_deliveries or (u.budget is not None and u.budget.spent):
                self._spill(u)
                return
            iid, ev, ctx = u.queue.popleft()
            e = self._load(u, iid)
            if e is None or e.position is None or e.position.status != RUNNING:
                continue  # the spec drops events for sessions that are gone
            if e.suspended:   # routed here from another instance: it waits, parked, for resume
                self._keep_as_row(u, iid, e, ev, ctx, "sb.suspended", SUSPENDED)
                continue
            u.deliveries += 1
            if e.steps is not None:
                e.steps.append({"event": ev.to_dict()} if ctx is None else {"event": ev.to_dict(), "context": ctx})
            interp = self._interpreters[e.position.chart.identity]
            pos, effects = interp.drive(e.position, ev, caller_context=ctx, budget=u.budget)
            self.metrics.add("drives")
            if u.deliveries + u.starts > 1 and pos is e.position and _out_of_budget(effects):
                # Earlier drives of this call spent the budget: this event is not to blame,
                # so it waits (as a row due now) for a call with a budget of its own.
                u.queue.appendleft((iid, ev, ctx))
                self._spill(u)
                return
            if pos is not e.position:
                e.position, e.dirty = pos, True
            self._apply(u, iid, effects, ctx)

    def _spill(self, u: _Unit) -> None:
        """Over the delivery budget: keep the rest as timer rows due now (durable, FIFO)."""
        while u.queue:
            iid, ev, ctx = u.queue.popleft()
            e = self._load(u, iid)
            if e is None or e.position is None:
                continue
            self._keep_as_row(u, iid, e, ev, ctx, "sb.spill", SUSPENDED if e.suspended else PENDING)

    def _keep_as_row(self, u: _Unit, iid: str, e: _Entry, ev: Event, ctx: Any, prefix: str, state: str) -> None:
        """An event the instance cannot take now becomes its own row, due now (FIFO by ordinal)."""
        ordinal = self._next_ordinal(e)
        row = TimerRow(iid, ordinal, iid, self.clock.now_ms(), f"{prefix}.{ordinal}", ev.to_dict(),
                       caller_context=ctx, state=state)
        u.puts[row.key] = row
        e.refs.append(TimerRef(ordinal, row.send_id))

    @staticmethod
    def _next_ordinal(e: _Entry) -> int:
        """Take the instance's next ordinal for a row the host writes (an outbox row, a spill)."""
        assert e.position is not None
        e.position = _bump_ordinal(e.position)
        e.dirty = True
        if e.steps is not None:
            e.steps.append({"ordinal": 1})
        return e.position.ordinal

    def _apply(self, u: _Unit, iid: str, effects: tuple[Any, ...], ctx: Any) -> None:
        e = u.entries[iid]
        pos = e.position
        assert pos is not None
        if e.steps is not None:
            if e.effects is None:
                e.effects = {}
            history_mod.summarize(e.effects, effects)
        processors = self.processors
        if pos.chart.trust == UNTRUSTED:
            processors = {k: v for k, v in processors.items() if k in self.untrusted_may_use}
        for eff in effects:
            t = type(eff)
            if t is Send:
                if eff.type in processors:
                    self._outbox.send(u, iid, eff, ctx)
                    continue
                dest, ev = self._route(iid, pos, eff.target, eff)
                if dest is not None and _to_invoked(eff) and \
                        self._outbox.forward(u, iid, eff.target[2:], ev, ctx, eff.send_id):
                    continue  # <send target="#_id"> to a handler's invocation
                if dest is not None:
                    u.queue.append((dest, ev, ctx))
            elif t is SendDelayed:
                if eff.type in processors:
                    self._outbox.send(u, iid, eff, ctx)
                    continue
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
                if eff.type in self.invokers and (pos.chart.trust != UNTRUSTED or eff.type in self.untrusted_may_use):
                    self._outbox.invoke(u, iid, eff, ctx)
                else:
                    self._invoke(u, iid, pos, eff, ctx)
            elif t is CancelInvoke:
                if self._outbox.cancel_invoke(u, iid, eff.invokeid):
                    continue
                cid = child_instance_id(iid, eff.invokeid)
                if self._load(u, cid) is not None:
                    self._delete_instance(u, cid)
            elif t is Autoforward:
                if not self._outbox.forward(u, iid, eff.invokeid, eff.event, ctx):
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
                self.metrics.add("budget_exhausted")
                log.warning("instance %r: event %r exhausted the %s budget after %d rounds; position unchanged",
                            iid, eff.event, eff.reason, eff.rounds)

    def _route(self, iid: str, pos: Position, target: str | None, eff: Any) -> tuple[str | None, Event]:
        """Resolve a send target to an instance id and the event it receives."""
        if eff.type == BASICHTTP_PROCESSOR:
            return self._route_http(iid, pos, target, eff)
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

    def _route_http(self, iid: str, pos: Position, target: str | None, eff: Any) -> tuple[str | None, Event]:
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
        if pos.chart.trust == UNTRUSTED and not _related(iid, pos.parent, dest):
            return iid, Event("error.communication",
                              {"message": f"Basic HTTP target {target!r} is not reachable from an untrusted chart"},
                              "platform", eff.send_id)
        raw = (f"POST {target[len(self.http_base or ''):]} HTTP/1.1\r\n"
               "Content-Type: application/x-www-form-urlencoded\r\n\r\n" + body)
        name = str(form.get("_scxmleventname") or "HTTP.POST")
        data = form if isinstance(eff.data, dict) or form else eff.data
        return dest, Event(name, data, "external", eff.send_id if eff.id_from_author else None,
                           self.http_location(iid), BASICHTTP_PROCESSOR, None, raw)

    def _invoke(self, u: _Unit, iid: str, pos: Position, eff: Invoke, ctx: Any) -> None:
        chart = eff.chart
        try:
            if iid.count("::") >= MAX_INVOKE_DEPTH:  # a chart invoking itself by srcexpr, forever
                raise ChartError(f"invoked sessions nest deeper than {MAX_INVOKE_DEPTH}")
            if u.starts >= self.max_deliveries:  # ... or ten times over at every level
                raise ChartError(f"this call already started {u.starts} sessions (max_deliveries)")
            if chart is None and u.budget is not None and u.budget.spent:  # compiling costs CPU too
                raise ChartError("the call's CPU budget is spent; no chart was compiled")
            # Run-time children are loaded under the parent's policy: its src containment, and
            # an untrusted parent's children are untrusted too.
            if chart is None and eff.content is not None:
                if not isinstance(eff.content, str):
                    raise ChartError("an SCXML <invoke>'s <content expr> must give the child's document as a string")
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
        cid = child_instance_id(iid, eff.invokeid)
        try:
            self._start_instance(u, cid, chart, eff.data, iid, eff.invokeid, ctx)
        except (BudgetExceeded, SerializationError) as exc:
            # the child did not settle, the call's budget ran out, or the parent's <param>s do
            # not fit the child's datamodel (bytes, or values nested too deep for ecmascript)
            u.entries.pop(cid, None)
            u.queue.append((iid, Event("error.execution", {"message": f"invoke {eff.invokeid!r}: {exc}"},
                                       "platform"), ctx))

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



def _out_of_budget(effects: tuple[Any, ...]) -> bool:
    return len(effects) == 1 and type(effects[0]) is BudgetExhausted and effects[0].reason != "rounds"


def _related(me: str, parent: str | None, other: str) -> bool:
    """Whether an untrusted session ``me`` may address ``other``: itself, its parent, or a child of its own."""
    if other in (me, parent):
        return True
    head, sep, tail = other.rpartition("::")
    return bool(sep) and head == me and "::" not in tail


def _restamp(pos: Position, routes: Any = None, ioprocessors: Any = None, invokers: Any = None) -> Position:
    """``pos.restamp(...)`` built the interpreter's fast way: twice on every host call, and
    ``dataclasses.replace`` costs about three times as much."""
    return make_position(pos.chart, pos.session_id, pos.status, pos.states, pos.history, pos.data, pos.macrostep,
                         pos.send_counter, pos.ordinal, pos.invoke_counter, pos.invocations, pos.initialized,
                         pos.parent, pos.invokeid, pos.timeouts, routes=routes, ioprocessors=ioprocessors,
                         invokers=invokers)


def _bump_ordinal(pos: Position) -> Position:
    return replace(pos, ordinal=pos.ordinal + 1)


def _to_invoked(eff: Send) -> bool:
    """Whether an SCXML send targets an invocation (``#_<invokeid>``)."""
    t = eff.target
    return (eff.type == SCXML_PROCESSOR and t is not None and t.startswith("#_")
            and not t.startswith("#_scxml_") and t not in ("#_parent", "#_internal"))


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


def _check_storable(value: Any, what: str) -> None:
    from .store import pack_field
    pack_field(value, what)


def _check_id(instance_id: str) -> None:
    if not isinstance(instance_id, str) or not instance_id:
        raise ValueError("an instance id must be a non-empty string")
    if len(instance_id) > 512:
        raise ValueError("an instance id may be at most 512 characters")
    if "::" in instance_id:
        raise ValueError("'::' is reserved for invoked child ids")

