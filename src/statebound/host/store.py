"""The Store protocol: the one seam between the host and a persistence backend.

A backend stores two kinds of record:

* a **position record** per instance: the blob, an integer version for optimistic
  concurrency, the chart name and status, the list of the instance's pending
  timer refs (so that a cancel by ``send_id`` never needs a scan), and the instance's
  most recent inbound idempotency keys (:class:`KeyRecord`);
* a **row** per pending delayed send or outbox entry, keyed by ``(instance_id, ordinal)``
  where ``instance_id`` is the *scheduling* instance. A row's ``kind`` says what firing
  it means: a ``timer`` delivers an event to ``target_id`` (the same instance, its parent,
  or a child); a ``send`` hands a ``<send>`` to a send processor; an ``invoke`` starts an
  invoke handler; a ``cancel`` calls an invoke handler's cancel hook. Every kind shares
  one machinery: due times, claims, attempts with backoff, the dead state.

Every host call ends in exactly one :meth:`Store.commit`, which the backend applies
atomically: all position writes (each conditional on the version loaded), the new
timer rows, the deleted (cancelled) rows and the completion of the fired row, or
nothing at all. A completion usually marks the row ``done``; it may instead park it as
``waiting`` (an invoke handler will answer later) or ``dead`` (a delivery that failed for
good, in the same commit that tells the chart so). A commit may also name rows it
rewrites with the states it read them in (``Commit.timers_expect``: suspend and resume do);
a row found in another state fails the commit like a version. A failed condition raises
:class:`~statebound.ConflictError` and writes nothing; the host reloads and retries.

**Group commit** (optional, :class:`BatchStore`): a backend may also offer
``load_many(ids)`` and ``commit_many(commits)``. ``commit_many`` applies many commits of
*independent* instances at once (SQLite: one transaction, one fsync), each still all or
nothing on its own: a commit whose condition fails, or that cannot be stored, writes
nothing and gets its error in its slot of the returned list, and the others are applied.
If it raises instead, nothing at all was written. The host hands it commits that touch
disjoint instances only, and falls back to one :meth:`Store.commit` per host call for a
store without it, so every existing store keeps working unchanged.

**Claims by key** (optional, :class:`RowClaimStore`): a backend may also offer
``claim_rows(keys, now_ms, node_id, lease_ms)``, which claims named rows as ``claim_due``
claims due ones. A wake-up names its rows by key (``host/wakeup.py``), and an outbox row
is handed to the outside world before its conditional completion, so the sweeper claims
the woken outbox rows with it before firing them: of two sweepers given one wake-up, one
calls out. A store without it keeps working; a duplicated wake-up of an outbox row is then
delivered at least once (ADR 0022).

Backends live one per file: ``host/memory.py``, ``host/sqlite.py``, ``dynamodb/store.py``.
Each must raise only :mod:`statebound.exceptions` errors (translate driver errors at the
boundary), so the host never imports a driver.

Instance ids are data from outside (an HTTP path, a CLI argument), so every backend checks
them with :func:`check_instance_id` before using one as a key: an id it cannot store is
refused with :class:`~statebound.InvalidInstanceId`, and any other string works, whatever
it looks like. A backend that keeps internal records (leases, cursors) must keep them
where no instance id can reach them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgpack

from .._fastinit import fast_init
from ..exceptions import InvalidArgument, InvalidInstanceId, SerializationError, StateboundError, StoreError

__all__ = [
    "TimerRef", "KeyRecord", "PositionRecord", "TimerRow", "TimerKey", "PositionWrite", "HistoryRecord",
    "pack_history", "unpack_history",
    "TimerCompletion", "Commit", "Store", "BatchStore", "RowClaimStore", "pack_field", "unpack_field", "check_instance_id",
    "commit_instance_ids", "make_timer_row", "purges", "live", "check_ints", "check_text", "check_field",
    "DELETED", "PENDING", "CLAIMED", "WAITING", "DEAD", "DONE", "SUSPENDED", "TIMER", "SEND", "INVOKE", "CANCEL", "ROW_KINDS",
]


def check_instance_id(instance_id: object, max_bytes: int | None = None) -> str:
    """Return ``instance_id`` if a backend can key on it, else raise.

    :param max_bytes: the backend's limit on the id's UTF-8 length, if it has one.
    :raises InvalidInstanceId: not a string, empty, not encodable as UTF-8 (a lone
        surrogate), or longer than ``max_bytes``.
    """
    if not isinstance(instance_id, str):
        raise InvalidInstanceId(instance_id, f"it is a {type(instance_id).__name__}, not a string")
    if not instance_id:
        raise InvalidInstanceId(instance_id, "it is empty")
    try:
        # an ASCII id (nearly all) is its own UTF-8: no need to encode it to count its bytes
        size = len(instance_id) if instance_id.isascii() else len(instance_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInstanceId(instance_id, f"it is not valid Unicode ({exc.reason} at {exc.start})") from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidInstanceId(instance_id, f"it is {size:,} bytes in UTF-8; this store keys at most {max_bytes:,}")
    return instance_id


def check_ints(**values: object) -> None:
    """Refuse an integer argument of a store call (a time in ms, a count, a version) that is
    not one, before anything is read or written: ``check_ints(limit=limit)``.

    Without it a wrong type reached the backend, which answered in its own way: a
    ``TypeError`` on one store, a ``StoreUnavailable`` (a retryable error) on SQLite, or,
    on SQLite, where any integer sorts below any text, a cutoff of ``"x"`` that matched
    every row. ``bool`` is no integer here.

    :raises InvalidArgument: naming the argument.
    """
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgument(f"{name} must be an integer, not {value!r}")


def check_text(name: str, value: object) -> None:
    """Refuse an optional text argument of a store call (a chart name, a listing's
    ``after``) that is neither a string nor ``None``.

    :raises InvalidArgument: naming the argument.
    """
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string or None, not {value!r}")


def pack_field(value: Any, what: str) -> bytes:
    """Encode a row field (event, dedup fields, caller context, refs) for a backend.

    :raises SerializationError: naming ``what``, before anything is written.
    """
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"{what} cannot be stored: {exc}") from exc


def check_field(value: Any, what: str) -> None:
    """Refuse a value a caller hands the host to keep (a ``caller_context``, an invocation's
    result) unless it comes back from its own bytes.

    msgpack packs some values it cannot unpack: a map keyed by a tuple packs its key as an
    array, which cannot key a map again. Such a value was accepted and written on a row
    that no sweep could ever read (ADR 0027 parks it as dead), while ``MemoryStore``, which
    keeps objects, delivered it: the two stores disagreed, and the chart waited for good.

    :raises SerializationError: naming ``what``, before anything is written.
    """
    packed = pack_field(value, what)
    try:
        msgpack.unpackb(packed, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SerializationError(f"{what} cannot be stored: it does not read back ({exc}); "
                                 "map keys must be strings, numbers, bytes, booleans or None") from None


def unpack_field(raw: bytes, what: str) -> Any:
    """Decode a field written by :func:`pack_field`; damaged bytes are a :class:`StoreError`."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise StoreError(f"stored {what} is not valid msgpack: {exc}") from exc


#: Row states. ``waiting`` rows (an invoke handler answered "later") are in no due index:
#: only ``complete_invoke``/``fail_invoke`` or the invoking state's exit finish them.
PENDING = "pending"
CLAIMED = "claimed"
WAITING = "waiting"
DEAD = "dead"
DONE = "done"
#: A row of a suspended instance, parked until ``Host.resume``: in no due index, so no
#: sweep sees it, and listed by ``pending_timers`` like any unfinished row. Also the
#: ``status`` of a suspended instance's position record (its blob still says running).
SUSPENDED = "suspended"
#: The ``status`` of a deleted instance's record, its **tombstone**: it keeps the id's last
#: version and (in a blob only the host reads) its last ordinal, and nothing else, so that a
#: new instance of the same id goes on from them instead of starting again at version 1 and
#: ordinal 1 (ADR 0028). A tombstone is no instance: the host treats it as not found, and
#: ``list_positions`` leaves it out. Writing one purges the instance's rows and history.
DELETED = "deleted"

#: Row kinds: what firing the row does (see the module docstring).
TIMER = "timer"
SEND = "send"
INVOKE = "invoke"
CANCEL = "cancel"
ROW_KINDS = (TIMER, SEND, INVOKE, CANCEL)

#: ``(instance_id, ordinal)``: the primary key of a timer row.
TimerKey = tuple[str, int]


@fast_init
@dataclass(frozen=True, slots=True)
class TimerRef:
    """What a position record remembers about one of its pending timer rows.

    :ivar name: a named timeout's name; ``"invoke"`` on the host's ref of a handler
        invocation (``host/outbox.py``), whose send id is ``sb.invoke.<invokeid>``: a
        chart's send ref has no name, and a timeout's send id is ``sb.timeout.*``;
        ``None`` otherwise.
    """

    ordinal: int
    send_id: str
    name: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One inbound idempotency key an instance has applied, kept beside its position.

    :ivar key: the caller's ``idempotency_key``.
    :ivar fingerprint: a digest of what was sent with it (event name and data, or the start
        data), so a reuse of the key for something else can be refused.
    """

    key: str
    fingerprint: bytes


@fast_init
@dataclass(frozen=True, slots=True)
class PositionRecord:
    """A stored instance, as returned by :meth:`Store.load`.

    :ivar instance_id: the instance id (also the SCXML ``_sessionid``).
    :ivar chart: the name of the chart it runs (the host resolves it to a Chart).
    :ivar version: monotonically increasing integer, starting at 1 on creation.
    :ivar blob: the encoded :class:`~statebound.Position`.
    :ivar status: ``"running"``, ``"done"`` or ``"cancelled"``, kept beside the blob so
        the liveness check needs no decode.
    :ivar timers: refs to the instance's pending timer rows (it is the scheduler).
    :ivar parent: the parent instance id for an invoked child, else ``None``.
    :ivar idempotency: the most recent inbound idempotency keys applied, oldest first
        (the host bounds how many are kept).
    """

    instance_id: str
    chart: str
    version: int
    blob: bytes
    status: str
    timers: tuple[TimerRef, ...] = ()
    parent: str | None = None
    idempotency: tuple[KeyRecord, ...] = ()


@fast_init
@dataclass(frozen=True, slots=True)
class TimerRow:
    """One durable row: a timer, or an outbox entry (see ``kind``).

    :ivar instance_id: the scheduling instance (key part 1; ``cancel`` scope).
    :ivar ordinal: the ``SendDelayed.ordinal`` (key part 2).
    :ivar target_id: the instance that receives the event when it fires.
    :ivar due_at_ms: epoch ms, computed once at commit (``now + delay_ms`` or ``at_ms``).
    :ivar send_id: the send id (cancellation key together with ``instance_id``).
    :ivar event: the row's payload. For a ``timer``, the event to deliver, as
        :meth:`statebound.Event.to_dict`; for the outbox kinds, what the processor or
        handler is handed (see ``host/outbox.py``).
    :ivar name: the ``<sb:timeout>`` name, if the row is a named timeout.
    :ivar dedup: the dedup fields of the ``SendDelayed`` (macrostep, microstep, round,
        c_index, owner, id_from_author), kept as row data for operators.
    :ivar caller_context: the opaque host value of the scheduling event.
    :ivar state: ``pending``, ``claimed``, ``waiting``, ``dead`` or ``done``.
    :ivar attempts: failed delivery attempts so far.
    :ivar next_attempt_at_ms: when a released row may be tried again (backoff), or ``None``.
    :ivar claimed_by: node id of the sweeper holding the claim, if claimed.
    :ivar claim_expires_ms: when that claim lapses (a dead sweeper's lease runs out).
    :ivar last_error: text of the last delivery failure.
    :ivar outcome: for ``done`` rows: ``fired``, ``discarded`` or ``stale`` (timers and
        invoke results), ``delivered`` (sends) or ``cancelled`` (invokes).
    :ivar reason: why a row was discarded, e.g. ``"instance not found"``.
    :ivar kind: ``timer``, ``send``, ``invoke`` or ``cancel``.
    """

    instance_id: str
    ordinal: int
    target_id: str
    due_at_ms: int
    send_id: str
    event: dict[str, Any]
    name: str | None = None
    dedup: dict[str, Any] = field(default_factory=dict)
    caller_context: Any = None
    state: str = PENDING
    attempts: int = 0
    next_attempt_at_ms: int | None = None
    claimed_by: str | None = None
    claim_expires_ms: int | None = None
    last_error: str | None = None
    outcome: str | None = None
    reason: str | None = None
    kind: str = TIMER

    @property
    def key(self) -> TimerKey:
        """The row's primary key ``(instance_id, ordinal)``."""
        return (self.instance_id, self.ordinal)

    @property
    def ready_at_ms(self) -> int:
        """When the row may fire: the due time, or the backoff time if later."""
        if self.next_attempt_at_ms is not None and self.next_attempt_at_ms > self.due_at_ms:
            return self.next_attempt_at_ms
        return self.due_at_ms


(_t_instance_id, _t_ordinal, _t_target_id, _t_due_at_ms, _t_send_id, _t_event, _t_name, _t_dedup,
 _t_caller_context, _t_state, _t_attempts, _t_next_attempt_at_ms, _t_claimed_by, _t_claim_expires_ms,
 _t_last_error, _t_outcome, _t_reason, _t_kind) = (getattr(TimerRow, f).__set__ for f in TimerRow.__dataclass_fields__)
_new = object.__new__


def make_timer_row(instance_id: str, ordinal: int, target_id: str, due_at_ms: int, send_id: str,
                   event: dict[str, Any], name: str | None, dedup: dict[str, Any], caller_context: Any, state: str,
                   attempts: int, next_attempt_at_ms: int | None, claimed_by: str | None,
                   claim_expires_ms: int | None, last_error: str | None, outcome: str | None, reason: str | None,
                   kind: str) -> TimerRow:
    """``TimerRow(...)`` with every field given positionally, built without the frozen
    dataclass's ``__init__`` (about half the cost): a store builds one for every row a
    sweep claims."""
    row = _new(TimerRow)
    _t_instance_id(row, instance_id)
    _t_ordinal(row, ordinal)
    _t_target_id(row, target_id)
    _t_due_at_ms(row, due_at_ms)
    _t_send_id(row, send_id)
    _t_event(row, event)
    _t_name(row, name)
    _t_dedup(row, dedup)
    _t_caller_context(row, caller_context)
    _t_state(row, state)
    _t_attempts(row, attempts)
    _t_next_attempt_at_ms(row, next_attempt_at_ms)
    _t_claimed_by(row, claimed_by)
    _t_claim_expires_ms(row, claim_expires_ms)
    _t_last_error(row, last_error)
    _t_outcome(row, outcome)
    _t_reason(row, reason)
    _t_kind(row, kind)
    return row


@fast_init
@dataclass(frozen=True, slots=True)
class PositionWrite:
    """One position to write in a commit.

    :ivar expected_version: the version loaded; ``None`` means the record must not exist
        yet (a create). The backend raises ``ConflictError`` when it does not match.
    :ivar blob: the new blob, or ``None`` to delete the record outright. A ``None`` blob
        or a ``status`` of :data:`DELETED` (a tombstone) also purges all the instance's
        timer rows (the ones it scheduled) and its history: see :func:`purges`.
    :ivar timers: the instance's pending timer refs after this commit.
    :ivar idempotency: the instance's retained idempotency keys after this commit (the
        whole list: a write replaces it).
    """

    instance_id: str
    chart: str
    expected_version: int | None
    blob: bytes | None
    status: str
    timers: tuple[TimerRef, ...] = ()
    parent: str | None = None
    idempotency: tuple[KeyRecord, ...] = ()


def purges(w: PositionWrite) -> bool:
    """Whether a store applying ``w`` purges the instance's rows and history with it: a
    delete (``blob`` ``None``) or a tombstone (``status`` :data:`DELETED`)."""
    return w.blob is None or w.status == DELETED


def live(rec: PositionRecord | None) -> PositionRecord | None:
    """``rec``, or ``None`` for no record or a tombstone (a deleted instance)."""
    return None if rec is None or rec.status == DELETED else rec


@fast_init
@dataclass(frozen=True, slots=True)
class TimerCompletion:
    """Finishes the fired row in the same commit.

    The backend must check the row still exists and is neither done nor dead (and, when
    ``node_id`` is given, that it is not claimed by another node); otherwise it raises
    ``ConflictError`` and writes nothing, which is what makes a fire happen exactly once.

    ``state`` is where the row goes: ``done`` (with ``outcome`` and ``reason``),
    ``waiting`` (an invoke handler will answer later: out of every due index, still
    completable) or ``dead`` (``attempts + 1`` and ``error`` as ``last_error``: a delivery
    that failed for good, parked in the commit that gives the chart its error event).
    The claim is cleared in every case.
    """

    key: TimerKey
    outcome: str | None  # done: "fired" | "discarded" | "stale" | "delivered" | "cancelled"
    reason: str | None = None
    node_id: str | None = None
    state: str = DONE
    error: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One entry of an instance's execution history (``Host(history=...)``), appended in the
    commit of the unit of work it describes, so an uncommitted event never has one.

    :ivar instance_id: the instance.
    :ivar version: the position version this commit wrote: the record's key, oldest first.
    :ivar at_ms: when (the host's clock).
    :ivar kind: ``start``, ``event`` (events were delivered), ``write`` (the position was
        written without an event: a timer discarded, a row kept for later), ``suspend``,
        ``resume`` or ``migrate``.
    :ivar steps: what the host did to the position, in order: ``{"event": Event.to_dict()}``
        for each event delivered, ``{"ordinal": 1}`` for each ordinal the host took itself
        (a row it wrote). With ``start`` (and ``migrate``), enough to re-drive it exactly.
    :ivar configuration: the active state ids after the commit.
    :ivar status: the position's status after the commit.
    :ivar effects: a summary of the effects: timers armed and cancelled, sends, invokes.
    :ivar chart: the chart name; ``revision`` its identity.
    :ivar call: the host call this came from: ``op`` (``start``, ``send``, ``fire``...), the
        ``instance`` it named, and its ``idempotency_key`` or fired ``timer`` when it had one.
    :ivar caller_context: the caller context of the call (or of the first event delivered).
    :ivar start: for ``start``: the data, parent and invokeid; for ``migrate``: the revision
        it came from and the state id mapping.
    :ivar expires_at_ms: when a TTL-keeping backend (DynamoDB) may drop it, if a TTL is set.
    """

    instance_id: str
    version: int
    at_ms: int
    kind: str
    steps: tuple[dict[str, Any], ...] = ()
    configuration: tuple[str, ...] = ()
    status: str = "running"
    effects: dict[str, Any] = field(default_factory=dict)
    chart: str = ""
    revision: str = ""
    call: dict[str, Any] = field(default_factory=dict)
    caller_context: Any = None
    start: dict[str, Any] | None = None
    expires_at_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data (for ``--json`` and for the backends' encoding)."""
        return {"instance_id": self.instance_id, "version": self.version, "at_ms": self.at_ms, "kind": self.kind,
                "steps": list(self.steps), "configuration": list(self.configuration), "status": self.status,
                "effects": self.effects, "chart": self.chart, "revision": self.revision, "call": self.call,
                "caller_context": self.caller_context, "start": self.start, "expires_at_ms": self.expires_at_ms}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HistoryRecord:
        """Rebuild a record from :meth:`to_dict` output."""
        try:
            return cls(d["instance_id"], int(d["version"]), int(d["at_ms"]), d["kind"], tuple(d.get("steps") or ()),
                       tuple(d.get("configuration") or ()), d.get("status", "running"), dict(d.get("effects") or {}),
                       d.get("chart", ""), d.get("revision", ""), dict(d.get("call") or {}), d.get("caller_context"),
                       d.get("start"), d.get("expires_at_ms"))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed history record: {exc!r}") from exc


def pack_history(record: HistoryRecord) -> bytes:
    """A history record as bytes (msgpack), for a backend to store."""
    return pack_field(record.to_dict(), f"history record {record.instance_id!r} v{record.version}")


def unpack_history(raw: bytes) -> HistoryRecord:
    """The inverse of :func:`pack_history`."""
    return HistoryRecord.from_dict(unpack_field(raw, "history record"))


@fast_init
@dataclass(frozen=True, slots=True)
class Commit:
    """Everything one host call writes, applied atomically by :meth:`Store.commit`.

    Kept a plain value of independent parts so that a backend can later apply several
    commits in one transaction (group commit) or append more record kinds (history).
    """

    writes: tuple[PositionWrite, ...] = ()
    timers_put: tuple[TimerRow, ...] = ()
    timers_delete: tuple[TimerKey, ...] = ()
    complete: TimerCompletion | None = None
    #: history records to append (each describes one of ``writes``); an instance deleted
    #: by ``writes`` loses its whole history
    history: tuple[HistoryRecord, ...] = ()
    #: keep at most this many history records per instance written (older ones are
    #: deleted in the same commit); ``None`` keeps them all. DynamoDB bounds history by
    #: ``expires_at_ms`` (TTL) instead.
    history_keep: int | None = None
    #: the writing host records history (kept for stores that want to know; every store now
    #: drops a deleted instance's history whoever deletes it)
    history_in_use: bool = False
    #: ``(key, states)``: the commit applies only if each of these rows is, at that moment,
    #: in one of ``states`` (else ``ConflictError``, nothing written). A host that rewrites rows
    #: it read outside the commit (suspend, resume) names what it read, so that a row a
    #: sweeper completed meanwhile, which a position version cannot show, is not brought back.
    timers_expect: tuple[tuple[TimerKey, tuple[str, ...]], ...] = ()

    @property
    def empty(self) -> bool:
        """True when there is nothing to write."""
        return not (self.writes or self.timers_put or self.timers_delete or self.complete)


@runtime_checkable
class Store(Protocol):
    """What a persistence backend implements. See the module docstring for the contract."""

    def load(self, instance_id: str) -> PositionRecord | None:
        """Return the instance's record (strongly consistent), or ``None``."""
        ...

    def commit(self, commit: Commit) -> None:
        """Apply the commit atomically, or raise ``ConflictError``/``StoreError`` and write nothing."""
        ...

    def claim_due(self, now_ms: int, limit: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim up to ``limit`` rows that are ready (``ready_at_ms <= now_ms``), earliest first.

        Ready means state ``pending``, or ``claimed`` with ``claim_expires_ms <= now_ms``
        (a dead sweeper's claim). Claiming sets ``claimed_by``/``claim_expires_ms``
        atomically so two sweepers never hold the same row. A backend whose commit
        already guards the fire (DynamoDB) may return rows without writing a claim.
        """
        ...

    def release(self, key: TimerKey, node_id: str, *, error: str, next_attempt_at_ms: int | None,
                dead: bool, attempt: bool = True) -> None:
        """Give a claimed row back after a failed delivery: ``attempts += 1``, record the
        error and the backoff time, or park it as ``dead``. A no-op if the row is gone.

        With ``attempt=False`` the row was never tried (a sweep stopped by its deadline before
        it): it goes back to pending with its attempts and last error as they were, ready at
        ``next_attempt_at_ms`` (``None``: its due time), so that it fires before a later row of
        its instance instead of after its lease."""
        ...

    def next_due(self) -> int | None:
        """The earliest ``ready_at_ms`` among pending (or claim-expired) rows, or ``None``."""
        ...

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The not-yet-done rows scheduled by this instance (pending, claimed, waiting or
        dead), by ordinal."""
        ...

    def dead_timers(self, limit: int = 100) -> Sequence[TimerRow]:
        """Rows parked as dead after too many failed attempts."""
        ...

    def due_timers(self, due_before_ms: int, limit: int = 1_000) -> Sequence[TimerRow]:
        """Up to ``limit`` rows of any instance that will fire by ``due_before_ms``: pending
        or claimed, ``ready_at_ms <= due_before_ms``, earliest first (overdue rows included).
        For operators ("what fires in the next hour?"); it claims nothing."""
        ...

    def retry_timer(self, key: TimerKey, now_ms: int) -> bool:
        """Revive a dead row: pending, attempts reset, due now. Returns whether a row was revived."""
        ...

    def history(self, instance_id: str, *, after_version: int = 0, limit: int = 1_000) -> Sequence[HistoryRecord]:
        """The instance's history records with ``version > after_version``, oldest first, at
        most ``limit`` (pass the last version returned to page on)."""
        ...

    def list_positions(self, chart: str | None = None, *, after: str | None = None,
                       limit: int = 1_000) -> Sequence[PositionRecord]:
        """Up to ``limit`` stored instances (of chart ``chart``, or all), in the backend's own
        stable order, starting after instance ``after``: pass the last id returned to page on.
        For batch jobs such as bulk migration; the records may be slightly stale (commit
        against their version, and reload on a conflict). Tombstones (:data:`DELETED`) are
        left out."""
        ...

    def get_timer(self, key: TimerKey) -> TimerRow | None:
        """One row by key, in whatever state (done rows included while they are kept)."""
        ...


@runtime_checkable
class BatchStore(Store, Protocol):
    """A :class:`Store` that can also load and commit for many instances at once (group
    commit; see the module docstring). The host uses these methods when they are there."""

    def load_many(self, instance_ids: Sequence[str]) -> dict[str, PositionRecord]:
        """The records of those of ``instance_ids`` that exist (strongly consistent), by id.

        :raises InvalidInstanceId: an id the backend cannot key (nothing is read).
        """
        ...

    def commit_many(self, commits: Sequence[Commit]) -> list[StateboundError | None]:
        """Apply each commit atomically and independently, together where the backend can.

        Returns one slot per commit: ``None`` when it was applied, else the error that
        kept it from being applied (``ConflictError``, ``ItemTooLarge``,
        ``SerializationError``...), with nothing of it written. Raises only when nothing
        at all was written (the whole batch failed, e.g. ``StoreUnavailable``).
        The commits must touch disjoint instances (:func:`commit_instance_ids`).
        """
        ...


@runtime_checkable
class RowClaimStore(Store, Protocol):
    """A :class:`Store` that can also claim rows named by key (see the module docstring).
    The sweeper uses it for woken outbox rows when it is there."""

    def claim_rows(self, keys: Sequence[TimerKey], now_ms: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim each of the rows ``keys`` names for ``node_id`` until ``now_ms + lease_ms``,
        atomically per row, and return the rows claimed, in the order of ``keys``.

        A row is claimed when it is ``pending`` and ready (``ready_at_ms <= now_ms``),
        ``claimed`` with a lease that has run out (``claim_expires_ms <= now_ms``), or
        already claimed by ``node_id`` (its lease is renewed). Each returned row is as
        stored after the claim: ``claimed``, ``claimed_by`` ``node_id``, ``claim_expires_ms``
        set. Rows that are gone, not ready, done, dead, waiting, suspended or held by
        another node's live claim are left out, and so is a row a damaged store cannot read
        (parked dead, as ``claim_due`` parks it: ADR 0027). Of two callers racing for one
        row, with different node ids, one gets it.

        Unlike ``claim_due`` this claim must be written where every process sees it, also on
        a backend whose ``claim_due`` may skip the write (DynamoDB): its point is to keep
        another process from calling out for the same row.

        :raises InvalidArgument: ``now_ms`` or ``lease_ms`` not an integer.
        :raises InvalidInstanceId: a key's instance id the backend cannot key (nothing claimed).
        """
        ...


def commit_instance_ids(commit: Commit) -> set[str]:
    """Every instance id a commit keys on: positions written and timer rows put, deleted
    or completed (so a backend can check them all before it writes anything)."""
    writes = commit.writes
    # most commits write one position: a set display costs a fraction of a comprehension
    ids = {writes[0].instance_id} if len(writes) == 1 else {w.instance_id for w in writes}
    if commit.timers_put:   # most commits have no rows: skip building empty generators
        ids.update(row.instance_id for row in commit.timers_put)
    if commit.timers_delete:
        ids.update(key[0] for key in commit.timers_delete)
    if commit.complete is not None:
        ids.add(commit.complete.key[0])
    return ids
