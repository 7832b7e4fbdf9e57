"""The outbox and idempotent events on DynamoDB.

* Request counts per host call, on in-process moto (``mock_aws``), counted with botocore
  ``before-call`` hooks (``CallLog``): a host given processors and invoke handlers costs
  exactly what a bare host costs as long as no effect is sent, and a keyed event costs no
  more than an unkeyed one. ``docs/dynamodb.md`` states these numbers.
* Processors, handlers, dead rows and late results end to end on DynamoStore.
* The race: 4 processes x 200 keyed sends of 50 keys on one instance, refereed by the
  **serialised moto server** (``moto_endpoint``: one request at a time, so conditional
  writes are atomic as on DynamoDB); each process has its own boto3 client.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import statebound as sb
from statebound.host.processors import Pending
from statebound.host.store import DEAD, DONE, WAITING

from .helpers import CallLog, make_store, server_client

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
from _idem_child import BAG  # noqa: E402
from test_host_concurrency import _collect, _release  # noqa: E402

T0 = 1_800_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

SHOP = sb.Chart.from_scxml(f"""<scxml {NS} name="shop" initial="Idle">
  <datamodel><data id="n" expr="0"/><data id="receipt" expr="None"/><data id="error" expr="None"/></datamodel>
  <state id="Idle">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
    <transition event="Notify"><send type="app" event="Notified" target="ops"/></transition>
    <transition event="Pay" target="Charging"/>
    <transition event="error.communication" target="Unreachable"><assign location="error" expr="_event.data"/>
    </transition>
  </state>
  <state id="Charging">
    <invoke type="payment" id="charge"><param name="n" expr="n"/>
      <finalize><assign location="receipt" expr="_event.data"/></finalize></invoke>
    <transition event="done.invoke.charge" target="Idle"/>
    <transition event="Abort" target="Idle"/>
  </state>
  <state id="Unreachable"/>
</scxml>""")


class Receiver:
    def __init__(self, fail: bool = False) -> None:
        self.keys: list[str] = []
        self.fail = fail

    def deliver(self, d) -> None:
        self.keys.append(d.idempotency_key)
        if self.fail:
            raise ConnectionError("unreachable")


class Gateway:
    def __init__(self, answer: str = "now") -> None:
        self.answer = answer
        self.requests: list = []
        self.cancelled: list = []

    def start(self, request):
        self.requests.append(request)
        return Pending() if self.answer == "later" else {"charge": "ch_1"}

    def cancel(self, request):
        self.cancelled.append(request)


def test_request_counts_do_not_grow_when_no_effect_is_sent(mock_client, table):
    """botocore hooks: with processors and handlers registered, an event that sends
    nothing is 1 GetItem + 1 PutItem, as on a bare host; a keyed event is the same, and a
    repeat of it is 1 GetItem alone."""
    clock = sb.ManualClock(T0)
    bare = sb.Host([SHOP], store=make_store(mock_client, table), clock=clock)
    full = sb.Host([SHOP], store=make_store(mock_client, table), clock=clock,
                   processors={"app": Receiver()}, invokers={"payment": Gateway()})
    bare.start("shop", "b")
    full.start("shop", "f")
    log = CallLog(mock_client)
    try:
        bare.send("b", "inc")
        assert log.take() == ["GetItem", "PutItem"]
        full.send("f", "inc")
        assert log.take() == ["GetItem", "PutItem"]
        full.send("f", "inc", idempotency_key="req-1")
        assert log.take() == ["GetItem", "PutItem"]
        full.send("f", "inc", idempotency_key="req-1")
        assert log.take() == ["GetItem"]                     # a repeat writes nothing
        for i in range(100):                                 # retention full: still one item, one write
            full.send("f", "inc", idempotency_key=f"bulk-{i}")
        assert log.take() == ["GetItem", "PutItem"] * 100
    finally:
        log.close()
    assert full.get("f").datamodel["n"] == 102


def test_request_counts_of_a_send_and_an_invoke(mock_client, table):
    """botocore hooks: a send to a processor is the event's GetItem and one
    TransactWriteItems (position + outbox row), then one UpdateItem acknowledging the
    delivery. An invoke answered at once adds one GetItem + one TransactWriteItems (the
    result delivered with the row's completion); one answered later, a GetItem (is it still
    live?) and the UpdateItem that parks its row."""
    clock = sb.ManualClock(T0)
    rx, gw = Receiver(), Gateway()
    host = sb.Host([SHOP], store=make_store(mock_client, table), clock=clock,
                   processors={"app": rx}, invokers={"payment": gw})
    host.start("shop", "o")
    log = CallLog(mock_client)
    try:
        host.send("o", "Notify")
        assert log.take() == ["GetItem", "TransactWriteItems", "UpdateItem"]
        host.send("o", "Pay")
        assert log.take() == ["GetItem", "TransactWriteItems", "GetItem", "TransactWriteItems"]
        later = sb.Host([SHOP], store=make_store(mock_client, table), clock=clock,
                        invokers={"payment": Gateway(answer="later")})
        later.start("shop", "p")
        log.take()
        later.send("p", "Pay")
        # the row parked as waiting, once a read shows the invocation still live (its state
        # may have been exited while start ran: then the row is the cancel hook's)
        assert log.take() == ["GetItem", "TransactWriteItems", "GetItem", "UpdateItem"]
        assert later.complete_invoke("p", "charge", {"charge": "ch_2"}).outcome == "fired"
        assert log.take() == ["GetItem", "TransactWriteItems"]
    finally:
        log.close()
    assert len(rx.keys) == 1 and host.get("o").datamodel["receipt"] == {"charge": "ch_1"}
    assert later.get("p").datamodel["receipt"] == {"charge": "ch_2"}


def test_dead_rows_waiting_rows_and_late_results_on_dynamodb(mock_client, table):
    clock = sb.ManualClock(T0)
    rx, gw = Receiver(fail=True), Gateway(answer="later")
    host = sb.Host([SHOP], store=make_store(mock_client, table), clock=clock, max_attempts=2, backoff_ms=1_000,
                   processors={"app": rx}, invokers={"payment": gw})
    host.start("shop", "o")
    host.send("o", "Pay")
    [row] = host.pending_timers("o")
    assert row.state == WAITING
    host.send("o", "Abort")
    assert len(gw.cancelled) == 1
    late = host.complete_invoke("o", "charge", {"charge": "late"}, token=gw.requests[0].token)
    assert late.outcome == "discarded"
    done = host.store.get_timer(row.key)
    assert (done.state, done.outcome) == (DONE, "discarded") and "state was exited" in done.reason
    host.send("o", "Notify")
    clock.advance(1_000)
    host.fire_due()
    [dead] = host.dead_timers()
    assert (dead.state, dead.attempts) == (DEAD, 2)
    assert host.get("o").configuration == {"Unreachable"} and len(set(rx.keys)) == 1


def test_four_processes_200_sends_of_50_keys_apply_exactly_50_on_dynamodb(moto_endpoint, server_table,
                                                                           tmp_path, capsys):
    """Serialised moto server, 4 processes with their own clients."""
    store = make_store(server_client(moto_endpoint), server_table)
    host = sb.Host([sb.Chart.from_scxml(BAG)], store=store)
    host.start("bag", "c")
    go = str(tmp_path / "go")
    procs = [subprocess.Popen([sys.executable, str(TESTS / "_idem_child.py"), "dynamodb",
                               f"{moto_endpoint}:{server_table}", go, str(seed), "200", "50"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in range(4)]
    _release(go, procs)
    results = _collect(procs, timeout=300)
    keys = host.get("c").datamodel["keys"]
    assert sorted(keys) == sorted(f"k{i}" for i in range(50))
    assert sum(r["applied"] for r in results) == 50
    assert sum(r["duplicates"] for r in results) == 750
    assert store.load("c").version == 51
    with capsys.disabled():
        print(f"\nDynamoDB (moto server), 4 x 200 keyed sends of 50 keys: 50 applied, 750 repeats, "
              f"{sum(r['conflicts'] for r in results)} conflicts retried, "
              f"{max(r['seconds'] for r in results):.1f}s")
