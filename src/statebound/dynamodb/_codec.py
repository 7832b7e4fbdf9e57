"""Item layout of the statebound table: records <-> DynamoDB attribute values, and sizes.

Kept apart from ``store.py`` so the layout is readable in one place and testable
without a client. Everything here is pure: no boto3, no I/O, no clock.

One table, ``pk`` (S) + ``sk`` (S)::

    pk                 sk             what
    <instance id>      P              position: chart, version, blob, status, timers, parent,
                                      idem (the retained inbound idempotency keys)
    <instance id>      T#<ordinal>    timer or outbox row scheduled by that instance (ordinal
                                      zero-padded); ``kind`` is absent for a timer
    lease#board        B              the shard lease board: owners and heartbeats (leases.py)
    cli#charts         R#<name>...    a chart revision the CLI remembers (cli/registry.py)
    statebound#layout  V              the layout marker (``layout`` = :data:`LAYOUT`): no 0.1-keyed
                                      row is left (``_migrate.py``)
    sweep#<shard>      C              0.1 only: a sweep cursor; its presence marks a 0.1 table
    lease#<shard>      L              0.1 only: a shard lease; deleted by the migration
    lease#members      N#<node id>    0.1 only: a membership heartbeat; deleted by the migration

**Key spaces.** An instance id is any string :func:`check_id` accepts, so an instance
may well be called ``lease#members`` or ``sweep#3`` and share a partition with internal
items. What keeps them apart is the sort key: an instance's items have ``sk`` ``P`` or
``T#<20 digits>`` or ``H#<20 digits>`` and nothing else (:data:`INSTANCE_SKS`), internal items never do. Two
rules follow, and every read in this package keeps them:

* an internal item is read by its full key (``GetItem``, ``BatchGetItem``, a conditional
  write), or by a ``Query`` that pins ``sk`` to its own prefix (the CLI's chart registry
  reads ``begins_with(sk, "R#")``), never by ``pk`` alone;
* a ``Query`` of an instance's partition pins ``sk`` to ``T#`` (or, for its history, ``H#``).

So no instance id, however hostile, can reach an internal item, and an internal item can
never show up as an instance's data.

Ids are limited to :data:`MAX_INSTANCE_ID_BYTES` of UTF-8: DynamoDB allows 2,048 bytes in
a partition key but only 1,024 in a sort key, and the dead index's sort key is the id plus
a 21-byte suffix.

Two sparse global secondary indexes, both projecting ALL attributes:

* ``due-index``: ``gsi_pk`` = ``"due#<shard>"`` and ``gsi_due`` = the row's ready time.
  Only pending rows carry these two attributes, so one ``Query`` of a shard, earliest
  first, returns what is due *and* (the first row past now) when the shard is next due.
* ``dead-index``: ``dead_pk`` = ``"dead#<shard>"`` and ``dead_sk`` =
  ``"<instance>\\x1f<ordinal>"``. Only dead rows carry them, spread over the shards like
  the due rows, so listing dead rows reads dead rows only and no key takes every one.

0.1 tables put a time bucket in the due partition (``"<bucket>#<shard>"``) and every dead
row under ``"dead"``; :func:`is_legacy_due_partition` recognises the former, and
``_migrate.py`` rewrites both.
"""

from __future__ import annotations

import zlib
from typing import Any


from ..exceptions import StoreError
from ..host.store import (CLAIMED, DEAD, PENDING, TIMER, KeyRecord, PositionRecord, TimerKey, TimerRef,
                          TimerRow, check_instance_id, pack_field, unpack_field)

__all__ = [
    "POSITION_SK", "TIMER_PREFIX", "INSTANCE_SKS", "MAX_INSTANCE_ID_BYTES", "check_id", "DUE_INDEX",
    "DEAD_INDEX", "LEGACY_DEAD_PARTITION", "LEGACY_CURSOR_PREFIX", "LEGACY_CURSOR_SK", "LAYOUT_PK", "LAYOUT_SK",
    "LAYOUT", "timer_sk", "shard_of", "due_partition", "dead_partition",
    "is_legacy_due_partition", "dead_sort_key", "position_item",
    "record_from_item", "timer_item", "row_from_item", "listed_row", "index_attributes",
    "item_size", "attr_size", "pack", "unpack", "S", "N", "B",
]

POSITION_SK = "P"
TIMER_PREFIX = "T#"
#: The sort-key prefixes of an instance's own items; internal items use none of them.
INSTANCE_SKS = (POSITION_SK, TIMER_PREFIX, "H#")
#: The sparse GSI of pending rows, and the one of dead rows (listed for operators).
DUE_INDEX = "due-index"
DEAD_INDEX = "dead-index"
#: Where 0.1 put every dead row.
LEGACY_DEAD_PARTITION = "dead"
DUE_PREFIX = "due#"
#: 0.1's per-shard sweep cursor item: ``("sweep#<shard>", "C")``.
LEGACY_CURSOR_PREFIX = "sweep#"
LEGACY_CURSOR_SK = "C"
#: 0.1's lease items: ``("lease#<shard>", "L")`` and ``("lease#members", "N#<node>")``.
LEGACY_LEASE_PREFIX = "lease#"
LEGACY_LEASE_SK = "L"
LEGACY_MEMBERS_PK = "lease#members"
LEGACY_MEMBER_PREFIX = "N#"
DEAD_PREFIX = "dead#"
#: The layout marker item, ``("statebound#layout", "V")``, and the layout it records: 0.1's
#: bucketed due index was layout 1, the shard-keyed one is 2. Written once the table is
#: known to hold no 0.1-keyed row, so a sweeper looks for such rows at most once per table.
LAYOUT_PK = "statebound#layout"
LAYOUT_SK = "V"
LAYOUT = 2
#: Width of the zero-padded ordinal in a timer sort key: 20 digits hold any uint64,
#: and a fixed width makes the string order of the sort keys the numeric order.
ORDINAL_WIDTH = 20
#: Separates instance id and ordinal inside strings that must sort like the key tuple;
#: a control character sorts below every printable one, so ``("a", 9)`` < ``("a#b", 0)``.
KEY_SEPARATOR = "\x1f"
#: Longest instance id (UTF-8 bytes) the table keys on: ``dead_sk`` is the id plus a
#: separator and a 20-digit ordinal and must fit DynamoDB's 1,024-byte sort-key limit.
MAX_INSTANCE_ID_BYTES = 1_000


def check_id(instance_id: object) -> str:
    """The id if this table layout can key on it, else :class:`~statebound.InvalidInstanceId`."""
    return check_instance_id(instance_id, MAX_INSTANCE_ID_BYTES)


# --------------------------------------------------------------------------- values


def S(value: str) -> dict[str, Any]:
    """A string attribute value."""
    return {"S": value}


def N(value: int) -> dict[str, Any]:
    """A number attribute value (statebound only stores integers)."""
    return {"N": str(int(value))}


def B(value: bytes) -> dict[str, Any]:
    """A binary attribute value."""
    return {"B": bytes(value)}


pack = pack_field      # one encoding for row fields, shared with the other backends
unpack = unpack_field


# --------------------------------------------------------------------------- keys


def timer_sk(ordinal: int) -> str:
    """The sort key of the timer row with this ordinal."""
    if ordinal < 0:
        # a negative number would break the zero-padded ordering, and ordinals are counters
        raise StoreError(f"timer ordinal must be >= 0, got {ordinal}")
    return f"{TIMER_PREFIX}{ordinal:0{ORDINAL_WIDTH}d}"


def shard_of(key: TimerKey, shards: int) -> int:
    """The shard of a timer row: CRC-32 of the key, so every process agrees without state."""
    instance_id, ordinal = key
    return zlib.crc32(f"{instance_id}{KEY_SEPARATOR}{ordinal}".encode()) % shards


def due_partition(shard: int) -> str:
    """The ``gsi_pk`` value of a shard's due-index partition."""
    return f"{DUE_PREFIX}{shard}"


def dead_partition(shard: int) -> str:
    """The ``dead_pk`` value of a shard's dead-index partition."""
    return f"{DEAD_PREFIX}{shard}"


def is_legacy_due_partition(value: str) -> bool:
    """Whether a ``gsi_pk`` value is 0.1's ``"<bucket>#<shard>"``."""
    return not value.startswith(DUE_PREFIX)


def dead_sort_key(key: TimerKey) -> str:
    """The ``dead_sk`` value: sorts dead rows by ``(instance_id, ordinal)``."""
    return f"{key[0]}{KEY_SEPARATOR}{key[1]:0{ORDINAL_WIDTH}d}"


def index_attributes(row: TimerRow, *, shards: int) -> dict[str, dict[str, Any]]:
    """The sparse index attributes a row in this state carries (possibly none).

    Pending and claimed rows are in the due index under their shard, sorted by ready
    time; dead rows are in the dead index; waiting and done rows are in neither.
    """
    shard = shard_of(row.key, shards)
    if row.state in (PENDING, CLAIMED):
        return {"gsi_pk": S(due_partition(shard)), "gsi_due": N(row.ready_at_ms)}
    if row.state == DEAD:
        return {"dead_pk": S(dead_partition(shard)), "dead_sk": S(dead_sort_key(row.key))}
    return {}


# --------------------------------------------------------------------------- positions


def _ref_value(ref: TimerRef) -> dict[str, Any]:
    return {"M": {"ordinal": N(ref.ordinal), "send_id": S(ref.send_id),
                  "name": {"NULL": True} if ref.name is None else S(ref.name)}}


def position_item(instance_id: str, chart: str, version: int, blob: bytes, status: str,
                  timers: tuple[TimerRef, ...], parent: str | None,
                  commit_token: str, idempotency: tuple[KeyRecord, ...] = ()) -> dict[str, dict[str, Any]]:
    """The position item. ``commit_token`` identifies the commit that wrote it (see store.py)."""
    item = {
        "pk": S(instance_id), "sk": S(POSITION_SK), "chart": S(chart), "version": N(version),
        "blob": B(blob), "status": S(status), "timers": {"L": [_ref_value(t) for t in timers]},
        "commit_token": S(commit_token),
    }
    if parent is not None:
        item["parent"] = S(parent)
    if idempotency:
        # one binary attribute, not a list of maps: it rides on every load of the instance
        item["idem"] = B(pack([[k.key, k.fingerprint] for k in idempotency],
                              f"idempotency keys of {instance_id!r}"))
    return item


def _keys_from(item: dict[str, Any]) -> tuple[KeyRecord, ...]:
    if "idem" not in item:
        return ()
    return tuple(KeyRecord(k, bytes(f)) for k, f in unpack(item["idem"]["B"], "idempotency keys"))


def record_from_item(item: dict[str, Any]) -> PositionRecord:
    """Rebuild a :class:`PositionRecord` from a position item."""
    try:
        refs = []
        for value in item.get("timers", {}).get("L", []):
            m = value["M"]
            name = m.get("name", {"NULL": True})
            refs.append(TimerRef(int(m["ordinal"]["N"]), m["send_id"]["S"],
                                 None if "NULL" in name else name["S"]))
        return PositionRecord(
            instance_id=item["pk"]["S"], chart=item["chart"]["S"],
            version=int(item["version"]["N"]), blob=bytes(item["blob"]["B"]),
            status=item["status"]["S"], timers=tuple(refs),
            parent=item["parent"]["S"] if "parent" in item else None, idempotency=_keys_from(item))
    except (KeyError, TypeError, ValueError) as exc:
        # A hand-edited or foreign item: say which instance, never a bare KeyError.
        pk = item.get("pk", {}).get("S", "?")
        raise StoreError(f"position item of {pk!r} is malformed: missing or bad {exc}") from exc


# --------------------------------------------------------------------------- timers

# Optional TimerRow fields stored only when set, with their DynamoDB type.
_OPTIONAL_S = ("name", "claimed_by", "last_error", "outcome", "reason")
_OPTIONAL_N = ("next_attempt_at_ms", "claim_expires_ms")


def timer_item(row: TimerRow, *, shards: int) -> dict[str, dict[str, Any]]:
    """The timer item for ``row``, index attributes included."""
    item: dict[str, dict[str, Any]] = {
        "pk": S(row.instance_id), "sk": S(timer_sk(row.ordinal)), "ordinal": N(row.ordinal),
        "target_id": S(row.target_id), "due_at_ms": N(row.due_at_ms), "send_id": S(row.send_id),
        "event": B(pack(row.event, f"event of timer {row.key}")),
        "dedup": B(pack(row.dedup, f"dedup fields of timer {row.key}")),
        "caller_context": B(pack(row.caller_context, f"caller_context of timer {row.key}")),
        "state": S(row.state), "attempts": N(row.attempts),
    }
    for name in _OPTIONAL_S:
        value = getattr(row, name)
        if value is not None:
            item[name] = S(value)
    for name in _OPTIONAL_N:
        value = getattr(row, name)
        if value is not None:
            item[name] = N(value)
    if row.kind != TIMER:
        item["kind"] = S(row.kind)
    item.update(index_attributes(row, shards=shards))
    return item


def row_from_item(item: dict[str, Any]) -> TimerRow:
    """Rebuild a :class:`TimerRow` from a timer item (base table or an ALL-projected index)."""
    try:
        key = (item["pk"]["S"], int(item["ordinal"]["N"]))
        kwargs: dict[str, Any] = {}
        for name in _OPTIONAL_S:
            if name in item:
                kwargs[name] = item[name]["S"]
        for name in _OPTIONAL_N:
            if name in item:
                kwargs[name] = int(item[name]["N"])
        return TimerRow(
            instance_id=key[0], ordinal=key[1], target_id=item["target_id"]["S"],
            due_at_ms=int(item["due_at_ms"]["N"]), send_id=item["send_id"]["S"],
            event=unpack(item["event"]["B"], f"event of timer {key}"),
            dedup=unpack(item["dedup"]["B"], f"dedup of timer {key}") if "dedup" in item else {},
            caller_context=(unpack(item["caller_context"]["B"], f"caller_context of timer {key}")
                            if "caller_context" in item else None),
            state=item["state"]["S"], attempts=int(item.get("attempts", {"N": "0"})["N"]),
            kind=item["kind"]["S"] if "kind" in item else TIMER, **kwargs)
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"timer item {item.get('pk')}/{item.get('sk')} is malformed: {exc!r}") from exc


def listed_row(item: dict[str, Any]) -> TimerRow:
    """:func:`row_from_item` for a listing or a lookup: an item whose event, dedup or caller
    context cannot be decoded (parked dead by the sweep that found it) still shows, with an
    empty event and the reason in ``last_error``, so an operator can list, revive or delete it.

    :raises StoreError: not even its key and state can be read.
    """
    try:
        return row_from_item(item)
    except StoreError as exc:
        try:
            key = (item["pk"]["S"], int(item["ordinal"]["N"]))
            return TimerRow(
                instance_id=key[0], ordinal=key[1], target_id=item.get("target_id", {}).get("S", key[0]),
                due_at_ms=int(item.get("due_at_ms", {}).get("N", 0)), send_id=item.get("send_id", {}).get("S", ""),
                event={}, state=item["state"]["S"], attempts=int(item.get("attempts", {"N": "0"})["N"]),
                last_error=item.get("last_error", {}).get("S") or f"the stored row cannot be read: {exc}",
                kind=item["kind"]["S"] if "kind" in item else TIMER)
        except (KeyError, TypeError, ValueError):
            raise exc from None


# --------------------------------------------------------------------------- sizes


def attr_size(value: dict[str, Any]) -> int:
    """A conservative estimate of the stored size of one attribute value, in bytes.

    DynamoDB documents: strings count their UTF-8 length, binary its length, numbers about
    one byte per two digits plus one (we count one byte per character plus one, which is
    never less), null/bool one byte, and lists/maps three bytes plus one per element plus
    the elements (and, for maps, the key names).
    """
    (kind, v), = value.items()
    if kind == "S":
        return len(v.encode("utf-8"))
    if kind == "N":
        return len(v) + 1
    if kind == "B":
        return len(v)
    if kind in ("NULL", "BOOL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + attr_size(e) for e in v)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + attr_size(e) for k, e in v.items())
    if kind in ("SS", "NS", "BS"):
        return 3 + sum(1 + len(e if isinstance(e, bytes) else str(e).encode("utf-8")) for e in v)
    raise StoreError(f"unknown DynamoDB attribute type {kind!r}")


def item_size(item: dict[str, dict[str, Any]]) -> int:
    """Estimated item size: attribute names plus values, the way DynamoDB bills and limits."""
    return sum(len(name.encode("utf-8")) + attr_size(value) for name, value in item.items())
