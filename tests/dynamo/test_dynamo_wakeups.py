"""SQS wake-ups on DynamoDB (issue #13, "wake-ups instead of polling").

moto's SQS honours ``DelaySeconds`` on the wall clock only (``shared/notes/moto.md``), so
the timing test records what :class:`SQSWakeup` sends on a recording SQS client and
delivers each message itself at ``sent + DelaySeconds`` on the manual clock, the way SQS and
a Lambda event source would; the DynamoDB side is in-process moto, counted with botocore
hooks. One test sends through moto's real SQS to check the API accepts what we send.
"""

from __future__ import annotations

import random

import pytest

import statebound as sb
from statebound.dynamodb import SQSWakeup
from statebound.dynamodb.lambda_handlers import fallback_sweep, handle_wakeup_event
from statebound.dynamodb.sqs_wakeup import MAX_DELAY_S, ROWS_PER_MESSAGE, decode_wakeup
from statebound.exceptions import StoreUnavailable
from statebound.host import WakeupRequest

from .helpers import CallLog, make_store

T0 = 1_800_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

# each instance arms one timer after the delay it is started with
TIMER = sb.Chart.from_scxml(f"""<scxml {NS} name="timer" initial="waiting">
  <datamodel><data id="delay" expr="'1s'"/></datamodel>
  <state id="waiting">
    <onentry><send event="go" delayexpr="delay"/></onentry>
    <transition event="go" target="fired"/>
  </state>
  <final id="fired"/>
</scxml>""")


class RecordingSQS:
    """An SQS client that keeps what is sent, stamped with the manual clock's time."""

    def __init__(self, clock):
        self.clock = clock
        self.sent: list[tuple[int, dict]] = []   # (sent at ms, entry)
        self.calls = 0

    def send_message_batch(self, QueueUrl, Entries):
        self.calls += 1
        assert len(Entries) <= 10 and len({e["Id"] for e in Entries}) == len(Entries)
        for entry in Entries:
            assert 0 <= entry["DelaySeconds"] <= MAX_DELAY_S
            self.sent.append((self.clock.now_ms(), entry))
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


def deliver(queue: RecordingSQS, clock, sweeper, until_ms, log):
    """Play SQS and the Lambda event source: at each moment a message becomes visible, hand
    every visible message (ten at a time) to the wake-up handler. Returns the times."""
    delivered = 0
    moments = []
    while True:
        pending = [(sent + e["DelaySeconds"] * 1000, i) for i, (sent, e) in enumerate(queue.sent)
                   if i >= delivered]
        pending.sort()
        if not pending or pending[0][0] > until_ms:
            return moments
        at = pending[0][0]
        clock.set(max(at, clock.now_ms()))
        visible = [i for t, i in pending if t <= clock.now_ms()]
        # delivered in order of sending is enough here: we deliver every visible one at once
        batch = [queue.sent[i][1] for i in visible]
        # remove delivered entries by marking them (keep indexes stable)
        for i in visible:
            queue.sent[i] = (queue.sent[i][0], {**queue.sent[i][1], "DelaySeconds": 10**9})
        for start in range(0, len(batch), 10):
            records = [{"messageId": e["Id"] + f"-{start}", "body": e["MessageBody"]} for e in batch[start:start + 10]]
            before = len(log.names)
            assert handle_wakeup_event({"Records": records}, sweeper) == {"batchItemFailures": []}
            moments.append((clock.now_ms(), log.names[before:]))


def test_messages_group_rows_by_the_second_they_are_due():
    """Delays are whole seconds rounded up (never early), capped at 900; rows due in the
    same second share a message, at most ROWS_PER_MESSAGE each."""
    w = SQSWakeup("q", client=object())
    now = T0
    rows = [WakeupRequest(f"i{n}", 1, now + 1_500) for n in range(ROWS_PER_MESSAGE + 1)]
    rows += [WakeupRequest("soon", 1, now), WakeupRequest("past", 1, now - 5_000),
             WakeupRequest("far", 1, now + 3_600_000), WakeupRequest("exact", 1, now + 2_000)]
    messages = w.messages(rows, now)
    assert [d for d, _ in messages] == [0, 2, 2, 900]
    assert [len(decode_wakeup(b)) for _, b in messages] == [2, ROWS_PER_MESSAGE, 2, 1]
    assert decode_wakeup(messages[-1][1]) == [WakeupRequest("far", 1, now + 3_600_000)]
    for bad in ('{"v": 1}', "[1]", '{"statebound": "wakeup", "v": 1, "rows": [["a", 1, NaN]]}', "nope"):
        with pytest.raises(ValueError):
            decode_wakeup(bad)


def test_two_hundred_timers_fire_within_a_second_of_due_without_polling(mock_client, table):
    """200 timers due 1-120 s out, started through a host whose wake-ups go to SQS. Each
    message is delivered at ``sent + DelaySeconds``; the wake-up function fires the rows.
    Every timer fires once, less than a second late (DelaySeconds is whole seconds,
    rounded up, and delivery is immediate here), and the sweeper side never reads the due
    index: each fire costs the row's GetItem, its position's read and one transaction, and
    nothing runs between deliveries."""
    clock = sb.ManualClock(T0)
    queue = RecordingSQS(clock)
    wakeup = SQSWakeup("https://sqs.invalid/q", client=queue)
    writer = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock, wakeup=wakeup)
    delays = random.Random(13).sample(range(1_000, 120_001), 200)
    for i, ms in enumerate(delays):
        writer.start(TIMER, f"t{i}", data={"delay": f"{ms}ms"})
    assert len(queue.sent) <= 200 and queue.calls == 200   # one batch per commit, here one row each
    # one worker: in-process moto is not thread-safe (the pool runs on the moto server elsewhere)
    sweeper = sb.Sweeper(sb.Host([TIMER], store=make_store(mock_client, table), clock=clock, wakeup=wakeup))
    log = CallLog(mock_client)
    try:
        moments = deliver(queue, clock, sweeper, T0 + 200_000, log)
    finally:
        log.close()
        sweeper.close()
    assert sweeper.metrics.fired == 200 and sweeper.metrics.empty == 0
    assert sweeper.metrics.max_lag_ms < 1_000
    names = [n for _, calls in moments for n in calls]
    assert "Query" not in names and "Scan" not in names
    assert sorted(set(names)) <= ["BatchGetItem", "GetItem", "TransactWriteItems"]
    # per timer: its row by key, its position (a delivery's positions in one BatchGetItem,
    # or one GetItem), one transaction
    assert names.count("TransactWriteItems") == 200
    assert names.count("GetItem") + names.count("BatchGetItem") <= 400
    assert all(writer.get(f"t{i}").configuration == frozenset({"fired"}) for i in range(200))


def test_the_fallback_arms_a_long_timer_once_when_it_nears(mock_client, table):
    """A timer 7,350 s out gets no message at commit (beyond the 900 s horizon). The
    fallback, run every 5 minutes, arms it exactly once, in the run whose look-ahead window
    it enters (here 750 s before it is due); that message then fires it within a second."""
    clock = sb.ManualClock(T0)
    queue = RecordingSQS(clock)
    wakeup = SQSWakeup("https://sqs.invalid/q", client=queue)
    host = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock, wakeup=wakeup)
    host.start(TIMER, "long", data={"delay": "7350s"})
    host.start(TIMER, "short", data={"delay": "30s"})
    assert [decode_wakeup(e["MessageBody"])[0].instance_id for _, e in queue.sent] == ["short"]
    queue.sent.clear()
    sweeper = sb.Sweeper(host)
    period = 5 * 60_000
    armed = {}
    for run in range(24):   # two hours of fallback runs
        clock.set(T0 + run * period)
        armed[run] = fallback_sweep(sweeper, period_ms=period)["armed"]
    assert {run: n for run, n in armed.items() if n} == {22: 1}   # at 6,600 s: due 750 s later
    [(sent, entry)] = queue.sent
    assert (sent, entry["DelaySeconds"]) == (T0 + 6_600_000, 750)
    log = CallLog(mock_client)
    try:
        deliver(queue, clock, sweeper, T0 + 7_400_000, log)
    finally:
        log.close()
    assert host.get("long").configuration == frozenset({"fired"})
    [lag] = sweeper.metrics.last_lag_ms   # the wake-up's one fire (the short row went to the fallback)
    assert 0 <= lag < 1_000


def test_sqs_on_moto_accepts_the_messages_and_the_handler_fires_them(mock_client, table):
    """In-process moto, SQS and DynamoDB: rows due later are sent with DelaySeconds and held
    back (moto counts them as delayed); a wake-up for a row due now is sent with
    DelaySeconds 0 and received at once. The received message, in a Lambda SQS event,
    fires its row."""
    import boto3
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="wakeups")["QueueUrl"]
    clock = sb.ManualClock(T0)
    wakeup = SQSWakeup(url, client=sqs)
    host = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock, wakeup=wakeup)
    host.start(TIMER, "now", data={"delay": "1s"})
    host.start(TIMER, "later", data={"delay": "30s"})
    clock.set(T0 + 1_000)   # "now" is due; its first message is still held on moto's wall clock,
    wakeup.request([WakeupRequest("now", 1, T0 + 1_000)], clock.now_ms())   # so ask again: delay 0
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesDelayed"]) == ("1", "2")
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    event = {"Records": [{"messageId": m["MessageId"], "body": m["Body"], "eventSource": "aws:sqs"}
                         for m in messages]}
    assert handle_wakeup_event(event, sb.Sweeper(host)) == {"batchItemFailures": []}
    assert host.get("now").configuration == frozenset({"fired"})
    assert host.get("later").configuration == frozenset({"waiting"})


def test_an_unavailable_store_fails_the_batch_and_a_foreign_message_is_dropped(mock_client, table):
    """Partial-batch response: a store outage reports every wake-up message failed (SQS
    delivers them again); a body that is no wake-up is dropped, not retried for ever."""
    clock = sb.ManualClock(T0)
    store = make_store(mock_client, table)
    host = sb.Host([TIMER], store=store, clock=clock)
    good = {"messageId": "m1", "body": SQSWakeup("q", client=object()).messages(
        [WakeupRequest("x", 1, T0)], T0)[0][1]}
    foreign = {"messageId": "m2", "body": "hello"}

    def down(key):
        raise StoreUnavailable("throttled")

    store.get_timer = down
    assert handle_wakeup_event({"Records": [good, foreign]}, sb.Sweeper(host)) == {
        "batchItemFailures": [{"itemIdentifier": "m1"}]}


@pytest.mark.parametrize("rows", [
    '[["x", 1, 1e400]]',                   # a number JSON allows and no int can hold
    f'[["{"x" * 1_100}", 1, {T0}]]',       # an id no row can have (over the 1,024-byte key limit)
    f'[["", 1, {T0}]]',
    f'[[7, 1, {T0}]]',                     # not a string
    f'[["x", "one", {T0}]]',
    '[["x", 1]]',
    f'[["x", -1, {T0}]]',                  # no row has a negative ordinal: the key refused it later
    f'[["x", {2 ** 63}, {T0}]]',
    '[["x", 1, -5]]',
    "[" * 100_000 + "]" * 100_000,         # deeper than the parser goes: RecursionError
])
def test_a_malformed_wake_up_is_dropped_without_failing_its_batch(mock_client, table, rows):
    """A message no writer of ours could have sent (a bug, or whoever else may send to the
    queue) is logged and dropped; the good messages in the same batch fire, and none is
    reported for retry: before, one such body raised out of the handler, so SQS redelivered
    the whole batch until it was dead-lettered and its good timers waited for the fallback."""
    clock = sb.ManualClock(T0)
    host = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock)
    host.start(TIMER, "good", data={"delay": "1s"})
    clock.set(T0 + 1_000)
    good = {"messageId": "m1", "body": SQSWakeup("q", client=object()).messages(
        [WakeupRequest("good", 1, T0 + 1_000)], T0 + 1_000)[0][1]}
    bad = {"messageId": "m2", "body": f'{{"statebound": "wakeup", "v": 1, "rows": {rows}}}'}
    with pytest.raises(ValueError):
        decode_wakeup(bad["body"])
    assert handle_wakeup_event({"Records": [bad, good]}, sb.Sweeper(host)) == {"batchItemFailures": []}
    assert host.get("good").configuration == frozenset({"fired"})


class _Remaining:
    """A Lambda context's remaining time, running down by ``step_ms`` per call."""

    def __init__(self, total_ms: int, step_ms: int) -> None:
        self.left, self.step, self.calls = total_ms, step_ms, 0

    def __call__(self) -> int:
        self.calls += 1
        self.left -= self.step
        return self.left


def test_a_fallback_behind_a_backlog_arms_first_and_stops_before_its_deadline(mock_client, table):
    """After an outage 30 rows are overdue and one long timer enters the look-ahead window.
    A fallback whose invocation has time for a few sweeps only (batch 5) arms the long
    timer first, fires what it has time for, and returns before its margin, saying more is
    due: before, it fired until idle whatever the Lambda timeout, so behind a backlog every
    run was killed before the arming step, and the long timers never got their wake-ups."""
    clock = sb.ManualClock(T0)
    queue = RecordingSQS(clock)
    wakeup = SQSWakeup("https://sqs.invalid/q", client=queue)
    host = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock, wakeup=wakeup)
    for i in range(30):
        host.start(TIMER, f"due{i}", data={"delay": "1s"})
    host.start(TIMER, "long", data={"delay": "3000s"})
    queue.sent.clear()                  # the short rows' wake-ups were lost in the outage
    clock.set(T0 + 3_000_000 - 750_000)   # "long" is 750 s out: inside this run's window
    remaining = _Remaining(total_ms=60_000, step_ms=12_000)   # 48 s, 36 s, 24 s, then 12 s: under the margin
    result = fallback_sweep(sb.Sweeper(host, batch=5), period_ms=300_000, remaining_ms=remaining,
                            margin_ms=15_000)
    assert result["armed"] == 1
    assert [r.instance_id for _, e in queue.sent for r in decode_wakeup(e["MessageBody"])] == ["long"]
    assert result["fired"] == 15 and result["more"] is True   # three sweeps of five, then out of time
    assert remaining.left > 0
    rest = fallback_sweep(sb.Sweeper(host, batch=5), period_ms=300_000)   # no deadline: until idle
    assert (rest["fired"], rest["more"]) == (15, False)


def test_a_fallback_fires_what_is_due_while_sqs_refuses_its_wake_ups(mock_client, table, caplog):
    """SQS down (here: the queue is gone): arming the long timer fails, and the run still
    fires the overdue row. Before, the refusal raised out of the fallback before it swept,
    so while SQS refused nothing fired at all, the case the fallback exists for."""
    from botocore.exceptions import ClientError

    class Refusing:
        def send_message_batch(self, **kwargs):
            raise ClientError({"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue",
                                         "Message": "The specified queue does not exist."}}, "SendMessageBatch")

    clock = sb.ManualClock(T0)
    host = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock,
                   wakeup=SQSWakeup("https://sqs.invalid/q", client=RecordingSQS(clock)))
    host.start(TIMER, "overdue", data={"delay": "1s"})
    host.start(TIMER, "long", data={"delay": "3000s"})
    clock.set(T0 + 3_000_000 - 750_000)   # "overdue" is long due; "long" enters the window
    down = sb.Host([TIMER], store=make_store(mock_client, table), clock=clock,
                   wakeup=SQSWakeup("https://sqs.invalid/q", client=Refusing()))
    result = fallback_sweep(sb.Sweeper(down), period_ms=300_000)
    assert (result["armed"], result["arm_failed"], result["fired"]) == (0, 1, 1)
    assert host.get("overdue").configuration == frozenset({"fired"})
    assert host.get("long").configuration != frozenset({"fired"})
    assert "arming 1 wake-up(s) failed" in caplog.text


def test_the_sent_count_adds_up_when_pool_threads_send_at_once():
    """A sweeper's workers commit, and so send wake-ups, from several threads. A profile
    hook makes each thread give up the interpreter after every ``len()`` (the count is
    read, then the sizes taken, then written back), as a busy machine might."""
    import sys
    import threading
    import time

    class Accepting:
        def send_message_batch(self, QueueUrl, Entries):
            return {"Successful": [{"Id": e["Id"]} for e in Entries]}

    wakeup = SQSWakeup("q", client=Accepting())

    def hook(frame, event, arg):
        if event == "c_return" and arg is len:
            time.sleep(0)

    def send(i):
        sys.setprofile(hook)
        try:
            for n in range(200):
                wakeup.request([WakeupRequest(f"i{i}-{n}", 1, T0)], T0)
        finally:
            sys.setprofile(None)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wakeup.sent == 8 * 200
