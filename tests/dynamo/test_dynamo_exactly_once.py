"""Exactly once under concurrency (issue #13): three sweepers, each with a thread pool, and
a wake-up handler race over the same due rows on a **serialised moto server** (one request
at a time, so each conditional write is atomic as on DynamoDB). Each node has its own
boto3 client and store, as separate processes would. Every row must fire exactly once.

The full figure (1,000 rows) runs with ``make soak``; the default run races 120.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import statebound as sb
from statebound.host import WakeupRequest
from statebound.host.store import DONE, Commit, PositionWrite, TimerRef
from store_contract import timer

from .helpers import make_store, server_client

NOW = 1_800_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'
COUNTER = sb.Chart.from_scxml(f"""<scxml {NS} name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><transition event="tick"><assign location="n" expr="n + 1"/></transition></state>
</scxml>""")
PER_INSTANCE = 4


def seed(endpoint, table, rows):
    """``rows // 4`` counter instances, each with four ``tick`` rows due by NOW."""
    clock = sb.ManualClock(NOW - 10_000)
    host = sb.Host([COUNTER], store=make_store(server_client(endpoint), table), clock=clock)
    instances = rows // PER_INSTANCE
    for i in range(instances):
        host.start(COUNTER, f"c{i}")
    store = host.store
    tick = sb.Event("tick").to_dict()
    for i in range(instances):
        rec = store.load(f"c{i}")
        store.commit(Commit(
            writes=(PositionWrite(rec.instance_id, rec.chart, rec.version, rec.blob, rec.status,
                                          tuple(TimerRef(n, f"s{n}") for n in range(1, PER_INSTANCE + 1))),),
            timers_put=tuple(timer(f"c{i}", n, NOW - 1_000 * n, event=tick) for n in range(1, PER_INSTANCE + 1))))
    return host, instances


@pytest.mark.parametrize("rows", [120, pytest.param(1_000, marks=pytest.mark.slow)])
def test_three_pooled_sweepers_and_wakeups_fire_every_row_once(moto_endpoint, server_table, rows):
    """Serialised moto server. Sweepers a, b, c (four workers each) run until idle while a
    fourth node handles a wake-up for every row, all started together. Every row is done,
    each counter counted exactly its four ticks, and the fired results add up to the rows:
    the losers of each race got a conflict or an empty read, never a second fire."""
    checker, instances = seed(moto_endpoint, server_table, rows)
    clock = sb.ManualClock(NOW)

    def node(name):
        host = sb.Host([COUNTER], store=make_store(server_client(moto_endpoint), server_table), clock=clock,
                       conflict_backoff_s=0.002)
        return sb.Sweeper(host, node_id=name, workers=4, batch=50)

    sweepers = [node(name) for name in ("a", "b", "c")]
    waker = node("wake")
    wakeups = [WakeupRequest(f"c{i}", n, NOW - 1_000 * n) for i in range(instances)
               for n in range(1, PER_INSTANCE + 1)]
    start = threading.Barrier(4)
    reports: dict[str, list] = {}
    errors: list[BaseException] = []

    def run(name, work):
        try:
            start.wait()
            reports[name] = work()
        except BaseException as exc:  # surfaced below, with the thread's name
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s.node_id, s.run_until_idle)) for s in sweepers]
    threads.append(threading.Thread(target=run, args=(
        "wake", lambda: [waker.handle_wakeups(wakeups[i:i + 10]) for i in range(0, len(wakeups), 10)])))
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for s in [*sweepers, waker]:
        s.close()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    fired = sum(r.fired for r in [reports[s.node_id] for s in sweepers]) + sum(r.fired for r in reports["wake"])
    assert fired == rows
    assert sum(s.metrics.failed for s in [*sweepers, waker]) == 0
    counts = Counter(checker.get(f"c{i}").datamodel["n"] for i in range(instances))
    assert counts == {PER_INSTANCE: instances}
    assert all(checker.store.get_timer((f"c{i}", n)).state == DONE
               for i in range(instances) for n in range(1, PER_INSTANCE + 1))
    assert sum(s.metrics.fired for s in sweepers) > 0 and waker.metrics.fired > 0   # a real race
