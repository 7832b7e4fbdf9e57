"""The positions this host last held, by instance, so that a load of bytes it wrote
itself skips decoding them.

Every host call loads its instance's record and decodes the blob (parse, then check it
against the chart), and every write encodes one: on a hot instance the host decoded, a
moment ago, exactly the bytes it had just encoded. A msgpack blob is a pure function of
the position's persisted fields, and decoding it rebuilds every one of them (the
per-driver fields are re-stamped on each load anyway), so when the stored bytes equal the
bytes this host encoded from, or decoded into, a position it kept, that position *is* the
decode. The comparison is of the whole blob, never a version number: bytes written by
another host, a migration or a restore differ and are decoded and checked as before.

Only msgpack blobs are kept: a cbor blob re-packs the datamodel on decode, so its bytes
are not the position's own. The table is bounded in entries and in bytes (a kept blob and
its position's datamodel are counted; least recently used goes first), so large
positions cannot pile up, and locked, since one host may serve several threads.
"""

from __future__ import annotations

import threading

from ..chart.model import Chart
from ..interpreter import Position

__all__ = ["DecodedPositions", "DEFAULT_SIZE", "DEFAULT_BYTES"]

#: how many instances' positions a host keeps: the working set of a batch (100 by
#: default) several times over
DEFAULT_SIZE = 1024
#: and how many bytes of blobs and datamodels, whichever bound comes first
DEFAULT_BYTES = 32 * 1024 * 1024


class DecodedPositions:
    """``instance id -> (blob, position)`` for the last blob this host wrote or read."""

    __slots__ = ("_lock", "_table", "max_bytes", "nbytes", "size")

    def __init__(self, size: int = DEFAULT_SIZE, max_bytes: int = DEFAULT_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        #: the bytes kept now: every kept blob and its position's datamodel
        self.nbytes = 0
        self._lock = threading.Lock()
        #: instance id -> (blob, position, the bytes both count for)
        self._table: dict[str, tuple[bytes, Position, int]] = {}

    def get(self, instance_id: str, blob: bytes, chart: Chart) -> Position | None:
        """The kept position whose blob is exactly ``blob`` on ``chart``, else ``None``."""
        hit = self._table.get(instance_id)
        if hit is None:
            return None
        kept_blob, pos, _cost = hit
        if pos.chart is not chart or (kept_blob is not blob and kept_blob != blob):
            return None
        return pos

    def put(self, instance_id: str, blob: bytes, pos: Position) -> None:
        """Keep ``pos`` as the decode of ``blob``; drops the least recently kept past ``size``
        entries or ``max_bytes`` bytes (a position larger than that alone is not kept)."""
        cost = len(blob) + len(pos.data)
        table = self._table
        with self._lock:
            old = table.pop(instance_id, None)   # re-inserted last: the dict's order is the recency
            if old is not None:
                self.nbytes -= old[2]
            if cost > self.max_bytes:
                return
            table[instance_id] = (blob, pos, cost)
            self.nbytes += cost
            while len(table) > self.size or self.nbytes > self.max_bytes:
                self.nbytes -= table.pop(next(iter(table)))[2]
