"""Deleting an instance and starting a new one under its id, against any store (ADR 0028).

Shared by ``tests/test_tombstone.py`` (memory, SQLite) and ``tests/dynamo`` (DynamoDB on
moto): each function takes a fresh store. Before tombstones, the new instance started again
at version 1 and ordinal 1, so what was in flight for the old one met it as its own.
"""

from __future__ import annotations

import statebound as sb
from statebound.host.processors import Pending
from statebound.host.store import DELETED

T0 = 1_700_000_000_000

TICKS = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="c" initial="s" datamodel="python">
 <datamodel><data id="got" expr="[]"/><data id="owner" expr="'?'"/><data id="d" expr="'1s'"/></datamodel>
 <state id="s">
  <onentry><send event="tick" delayexpr="d"><param name="owner" expr="owner"/></send></onentry>
  <transition event="tick"><assign location="got" expr="got + [_event.data['owner']]"/></transition>
  <transition event="inc"><assign location="got" expr="got + ['inc']"/></transition>
 </state>
</scxml>"""

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="order" initial="charging" datamodel="python">
 <datamodel><data id="amount" expr="0"/><data id="receipt" expr="None"/></datamodel>
 <state id="charging">
  <invoke type="payment" id="charge"><param name="amount" expr="amount"/></invoke>
  <transition event="done.invoke.charge" target="paid"><assign location="receipt" expr="_event.data"/></transition>
 </state>
 <state id="paid"/>
</scxml>"""


class LaterGateway:
    """An invoke handler that answers later: the test answers with the token it was given."""

    def __init__(self) -> None:
        self.requests: list[sb.InvokeRequest] = []

    def start(self, request):
        self.requests.append(request)
        return Pending()


def a_claim_from_before_the_delete_never_fires_into_the_new_instance(store) -> None:
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(TICKS)], store=store, clock=clock)
    host.start("c", "x", {"owner": "alice"})
    clock.advance(2_000)
    claimed = store.claim_due(clock.now_ms(), 10, "sweeper-a", 30_000)   # alice's tick, claimed
    assert [r.key for r in claimed] == [("x", 1)]
    host.delete("x")
    host.start("c", "x", {"owner": "bob", "d": "10s"})                  # a new x, bob's
    assert [r.ordinal for r in host.pending_timers("x")] == [2]        # its ordinals go on
    (stale,) = host.fire_many(claimed, node_id="sweeper-a")
    assert stale.outcome == "skipped"
    assert host.get("x").datamodel["got"] == []                         # alice's event never reached bob
    assert [r.state for r in host.pending_timers("x")] == ["pending"]  # and bob's row is his
    clock.advance(10_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("x").datamodel["got"] == ["bob"]


def a_new_instance_never_repeats_a_key_or_token_of_the_old(store) -> None:
    gateway = LaterGateway()
    host = sb.Host([sb.Chart.from_scxml(ORDER)], store=store, clock=sb.ManualClock(T0),
                   invokers={"payment": gateway})
    host.start("order", "o-1", {"amount": 10})
    host.delete("o-1")
    host.start("order", "o-1", {"amount": 99})
    old, new = gateway.requests
    assert old.token != new.token and old.idempotency_key != new.idempotency_key
    # a late answer to the old order's charge is not the new order's
    assert host.complete_invoke("o-1", "charge", {"charge": "old"}, token=old.token).outcome == "discarded"
    assert host.get("o-1").configuration == frozenset({"charging"})
    host.complete_invoke("o-1", "charge", {"charge": "new"}, token=new.token)
    assert host.get("o-1").datamodel["receipt"] == {"charge": "new"}


def a_call_that_loaded_the_old_instance_never_writes_over_the_new(store) -> None:
    chart = sb.Chart.from_scxml(TICKS)
    host = sb.Host([chart], store=store, clock=sb.ManualClock(T0))
    host.start("c", "x", {"owner": "alice"})
    host.delete("x")
    host.start("c", "x", {"owner": "alice"})     # the version a fresh start had
    real = store.load
    raced = []

    def load(iid):
        rec = real(iid)
        if iid == "x" and not raced:
            raced.append(rec.version)
            other = sb.Host([chart], store=store, clock=host.clock)
            other.delete("x")
            other.start("c", "x", {"owner": "bob"})
        return rec
    store.load = load
    try:
        host.send("x", "inc")     # loaded alice's x; bob's x is there by its commit
    finally:
        store.load = real
    assert raced
    after = host.get("x").datamodel
    assert after["owner"] == "bob"               # the send went to the instance there now...
    assert after["got"] == ["inc"]               # ...once, on bob's data, never alice's written over it


def a_deleted_instance_is_gone_to_every_reader(store) -> None:
    host = sb.Host([sb.Chart.from_scxml(TICKS)], store=store, clock=sb.ManualClock(T0))
    host.start("c", "x")
    host.start("c", "y")
    before = store.load("x").version
    host.delete("x")
    assert not host.exists("x") and not host.is_suspended("x")
    assert host.pending_timers("x") == []
    assert [r.instance_id for r in store.list_positions()] == ["y"]
    for call in (lambda: host.get("x"), lambda: host.send("x", "inc"), lambda: host.delete("x"),
                 lambda: host.suspend("x")):
        try:
            call()
        except sb.InstanceNotFound:
            pass
        else:
            raise AssertionError("a deleted instance answered")
    rec = store.load("x")
    assert rec.status == DELETED and rec.version == before + 1
    host.start("c", "x", {"owner": "carol"})
    assert store.load("x").version == before + 2 and host.get("x").datamodel["owner"] == "carol"


PARENT = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="p" initial="a" datamodel="python">
 <state id="a">
  <invoke id="kid" type="scxml"><content>
   <scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="k" initial="k1" datamodel="python">
    <state id="k1"><onentry><send type="charge" event="charge"/><send event="tick" delay="100s"/></onentry>
     <transition event="tick" target="ticked"/></state>
    <state id="ticked"/>
   </scxml></content></invoke>
  <transition event="again" target="a"/>
 </state>
</scxml>"""


def a_child_invoked_again_in_one_call_never_repeats_the_old_childs_keys_or_rows(store) -> None:
    # exiting and re-entering the invoking state in one macrostep deletes the child and
    # invokes it again in the same commit: no tombstone in between, so the new child's
    # ordinals must go on from the old one's, and the old one's rows must go with it
    keys: list[str] = []
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(PARENT)], store=store, clock=clock,
                   processors={"charge": lambda d: keys.append(d.idempotency_key)})
    host.start("p", "o")
    old_rows = [r.key for r in host.pending_timers("o::kid")]
    claimed = store.claim_due(clock.now_ms() + 100_000, 10, "sweeper-a", 30_000)   # the old child's tick
    host.send("o", "again")
    assert len(keys) == 2 and keys[0] != keys[1]
    new_rows = [r.key for r in host.pending_timers("o::kid")]
    assert len(new_rows) == 1 and not set(new_rows) & set(old_rows)
    assert [r.outcome for r in host.fire_many(claimed, node_id="sweeper-a")] == ["skipped"]
    assert host.get("o::kid").configuration == frozenset({"k1"})   # the old tick never reached it
    clock.advance(100_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("o::kid").configuration == frozenset({"ticked"})
