"""What a deleted instance leaves behind: a tombstone, so that its id never repeats a version,
an ordinal or a key (``docs/adr/0028-a-deleted-instance-leaves-a-tombstone.md``).

Every row key ``(instance, ordinal)``, every outbox idempotency key (``instance:ordinal``),
every invoke token (``instance:invokeid:ordinal``) and every conditional write (on the
record's version) names an instance by its id. When a delete erased the record, a new
instance of the same id started again at version 1 and ordinal 1, and so met everything
still in flight for the old one: a sweeper's claim fired the old event into it and completed
its row of the same key; a late invoke answer finished its invocation; a receiver that
deduplicates on the key dropped its first send as a repeat; a call that had loaded the old
record at version 1 wrote over it.

So a delete writes a tombstone instead: a record with status
:data:`~statebound.host.store.DELETED` (the store purges the instance's rows and history with
it, as it did for a delete), its version one past the last, and a blob that holds only the
last ordinal the instance used. The host treats a tombstone as no instance; a start on its
id writes over it (conditional on its version, so the versions go on) and begins its
ordinals after the tombstone's.
"""

from __future__ import annotations

import msgpack

from ..exceptions import StoreError
from .store import DELETED, PositionRecord

__all__ = ["MAGIC", "blob", "last_ordinal"]

#: How a tombstone's blob begins: never the start of a position blob (``SB\x00P``), so a reader
#: that is not the host (an older version, a tool) fails on it as on a damaged blob instead
#: of reading it as a position.
MAGIC = b"SBDELETED\x00"


def blob(last_ordinal: int) -> bytes:
    """A tombstone's blob: the last ordinal the deleted instance used."""
    return MAGIC + msgpack.packb(last_ordinal)


def last_ordinal(rec: PositionRecord) -> int:
    """The last ordinal of the instance a tombstone stands for (0 for a record that is no
    tombstone: a new id's ordinals start at 1)."""
    if rec.status != DELETED:
        return 0
    if not rec.blob.startswith(MAGIC):
        raise StoreError(f"the tombstone of {rec.instance_id!r} is damaged (its blob does not start "
                         f"with {MAGIC!r})")
    try:
        value = msgpack.unpackb(rec.blob[len(MAGIC):])
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise StoreError(f"the tombstone of {rec.instance_id!r} is damaged: {exc}") from None
    if type(value) is not int or value < 0:
        raise StoreError(f"the tombstone of {rec.instance_id!r} is damaged: ordinal {value!r}")
    return value
