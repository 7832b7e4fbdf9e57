"""Outbox rows are handed over only while they are live: a copy read earlier (a sweep's
claim, the hand-over's queue) is checked against the stored row before the outside world is
called; an invocation's failure or result after its state was exited is discarded and its
cancel hook still runs; a session ended by its parent cancels its handler invocations; a
chart's own send id never passes for an invocation. Each case was reproduced against the
code before its fix (``docs/effects.md``), on MemoryStore and SQLite.
"""

from __future__ import annotations

import pytest

import statebound as sb
from statebound.host.processors import Delivery, InvokeRequest, Pending
from statebound.host.store import CANCEL, DONE, INVOKE, SUSPENDED, Commit, TimerCompletion

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

SHOP = f"""<scxml {NS} name="shop" initial="Idle">
  <datamodel><data id="receipt" expr="None"/><data id="errors" expr="[]"/></datamodel>
  <state id="Idle">
    <transition event="Pay" target="Charging"/>
    <transition event="Notify"><send type="app" event="Notified" target="ops"/></transition>
    <transition event="Later"><send id="later" type="app" event="Reminder" target="ops" delay="5s"/></transition>
    <transition event="Unlater"><cancel sendid="later"/></transition>
  </state>
  <state id="Charging">
    <invoke type="payment" id="charge" src="stripe:charges"/>
    <transition event="done.invoke.charge" target="Paid"/>
    <transition event="error.execution" cond="_event.invokeid == 'charge'" target="Failed"/>
    <transition event="Abort" target="Aborted"/>
  </state>
  <state id="Paid"/>
  <state id="Failed"/>
  <state id="Aborted">
    <transition event="error.execution"><script>errors.append(_event.data['message'])</script></transition>
  </state>
</scxml>"""


class Receiver:
    def __init__(self, fail_times: int = 0) -> None:
        self.calls: list[Delivery] = []
        self.fail_times = fail_times

    def deliver(self, d: Delivery) -> None:
        self.calls.append(d)
        if len(self.calls) <= self.fail_times:
            raise ConnectionError(f"attempt {d.attempt} failed")


class Gateway:
    def __init__(self, answer: str = "now", fail_times: int = 0) -> None:
        self.answer = answer
        self.fail_times = fail_times
        self.requests: list[InvokeRequest] = []
        self.cancelled: list[InvokeRequest] = []

    def start(self, request: InvokeRequest):
        self.requests.append(request)
        if len(self.requests) <= self.fail_times:
            raise TimeoutError("gateway timed out")
        return Pending("queued") if self.answer == "later" else {"charge": f"ch_{len(self.requests)}"}

    def cancel(self, request: InvokeRequest) -> None:
        self.cancelled.append(request)


def shop(store, clock=None, **kw) -> sb.Host:
    kw.setdefault("backoff_ms", 1_000)
    return sb.Host([sb.Chart.from_scxml(SHOP)], store=store, clock=clock or sb.ManualClock(T0), **kw)


# ----------------------------------------------------------------------------- a suspend

def test_a_delayed_send_claimed_before_a_suspend_goes_out_after_resume(store):
    # it was discarded ("instance is suspended") and never went out
    rx = Receiver()
    host = shop(store, processors={"app": rx})
    host.start("shop", "o1")
    host.send("o1", "Later")
    host.clock.advance(5_000)
    claimed = store.claim_due(host.clock.now_ms(), 10, "S", 30_000)
    host.suspend("o1")
    assert [host.fire(r, node_id="S").outcome for r in claimed] == ["parked"]
    assert [r.state for r in host.pending_timers("o1")] == [SUSPENDED] and rx.calls == []
    host.resume("o1")
    assert [r.outcome for r in host.fire_due()] == ["delivered"]
    assert [(d.event, d.idempotency_key) for d in rx.calls] == [("Reminder", "o1:1")]
    assert host.pending_timers("o1") == []


def test_a_delayed_send_whose_instance_is_suspended_while_it_fires_is_parked(store):
    # the row read back still claimed, the suspend landing just after: parked in place by the
    # fire's own conditional commit, not discarded
    rx = Receiver()
    host = shop(store, processors={"app": rx})
    host.start("shop", "o1")
    host.send("o1", "Later")
    host.clock.advance(5_000)
    [claimed] = store.claim_due(host.clock.now_ms(), 10, "S", 30_000)
    read = store.get_timer

    def get_timer(key):
        row = read(key)
        if key == claimed.key and not host.is_suspended("o1"):
            host.suspend("o1")   # an operator, right after the fire's read
        return row
    store.get_timer = get_timer
    try:
        assert host.fire(claimed, node_id="S").outcome == "parked"
    finally:
        del store.get_timer
    assert [r.state for r in host.pending_timers("o1")] == [SUSPENDED] and rx.calls == []
    host.resume("o1")
    assert [r.outcome for r in host.fire_due()] == ["delivered"] and len(rx.calls) == 1


# ----------------------------------------------------------------------------- stale copies

@pytest.mark.parametrize("change", ["exit", "cancel", "delete"])
def test_a_claimed_invoke_row_is_not_started_after_its_invocation_ended(store, change):
    # start ran from the sweeper's copy after the cancel hook had run (or for a deleted
    # instance): the work it started was never cancelled
    gw = Gateway(fail_times=1)
    host = shop(store, invokers={"payment": gw})
    host.start("shop", "o1")
    host.send("o1", "Pay")                     # the first start times out: retried in 1 s
    host.clock.advance(1_000)
    [claimed] = store.claim_due(host.clock.now_ms(), 10, "S", 30_000)
    assert claimed.kind == INVOKE
    if change == "exit":
        host.send("o1", "Abort")
    elif change == "cancel":
        host.cancel("o1")
    else:
        host.delete("o1")
    result = host.fire(claimed, node_id="S")
    assert result.outcome == "skipped" and len(gw.requests) == 1
    assert len(gw.cancelled) == (0 if change == "delete" else 1)


def test_a_sweep_does_not_start_an_invocation_aborted_while_an_earlier_row_was_delivered(store):
    log: list[tuple[str, str]] = []

    class Gw(Gateway):
        def start(self, request):
            log.append(("start", request.idempotency_key))
            return super().start(request)

        def cancel(self, request):
            log.append(("cancel", request.idempotency_key))

    web: sb.Host

    def slow_mail(d: Delivery) -> None:        # meanwhile, another process aborts o1
        log.append(("mail", d.idempotency_key))
        if d.instance_id == "o0":
            web.send("o1", "Abort")
    clock = sb.ManualClock(T0)
    kw = dict(processors={"app": slow_mail}, invokers={"payment": Gw(fail_times=1)})
    web = shop(store, clock, node_id="web", **kw)
    host = shop(store, clock, deliver_after_commit=False, **kw)
    host.start("shop", "o1")
    host.send("o1", "Pay")
    sb.Sweeper(host, node_id="S").run_once()      # the first start times out
    host.start("shop", "o0")
    host.send("o0", "Notify")
    clock.advance(1_000)
    log.clear()
    sb.Sweeper(host, node_id="S", batch=10).run_once()
    assert log == [("mail", "o0:1"), ("cancel", "o1:charge:1")]


def test_the_hand_over_does_not_start_an_invocation_a_send_before_it_aborted(store):
    # in one call: the commit wrote a send and an invoke row; the send's processor answers
    # back at once and aborts, and the invoke row's queued copy was still started
    chart = f"""<scxml {NS} name="ab" initial="Idle">
      <state id="Idle"><transition event="Pay" target="Charging"/></state>
      <state id="Charging">
        <onentry><send type="fraud" event="Check" target="fraud-svc"/></onentry>
        <invoke type="payment" id="charge" src="stripe"/>
        <transition event="Abort" target="Aborted"/>
      </state>
      <state id="Aborted"/>
    </scxml>"""
    gw = Gateway()
    host: sb.Host

    def fraud(d: Delivery) -> None:
        host.send(d.instance_id, "Abort")
    host = sb.Host([sb.Chart.from_scxml(chart)], store=store, clock=sb.ManualClock(T0),
                   processors={"fraud": fraud}, invokers={"payment": gw})
    host.start("ab", "o1")
    host.send("o1", "Pay")
    assert gw.requests == [] and [r.token for r in gw.cancelled] == ["o1:charge:2"]
    assert host.get("o1").configuration == {"Aborted"} and host.pending_timers("o1") == []


@pytest.mark.parametrize("change", ["cancel", "delete", "delete and start again"])
def test_a_claimed_send_is_not_delivered_after_it_was_cancelled_or_its_instance_deleted(store, change):
    rx = Receiver()
    host = shop(store, processors={"app": rx})
    host.start("shop", "o1")
    host.send("o1", "Later")
    host.clock.advance(5_000)
    [claimed] = store.claim_due(host.clock.now_ms(), 10, "S", 30_000)
    if change == "cancel":
        host.send("o1", "Unlater")
    else:
        host.delete("o1")
        if change != "delete":
            host.start("shop", "o1")           # the same business id, a new order
    assert host.fire(claimed, node_id="S").outcome == "skipped"
    assert rx.calls == []


def test_a_claimed_immediate_send_is_not_delivered_after_its_instance_was_deleted(store):
    rx = Receiver(fail_times=1)
    host = shop(store, processors={"app": rx})
    host.start("shop", "o1")
    host.send("o1", "Notify")                  # the hand-over fails: retried in 1 s
    host.clock.advance(1_000)
    [claimed] = store.claim_due(host.clock.now_ms(), 10, "S", 30_000)
    host.delete("o1")
    assert host.fire(claimed, node_id="S").outcome == "skipped"
    assert len(rx.calls) == 1


def test_a_copy_whose_claim_lapsed_and_was_taken_by_another_sweeper_is_not_delivered(store):
    rx = Receiver(fail_times=1)
    host = shop(store, processors={"app": rx})
    host.start("shop", "o1")
    host.send("o1", "Notify")
    host.clock.advance(1_000)
    [stale] = store.claim_due(host.clock.now_ms(), 10, "S", 5_000)
    host.clock.advance(5_000)                  # S stalls; its lease lapses
    [taken] = store.claim_due(host.clock.now_ms(), 10, "W", 5_000)
    assert host.fire(stale, node_id="S").outcome == "skipped"
    assert host.fire(taken, node_id="W").outcome == "delivered"
    assert len(rx.calls) == 2                  # the failed hand-over, and W's delivery


def test_an_exit_never_brings_back_a_row_completed_between_its_read_and_its_commit(store):
    # the exit rewrote the invoke row as a cancel row from the copy it had read, whatever had
    # happened to the row since; the rewrite is now conditional on the state it read
    gw = Gateway(answer="later")
    host = shop(store, invokers={"payment": gw})
    host.start("shop", "o1")
    host.send("o1", "Pay")
    [row] = host.pending_timers("o1")
    read = store.get_timer
    done = []

    def get_timer(key):
        got = read(key)
        if key == row.key and not done:        # another process completes the row meanwhile
            done.append(key)
            store.commit(Commit(complete=TimerCompletion(key, "fired", None, "elsewhere")))
        return got
    store.get_timer = get_timer
    try:
        host.send("o1", "Abort")
    finally:
        del store.get_timer
    assert gw.cancelled == []
    assert [r for r in host.pending_timers("o1") if r.kind == CANCEL] == []
    after = store.get_timer(row.key)
    assert after is None or (after.state, after.kind) == (DONE, INVOKE)


def test_a_row_handed_over_straight_from_its_commit_is_not_read_again(store):
    # one read per row fired, except the one a commit of this thread just wrote with no
    # processor or handler called since: the first of a commit's rows
    reads = []
    read = store.get_timer

    def get_timer(key):
        reads.append(key)
        return read(key)
    chart = f"""<scxml {NS} name="two" initial="s"><state id="s"><transition event="go">
      <send type="app" event="a" target="x"/><send type="app" event="b" target="x"/>
    </transition></state></scxml>"""
    rx = Receiver()
    host = sb.Host([sb.Chart.from_scxml(chart)], store=store, clock=sb.ManualClock(T0), processors={"app": rx})
    host.start("two", "t")
    store.get_timer = get_timer
    try:
        host.send("t", "go")
    finally:
        del store.get_timer
    assert [d.event for d in rx.calls] == ["a", "b"]
    assert reads == [("t", 2)]


# ----------------------------------------------------------------------------- duplicated wake-ups

def test_a_timer_fired_from_two_copies_of_one_wake_up_fires_once(store):
    # (two sweepers given the same wake-up both read the row pending: a timer's completion
    # is conditional and commits with the event, so the second finds it done)
    chart = f"""<scxml {NS} name="tick" initial="s"><datamodel><data id="n" expr="0"/></datamodel>
      <state id="s"><transition event="arm"><send event="tick" delay="1s"/></transition>
      <transition event="tick"><assign location="n" expr="n + 1"/></transition></state></scxml>"""
    host = sb.Host([sb.Chart.from_scxml(chart)], store=store, clock=sb.ManualClock(T0))
    host.start("tick", "c")
    host.send("c", "arm")
    host.clock.advance(1_000)
    [row] = host.pending_timers("c")
    assert host.fire(row, node_id="A").outcome == "fired"
    assert host.fire(row, node_id="B").outcome == "skipped"
    assert host.get("c").datamodel["n"] == 1


# ----------------------------------------------------------------------------- failures after the exit

def test_a_start_that_fails_for_good_after_its_state_was_exited_leaves_the_cancel_hook_its_row(store):
    # the failure was delivered to the aborted chart as error.execution and parked the cancel
    # row dead: the hook never ran
    log: list[str] = []
    host: sb.Host

    class Gw:
        def start(self, request):
            log.append("start")
            host.send(request.instance_id, "Abort")     # while the gateway call runs
            raise sb.DeliveryRejected("card declined")

        def cancel(self, request):
            log.append("cancel")
    host = shop(store, invokers={"payment": Gw()})
    host.start("shop", "o1")
    host.send("o1", "Pay")
    pos = host.get("o1")
    assert pos.configuration == {"Aborted"} and pos.datamodel["errors"] == []
    assert log == ["start", "cancel"]
    assert host.pending_timers("o1") == [] and host.dead_timers() == []


def test_a_failure_for_good_seen_by_another_host_after_the_exit_is_discarded(store):
    log: list[str] = []
    clock = sb.ManualClock(T0)
    web: sb.Host

    class Gw:
        def start(self, request):
            log.append("start")
            web.send(request.instance_id, "Abort")      # another process, meanwhile
            raise sb.DeliveryRejected("card declined")

        def cancel(self, request):
            log.append("cancel")
    gw = Gw()
    web = shop(store, clock, invokers={"payment": gw}, deliver_after_commit=False, node_id="web")
    worker = shop(store, clock, invokers={"payment": gw}, node_id="worker")
    worker.start("shop", "o1")
    worker.send("o1", "Pay")
    clock.advance(60_000)
    sb.Sweeper(worker).run_until_idle()
    pos = worker.get("o1")
    assert pos.configuration == {"Aborted"} and pos.datamodel["errors"] == []
    assert log == ["start", "cancel"]
    assert worker.pending_timers("o1") == [] and worker.dead_timers() == []


def test_a_retryable_failure_after_the_exit_does_not_put_the_cancel_hook_off(store):
    # the release recorded start's failure on what was by then the cancel row, with backoff
    clock = sb.ManualClock(T0)
    web: sb.Host
    gw = Gateway()

    class Flaky(Gateway):
        def start(self, request):
            web.send(request.instance_id, "Abort")
            raise TimeoutError("gateway timed out")

        def cancel(self, request):
            gw.cancelled.append(request)
    flaky = Flaky()
    web = shop(store, clock, invokers={"payment": flaky}, deliver_after_commit=False, node_id="web")
    worker = shop(store, clock, invokers={"payment": flaky}, node_id="worker")
    worker.start("shop", "o1")
    worker.send("o1", "Pay")
    [row] = worker.pending_timers("o1")
    assert (row.kind, row.attempts, row.last_error) == (CANCEL, 0, None)
    assert [r.outcome for r in worker.fire_due()] == ["cancelled"]
    assert len(gw.cancelled) == 1 and worker.pending_timers("o1") == []


# ----------------------------------------------------------------------------- sessions ended by their parent

PARENT = f"""<scxml {NS} name="parent" initial="Run">
  <state id="Run">
    <invoke id="kid" type="scxml">
      <content>
        <scxml {NS} name="kid" initial="Charging">
          <state id="Charging">
            <invoke type="payment" id="charge" src="stripe:charges"/>
          </state>
        </scxml>
      </content>
    </invoke>
    <transition event="Abort" target="Stopped"/>
  </state>
  <state id="Stopped"/>
</scxml>"""


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("how", ["exit", "cancel"])
def test_a_childs_invocation_is_cancelled_when_its_parent_ends_the_child(store, how, inline):
    gw = Gateway(answer="later")
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(PARENT)], store=store, clock=clock, invokers={"payment": gw},
                   deliver_after_commit=inline)
    host.start("parent", "p1")
    if not inline:
        host.fire_due()
    [start] = gw.requests
    assert start.instance_id == "p1::kid"
    if how == "exit":
        host.send("p1", "Abort")
    else:
        host.cancel("p1")
    assert not host.exists("p1::kid")
    if not inline:
        [row] = host.pending_timers("p1")      # the parent keeps the child's cancel row
        assert row.kind == CANCEL and gw.cancelled == []
        assert [r.outcome for r in host.fire_due()] == ["cancelled"]
    [cancel] = gw.cancelled
    assert (cancel.instance_id, cancel.token, cancel.idempotency_key) == ("p1::kid", start.token, start.token)
    assert host.pending_timers("p1") == []


def test_deleting_a_parent_purges_its_childs_invocation_without_a_cancel(store):
    # Host.delete purges rows, undelivered ones included (docs/effects.md)
    gw = Gateway(answer="later")
    host = sb.Host([sb.Chart.from_scxml(PARENT)], store=store, clock=sb.ManualClock(T0), invokers={"payment": gw})
    host.start("parent", "p1")
    host.delete("p1")
    host.clock.advance(60_000)
    host.fire_due()
    assert gw.cancelled == [] and host.pending_timers("p1") == [] and host.pending_timers("p1::kid") == []


# ----------------------------------------------------------------------------- a failed forward

def test_a_failed_forward_runs_no_finalize_and_is_not_forwarded_again(store):
    chart = f"""<scxml {NS} name="fw" initial="Charging">
      <datamodel><data id="receipt" expr="None"/><data id="seen" expr="[]"/></datamodel>
      <state id="Charging">
        <invoke type="payment" id="charge" src="stripe:charges" autoforward="true">
          <finalize><assign location="receipt" expr="_event.data"/></finalize>
        </invoke>
        <transition event="*"><script>seen.append((_event.name, _event.invokeid))</script></transition>
      </state>
    </scxml>"""

    class Gw:
        def __init__(self) -> None:
            self.forwarded: list[Delivery] = []

        def start(self, request):
            return Pending("later")

        def forward(self, d: Delivery) -> None:
            self.forwarded.append(d)
            raise sb.DeliveryRejected("the payment service takes no events")
    gw = Gw()
    host = sb.Host([sb.Chart.from_scxml(chart)], store=store, clock=sb.ManualClock(T0), invokers={"payment": gw})
    host.start("fw", "o1")
    host.send("o1", "CustomerNote", {"text": "leave at door"})
    pos = host.get("o1")
    assert pos.datamodel["receipt"] is None
    assert [tuple(s) for s in pos.datamodel["seen"]] == [("CustomerNote", ""), ("error.communication", "")]
    assert [d.event for d in gw.forwarded] == ["CustomerNote"]   # its failure is not forwarded to it


# ----------------------------------------------------------------------------- a chart's own send id

RESERVED = f"""<scxml {NS} name="rs" initial="Idle">
  <state id="Idle">
    <transition event="Pay" target="Charging"><send id="sb.invoke.charge" event="Remind" delay="1h"/></transition>
  </state>
  <state id="Charging">
    <invoke type="payment" id="charge" src="x"/>
    <transition event="done.invoke.charge" target="Paid"/>
  </state>
  <state id="Paid"><transition event="Remind" target="Reminded"/></state>
  <state id="Reminded"/>
</scxml>"""


@pytest.mark.parametrize("answer", ["now", "later"])
def test_a_charts_own_send_id_is_not_taken_for_an_invocation(store, answer):
    gw = Gateway(answer=answer)
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(RESERVED)], store=store, clock=clock, invokers={"payment": gw})
    host.start("rs", "o1")
    host.send("o1", "Pay")
    result = host.complete_invoke("o1", "charge", {"charge": "ch_1"}) if answer == "later" else None
    assert host.get("o1").configuration == {"Paid"}
    [timer] = host.pending_timers("o1")
    assert (timer.kind, timer.send_id, timer.state) == ("timer", "sb.invoke.charge", "pending")
    if result is not None:   # (without a token: whichever invocation is live, never the timer)
        assert result.outcome == "fired" and result.key != timer.key
    clock.advance(3_600_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("o1").configuration == {"Reminded"}


# ----------------------------------------------------------------------------- redrive

def test_a_dead_invoke_row_the_chart_was_never_told_of_can_be_revived(store):
    # a row the sweep could not read is parked dead without an error.execution (ADR 0027);
    # redrive refused it as "ended with error.execution", and the chart waited for ever
    gw = Gateway()
    host = shop(store, invokers={"payment": gw}, deliver_after_commit=False)
    host.start("shop", "o1")
    host.send("o1", "Pay")
    [row] = store.claim_due(host.clock.now_ms(), 10, "S", 30_000)
    store.release(row.key, "S", error="stored event is not valid msgpack", next_attempt_at_ms=None, dead=True)
    assert [r.key for r in host.dead_timers()] == [row.key]
    assert host.retry_timer("o1", row.ordinal)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("o1").configuration == {"Paid"} and len(gw.requests) == 1


def test_a_dead_invoke_row_whose_chart_was_told_is_still_refused(store):
    host = shop(store, invokers={"payment": Gateway(fail_times=9)}, max_attempts=1)
    host.start("shop", "o1")
    host.send("o1", "Pay")
    assert host.get("o1").configuration == {"Failed"}
    [dead] = host.dead_timers()
    with pytest.raises(sb.InvalidArgument, match=r"ended with error\.execution"):
        host.retry_timer("o1", dead.ordinal)


CANCELLER = f"""<scxml {NS} name="cx" initial="Charging">
  <state id="Charging">
    <invoke type="payment" id="charge" src="stripe:charges"/>
    <transition event="Forget"><cancel sendid="sb.invoke.charge"/></transition>
    <transition event="done.invoke.charge" target="Paid"/>
  </state>
  <state id="Paid"/>
</scxml>"""


def test_a_charts_cancel_of_the_invocations_send_id_leaves_the_invocation_alone(store):
    # the chart's <cancel> dropped the host's ref and purged the invoke row: the answer
    # that came later was discarded, and no cancel hook had run either
    gw = Gateway(answer="later")
    host = sb.Host([sb.Chart.from_scxml(CANCELLER)], store=store, clock=sb.ManualClock(T0),
                   invokers={"payment": gw})
    host.start("cx", "o1")
    host.send("o1", "Forget")
    assert [(r.kind, r.state) for r in host.pending_timers("o1")] == [("invoke", "waiting")]
    assert host.complete_invoke("o1", "charge", {"charge": "ch_1"}).outcome == "fired"
    assert host.get("o1").configuration == {"Paid"} and gw.cancelled == []


NAMED_INVOKE = f"""<scxml {NS} xmlns:sb="urn:statebound" name="ti" initial="Waiting">
  <state id="Waiting">
    <sb:timeout name="invoke" event="Late" after="1h"/>
    <transition event="Poke" target="Waiting"/>
    <transition event="Late" target="Expired"/>
  </state>
  <state id="Expired"/>
</scxml>"""


def test_a_timeout_named_invoke_is_still_re_armed_and_cancelled(store):
    # the host marks its invocation refs with the name "invoke", which a timeout may have too:
    # only a ref under an sb.invoke.* send id is the host's
    clock = sb.ManualClock(T0)
    host = sb.Host([sb.Chart.from_scxml(NAMED_INVOKE)], store=store, clock=clock)
    host.start("ti", "t1")
    clock.advance(1_800_000)
    host.send("t1", "Poke")                      # re-entered: the timeout is re-armed, the old row cancelled
    rows = host.pending_timers("t1")
    assert len(rows) == 1 and rows[0].due_at_ms == T0 + 1_800_000 + 3_600_000
    clock.advance(1_800_000)
    assert host.fire_due() == []                 # the first arming's hour: nothing left to fire
    clock.advance(1_800_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]
    assert host.get("t1").configuration == {"Expired"}
