"""Capacity arithmetic for a statebound table: how many due-index shards a load needs.

The due index is keyed by shard (``due#<shard>``), so each shard's key takes every index
write of its rows. DynamoDB serves at most :data:`PARTITION_WCU` write units and
:data:`PARTITION_RCU` read units a second on one key (index keys included; a throttled
index throttles the table's writes). A pending row is written into the index when it is
armed (or released with backoff) and removed when it fires or is cancelled; each costs the
row's size in write units, rounded up to 1 KB::

    index WCU/s  = (arms/s + fires/s + cancels/s) * ceil(row KB)
    shards       = ceil(index WCU/s / (PARTITION_WCU * headroom))

Reads are lighter: a sweeper's ``Query`` of a shard reads the due rows once (eventually
consistent, half a unit per 4 KB) plus one row beyond, so the read limit binds long after
the write limit. ``docs/dynamodb.md`` ("Capacity") works the figures for 1M pending timers
and 1,000 fires a second, and ``tests/dynamo/test_dynamo_capacity.py`` checks them on a
simulated table that counts units per key.
"""

from __future__ import annotations

import math

from ..exceptions import InvalidArgument

__all__ = ["PARTITION_WCU", "PARTITION_RCU", "index_wcu_per_s", "recommended_shards"]

#: Write units per second DynamoDB serves on one partition key.
PARTITION_WCU = 1_000
#: Read units per second DynamoDB serves on one partition key.
PARTITION_RCU = 3_000


def index_wcu_per_s(fires_per_s: float, arms_per_s: float | None = None, cancels_per_s: float = 0.0,
                    *, row_kb: float = 1.0) -> float:
    """Due-index write units per second for a load (``arms_per_s`` defaults to
    ``fires_per_s + cancels_per_s``: in steady state every row armed leaves again)."""
    if min(fires_per_s, cancels_per_s, row_kb) < 0 or (arms_per_s is not None and arms_per_s < 0):
        raise InvalidArgument("rates and sizes must not be negative")
    arms = fires_per_s + cancels_per_s if arms_per_s is None else arms_per_s
    return (arms + fires_per_s + cancels_per_s) * max(1, math.ceil(row_kb))


def recommended_shards(fires_per_s: float, arms_per_s: float | None = None, cancels_per_s: float = 0.0,
                       *, row_kb: float = 1.0, headroom: float = 0.5, minimum: int = 4) -> int:
    """The due-index shard count for a peak load: enough keys that none takes more than
    ``headroom`` of :data:`PARTITION_WCU`, and at least ``minimum`` (leases spread shards
    over sweepers, so more shards also allow more sweepers)."""
    if not 0 < headroom <= 1 or minimum < 1:
        raise InvalidArgument("headroom must be in (0, 1] and minimum >= 1")
    wcu = index_wcu_per_s(fires_per_s, arms_per_s, cancels_per_s, row_kb=row_kb)
    return max(minimum, math.ceil(wcu / (PARTITION_WCU * headroom)))
