"""The Host and Sweeper end to end on DynamoStore, on in-process moto (``mock_aws``):
timers armed, cancelled and fired through the due index, the request count of an external
event, and a fire lost to another store object reported as skipped.
"""

from __future__ import annotations

import pytest

import statebound as sb

from .helpers import CallLog, make_store

T0 = 1_800_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

TIMERS = sb.Chart.from_scxml(f"""<scxml {NS} name="timers" initial="s">
  <datamodel><data id="got" expr="[]"/><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
    <transition event="arm">
      <send id="t" event="x" delay="5s"/>
      <send id="t" event="y" delay="7s"/>
      <send id="other" event="z" delay="9s"/>
    </transition>
    <transition event="cancel_t"><cancel sendid="t"/></transition>
    <transition event="x"><assign location="got" expr="got + ['x']"/></transition>
    <transition event="y"><assign location="got" expr="got + ['y']"/></transition>
    <transition event="z"><assign location="got" expr="got + ['z']"/></transition>
  </state>
</scxml>""")

PARENT = sb.Chart.from_scxml(f"""<scxml {NS} name="parent" initial="p">
  <datamodel><data id="got" expr="[]"/></datamodel>
  <state id="p">
    <invoke id="kid">
      <content>
        <scxml {NS} name="kid" initial="k">
          <state id="k"><onentry><send event="hello" target="#_parent" delay="1s"/></onentry></state>
        </scxml>
      </content>
    </invoke>
    <transition event="hello"><assign location="got" expr="got + ['hello']"/></transition>
  </state>
</scxml>""")


def host_on(client, table, clock, **kw):
    """A Host on its own DynamoStore."""
    return sb.Host([TIMERS, PARENT], store=make_store(client, table, **kw), clock=clock)


def test_timers_arm_cancel_and_fire(mock_client, table):
    """In-process moto: delayed sends become due-index rows, a cancel removes them, and
    fire_due delivers the rest at their due time, in order."""
    clock = sb.ManualClock(T0)
    host = host_on(mock_client, table, clock)
    host.start("timers", "i")
    host.send("i", "arm")
    assert [r.send_id for r in host.pending_timers("i")] == ["t", "t", "other"]
    assert host.next_due() == T0 + 5_000
    host.send("i", "cancel_t")
    assert [r.send_id for r in host.pending_timers("i")] == ["other"]
    clock.advance(8_000)
    assert host.fire_due() == []
    clock.advance(1_000)
    [result] = host.fire_due()
    assert result.outcome == "fired"
    assert host.get("i").datamodel["got"] == ["z"]
    assert host.pending_timers("i") == [] and host.next_due() is None


def test_an_external_event_is_one_read_and_one_write(mock_client, table):
    """In-process moto, counted with botocore hooks: ``send`` without timers is one GetItem
    and one PutItem; with timers one GetItem and one TransactWriteItems."""
    clock = sb.ManualClock(T0)
    host = host_on(mock_client, table, clock)
    host.start("timers", "i")
    log = CallLog(mock_client)
    host.send("i", "inc")
    assert log.take() == ["GetItem", "PutItem"]
    host.send("i", "arm")
    assert log.take() == ["GetItem", "TransactWriteItems"]
    log.close()


def test_a_fire_lost_to_another_store_is_skipped(mock_client, table):
    """In-process moto, sequential: sweeper B claimed a row, sweeper A (another store
    object, as another process) fired it first; B's fire finds it done and skips it, and
    the event was delivered once."""
    clock = sb.ManualClock(T0)
    a = host_on(mock_client, table, clock)
    b = host_on(mock_client, table, clock)
    a.start("timers", "i")
    a.send("i", "arm")
    a.send("i", "cancel_t")
    clock.advance(9_000)
    [row] = b.store.claim_due(clock.now_ms(), 10, "node-b", 30_000)
    assert [r.outcome for r in a.fire_due(node_id="node-a")] == ["fired"]
    assert b.fire(row, node_id="node-b").outcome == "skipped"
    assert a.get("i").datamodel["got"] == ["z"]


def test_invoked_child_and_delete(mock_client, table):
    """In-process moto: an invoke writes parent and child in one commit, the child's timer
    reaches the parent, and deleting the parent leaves no item of it behind."""
    clock = sb.ManualClock(T0)
    host = host_on(mock_client, table, clock)
    host.start("parent", "p")
    clock.advance(1_000)
    report = sb.Sweeper(host, batch=10).run_once()
    assert (report.fired, report.total) == (1, 1)
    assert host.get("p").datamodel["got"] == ["hello"]
    host.delete("p")
    assert not host.exists("p") and host.store.load("p").status == "deleted" and host.pending_timers("p") == []


def test_a_child_whose_id_the_table_cannot_key_is_an_error_for_the_parent(mock_client, table):
    """``parent::invokeid`` can pass the table's 1,000-byte key limit when the parent's id
    did not: the commit refused it and the parent's event failed on every retry (on SQLite
    the same chart ran). The parent gets ``error.execution`` instead, as for any invoke
    that cannot start."""
    import statebound as sb
    chart = sb.Chart.from_scxml("""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
      name="p" initial="idle"><state id="idle"><transition event="go" target="busy"/></state>
      <state id="busy"><invoke id="worker" type="scxml"><content><scxml xmlns="http://www.w3.org/2005/07/scxml"
      version="1.0" name="child" initial="w"><state id="w"/></scxml></content></invoke>
      <transition event="error.execution" target="failed"/></state><state id="failed"/></scxml>""")
    host = sb.Host([chart], store=make_store(mock_client, table))
    parent = "ж" * 498                 # 996 bytes: the table keys it; its child's id it cannot
    host.start("p", parent)
    assert host.send(parent, "go").configuration == {"failed"}
    assert host.get(parent).configuration == {"failed"}
    with pytest.raises(sb.InvalidInstanceId):            # no such child could ever be stored
        host.exists(f"{parent}::worker")
    short = "p-1"
    host.start("p", short)
    assert host.send(short, "go").configuration == {"busy"} and host.exists("p-1::worker")
