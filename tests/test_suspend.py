"""Host.suspend / resume: a suspended instance takes no events and its timers wait."""

from __future__ import annotations

from pathlib import Path

import pytest

import statebound as sb

ORDER = Path(__file__).resolve().parents[1] / "examples" / "order" / "order.scxml"

PONG = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="pong" initial="s" datamodel="python">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><transition event="pong"><assign location="n" expr="n + 1"/></transition></state>
</scxml>'''
PING = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="ping" initial="s" datamodel="python">
  <state id="s"><transition event="ping"><send event="pong" target="#_scxml_b"/></transition></state>
</scxml>'''


@pytest.fixture(params=["memory", "sqlite"])
def host(request, tmp_path):
    store = sb.MemoryStore() if request.param == "memory" else sb.SQLiteStore(tmp_path / "s.db")
    charts = [sb.Chart.from_file(ORDER), sb.Chart.from_scxml(PING), sb.Chart.from_scxml(PONG)]
    return sb.Host(charts, store=store, clock=sb.ManualClock(now_ms=1_000))


def test_a_suspended_instance_refuses_events_and_writes_nothing(host):
    host.start("order", "o1", {"payment_timeout": "1h"})
    host.suspend("o1")
    assert host.is_suspended("o1") and host.store.load("o1").status == "suspended"
    version = host.store.load("o1").version
    with pytest.raises(sb.InstanceSuspended) as err:
        host.send("o1", "StartPayment")
    assert err.value.instance_id == "o1" and isinstance(err.value, sb.HostError)
    with pytest.raises(sb.InstanceSuspended):
        host.cancel("o1")
    assert host.store.load("o1").version == version
    host.suspend("o1")                                           # again: nothing to do
    assert host.store.load("o1").version == version
    assert host.get("o1").status == "running"                    # the chart itself is still running
    host.resume("o1")
    host.resume("o1")                                            # again: nothing to do
    assert not host.is_suspended("o1") and host.store.load("o1").status == "running"
    assert host.send("o1", "StartPayment").configuration == {"Started"}
    with pytest.raises(sb.InstanceNotFound):
        host.suspend("ghost")
    with pytest.raises(sb.InstanceNotFound):
        host.resume("ghost")
    host.send("o1", "Complete")
    with pytest.raises(sb.NotRunning):
        host.suspend("o1")


def test_timers_wait_while_suspended_and_fire_after_resume(host):
    host.start("order", "o1", {"payment_timeout": "1s"})
    host.send("o1", "StartPayment")
    host.suspend("o1")
    [row] = host.pending_timers("o1")
    assert (row.state, row.name) == ("suspended", "PaymentTimeout")
    host.clock.advance(10_000)                                   # long past due
    assert host.next_due() is None and host.fire_due() == []
    assert host.get("o1").configuration == {"Started"}
    host.resume("o1")
    [row] = host.pending_timers("o1")
    assert row.state == "pending" and row.ready_at_ms == host.clock.now_ms() and row.due_at_ms == 2_000
    assert [r.outcome for r in host.fire_due()] == ["fired"]     # the same generation: not stale
    assert host.get("o1").configuration == {"Cancelled"}


def test_a_row_claimed_before_the_suspend_is_parked_in_place_when_it_fires(host):
    host.start("order", "o1", {"payment_timeout": "1s"})
    host.send("o1", "StartPayment")
    host.clock.advance(1_000)
    [claimed] = host.store.claim_due(host.clock.now_ms(), 10, "sweeper-1", 60_000)
    host.suspend("o1")
    res = host.fire(claimed, node_id="sweeper-1")
    assert res.outcome == "parked"
    [row] = host.pending_timers("o1")
    assert (row.key, row.state, row.name, row.claimed_by) == (claimed.key, "suspended", "PaymentTimeout", None)
    assert host.store.load("o1").timers[0].ordinal == claimed.ordinal
    host.resume("o1")
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("o1").configuration == {"Cancelled"}


def test_events_routed_to_a_suspended_instance_wait_as_its_rows(host):
    host.start("pong", "b")
    host.start("ping", "a")
    host.send("a", "ping")
    assert host.get("b").datamodel["n"] == 1
    host.suspend("b")
    host.send("a", "ping")                                       # a is not suspended: it runs
    host.send("a", "ping")
    assert host.get("b").datamodel["n"] == 1
    rows = host.pending_timers("b")
    assert [(r.state, r.event["name"]) for r in rows] == [("suspended", "pong")] * 2
    assert host.fire_due() == []
    host.resume("b")
    assert [r.outcome for r in host.fire_due()] == ["fired", "fired"]
    assert host.get("b").datamodel["n"] == 3 and host.pending_timers("b") == []


def test_a_suspended_instance_can_be_deleted(host):
    host.start("order", "o1", {"payment_timeout": "1s"})
    host.send("o1", "StartPayment")
    host.suspend("o1")
    host.delete("o1")
    assert not host.exists("o1") and host.pending_timers("o1") == []


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_delivery_that_fails_after_a_suspend_leaves_its_row_parked(kind, tmp_path):
    """An outbox send is being delivered when an operator suspends its instance, and then
    the processor fails. The row used to go back to pending (and, at max_attempts, dead)
    and the next sweep handed it to the processor while the instance was suspended. It
    stays parked, with the failure counted, and goes out after resume."""
    shop = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="shop" initial="s"
        datamodel="python"><state id="s"><transition event="buy">
        <send type="app" event="receipt"/></transition></state></scxml>''')
    store = sb.MemoryStore() if kind == "memory" else sb.SQLiteStore(tmp_path / "s.db")
    calls: list[bool] = []
    host: sb.Host

    def app(delivery):
        calls.append(host.is_suspended(delivery.instance_id))
        if len(calls) == 1:
            host.suspend(delivery.instance_id)   # the operator, while the call is in flight
            raise RuntimeError("receipt service down")

    clock = sb.ManualClock(now_ms=1_000)
    host = sb.Host([shop], store=store, clock=clock, processors={"app": app})
    host.start("shop", "r1")
    host.send("r1", "buy")                       # the hand-over after the commit: fails
    [row] = host.pending_timers("r1")
    assert (row.state, row.attempts) == ("suspended", 1) and "receipt service down" in row.last_error
    clock.advance(60_000)
    assert host.fire_due() == [] and calls == [False]
    host.resume("r1")
    clock.advance(60_000)
    assert [r.outcome for r in host.fire_due()] == ["delivered"]
    assert calls == [False, False] and host.pending_timers("r1") == []


TICK = """<scxml xmlns="http://www.w3.org/2005/07/scxml" name="tick" initial="s" datamodel="python">
  <datamodel><data id="ticks" expr="0"/></datamodel>
  <state id="s">
    <transition event="arm"><send event="tick" delay="10ms"/></transition>
    <transition event="tick"><assign location="ticks" expr="ticks + 1"/></transition>
  </state>
</scxml>"""


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_stale_claim_fired_after_a_suspend_never_brings_a_done_row_back(kind, tmp_path):
    """Sweeper S claims a row and stalls; its lease lapses, another sweeper fires the row;
    the instance is suspended; S wakes and fires its copy. The parked path wrote S's copy
    back as suspended, over the done row, and resume made it fire a second time. The park
    is now the row's conditional completion: S's copy is skipped."""
    store = sb.MemoryStore() if kind == "memory" else sb.SQLiteStore(tmp_path / "t.db")
    clock = sb.ManualClock(now_ms=1_000)
    host = sb.Host([sb.Chart.from_scxml(TICK)], store=store, clock=clock)
    host.start("tick", "c")
    host.send("c", "arm")
    clock.advance(10)
    [stale] = host.store.claim_due(clock.now_ms(), 10, "S", 5_000)
    clock.advance(6_000)                                          # S's lease lapses
    assert sb.Sweeper(host, node_id="W").run_once().fired == 1     # W fires it, once
    host.suspend("c")
    assert host.fire(stale, node_id="S").outcome == "skipped"
    assert host.store.get_timer(stale.key).state == "done"
    host.resume("c")
    clock.advance(10_000)
    assert host.fire_due() == []
    assert host.get("c").datamodel["ticks"] == 1


def test_a_claimed_row_fired_after_the_suspend_is_parked_and_fires_after_resume(tmp_path):
    """The other side of the same path: S still holds its claim when it fires into the
    suspended instance; the row is parked, and fires once after resume."""
    clock = sb.ManualClock(now_ms=1_000)
    host = sb.Host([sb.Chart.from_scxml(TICK)], store=sb.SQLiteStore(tmp_path / "p.db"), clock=clock)
    host.start("tick", "c")
    host.send("c", "arm")
    clock.advance(10)
    [claimed] = host.store.claim_due(clock.now_ms(), 10, "S", 60_000)
    host.suspend("c")
    assert host.fire(claimed, node_id="S").outcome == "parked"
    assert host.store.get_timer(claimed.key).state == "suspended"
    host.resume("c")
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("c").datamodel["ticks"] == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_an_outbox_send_delivered_while_suspend_reads_its_rows_is_not_brought_back(kind, tmp_path):
    """suspend reads the instance's rows, then writes them back as suspended. A sweeper that
    delivered and completed a send in between was not seen (a send's completion writes no
    position, so the version check passes): the done row came back suspended, and resume
    made it deliver again. The rewrite is now conditional on the state it was read in."""
    import threading

    base = sb.MemoryStore if kind == "memory" else sb.SQLiteStore

    class Hooked(base):   # type: ignore[misc, valid-type]
        hook = None

        def pending_timers(self, instance_id):
            rows = super().pending_timers(instance_id)
            hook, self.hook = self.hook, None
            if hook is not None:   # a sweeper on another thread, between the read and the commit
                t = threading.Thread(target=hook)
                t.start()
                t.join()
            return rows

    store = Hooked() if kind == "memory" else Hooked(tmp_path / "h.db")
    shop = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="shop" initial="s"
        datamodel="python"><state id="s"><transition event="buy"><send type="app" event="receipt"/>
        </transition></state></scxml>''')
    delivered: list[str] = []
    clock = sb.ManualClock(now_ms=1_000)
    host = sb.Host([shop], store=store, clock=clock, processors={"app": lambda d: delivered.append(d.idempotency_key)},
                   deliver_after_commit=False)
    host.start("shop", "r1")
    host.send("r1", "buy")
    outcomes: list[str] = []
    store.hook = lambda: outcomes.extend(r.outcome for r in host.fire_due(node_id="S"))
    host.suspend("r1")
    assert outcomes == ["delivered"] and host.pending_timers("r1") == []
    host.resume("r1")
    clock.advance(60_000)
    assert host.fire_due() == [] and delivered == ["r1:1"]
