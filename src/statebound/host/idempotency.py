"""Inbound idempotency keys: what ``host.send(..., idempotency_key=...)`` remembers.

A key is recorded in the same commit as the event it came with, inside the instance's
position record (:class:`~statebound.host.store.KeyRecord`), so recording it costs no
extra request and two racing deliveries of one key are refereed by the position's version
check: one commits, the other reloads, finds the key and applies nothing.

Each key keeps a fingerprint of what came with it (the event name and data, or the start
data), so reusing a key for something else is refused with
:class:`~statebound.IdempotencyKeyReused` instead of being silently swallowed. Retention
is the last ``Host(idempotency_retention=N)`` keys per instance (see ``docs/effects.md``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ..exceptions import InvalidArgument, SerializationError
from ..events import Event
from .store import KeyRecord, pack_field

__all__ = ["event_fingerprint", "start_fingerprint", "check_key", "find_key", "remember_key", "MAX_KEY_CHARS"]

#: Longest idempotency key accepted (keys ride in the position record of every load).
MAX_KEY_CHARS = 256


def _canonical(value: Any) -> Any:
    """``value`` with every mapping as a list of pairs sorted by their encoded keys, so
    ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` have one fingerprint."""
    if isinstance(value, dict):
        pairs = [(pack_field(k, "a data key"), k, _canonical(v)) for k, v in value.items()]
        return ["\x00map", [[k, v] for _, k, v in sorted(pairs, key=lambda p: p[0])]]
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _digest(parts: list[Any]) -> bytes:
    try:
        canonical = _canonical(parts)
    except RecursionError:
        # no store could hold it either (msgpack stops at 512 levels): refused like them
        raise SerializationError("the data nests too deeply to be stored") from None
    return hashlib.blake2b(pack_field(canonical, "idempotency fingerprint data"), digest_size=16).digest()


def event_fingerprint(event: Event) -> bytes:
    """What a repeat of an event must match: every field the chart can see.

    :raises SerializationError: the event's data cannot be stored.
    """
    return _digest(["event", event.name, event.data, event.type, event.sendid, event.origin,
                    event.origintype, event.invokeid, event.raw])


def start_fingerprint(chart_name: str, data: Any) -> bytes:
    """What a repeated ``start`` must match: the chart name and the start data."""
    return _digest(["start", chart_name, data])


def check_key(key: Any) -> str:
    """Refuse a key that is not a short, non-empty string."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument("an idempotency key must be a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidArgument(f"an idempotency key may be at most {MAX_KEY_CHARS} characters")
    return key


def find_key(keys: Sequence[KeyRecord], key: str) -> KeyRecord | None:
    """The record of ``key`` among an instance's retained keys, or ``None``."""
    for record in keys:
        if record.key == key:
            return record
    return None


def remember_key(keys: list[KeyRecord], record: KeyRecord, retention: int) -> None:
    """Append ``record`` and drop the oldest keys beyond ``retention`` (in place)."""
    keys.append(record)
    if len(keys) > retention:
        del keys[:len(keys) - retention]
