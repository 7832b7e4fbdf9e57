"""A sweeper that claimed a row another sweeper fired first (two sweepers without leases,
or a wake-up racing a sweep): exactly-once held, but its soft claim was never dropped, so
once it lapsed ``next_due()`` answered a time in the past for ever, ``run_forever`` never
slept, and every sweep re-read the shard with a ``Query``."""

from __future__ import annotations

import statebound as sb
from statebound.dynamodb import DynamoStore

from .helpers import CallLog

T0 = 1_800_000_000_000
CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="null" name="tick" initial="w">
  <state id="w"><onentry><send event="go" delay="1s"/></onentry><transition event="go" target="f"/></state>
  <final id="f"/></scxml>"""


def test_a_sweeper_that_lost_a_race_goes_back_to_sleeping(mock_client, table):
    chart = sb.Chart.from_scxml(CHART)
    clock = sb.ManualClock(T0)
    a = sb.Sweeper(sb.Host([chart], store=DynamoStore(table, mock_client, shards=16), clock=clock), node_id="A")
    b = sb.Sweeper(sb.Host([chart], store=DynamoStore(table, mock_client, shards=16), clock=clock), node_id="B")
    sb.Host([chart], store=DynamoStore(table, mock_client, shards=16), clock=clock).start("tick", "order-1")
    a.run_once()
    b.run_once()
    clock.advance(1_000)
    rows = a.host.store.claim_due(clock.now_ms(), a.batch, a.node_id, a.lease_ms)   # both claim...
    assert b.run_once().fired == 1                                                  # ...B fires first
    assert [r.outcome for r in a.fire_rows(rows)] == ["skipped"]
    clock.advance(a.lease_ms + 1)                                                   # A's claim lapses
    a.run_once()
    log = CallLog(mock_client)
    try:
        start, sweeps = clock.now_ms(), 0

        def stop() -> bool:
            nonlocal sweeps
            sweeps += 1
            return clock.now_ms() >= start + 60_000 or sweeps > 1_000
        a.run_forever(stop)        # sleeps on the manual clock: one idle minute
        assert clock.now_ms() >= start + 60_000, "the sweeper never slept"
        assert sweeps < 100
        assert log.names.count("Query") <= 2 * 16      # about one per shard per fallback period
    finally:
        log.close()
    assert a.host.next_due() is None
