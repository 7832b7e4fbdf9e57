"""Send processors and invoke handlers: outbox rows, delivery, retries, failure events,
cancellation and late results (``docs/effects.md``), on SQLite and MemoryStore."""

from __future__ import annotations

import pytest

import statebound as sb
from statebound.host.processors import Delivery, InvokeRequest, Pending
from statebound.host.store import CANCEL, DEAD, DONE, INVOKE, PENDING, SEND, WAITING

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

SHOP = f"""<scxml {NS} name="shop" initial="Idle">
  <datamodel>
    <data id="amount" expr="10"/><data id="receipt" expr="None"/><data id="error" expr="None"/>
    <data id="forwarded" expr="0"/>
  </datamodel>
  <state id="Idle">
    <transition event="Pay" target="Charging"/>
    <transition event="Notify"><send type="app" event="Notified" target="ops" namelist="amount"/></transition>
    <transition event="Later"><send id="later" type="app" event="Reminder" target="ops" delay="5s"/></transition>
    <transition event="Unlater"><cancel sendid="later"/></transition>
    <transition event="error.communication" target="Unreachable"><assign location="error" expr="_event.data"/>
    </transition>
    <transition event="error.execution" target="Broken"><assign location="error" expr="_event.data"/></transition>
  </state>
  <state id="Charging">
    <invoke type="payment" id="charge" src="stripe:charges" autoforward="true">
      <param name="amount" expr="amount"/>
      <finalize><assign location="receipt" expr="_event.data"/></finalize>
    </invoke>
    <transition event="done.invoke.charge" target="Paid"/>
    <transition event="error.execution" cond="_event.invokeid == 'charge'" target="Failed">
      <assign location="error" expr="_event.data"/>
    </transition>
    <transition event="Abort" target="Aborted"/>
    <transition event="Again" target="Charging"/>
    <transition event="Poke"><send event="Poked" target="#_charge"/></transition>
  </state>
  <state id="Paid">
    <onentry><send type="app" event="OrderPaid" target="ledger"><param name="amount" expr="amount"/></send></onentry>
    <transition event="error.communication" target="Unreachable"><assign location="error" expr="_event.data"/>
    </transition>
  </state>
  <state id="Unreachable"/>
  <state id="Failed"/>
  <state id="Aborted"/>
  <state id="Broken"/>
</scxml>"""


class SimulatedCrash(BaseException):
    """Not an Exception: the host must not mistake it for a delivery failure."""


class Receiver:
    """An idempotent receiver: acts once per idempotency key, however often it is called."""

    def __init__(self, fail_times: int = 0, error: type[Exception] = ConnectionError) -> None:
        self.calls: list[Delivery] = []
        self.acted: dict[str, Delivery] = {}
        self.fail_times = fail_times
        self.error = error

    def deliver(self, d: Delivery) -> None:
        self.calls.append(d)
        if len(self.calls) <= self.fail_times:
            raise self.error(f"attempt {d.attempt} failed")
        self.acted.setdefault(d.idempotency_key, d)


class Gateway:
    """An invoke handler: charges once per idempotency key; answers, or says it will later."""

    def __init__(self, answer: str = "now", fail_times: int = 0) -> None:
        self.answer = answer
        self.fail_times = fail_times
        self.requests: list[InvokeRequest] = []
        self.charges: dict[str, dict] = {}
        self.cancelled: list[InvokeRequest] = []
        self.forwarded: list[Delivery] = []

    def start(self, request: InvokeRequest):
        self.requests.append(request)
        if len(self.requests) <= self.fail_times:
            raise TimeoutError("gateway timed out")
        charge = self.charges.setdefault(request.idempotency_key,
                                         {"charge": f"ch_{len(self.charges) + 1}", "amount": request.data["amount"]})
        if self.answer == "later":
            return Pending("queued")
        if self.answer == "unstorable":
            return {"charge": object()}
        return charge

    def cancel(self, request: InvokeRequest) -> None:
        self.cancelled.append(request)

    def forward(self, delivery: Delivery) -> None:
        self.forwarded.append(delivery)


@pytest.fixture(params=["sqlite", "memory"])
def make(request, tmp_path):
    """``make(**host_kwargs) -> (host, clock)`` on a fresh store of each kind."""
    clock = sb.ManualClock(T0)
    stores = []

    def build(**kw):
        if not stores:
            stores.append(sb.SQLiteStore(tmp_path / "outbox.db") if request.param == "sqlite" else sb.MemoryStore())
        kw.setdefault("backoff_ms", 1_000)
        host = sb.Host([sb.Chart.from_scxml(SHOP)], store=stores[0], clock=clock, **kw)
        return host, clock
    yield build
    for s in stores:
        if hasattr(s, "close"):
            s.close()


def sweep(host, clock, ms=0):
    clock.advance(ms)
    return host.fire_due()


# ----------------------------------------------------------------------------- send processors

def test_a_send_is_an_outbox_row_written_with_the_position_and_delivered_after_the_commit(make):
    seen = []

    def app(d: Delivery) -> None:            # a plain callable is a processor
        row = host.store.get_timer((d.instance_id, d.ordinal))
        seen.append((d, row.state, host.store.load("o").version))

    host, _clock = make(processors={"app": app})
    host.start("shop", "o")
    host.send("o", "Notify")
    [(d, state, version)] = seen
    assert state == PENDING and version == 2          # the row and the event committed together, before delivery
    assert (d.type, d.target, d.event, d.data, d.send_id) == ("app", "ops", "Notified", {"amount": 10}, "send.1")
    assert d.idempotency_key == f"o:{d.ordinal}" and d.attempt == 1 and d.instance_id == "o"
    row = host.store.get_timer(("o", d.ordinal))
    assert (row.kind, row.state, row.outcome) == (SEND, DONE, "delivered")
    assert host.pending_timers("o") == []
    assert host.get("o").configuration == {"Idle"}


def test_a_processor_object_with_deliver_is_used(make):
    rx = Receiver()
    host, _clock = make(processors={"app": rx})
    host.start("shop", "o")
    host.send("o", "Notify")
    assert len(rx.calls) == 1 and len(rx.acted) == 1


def test_the_processor_types_are_the_charts_ioprocessors(make):
    host, _clock = make(processors={"app": Receiver()})
    chart = sb.Chart.from_scxml(f"""<scxml {NS} name="iop" initial="s">
      <datamodel><data id="has" expr="'app' in _ioprocessors"/></datamodel><state id="s"/></scxml>""")
    host.register(chart)
    assert host.start("iop", "i").datamodel["has"] is True


def test_a_receiver_failing_three_times_then_succeeding_acts_once(make):
    rx = Receiver(fail_times=3)
    host, clock = make(processors={"app": rx}, max_attempts=5)
    host.start("shop", "o")
    host.send("o", "Notify")                      # attempt 1, right after the commit: fails
    assert [r.outcome for r in sweep(host, clock, 999)] == []   # backoff 1 s not over yet
    outcomes = [r.outcome for r in sweep(host, clock, 1)]        # attempt 2
    outcomes += [r.outcome for r in sweep(host, clock, 2_000)]   # attempt 3 (backoff 2 s)
    outcomes += [r.outcome for r in sweep(host, clock, 4_000)]   # attempt 4 (backoff 4 s): succeeds
    assert outcomes == ["failed", "failed", "delivered"]
    keys = {d.idempotency_key for d in rx.calls}
    assert len(keys) == 1 and [d.attempt for d in rx.calls] == [1, 2, 3, 4]
    assert len(rx.acted) == 1                     # one success
    [row] = [host.store.get_timer((rx.calls[0].instance_id, rx.calls[0].ordinal))]
    assert (row.state, row.outcome, row.attempts) == (DONE, "delivered", 3)
    assert host.get("o").configuration == {"Idle"}


def test_a_receiver_that_always_fails_ends_dead_and_the_chart_gets_error_communication(make):
    rx = Receiver(fail_times=10**6)
    host, clock = make(processors={"app": rx}, max_attempts=3)
    host.start("shop", "o")
    host.send("o", "Notify")
    sweep(host, clock, 1_000)
    results = sweep(host, clock, 2_000)
    assert [r.outcome for r in results] == ["failed"]
    [dead] = host.dead_timers()
    assert (dead.state, dead.attempts, dead.kind) == (DEAD, 3, SEND)
    assert dead.last_error == "ConnectionError: attempt 3 failed"
    pos = host.get("o")
    assert pos.configuration == {"Unreachable"}
    err = pos.datamodel["error"]
    assert (err["type"], err["target"], err["attempts"], err["error"]) == ("app", "ops", 3, "ConnectionError")
    assert "failed for good after 3 attempt(s)" in err["message"]
    assert sweep(host, clock, 60_000) == [] and len(rx.calls) == 3


def test_error_communication_carries_the_sendid(make):
    class Rejecting:
        def deliver(self, d):
            raise sb.DeliveryRejected("queue does not exist")
    chart = sb.Chart.from_scxml(f"""<scxml {NS} name="sid" initial="s">
      <datamodel><data id="sid" expr="None"/></datamodel>
      <state id="s"><onentry><send id="mine" type="app" event="x"/></onentry>
        <transition event="error.communication" target="t"><assign location="sid" expr="_event.sendid"/></transition>
      </state><state id="t"/></scxml>""")
    host, _clock = make(processors={"app": Rejecting()})
    host.register(chart)
    host.start("sid", "i")
    pos = host.get("i")
    assert pos.configuration == {"t"} and pos.datamodel["sid"] == "mine"     # rejected: dead at once
    assert host.dead_timers()[0].attempts == 1


def test_an_unknown_processor_type_is_error_execution_with_a_clear_message(make):
    host, _clock = make()               # no processors at all
    host.start("shop", "o")
    pos = host.send("o", "Notify")
    assert pos.configuration == {"Broken"}
    message = pos.datamodel["error"]["message"]
    assert "<send type='app'> names no event I/O processor" in message
    assert "processors={'app': ...}" in message
    assert host.pending_timers("o") == []


def test_a_delayed_send_is_due_at_its_delay_and_can_be_cancelled(make):
    rx = Receiver()
    host, clock = make(processors={"app": rx})
    host.start("shop", "o")
    host.send("o", "Later")
    [row] = host.pending_timers("o")
    assert (row.kind, row.due_at_ms, row.send_id) == (SEND, T0 + 5_000, "later")
    assert rx.calls == []
    assert [r.outcome for r in sweep(host, clock, 5_000)] == ["delivered"]
    assert rx.calls[0].event == "Reminder"
    host.send("o", "Later")
    host.send("o", "Unlater")
    assert host.pending_timers("o") == []
    assert sweep(host, clock, 10_000) == [] and len(rx.calls) == 1


def test_a_crash_between_commit_and_delivery_is_delivered_by_the_sweeper_after_the_lease(make):
    class CrashOnce:
        def __init__(self):
            self.calls = []

        def deliver(self, d):
            self.calls.append(d)
            if len(self.calls) == 1:
                raise SimulatedCrash()
    rx = CrashOnce()
    host, clock = make(processors={"app": rx}, outbox_lease_ms=30_000)
    host.start("shop", "o")
    with pytest.raises(SimulatedCrash):
        host.send("o", "Notify")
    restarted, _ = make(processors={"app": rx}, outbox_lease_ms=30_000)
    assert restarted.get("o").macrostep == 1                  # the event itself committed
    assert sweep(restarted, clock, 29_999) == []               # hidden while the dead host's lease runs
    assert [r.outcome for r in sweep(restarted, clock, 1)] == ["delivered"]
    assert [d.idempotency_key for d in rx.calls] == [rx.calls[0].idempotency_key] * 2


def test_without_delivery_after_commit_the_sweeper_delivers_at_once(make):
    rx = Receiver()
    host, _clock = make(processors={"app": rx}, deliver_after_commit=False)
    host.start("shop", "o")
    host.send("o", "Notify")
    assert rx.calls == []
    assert [r.outcome for r in host.fire_due()] == ["delivered"]


def test_a_sweeper_without_the_processor_leaves_the_row_alone(make):
    rx = Receiver(fail_times=1)
    host, clock = make(processors={"app": rx})
    host.start("shop", "o")
    host.send("o", "Notify")
    bare, _ = make()  # a host that was given no processors
    [res] = sweep(bare, clock, 1_000)
    assert res.outcome == "skipped" and "no send processor 'app'" in res.reason
    assert host.store.get_timer(res.key).attempts == 1        # not counted as an attempt


def test_bad_processor_and_handler_registrations_are_refused():
    with pytest.raises(TypeError, match="deliver"):
        sb.Host(processors={"app": 42})
    with pytest.raises(ValueError, match="SCXML or Basic HTTP"):
        sb.Host(processors={"scxml": lambda d: None})
    with pytest.raises(TypeError, match="start"):
        sb.Host(invokers={"payment": object()})


# ----------------------------------------------------------------------------- invoke handlers

def test_an_invoke_handler_result_is_done_invoke_with_finalize(make):
    gw, rx = Gateway(), Receiver()
    host, _clock = make(invokers={"payment": gw}, processors={"app": rx})
    host.start("shop", "o")
    pos = host.send("o", "Pay")
    assert pos.configuration == {"Charging"}        # the answer comes after the commit
    [req] = gw.requests
    assert (req.invokeid, req.type, req.src, req.data, req.attempt) == ("charge", "payment", "stripe:charges",
                                                                        {"amount": 10}, 1)
    assert req.token == req.idempotency_key == f"o:charge:{int(req.token.rsplit(':', 1)[1])}"
    pos = host.get("o")
    assert pos.configuration == {"Paid"}
    assert pos.datamodel["receipt"] == {"charge": "ch_1", "amount": 10}     # finalize saw the result
    row = host.store.get_timer(("o", int(req.token.rsplit(":", 1)[1])))
    assert (row.kind, row.state, row.outcome) == (INVOKE, DONE, "fired")
    assert [d.event for d in rx.calls] == ["OrderPaid"]                      # Paid's send, delivered in turn
    assert host.pending_timers("o") == [] and host.get("o").datamodel["error"] is None


def test_a_pending_handler_is_completed_later_by_complete_invoke(make):
    gw = Gateway(answer="later")
    host, clock = make(invokers={"payment": gw}, processors={"app": Receiver()})
    host.start("shop", "o")
    host.send("o", "Pay")
    [req] = gw.requests
    [row] = host.pending_timers("o")
    assert (row.state, row.reason) == (WAITING, "queued")
    assert sweep(host, clock, 3_600_000) == []                  # nobody sweeps a waiting row
    res = host.complete_invoke("o", "charge", {"charge": "ch_9"}, token=req.token)
    assert (res.outcome, res.key) == ("fired", row.key)
    assert host.get("o").configuration == {"Paid"} and host.get("o").datamodel["receipt"] == {"charge": "ch_9"}
    again = host.complete_invoke("o", "charge", {"charge": "ch_9"}, token=req.token)
    assert again.outcome == "discarded"                           # a second answer is never delivered
    assert host.store.get_timer(row.key).outcome == "fired"


def test_complete_invoke_without_a_token_finishes_the_live_invocation(make):
    host, _clock = make(invokers={"payment": Gateway(answer="later")}, processors={"app": Receiver()})
    host.start("shop", "o")
    host.send("o", "Pay")
    assert host.complete_invoke("o", "charge", {"ok": 1}).outcome == "fired"
    assert host.get("o").configuration == {"Paid"}


def test_fail_invoke_gives_error_execution_with_the_invokeid(make):
    host, _clock = make(invokers={"payment": Gateway(answer="later")})
    host.start("shop", "o")
    host.send("o", "Pay")
    res = host.fail_invoke("o", "charge", "CardDeclined", {"code": 51})
    assert res.outcome == "fired"
    pos = host.get("o")
    assert pos.configuration == {"Failed"}
    assert pos.datamodel["error"]["error"] == "CardDeclined" and pos.datamodel["error"]["cause"] == {"code": 51}


def test_leaving_the_state_cancels_and_a_late_result_is_discarded_with_a_reason_on_the_row(make):
    gw = Gateway(answer="later")
    host, _clock = make(invokers={"payment": gw})
    host.start("shop", "o")
    host.send("o", "Pay")
    [req] = gw.requests
    key = ("o", int(req.token.rsplit(":", 1)[1]))
    assert host.send("o", "Abort").configuration == {"Aborted"}
    assert [c.token for c in gw.cancelled] == [req.token]     # the cancel hook, right after the commit
    row = host.store.get_timer(key)
    assert (row.kind, row.state, row.outcome) == (CANCEL, DONE, "cancelled")
    late = host.complete_invoke("o", "charge", {"charge": "ch_1"}, token=req.token)
    assert late.outcome == "discarded" and "state was exited" in late.reason
    row = host.store.get_timer(key)
    assert row.outcome == "discarded" and "state was exited" in row.reason and "exited before" in row.reason
    pos = host.get("o")
    assert pos.configuration == {"Aborted"} and pos.datamodel["receipt"] is None   # never delivered
    blind = host.complete_invoke("o", "charge", {"charge": "ch_1"})
    assert blind.outcome == "discarded" and blind.key is None and "pass the request's token" in blind.reason


def test_a_result_arriving_after_the_state_was_left_is_discarded_on_the_row(make):
    """The handler is still working when the state exits (here: it exits it itself)."""
    class Slow(Gateway):
        def start(self, request):
            host.send("o", "Abort")          # the chart moves on while the charge runs
            return super().start(request)
    gw = Slow()
    host, _clock = make(invokers={"payment": gw})
    host.start("shop", "o")
    host.send("o", "Pay")
    [req] = gw.requests
    row = host.store.get_timer(("o", int(req.token.rsplit(":", 1)[1])))
    # the result is discarded, never delivered; the row is the cancel hook's, which runs
    # (before, the discard completed the cancel row and the hook never ran)
    assert (row.state, row.outcome) == (DONE, "cancelled") and [r.token for r in gw.cancelled] == [req.token]
    assert "was exited before a result arrived" in row.reason
    assert host.get("o").configuration == {"Aborted"} and host.get("o").datamodel["receipt"] is None


def test_a_result_for_an_earlier_entry_of_the_state_is_stale(make):
    gw = Gateway(answer="later")
    host, _clock = make(invokers={"payment": gw}, processors={"app": Receiver()})
    host.start("shop", "o")
    host.send("o", "Pay")
    host.send("o", "Again")                   # exit and re-enter: a new generation
    first, second = gw.requests
    assert first.token != second.token and first.invokeid == second.invokeid
    stale = host.complete_invoke("o", "charge", {"n": 1}, token=first.token)
    assert stale.outcome == "discarded" and "started again" in stale.reason
    assert host.get("o").configuration == {"Charging"}
    assert host.complete_invoke("o", "charge", {"n": 2}, token=second.token).outcome == "fired"
    assert host.get("o").datamodel["receipt"] == {"n": 2}


def test_a_handler_that_raises_is_retried_then_the_chart_gets_error_execution(make):
    gw = Gateway(fail_times=10**6)
    host, clock = make(invokers={"payment": gw}, max_attempts=2)
    host.start("shop", "o")
    host.send("o", "Pay")
    sweep(host, clock, 1_000)
    pos = host.get("o")
    assert pos.configuration == {"Failed"}
    err = pos.datamodel["error"]
    assert (err["invokeid"], err["error"], err["attempts"]) == ("charge", "TimeoutError", 2)
    [dead] = host.dead_timers()
    assert dead.kind == INVOKE and dead.last_error == "TimeoutError: gateway timed out"
    assert {r.idempotency_key for r in gw.requests} == {gw.requests[0].idempotency_key}


def test_a_retried_charge_happens_once(make):
    gw = Gateway(fail_times=1)               # the first answer is lost after the charge
    host, clock = make(invokers={"payment": gw}, processors={"app": Receiver()})
    host.start("shop", "o")
    host.send("o", "Pay")
    assert host.get("o").configuration == {"Charging"}
    sweep(host, clock, 1_000)
    assert host.get("o").configuration == {"Paid"}
    assert [r.attempt for r in gw.requests] == [1, 2] and len(gw.charges) == 1


def test_an_unstorable_result_is_dead_at_once_with_a_typed_error(make):
    host, _clock = make(invokers={"payment": Gateway(answer="unstorable")})
    host.start("shop", "o")
    host.send("o", "Pay")
    [dead] = host.dead_timers()
    assert dead.attempts == 1 and dead.last_error.startswith("SerializationError: the result of invoke 'charge'")
    assert host.get("o").configuration == {"Failed"}


def test_complete_invoke_refuses_unstorable_data_and_unknown_instances(make):
    host, _clock = make(invokers={"payment": Gateway(answer="later")})
    host.start("shop", "o")
    host.send("o", "Pay")
    with pytest.raises(sb.SerializationError):
        host.complete_invoke("o", "charge", {"x": object()})
    with pytest.raises(sb.InstanceNotFound):
        host.complete_invoke("nobody", "charge", 1)
    with pytest.raises(ValueError, match="token"):
        host.complete_invoke("o", "charge", 1, token="other:charge:3")
    assert host.get("o").configuration == {"Charging"}


def test_an_unknown_invoke_type_is_error_execution_with_a_clear_message(make):
    host, _clock = make()
    host.register(sb.Chart.from_scxml(f"""<scxml {NS} name="inv" initial="s">
      <datamodel><data id="msg" expr="None"/></datamodel>
      <state id="s"><invoke type="payment" src="stripe:charges"/>
        <transition event="error.execution" target="t"><assign location="msg" expr="_event.data['message']"/>
        </transition></state><state id="t"/></scxml>"""))
    pos = host.start("inv", "i")
    assert pos.configuration == {"t"}
    assert "<invoke type='payment'> names no invoke handler" in pos.datamodel["msg"]
    assert "invokers={'payment': ...}" in pos.datamodel["msg"]
    assert host.pending_timers("i") == [] and pos.invocations == ()


def test_autoforward_and_sends_to_the_invocation_reach_the_handlers_forward(make):
    gw = Gateway(answer="later")
    host, _clock = make(invokers={"payment": gw})
    host.start("shop", "o")
    host.send("o", "Pay")
    host.send("o", "Poke")                   # autoforwarded, and it sends Poked to #_charge
    events = [d.event for d in gw.forwarded]
    assert events == ["Poke", "Poked"]
    assert all(d.target == "#_charge" and d.type == "payment" for d in gw.forwarded)
    assert len({d.idempotency_key for d in gw.forwarded}) == 2


def test_halting_the_instance_cancels_its_invocations(make):
    gw = Gateway(answer="later")
    host, _clock = make(invokers={"payment": gw})
    host.start("shop", "o")
    host.send("o", "Pay")
    host.cancel("o")
    assert len(gw.cancelled) == 1
    assert host.complete_invoke("o", "charge", 1, token=gw.requests[0].token).outcome == "discarded"


def test_a_handler_without_a_cancel_hook_is_finished_as_cancelled_in_the_exit_commit(make):
    class NoCancel:
        def start(self, request):
            return Pending()
    host, _clock = make(invokers={"payment": NoCancel()})
    host.start("shop", "o")
    host.send("o", "Pay")
    [row] = host.pending_timers("o")
    commits = host.metrics["commits"]
    host.send("o", "Abort")
    assert host.metrics["commits"] == commits + 1
    assert (host.store.get_timer(row.key).state, host.store.get_timer(row.key).outcome) == (DONE, "cancelled")


def test_the_sweeper_reports_outbox_outcomes(make):
    rx = Receiver(fail_times=1)
    host, clock = make(processors={"app": rx}, invokers={"payment": Gateway(answer="later")})
    host.start("shop", "o")
    host.send("o", "Notify")
    clock.advance(1_000)
    report = sb.Sweeper(host).run_once()
    assert (report.delivered, report.total) == (1, 1)


def test_a_handler_invokes_src_and_content_are_its_input_never_a_chart(tmp_path):
    (tmp_path / "charge.json").write_text('{"not": "scxml"}')
    (tmp_path / "c.scxml").write_text(f"""<scxml {NS} name="c" initial="s">
      <state id="s">
        <invoke type="payment" src="charge.json"/>
        <invoke type="payment"><content>{{"plan": "gold"}}</content></invoke>
      </state></scxml>""")
    chart = sb.Chart.from_file(tmp_path / "c.scxml")       # nothing compiled, nothing refused
    assert chart.subcharts == ()
    seen = []

    class Handler:
        def start(self, request):
            seen.append((request.src, request.content))
            return Pending()
    host = sb.Host([chart], invokers={"payment": Handler()}, clock=sb.ManualClock(T0))
    host.start("c", "i")
    assert seen == [("charge.json", None), (None, {"plan": "gold"})]
    assert [r.state for r in host.pending_timers("i")] == [WAITING, WAITING]


def test_a_result_for_a_deleted_instance_is_discarded_not_raised(make):
    class DeletesFirst(Gateway):
        def start(self, request):
            host.delete("o")                  # an operator purges the order meanwhile
            return super().start(request)
    host, _clock = make(invokers={"payment": DeletesFirst()})
    host.start("shop", "o")
    host.send("o", "Pay")                     # no exception escapes the delivery
    assert not host.exists("o") and host.metrics.get("discarded") == 1


def test_the_pure_interpreter_emits_processor_sends_and_handler_invokes_it_is_offered():
    chart = sb.Chart.from_scxml(f"""<scxml {NS} name="pure" initial="s">
      <state id="s">
        <onentry><send type="sqs" event="e" target="q" delay="2s"/><send type="sqs" event="f"/></onentry>
        <invoke type="payment" id="p"><content>[1, 2]</content></invoke>
      </state></scxml>""")
    interp = sb.Interpreter(chart)
    pos, effects = interp.start("i", ioprocessors={"sqs": {}}, invokers=frozenset({"payment"}))
    kinds = [(type(e).__name__, e.type) for e in effects]
    assert kinds == [("SendDelayed", "sqs"), ("Send", "sqs"), ("Invoke", "payment")]
    invoke = effects[2]
    assert (invoke.src, invoke.content, invoke.chart) == (None, [1, 2], None)
    assert pos.ordinal == 1                                 # only the delayed send took an ordinal
    _bare, bare_effects = interp.start("j")                 # offered nothing: error.execution, nothing to do
    # (each raised error.* is reported as a Log effect, ADR 0012; nothing is sent or invoked)
    assert [(type(e).__name__, e.label) for e in bare_effects] == [("Log", "error.execution")] * 2


class Unprintable(Exception):
    """What a careless client library raises: its __str__ itself fails."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_an_exception_that_cannot_be_printed_is_still_a_failed_delivery(make):
    """The row's error text was built with f"{exc}" outside any guard: every fire of the
    row raised RuntimeError out of fire_due (and killed the sweeper), the attempt was never
    counted and the row never died. It now backs off and dies like any failure."""
    calls: list[int] = []

    def app(delivery: Delivery) -> None:
        calls.append(delivery.attempt)
        raise Unprintable()
    host, clock = make(processors={"app": app}, max_attempts=3)
    host.start("shop", "s1")
    host.send("s1", "Notify")
    for _ in range(3):
        clock.advance(60_000)
        sb.Sweeper(host).run_once()
    assert calls == [1, 2, 3]
    [row] = [r for r in host.pending_timers("s1") if r.kind == SEND]
    assert row.state == DEAD and row.last_error == "Unprintable: <str() of this exception raised RuntimeError>"
    assert host.get("s1").configuration == {"Unreachable"}


GUARDED = """<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound" version="1.0"
       datamodel="python" name="guarded" initial="Idle">
  <state id="Idle"><transition event="Pay" target="Charging"/></state>
  <state id="Charging">
    <sb:timeout event="Timeout" after="1h"/>
    <invoke type="payment" id="charge"/>
    <transition event="done.invoke.charge" target="Paid"/>
    <transition event="Timeout" target="TimedOut"/>
  </state>
  <state id="Paid"/><state id="TimedOut"/>
</scxml>"""


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_token_naming_another_row_never_finishes_that_row(kind, tmp_path):
    """complete_invoke with a token whose generation is the ordinal of the state's
    <sb:timeout> row "discarded" the result and marked the timer row done with it: the
    timeout never fired. A token must name a generation of this invocation to touch a row."""
    store = sb.MemoryStore() if kind == "memory" else sb.SQLiteStore(tmp_path / "g.db")

    class Later:
        def __init__(self) -> None:
            self.requests: list[InvokeRequest] = []

        def start(self, request: InvokeRequest) -> Pending:
            self.requests.append(request)
            return Pending("queued")
    gateway = Later()
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(GUARDED)], store=store, clock=clock, invokers={"payment": gateway})
    host.start("guarded", "o1")
    host.send("o1", "Pay")
    [timer] = [r for r in host.pending_timers("o1") if r.kind == "timer"]
    assert gateway.requests[0].token != f"o1:charge:{timer.ordinal}"
    result = host.complete_invoke("o1", "charge", {"x": 1}, token=f"o1:charge:{timer.ordinal}")
    assert result.outcome == "discarded" and result.key is None
    assert host.store.get_timer(timer.key).state == PENDING
    with pytest.raises(sb.InvalidArgument):
        host.complete_invoke("o1", "charge", {"x": 1}, token="o1:charge:²")
    assert [r.state for r in host.pending_timers("o1") if r.kind == INVOKE] == [WAITING]   # untouched too
    clock.advance(3_600_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("o1").configuration == {"TimedOut"}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_result_for_a_suspended_instance_waits_for_resume_and_its_generation_is_checked_then(kind, tmp_path):
    """complete_invoke while the instance was suspended "fired": the result was parked as a
    plain event and, after resume, delivered with no generation check, into a later
    invocation of the same id. Now complete_invoke raises InstanceSuspended (nothing
    written, answer again after resume); a handler's start that answers while its instance
    is suspended leaves its invoke row parked, to fire (and be checked) after resume."""
    store = sb.MemoryStore() if kind == "memory" else sb.SQLiteStore(tmp_path / "s.db")
    clock = sb.ManualClock(T0)
    host: sb.Host

    class Handler:
        def __init__(self) -> None:
            self.requests: list[InvokeRequest] = []
            self.suspend_on_start = False

        def start(self, request: InvokeRequest):
            self.requests.append(request)
            if not self.suspend_on_start:
                return Pending("queued")
            self.suspend_on_start = False
            host.suspend(request.instance_id)   # the operator, while the handler works
            return {"charge": "ch_at_once"}
    handler = Handler()
    host = sb.Host([sb.Chart.from_scxml(GUARDED)], store=store, clock=clock, invokers={"payment": handler})
    host.start("guarded", "o1")
    host.send("o1", "Pay")
    token = handler.requests[-1].token
    host.suspend("o1")
    version = host.store.load("o1").version
    with pytest.raises(sb.InstanceSuspended):
        host.complete_invoke("o1", "charge", {"charge": "ch_late"}, token=token)
    with pytest.raises(sb.InstanceSuspended):
        host.fail_invoke("o1", "charge", "declined", token=token)
    assert host.store.load("o1").version == version
    host.resume("o1")
    assert host.complete_invoke("o1", "charge", {"charge": "ch_late"}, token=token).outcome == "fired"
    assert host.get("o1").configuration == {"Paid"}

    # the fire path: the handler answers at once, but its instance was suspended meanwhile
    host.start("guarded", "o2")
    handler.suspend_on_start = True
    host.send("o2", "Pay")
    [row] = [r for r in host.pending_timers("o2") if r.kind == INVOKE]
    assert row.state == "suspended" and host.get("o2").configuration == {"Charging"}
    host.resume("o2")
    clock.advance(60_000)   # past the hand-over's claim on the row
    handler_calls = len(handler.requests)
    assert [r.outcome for r in host.fire_due()] == ["waiting"]   # started again, same key
    assert len(handler.requests) == handler_calls + 1
    assert handler.requests[-1].idempotency_key == handler.requests[-2].idempotency_key
    assert host.complete_invoke("o2", "charge", {"charge": "ch"}, token=handler.requests[-1].token).outcome == "fired"
    assert host.get("o2").configuration == {"Paid"}


@pytest.mark.parametrize("answer", ["pending", "result"])
@pytest.mark.parametrize("inline", [True, False])
def test_a_state_exited_while_start_runs_still_gets_its_cancel_hook(make, answer, inline):
    """Another request exits the invoking state while the handler's start is running. The
    exit turned the row into a cancel row; then start's answer was written over it: Pending
    made it a waiting row for ever, a result completed it as discarded. Either way the
    cancel hook never ran. The answer now checks that its invocation is still live, in a
    commit conditional on the position, and leaves a cancel row to the hook."""
    host: sb.Host
    cancelled: list[str] = []

    class Racing:
        def __init__(self) -> None:
            self.starts = 0

        def start(self, request: InvokeRequest):
            self.starts += 1
            if self.starts == 1:
                host.send(request.instance_id, "Abort")   # the concurrent request
            return Pending("queued") if answer == "pending" else {"charge": "ch_1"}

        def cancel(self, request: InvokeRequest) -> None:
            cancelled.append(request.token)
    host, clock = make(invokers={"payment": Racing()}, deliver_after_commit=inline)
    host.start("shop", "o1")
    host.send("o1", "Pay")
    for _ in range(3):
        clock.advance(60_000)
        host.fire_due()
    assert host.get("o1").configuration == {"Aborted"}
    assert len(cancelled) == 1
    assert [r for r in host.pending_timers("o1") if r.kind in (INVOKE, CANCEL)] == []


def test_each_failed_delivery_counts_once_in_host_metrics(make):
    """A retryable outbox failure was counted twice (by the release, then by the result):
    three failed attempts read failed=5. Timer rows always counted once."""
    rx = Receiver(fail_times=10)
    host, clock = make(processors={"app": rx}, max_attempts=3)
    host.start("shop", "s1")
    host.send("s1", "Notify")
    assert host.metrics["failed"] == 1
    for _ in range(2):
        clock.advance(60_000)
        host.fire_due()
    assert len(rx.calls) == 3
    assert (host.metrics["failed"], host.metrics["dead"]) == (3, 1)


def test_the_default_log_line_quotes_what_could_forge_a_line(tmp_path, caplog):
    """With no on_log, a chart's <log> goes to the 'statebound' logger. The instance id was
    written as it is, so an id holding a newline wrote a second, forged log line."""
    chart = sb.Chart.from_scxml(f"""<scxml {NS} name="l" initial="s"><state id="s">
      <transition event="go"><log label="step" expr="'went'"/></transition></state></scxml>""")
    host = sb.Host([chart], store=sb.MemoryStore(), clock=sb.ManualClock(T0))
    forged = "order-9\nCRITICAL statebound admin password reset for order-1"
    host.start("l", forged)
    with caplog.at_level("INFO", logger="statebound"):
        host.send(forged, "go")
    [line] = [r.getMessage() for r in caplog.records if "went" in r.getMessage()]
    assert "\n" not in line and "order-9\\n" in line
