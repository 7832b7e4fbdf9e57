"""The capacity section of ``docs/dynamodb.md``, checked by simulation (issue #13, item 5).

A metered fake client (``fakeddb.py``, not moto) counts read and write units per
partition key and per simulated second while the real Host and Sweeper fire 1,000 timers a
second for five seconds, beside pending timers that are not due. Each fire re-arms its
timer an hour later, the steady state of a busy table: one row leaves the due index and one
joins it per fire. The figures asserted here are the ones the docs quote.
"""

from __future__ import annotations

import math

import pytest

import statebound as sb
from statebound.dynamodb import DUE_INDEX, DynamoStore
from statebound.dynamodb.capacity import PARTITION_RCU, PARTITION_WCU, recommended_shards
from statebound.host import MemoryWakeup

from .fakeddb import FakeDynamoDB

T0 = 1_800_000_000_000
RATE = 1_000          # fires per second
WINDOW_S = 5
FAR = 5_000           # pending timers days away: they must cost nothing
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'
REMINDER = sb.Chart.from_scxml(f"""<scxml {NS} name="reminder" initial="waiting">
  <datamodel><data id="first" expr="'1s'"/><data id="n" expr="0"/></datamodel>
  <state id="waiting">
    <onentry><send event="remind" delayexpr="first"/></onentry>
    <transition event="remind"><assign location="n" expr="n + 1"/><send event="remind" delay="1h"/></transition>
  </state>
</scxml>""")

#: The figures docs/dynamodb.md quotes, per fire (claim path / wake-up path).
DOC_WCU_PER_FIRE = 8          # position + completed row + re-armed row in one transaction (3 x 2), 2 index writes
DOC_RCU_PER_FIRE_SWEEP = 1.25  # position GetItem 1, the fire's share of the shard Queries (~0.12)
DOC_RCU_PER_FIRE_WAKE = 2     # row GetItem 1 + position GetItem 1, no Query


def world(shards, wakeup=None):
    """A metered table with RATE * WINDOW_S timers due from T0 on and FAR due days later."""
    clock = sb.ManualClock(T0 - 20_000)
    client = FakeDynamoDB(clock)
    store = DynamoStore("sim", client, shards=shards, sleep=lambda s: None)
    host = sb.Host([REMINDER], store=store, clock=clock, wakeup=wakeup)
    for i in range(RATE * WINDOW_S):
        host.start(REMINDER, f"due-{i}", data={"first": f"{20_000 + i * 1000 // RATE}ms"})
    for i in range(FAR):
        host.start(REMINDER, f"far-{i}", data={"first": f"{1 + i % 30}d"})
    client.meter.__init__(clock)   # count the firing only
    return clock, client, host


def per_fire(client, fired):
    m = client.meter
    return m.total(m.wcu) / fired, m.total(m.rcu) / fired


def test_recommended_shards_arithmetic():
    """(arms + fires) x 1 KB-units over half a key's 1,000 WCU/s; at least 4."""
    assert recommended_shards(1_000) == 4            # 2,000 index WCU/s / 500
    assert recommended_shards(10_000) == 40
    assert recommended_shards(1_000, cancels_per_s=1_000) == 8   # cancelled rows arm and leave too
    assert recommended_shards(1_000, row_kb=2.5) == 12
    assert recommended_shards(10) == 4
    with pytest.raises(ValueError):
        recommended_shards(1_000, headroom=0)


def test_sweeping_1000_fires_a_second_stays_under_every_key_limit():
    """Claim path, shards as recommended for 1,000 fires/s (4): every due timer fires once,
    the per-fire units are the documented ones, the due-index keys take half their write
    limit on average and the hottest under three quarters, the far-away rows are never
    read, and the table-side keys (one per instance) are cold."""
    shards = recommended_shards(RATE)
    clock, client, host = world(shards)
    sweeper = sb.Sweeper(host, batch=1_000)
    fired = 0
    while clock.now_ms() < T0 + WINDOW_S * 1000 + 500:
        clock.advance(50)
        fired += sweeper.run_once().fired
    assert fired == RATE * WINDOW_S
    wcu, rcu = per_fire(client, fired)
    m = client.meter
    assert wcu == DOC_WCU_PER_FIRE
    assert 1 < rcu <= DOC_RCU_PER_FIRE_SWEEP
    assert m.requests["Query"] <= 0.3 * fired   # pages of 2, 4, 8...: a few per shard read
    hot_w, key = m.hottest(m.wcu, DUE_INDEX)
    assert hot_w <= PARTITION_WCU * 0.75, (hot_w, key)
    # the arithmetic: 2 index writes per fire, spread over the shards by CRC-32 (+-25%)
    assert 2 * RATE / shards * 0.75 <= hot_w <= 2 * RATE / shards * 1.25
    assert m.hottest(m.rcu, DUE_INDEX)[0] <= PARTITION_RCU / 10
    assert m.items_read <= fired + 2 * m.requests["Query"]   # due rows plus the one past now, per Query
    assert m.hottest(m.wcu, "table")[0] <= 12                # one instance: a few fires a minute at most
    spread = m.keys(m.wcu, DUE_INDEX)
    assert len(spread) == shards and max(spread.values()) <= 1.25 * min(spread.values())


def test_wakeups_fire_1000_a_second_with_two_reads_and_no_query():
    """Wake-up path (the Lambda deployment): each fire reads its row and its position by key
    (the positions of one delivery together) and writes one transaction; nothing reads the
    due index at all."""
    wake = MemoryWakeup()
    clock, client, host = world(16, wakeup=wake)
    sweeper = sb.Sweeper(host)
    fired = 0
    while clock.now_ms() < T0 + WINDOW_S * 1000 + 500:
        clock.advance(50)
        fired += sweeper.handle_wakeups(wake.take_due(clock.now_ms())).fired
    assert fired == RATE * WINDOW_S
    wcu, rcu = per_fire(client, fired)
    assert (wcu, rcu) == (DOC_WCU_PER_FIRE, DOC_RCU_PER_FIRE_WAKE)
    requests = client.meter.requests
    assert requests["Query"] == 0 and requests["Scan"] == 0
    # each woken row read by key; the positions of a delivery's rows in one BatchGetItem
    # (the host's group commit loads them together); one transaction per fire
    assert set(requests) == {"GetItem", "BatchGetItem", "TransactWriteItems"}
    assert requests["GetItem"] == requests["TransactWriteItems"] == fired
    assert requests["BatchGetItem"] <= fired / 40


def test_cost_per_million_timers_from_the_measured_units():
    """The docs' cost line, from units measured on the metered table: what arming a timer
    adds to the event that arms it, and what firing it by a wake-up costs, times the
    on-demand list prices (us-east-1: $0.625 per million write units, $0.125 per million
    read units, SQS $0.40 per million requests: one send per timer, one receive and one
    delete per batch of ten)."""
    plain = sb.Chart.from_scxml(f"""<scxml {NS} name="plain" initial="s"><state id="s"/></scxml>""")
    once = sb.Chart.from_scxml(f"""<scxml {NS} name="once" initial="s">
      <state id="s"><onentry><send event="go" delay="1s"/></onentry><transition event="go" target="e"/></state>
      <final id="e"/></scxml>""")
    clock = sb.ManualClock(T0)
    client = FakeDynamoDB(clock)
    wake = MemoryWakeup()
    host = sb.Host([plain, once], store=DynamoStore("sim", client, shards=4), clock=clock, wakeup=wake)
    m = client.meter

    def units(action):
        before = (m.total(m.wcu), m.total(m.rcu))
        action()
        return m.total(m.wcu) - before[0], m.total(m.rcu) - before[1]

    without_timer, _ = units(lambda: host.start(plain, "p"))
    with_timer, _ = units(lambda: host.start(once, "o"))
    clock.advance(1_000)
    fire_w, fire_r = units(lambda: sb.Sweeper(host).handle_wakeups(wake.take_due(clock.now_ms())))
    arm = with_timer - without_timer
    assert (arm, fire_w, fire_r) == (4, 5, 2)   # the docs' table
    write_price, read_price, sqs_price = 0.625, 0.125, 0.40
    dynamo = (arm + fire_w) * write_price + fire_r * read_price
    sqs = (1 + 2 / 10) * sqs_price
    assert math.isclose(dynamo, 5.875)
    assert math.isclose(dynamo + sqs, 6.355)
