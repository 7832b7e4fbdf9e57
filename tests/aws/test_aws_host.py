"""The AWS built-ins end to end, through a real Host on a DynamoStore, all on moto.

A chart charges through ``<invoke type="lambda">`` (:class:`LambdaInvoker`) and, once
paid, sends to an SQS FIFO queue, an SQS standard queue and an EventBridge bus (a rule
routes the bus to an SQS queue, read back as a subscriber would). Everything runs in
moto's in-process ``mock_aws``, except the Lambda function's *code*: moto's Lambda runs
nothing without Docker (it echoes the payload), so the synchronous invoker is given
:class:`FakeLambda`, a small stand-in client that runs a Python function and answers in
``Invoke``'s response shape (``Payload`` stream, ``FunctionError``). The callback mode
(``InvocationType=Event``) goes to moto's real Lambda API, since nothing needs to run.

Crashes are injected with botocore hooks (``before-call``/``after-call`` on every
client) and in the fake function: :class:`SimulatedCrash` is a ``BaseException``, so no
``except Exception`` in the host can swallow it, and the "process" is restarted by
building a new Host over the same moto state. A crash *before* a call means the request
never left; *after* means AWS applied it but the host never heard back.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any

import pytest
from botocore.response import StreamingBody

import statebound as sb
from statebound.aws import EventBridgeProcessor, LambdaInvoker, SQSProcessor
from statebound.dynamodb import DynamoStore
from statebound.host.store import DEAD, WAITING

from .helpers import REGION, Requests

T0 = 1_800_000_000_000
TABLE = "shop-e2e"
LEASE_MS = 30_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

SHOP = sb.Chart.from_scxml(f"""<scxml {NS} name="shop" initial="Idle">
  <datamodel>
    <data id="amount" expr="0"/><data id="receipt" expr="None"/><data id="error" expr="None"/>
    <data id="blob" expr="''"/>
  </datamodel>
  <state id="Idle">
    <transition event="Pay" target="Charging"><assign location="amount" expr="_event.data['amount']"/></transition>
    <transition event="PayLater" target="ChargingLater"><assign location="amount" expr="_event.data['amount']"/>
    </transition>
  </state>
  <state id="Charging">
    <invoke type="lambda" id="charge" src="charge-card">
      <param name="amount" expr="amount"/>
      <finalize><assign location="receipt" expr="_event.data"/></finalize>
    </invoke>
    <transition event="done.invoke.charge" target="Paid"/>
    <transition event="error.execution" target="Failed"><assign location="error" expr="_event.data"/></transition>
  </state>
  <state id="ChargingLater">
    <invoke type="lambda_cb" id="charge" src="charge-later"><param name="amount" expr="amount"/></invoke>
    <transition event="done.invoke.charge" target="Paid"><assign location="receipt" expr="_event.data"/></transition>
    <transition event="error.execution" target="Failed"><assign location="error" expr="_event.data"/></transition>
    <transition event="Abort" target="Idle"/>
  </state>
  <state id="Paid">
    <onentry>
      <send type="fifo" id="receipt" event="order.paid" namelist="amount receipt"/>
      <send type="sqs" id="notice" event="order.paid" namelist="amount"/>
      <send type="events" id="announce" event="OrderPaid" namelist="amount"/>
    </onentry>
    <transition event="Oversize"><assign location="blob" expr="'x' * 300000"/>
      <send type="sqs" id="big" event="order.big" namelist="blob"/></transition>
    <transition event="error.communication" target="Unreachable">
      <assign location="error" expr="{{'sendid': _event.sendid, 'data': _event.data}}"/></transition>
  </state>
  <state id="Failed"/>
  <state id="Unreachable"/>
</scxml>""")


class SimulatedCrash(BaseException):
    """The process dies here (a BaseException: the host's ``except Exception`` cannot catch it)."""


class Crasher:
    """Counts every AWS call (and the fake function's runs) and crashes at one of them.

    ``at=(index, phase)`` crashes at the index-th call overall; ``on=(name, phase, nth)``
    at the nth call of one operation (``"sqs.SendMessage"``). One crash per run.
    """

    def __init__(self, at: tuple[int, str] | None = None, on: tuple[str, str, int] | None = None) -> None:
        self.at, self.on = at, on
        self.calls: list[str] = []   # "service.Operation", in the order they were made

    def hook(self, client: Any) -> Any:
        service = client.meta.service_model.service_name
        client.meta.events.register(f"before-call.{service}",
                                    lambda model, **kw: self.point(f"{service}.{model.name}", "before"))
        client.meta.events.register(f"after-call.{service}",
                                    lambda model, **kw: self.point(f"{service}.{model.name}", "after"))
        return client

    def point(self, name: str, phase: str) -> None:
        if phase == "before":
            self.calls.append(name)
        index = len(self.calls) - 1
        nth = self.calls.count(name)
        if self.at == (index, phase) or self.on == (name, phase, nth):
            self.at = self.on = None
            raise SimulatedCrash(f"{phase} call {index} ({name})")


class FakeLambda:
    """A stand-in Lambda client that *runs* functions (moto's echoes without Docker).

    ``invoke`` answers like the real API: ``StatusCode`` 200, the result as a ``Payload``
    stream, and ``FunctionError: "Unhandled"`` with ``{"errorType", "errorMessage"}`` when
    the function raised. The functions here are idempotent on their key, as the contract asks.
    """

    def __init__(self, crasher: Crasher | None = None) -> None:
        self.crasher = crasher
        self.events: list[dict[str, Any]] = []
        self.charges: dict[str, dict[str, Any]] = {}   # idempotency key -> the first run's result
        self.failures: list[str] = []                   # errorTypes to raise on the next runs

    def invoke(self, FunctionName: str, InvocationType: str, Payload: bytes, **rest: Any) -> dict[str, Any]:
        assert (FunctionName, InvocationType) == ("charge-card", "RequestResponse")
        if self.crasher is not None:
            self.crasher.point("lambda.Invoke", "before")
        event = json.loads(Payload)
        self.events.append(event)
        if self.failures:
            error = self.failures.pop(0)
            raw = json.dumps({"errorType": error, "errorMessage": "card network said: do not retry, ref 4242"})
            return self._answer(raw, FunctionError="Unhandled")
        key = event["metadata"]["idempotency_key"]
        result = self.charges.setdefault(key, {"charge": f"ch_{len(self.charges) + 1}",
                                               "amount": event["data"]["amount"]})
        if self.crasher is not None:
            self.crasher.point("lambda.Invoke", "after")
        return self._answer(json.dumps(result))

    @staticmethod
    def _answer(raw: str, **extra: Any) -> dict[str, Any]:
        body = raw.encode()
        return {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(body), len(body)), **extra}


class World:
    """The AWS side of one run: table, queues, bus and clients, all in moto."""

    def __init__(self, boto3: Any, crasher: Crasher | None = None, tag: str = "") -> None:
        self.crasher = crasher or Crasher()
        self.boto3 = boto3
        self.table = TABLE + tag
        mk = lambda service: self.crasher.hook(boto3.client(service, region_name=REGION))  # noqa: E731
        self.ddb, self.sqs, self.events, self.lam = mk("dynamodb"), mk("sqs"), mk("events"), mk("lambda")
        DynamoStore.create_table(self.table, client=boto3.client("dynamodb", region_name=REGION))
        reader = boto3.client("sqs", region_name=REGION)   # the consumers' client: never crashes
        self.reader = reader
        self.fifo = reader.create_queue(QueueName=f"receipts{tag}.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        self.standard = reader.create_queue(QueueName=f"notices{tag}")["QueueUrl"]
        self.tap = reader.create_queue(QueueName=f"bus-tap{tag}")["QueueUrl"]
        tap_arn = reader.get_queue_attributes(QueueUrl=self.tap, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events = boto3.client("events", region_name=REGION)
        self.bus = f"orders{tag}"
        events.create_event_bus(Name=self.bus)
        events.put_rule(Name="tap", EventBusName=self.bus, EventPattern=json.dumps({"source": ["shop"]}))
        events.put_targets(Rule="tap", EventBusName=self.bus, Targets=[{"Id": "q", "Arn": tap_arn}])
        self.function = FakeLambda(self.crasher)
        self.clock = sb.ManualClock(now_ms=T0)
        self.step_ends: list[int] = []   # calls made by the end of each step (see _scenario)

    def host(self, **kw: Any) -> sb.Host:
        """A new process: a fresh Host (and store) over the same moto state."""
        store = DynamoStore(self.table, self.ddb, shards=2, sleep=lambda s: None)
        kw.setdefault("backoff_ms", 1_000)
        return sb.Host([SHOP], store=store, clock=self.clock, outbox_lease_ms=LEASE_MS,
                       processors={"fifo": SQSProcessor(self.fifo, client=self.sqs),
                                   "sqs": SQSProcessor(self.standard, client=self.sqs),
                                   "events": EventBridgeProcessor(self.bus, source="shop", client=self.events)},
                       invokers={"lambda": LambdaInvoker("charge-card", client=self.function),
                                 "lambda_cb": LambdaInvoker("charge-later", callback=True, client=self.lam)},
                       **kw)

    def drain(self, host: sb.Host, rounds: int = 12) -> None:
        """Sweep until nothing is due, moving the clock past leases and backoffs."""
        for _ in range(rounds):
            self.clock.advance(LEASE_MS + 1)
            if not sb.Sweeper(host, batch=50).run_until_idle().total and host.next_due() is None:
                return

    def received(self, url: str) -> list[dict[str, Any]]:
        """Every message now in a queue, as a consumer reads it (and deletes it)."""
        out: list[dict[str, Any]] = []
        while True:
            batch = self.reader.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600,
                                                MessageAttributeNames=["All"]).get("Messages", [])
            if not batch:
                return out
            for m in batch:
                self.reader.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                out.append(m)


def _keys(messages: list[dict[str, Any]]) -> Counter[str]:
    """Idempotency keys of SQS messages (from the attribute the processor sets)."""
    return Counter(m["MessageAttributes"]["statebound.idempotency_key"]["StringValue"] for m in messages)


def _bus_keys(messages: list[dict[str, Any]]) -> Counter[str]:
    """Idempotency keys of EventBridge events delivered to an SQS target."""
    return Counter(json.loads(m["Body"])["detail"]["metadata"]["idempotency_key"] for m in messages)


@pytest.fixture
def boto3(aws):
    import boto3 as module
    return module


# --------------------------------------------------------------------------- the happy path


def test_a_paid_order_reaches_fifo_standard_and_the_bus_once_each(boto3):
    w = World(boto3)
    host = w.host()
    host.start("shop", "o1")
    # send answers with the position it committed: Charging, its invoke row just written
    assert host.send("o1", "Pay", {"amount": 12}, idempotency_key="pay-o1").configuration == {"Charging"}
    # then, in the same call, the host ran the function; its result was done.invoke.charge's
    # data, and <finalize> stored it
    pos = host.get("o1")
    assert pos.configuration == {"Paid"}
    assert pos.datamodel["receipt"] == {"charge": "ch_1", "amount": 12}
    [event] = w.function.events
    assert event["metadata"]["idempotency_key"] == "o1:charge:1" and event["data"] == {"amount": 12}
    assert "token" not in event["metadata"]   # a synchronous function answers by returning

    fifo, standard, bus = w.received(w.fifo), w.received(w.standard), w.received(w.tap)
    assert [json.loads(m["Body"])["data"] for m in fifo] == [{"amount": 12, "receipt": {"charge": "ch_1",
                                                                                          "amount": 12}}]
    assert _keys(fifo) == {"o1:2": 1} and _keys(standard) == {"o1:3": 1} and _bus_keys(bus) == {"o1:4": 1}
    assert json.loads(bus[0]["Body"])["detail-type"] == "OrderPaid"
    assert host.pending_timers("o1") == []


# --------------------------------------------------------------------------- crash, then the sweeper


@pytest.mark.parametrize("crash, copies", [
    (("sqs.SendMessage", "before", 1), {}),
    (("sqs.SendMessage", "after", 1), {}),                      # FIFO: SQS drops the repeat
    (("sqs.SendMessage", "after", 2), {"standard": 2}),         # standard: two copies, one key
    (("events.PutEvents", "after", 1), {"bus": 2}),            # EventBridge: two events, one key
    (("dynamodb.UpdateItem", "before", 1), {}),                 # the FIFO row's acknowledgement
])
def test_a_crash_between_commit_and_delivery_is_redelivered_with_one_key(boto3, crash, copies):
    """The host dies after the commit that entered Paid, around one delivery.

    Before a call, the message never left: the sweeper takes the row when its lease ends,
    and the message arrives once. After it, AWS had accepted the message and the host died
    before acknowledging the row: the sweeper sends it again **with the same key**. The
    FIFO queue drops that repeat (its deduplication id is the key); a standard queue and
    EventBridge keep both copies, which their consumer folds by key
    (``docs/aws-processors.md``). Either way every key arrives, and nothing else does.
    """
    w = World(boto3, Crasher(on=crash))
    host = w.host()
    host.start("shop", "o1")
    with pytest.raises(SimulatedCrash):
        host.send("o1", "Pay", {"amount": 12}, idempotency_key="pay-o1")

    restarted = w.host()
    # the caller retries: the key makes it a no-op, the undelivered rows are the sweeper's
    assert restarted.send("o1", "Pay", {"amount": 12}, idempotency_key="pay-o1").configuration == {"Paid"}
    left = {r.send_id for r in restarted.pending_timers("o1")}
    assert left and left <= {"receipt", "notice", "announce"}
    w.drain(restarted)

    assert restarted.pending_timers("o1") == [] and restarted.dead_timers() == []
    assert _keys(w.received(w.fifo)) == {"o1:2": 1}
    assert _keys(w.received(w.standard)) == {"o1:3": copies.get("standard", 1)}
    assert _bus_keys(w.received(w.tap)) == {"o1:4": copies.get("bus", 1)}
    assert restarted.get("o1").datamodel["receipt"] == {"charge": "ch_1", "amount": 12}


def _scenario(w: World, crash_at: tuple[int, str] | None) -> sb.Host:
    """Start, pay, drain; after a crash, restart and retry the interrupted step (with its key)."""
    w.crasher.at = crash_at
    steps = [lambda h: h.start("shop", "o1", idempotency_key="create-o1"),
             lambda h: h.send("o1", "Pay", {"amount": 12}, idempotency_key="pay-o1"),
             lambda h: w.drain(h)]
    host = w.host()
    w.step_ends = []
    for step in steps:
        try:
            step(host)
        except SimulatedCrash:
            host = w.host()
            step(host)
        w.step_ends.append(len(w.crasher.calls))
    return host


def _outcome(w: World, host: sb.Host) -> dict[str, Any]:
    return {"fifo": _keys(w.received(w.fifo)), "standard": set(_keys(w.received(w.standard))),
            "bus": set(_bus_keys(w.received(w.tap))), "charges": dict(w.function.charges),
            "configuration": host.get("o1").configuration, "datamodel": dict(host.get("o1").datamodel),
            "rows": host.pending_timers("o1"), "dead": host.dead_timers()}


def _crash_points(boto3: Any, steps: slice) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """A clean run's outcome, and the crash points (call index, phase) of the given steps."""
    w = World(boto3)
    host = _scenario(w, None)
    ends = w.step_ends
    first = ([0] + ends)[steps.start or 0]
    last = ends[(steps.stop or len(ends)) - 1]
    return _outcome(w, host), [(i, phase) for i in range(first, last) for phase in ("before", "after")]


def _check_crash_at(boto3: Any, clean: dict[str, Any], point: tuple[int, str]) -> None:
    w = World(boto3, tag=f"-{point[0]}-{point[1]}")   # fresh resources for each run
    got = _outcome(w, _scenario(w, point))
    assert w.crasher.at is None, f"crash point {point} was never reached"
    # FIFO: exactly one message per key; standard and bus: every key, perhaps more than once
    assert got == clean, point


def test_a_crash_at_every_aws_call_of_the_payment_loses_nothing_and_sends_once_per_key(boto3):
    """A crash before or after each AWS call of ``send(Pay)``: the commit, the function,
    the result's commit, the three deliveries and their acknowledgements, and the read of
    each row the hand-over did not take straight from its commit before it calls out (13
    calls, 26 runs). After a restart that retries the send with its idempotency key and a sweeper
    that drains, the outcome equals a clean run's: the same position, each FIFO key once,
    every key on the standard queue and the bus, one charge. The slow test below adds the
    start and the sweeper's own calls."""
    clean, points = _crash_points(boto3, slice(1, 2))
    assert clean["fifo"] == {"o1:2": 1} and clean["charges"] and clean["rows"] == []
    assert len(points) == 26
    for point in points:
        _check_crash_at(boto3, clean, point)


@pytest.mark.slow
def test_a_crash_at_every_aws_call_loses_nothing_and_sends_once_per_key(boto3):
    clean, points = _crash_points(boto3, slice(0, 3))
    for point in points:
        _check_crash_at(boto3, clean, point)


def test_an_answer_lost_to_a_timeout_is_retried_with_the_same_key(boto3):
    """SQS accepted the message, but the client timed out reading the answer: the row backs
    off (attempt 1 failed) and the sweeper's attempt 2 carries the same key, so the FIFO
    queue still holds one message."""
    from botocore.exceptions import ReadTimeoutError

    w = World(boto3)
    lost = []

    def time_out(model, **kw):
        if model.name == "SendMessage" and not lost:
            lost.append(model.name)
            raise ReadTimeoutError(endpoint_url="https://sqs.us-east-1.amazonaws.com")
    w.sqs.meta.events.register("after-call.sqs", time_out)
    host = w.host()
    host.start("shop", "o1")
    host.send("o1", "Pay", {"amount": 12})
    [row] = [r for r in host.pending_timers("o1") if r.send_id == "receipt"]
    assert row.attempts == 1 and "DeliveryFailed" in row.last_error
    w.drain(host)
    assert _keys(w.received(w.fifo)) == {"o1:2": 1}
    assert host.pending_timers("o1") == []


# --------------------------------------------------------------------------- invoke results


def test_a_function_that_fails_twice_then_answers_gives_the_chart_one_result(boto3):
    w = World(boto3)
    w.function.failures = ["Sandbox.Timedout", "ServiceBusy"]
    host = w.host()
    host.start("shop", "o1")
    host.send("o1", "Pay", {"amount": 12})
    assert host.get("o1").configuration == {"Charging"}
    [row] = host.pending_timers("o1")
    assert (row.kind, row.attempts) == ("invoke", 1)
    assert "errorMessage" not in row.last_error and "ref 4242" not in row.last_error   # the log has it
    w.drain(host)
    pos = host.get("o1")
    assert pos.configuration == {"Paid"} and pos.datamodel["receipt"] == {"charge": "ch_1", "amount": 12}
    assert [e["metadata"]["idempotency_key"] for e in w.function.events] == ["o1:charge:1"] * 3
    assert len(w.function.charges) == 1 and _keys(w.received(w.fifo)) == {"o1:2": 1}


def test_a_fatal_function_error_is_a_dead_row_and_error_execution(boto3):
    w = World(boto3)
    w.function.failures = ["CardDeclined"]
    host = w.host()
    host.invokers["lambda"] = LambdaInvoker("charge-card", fatal_errors={"CardDeclined"}, client=w.function)
    host.start("shop", "o1")
    host.send("o1", "Pay", {"amount": 12})
    pos = host.get("o1")
    assert pos.configuration == {"Failed"}
    assert pos.datamodel["error"]["invokeid"] == "charge"
    assert (pos.datamodel["error"]["error"], pos.datamodel["error"]["attempts"]) == ("DeliveryRejected", 1)
    [dead] = host.dead_timers()
    assert (dead.kind, dead.state, dead.instance_id) == ("invoke", DEAD, "o1")
    assert w.function.charges == {} and w.received(w.fifo) == []


# --------------------------------------------------------------------------- deliveries that fail for good


def test_a_payload_sqs_cannot_take_is_dead_at_once_and_the_chart_gets_error_communication(boto3):
    w = World(boto3)
    host = w.host()
    host.start("shop", "o1")
    host.send("o1", "Pay", {"amount": 12})
    w.received(w.standard)
    sent = Requests(w.sqs)
    host.send("o1", "Oversize")     # a 300,000-character payload: over SQS's 256 KiB
    assert sent.of("SendMessage") == []                          # refused before the call
    [dead] = host.dead_timers()
    assert (dead.send_id, dead.attempts, dead.state) == ("big", 1, DEAD)
    assert "PayloadTooLarge" in dead.last_error
    pos = host.get("o1")
    assert pos.configuration == {"Unreachable"}
    assert pos.datamodel["error"]["sendid"] == "big"
    assert pos.datamodel["error"]["data"]["error"] == "PayloadTooLarge"
    assert w.received(w.standard) == []


def test_a_queue_that_is_gone_is_refused_by_aws_and_the_chart_hears_of_it(boto3):
    w = World(boto3)
    w.reader.delete_queue(QueueUrl=w.standard)
    host = w.host()
    host.start("shop", "o1")
    host.send("o1", "Pay", {"amount": 12})
    [dead] = host.dead_timers()
    assert (dead.send_id, dead.attempts) == ("notice", 1)
    pos = host.get("o1")
    assert pos.configuration == {"Unreachable"} and pos.datamodel["error"]["sendid"] == "notice"
    # the other sends of that step were delivered all the same
    assert _keys(w.received(w.fifo)) == {"o1:2": 1} and _bus_keys(w.received(w.tap)) == {"o1:4": 1}


def test_throttling_that_never_ends_is_dead_after_max_attempts(boto3):
    from botocore.exceptions import ClientError

    w = World(boto3)

    def throttle(params, **kw):   # as AWS answers: the request is refused, for now
        if params["QueueUrl"] == w.standard:
            raise ClientError({"Error": {"Code": "RequestThrottled", "Message": "slow down"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "SendMessage")
    w.sqs.meta.events.register("before-parameter-build.sqs.SendMessage", throttle)
    host = w.host(max_attempts=3)
    host.start("shop", "o1")
    host.send("o1", "Pay", {"amount": 12})
    assert host.get("o1").configuration == {"Paid"}     # one attempt failed, two to go
    w.drain(host)
    [dead] = host.dead_timers()
    assert (dead.send_id, dead.attempts) == ("notice", 3)
    pos = host.get("o1")
    assert pos.configuration == {"Unreachable"}
    assert pos.datamodel["error"]["data"]["attempts"] == 3
    assert w.received(w.standard) == []


# --------------------------------------------------------------------------- callback mode


def _paying_later(boto3: Any) -> tuple[World, sb.Host, Requests]:
    """An order waiting in ChargingLater: moto's Lambda took the ``Event`` invocation."""
    w = World(boto3)
    _function(w, "charge-later")
    sent = Requests(w.lam)
    host = w.host()
    host.start("shop", "o1")
    host.send("o1", "PayLater", {"amount": 30})
    return w, host, sent


def test_callback_mode_waits_for_complete_invoke_with_the_token(boto3):
    """moto's Lambda takes the ``Event`` invocation (nothing needs to run); the function's
    answer is played by ``host.complete_invoke`` with the token from its payload."""
    w, host, sent = _paying_later(boto3)
    call = sent.only("Invoke")
    assert (call["FunctionName"], call["InvocationType"]) == ("charge-later", "Event")
    metadata = json.loads(call["Payload"])["metadata"]
    token = metadata["token"]
    # the token names the invocation (instance, invoke id, generation): it is the key, no secret
    assert token == metadata["idempotency_key"] == "o1:charge:1"
    [row] = host.pending_timers("o1")
    assert row.state == WAITING and host.get("o1").configuration == {"ChargingLater"}

    done = host.complete_invoke(metadata["instance_id"], metadata["invokeid"], {"charge": "ch_9"}, token=token)
    assert done.outcome == "fired"
    pos = host.get("o1")
    assert pos.configuration == {"Paid"} and pos.datamodel["receipt"] == {"charge": "ch_9"}
    assert _keys(w.received(w.fifo)) == {"o1:2": 1}
    again = host.complete_invoke("o1", "charge", {"charge": "ch_9"}, token=token)
    assert again.outcome == "discarded"                        # a second answer changes nothing
    assert host.store.get_timer(row.key).outcome == "fired"


def test_callback_mode_failure_and_a_stale_token(boto3):
    _, host, sent = _paying_later(boto3)
    first = json.loads(sent.of("Invoke")[0]["Payload"])["metadata"]["token"]
    host.send("o1", "Abort")                                   # leaving the state cancels it
    host.send("o1", "PayLater", {"amount": 31})
    second = json.loads(sent.of("Invoke")[1]["Payload"])["metadata"]["token"]
    assert first != second

    stale = host.complete_invoke("o1", "charge", {"charge": "late"}, token=first)
    assert stale.outcome == "discarded" and "started again (generation 2)" in stale.reason
    assert host.store.get_timer(stale.key).outcome == "discarded"    # written on the first invocation's row
    assert host.get("o1").configuration == {"ChargingLater"}
    failed = host.fail_invoke("o1", "charge", "CardDeclined", {"code": 51}, token=second)
    assert failed.outcome == "fired"
    pos = host.get("o1")
    assert pos.configuration == {"Failed"}
    assert (pos.datamodel["error"]["error"], pos.datamodel["error"]["cause"]) == ("CardDeclined", {"code": 51})


def _function(w: World, name: str) -> None:
    """Deploy a function in moto's Lambda (its code never runs)."""
    iam = w.boto3.client("iam", region_name=REGION)
    role = iam.create_role(RoleName=f"fn-{name}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    w.lam.create_function(FunctionName=name, Runtime="python3.13", Role=role, Handler="fn.handler",
                          Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})

