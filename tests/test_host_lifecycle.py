"""Lifecycle calls that meet rows in flight: a processor that deletes or suspends its own
instance while the commit's rows are being handed over, and reviving dead rows that must not
be revived. Each case was reproduced against the code before its fix.
"""

from __future__ import annotations

import pytest

import statebound as sb

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'

TWO_MAILS = f"""<scxml {NS} name="c" initial="s" datamodel="python">
 <state id="s"><transition event="go">
   <send type="mail" event="first" target="a"/>
   <send type="mail" event="second" target="b"/>
 </transition></state>
</scxml>"""

CHARGE = f"""<scxml {NS} name="o" initial="charging" datamodel="python">
 <datamodel><data id="errors" expr="0"/></datamodel>
 <state id="charging">
  <invoke type="pay" id="charge"/>
  <transition event="done.invoke.charge" target="paid"/>
  <transition event="error.execution"><assign location="errors" expr="errors + 1"/></transition>
  <transition event="mail"><send type="mail" event="note" target="a"/></transition>
  <transition event="error.communication"/>
 </state>
 <state id="paid"/>
</scxml>"""


@pytest.mark.parametrize("op", ["delete", "suspend"])
def test_a_row_purged_or_parked_by_an_earlier_delivery_is_not_handed_over(store, op):
    # delete purges undelivered rows, suspend parks them: the hand-over went on from the
    # copies it had, and sent the second mail anyway
    sent = []
    host = None

    def mail(d):
        sent.append(d.event)
        if d.event == "first":
            getattr(host, op)(d.instance_id)

    host = sb.Host([sb.Chart.from_scxml(TWO_MAILS)], store=store, clock=sb.ManualClock(T0),
                   processors={"mail": mail})
    host.start("c", "x")
    host.send("x", "go")
    assert sent == ["first"]
    if op == "suspend":
        assert [(r.ordinal, r.state) for r in host.pending_timers("x")] == [(2, "suspended")]
        host.resume("x")
        host.clock.advance(60_000)
        host.fire_due()
        assert sent == ["first", "second"]


class _Gateway:
    def __init__(self):
        self.up = False

    def start(self, request):
        if not self.up:
            raise RuntimeError("gateway down")
        return {"charge": "ch_1"}


def _dead_charge(store):
    gateway = _Gateway()
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(CHARGE)], store=store, clock=clock, invokers={"pay": gateway},
                   processors={"mail": lambda d: (_ for _ in ()).throw(RuntimeError("mail down"))},
                   max_attempts=1, backoff_ms=10)
    host.start("o", "o1")
    clock.advance(100)
    host.fire_due()
    return host, gateway


def test_a_dead_invoke_row_is_not_revived(store):
    # its invocation was ended with error.execution and its generation forgotten: revived, the
    # handler ran again (a charge) and its answer was discarded, "its state was exited"
    host, gateway = _dead_charge(store)
    (dead,) = host.dead_timers()
    assert dead.kind == "invoke" and host.get("o1").datamodel["errors"] == 1
    gateway.up = True
    with pytest.raises(sb.InvalidArgument, match="dead invoke row"):
        host.retry_timer("o1", dead.ordinal)
    assert [r.key for r in host.dead_timers()] == [dead.key]


def test_a_dead_row_of_a_suspended_instance_is_revived_only_after_resume(store):
    host, _gateway = _dead_charge(store)
    host.send("o1", "mail")
    host.clock.advance(100)
    host.fire_due()
    mail = next(r for r in host.dead_timers() if r.kind == "send")
    host.suspend("o1")
    with pytest.raises(sb.InvalidArgument, match="suspended"):
        host.retry_timer("o1", mail.ordinal)
    host.resume("o1")
    assert host.retry_timer("o1", mail.ordinal)
    assert [r.state for r in host.pending_timers("o1") if r.key == mail.key] == ["pending"]


@pytest.mark.parametrize("call", [
    lambda h: h.dead_timers("x"),
    lambda h: h.fire_due("x"),
    lambda h: h.fire_due(lease_ms=-1),
    lambda h: h.fire_many([1]),
    lambda h: h.send_many(None),
    lambda h: h.start("o", "y", [1, 2]),
    lambda h: h.migrate("o1", "o", mapping=["charging"]),
    lambda h: h.migrate("o1", 5),
    lambda h: h.fail_invoke("o1", "charge", error=object()),
    lambda h: h.retry_timer("o1", "1"),
    lambda h: h.complete_invoke("o1", "charge", token="o1:charge:" + "9" * 30),
], ids=["dead_timers", "fire_due", "lease", "fire_many", "send_many", "start_data", "mapping", "migrate_chart",
        "fail_invoke_error", "retry_ordinal", "huge_token"])
def test_arguments_the_api_cannot_use_are_invalid_argument_with_nothing_written(store, call):
    # these escaped as AttributeError, TypeError, or a StoreError on SQLite alone
    host, _gateway = _dead_charge(store)
    before = [(r.key, r.state) for r in host.pending_timers("o1")], host.get("o1")
    with pytest.raises(sb.InvalidArgument):
        call(host)
    assert ([(r.key, r.state) for r in host.pending_timers("o1")], host.get("o1")) == before


def test_migrate_takes_a_registered_chart_name_as_start_does(store):
    host, _gateway = _dead_charge(store)
    assert host.migrate("o1", "o").outcome == "already"
