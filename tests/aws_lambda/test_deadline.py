"""The sweeper and wake-up functions end before their Lambda timeout when fires are slow.

SQS hangs: every outbox send waits out its client's 2 s read timeout, and every release
then waits 2 s more for its wake-up request. Before, the handlers checked the time left
only between sweeps, and a sweep fired its whole batch: with a 20 s timeout the fallback
returned after 32 s, the wake function after 40 s with 30 s. A real invocation is killed
there mid-batch, with no metrics and no summary, and the next run repeats it.

Time is the harness's ManualClock, which the fake SQS client advances by 2 s a call; the
Lambda context's remaining time is read from the same clock, so the tests are exact and
do not depend on wall time. (The harness's own LambdaContext runs down per *call*, which
would say nothing about how long the fires took.)
"""

from __future__ import annotations

import importlib

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

import statebound as sb
from statebound.dynamodb import lambda_handlers
from statebound.dynamodb.lambda_handlers import Deadline
from statebound.exceptions import InvalidArgument
from statebound.host.wakeup import WakeupRequest

from .harness import ClockContext

WAKEUPS = "https://sqs.eu-west-1.amazonaws.com/123456789012/wakeups"


class HangingSQS:
    """SQS for the outbox and the wake-ups. ``refusing``: every call fails at once (the
    outage during the requests); ``hanging``: every call takes ``call_ms`` of the clock and
    times out; ``healthy``: calls succeed and are kept."""

    def __init__(self, clock, call_ms: int = 2_000) -> None:
        self.clock, self.call_ms = clock, call_ms
        self.mode = "refusing"
        self.sent: list[dict] = []

    def _fail(self, operation: str) -> None:
        if self.mode == "refusing":
            raise ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "down"},
                               "ResponseMetadata": {"HTTPStatusCode": 503}}, operation)
        self.clock.advance(self.call_ms)
        raise ReadTimeoutError(endpoint_url="https://sqs.eu-west-1.amazonaws.com/")

    def send_message(self, **kwargs):
        if self.mode != "healthy":
            self._fail("SendMessage")
        self.sent.append(kwargs)
        return {"MessageId": f"m-{len(self.sent)}"}

    def send_message_batch(self, QueueUrl, Entries):
        if self.mode != "healthy":
            self._fail("SendMessageBatch")
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


def _owed(lam, monkeypatch, n: int, *, wakeups: bool) -> HangingSQS:
    """``n`` completed orders whose confirmations SQS refused: ``n`` outbox rows to send."""
    if wakeups:
        monkeypatch.setenv("WAKEUP_QUEUE_URL", WAKEUPS)
    sqs = HangingSQS(lam.clock)
    lam.host = lam.app.build_host(client=lam.client, clock=lam.clock, sqs_client=sqs)
    lam.app.configure(lam.host)
    for i in range(n):
        lam.call("POST", f"/instances/o{i}", {"chart": "order", "data": {"amount": 5}})
        lam.call("POST", f"/instances/o{i}/events", {"event": "StartPayment"})
        status, body = lam.call("POST", f"/instances/o{i}/events", {"event": "Complete"})
        assert status == 200 and body["configuration"] == ["Done"]
    assert len(_rows(lam, n)) == n
    lam.clock.advance(60_000)          # past the first backoff
    sqs.mode = "hanging"
    return sqs


def _rows(lam, n):
    return [r for i in range(n) for r in lam.host.pending_timers(f"o{i}")]


def test_the_fallback_sweeper_stops_at_its_margin_and_the_next_run_sends_the_rest(lam, monkeypatch):
    """Eight confirmations owed, 4 s of clock each, a 20 s function: the fallback fires four,
    stops with 5 s or less left (never past its timeout), says ``more``, and logs its
    summary. The four it did not reach are untouched (no attempt counted); the next
    scheduled run, with SQS back, sends all eight, each once."""
    sqs = _owed(lam, monkeypatch, 8, wakeups=True)
    ctx = ClockContext(lam.clock, 20_000)
    result = lam.sweeper.handle({"source": "aws.events"}, ctx)
    left = ctx.get_remaining_time_in_millis()
    assert 0 < left <= 5_000, f"returned with {left} ms left (timeout 20 s, margin 5 s)"
    assert result["more"] is True and result["failed"] == 4
    attempts = sorted(r.attempts for r in _rows(lam, 8))
    assert attempts == [1, 1, 1, 1, 2, 2, 2, 2]          # the four not reached: only the request's attempt

    lam.clock.advance(300_000)                           # the next run, FallbackMinutes later
    sqs.mode = "healthy"
    again = lam.sweeper.handle({"source": "aws.events"}, ClockContext(lam.clock, 20_000))
    assert again["more"] is False
    assert _rows(lam, 8) == []
    assert sorted(m["MessageDeduplicationId"] for m in sqs.sent) == sorted({m["MessageDeduplicationId"]
                                                                            for m in sqs.sent})
    assert len(sqs.sent) == 8


def test_the_polling_sweeper_stops_within_its_sweep_too(lam, monkeypatch):
    """Without wake-ups (no WAKEUP_QUEUE_URL) a failed send costs its 2 s alone: twelve rows
    would take 24 s of a 20 s function; it fires eight and stops at its margin."""
    _owed(lam, monkeypatch, 12, wakeups=False)
    ctx = ClockContext(lam.clock, 20_000)
    result = lam.sweeper.handle({"source": "aws.events"}, ctx)
    left = ctx.get_remaining_time_in_millis()
    assert 0 < left <= 5_000, f"returned with {left} ms left (timeout 20 s, margin 5 s)"
    assert (result["failed"], result["more"]) == (8, True)
    assert sorted(r.attempts for r in _rows(lam, 12)) == [1] * 4 + [2] * 8


def test_the_wake_function_stops_at_its_margin_and_sqs_redelivers_what_it_did_not_reach(lam, monkeypatch):
    """Ten wake-ups, one message each, 4 s of clock per row, a 30 s function: seven rows are
    fired, and the three messages whose rows were not reached are reported failed, so SQS
    delivers them again; the other seven are deleted."""
    _owed(lam, monkeypatch, 10, wakeups=True)
    wake = importlib.import_module("wake")
    rows = _rows(lam, 10)
    now = lam.clock.now_ms()
    bodies = [body for r in rows for _, body in
              lam.host.wakeup.messages([WakeupRequest(r.instance_id, r.ordinal, r.due_at_ms)], now)]
    assert len(bodies) == 10
    message_of = {f"m{i}": r.key for i, r in enumerate(rows)}
    event = {"Records": [{"messageId": m, "body": b, "eventSource": "aws:sqs"}
                         for m, b in zip(message_of, bodies, strict=True)]}
    ctx = ClockContext(lam.clock, 30_000)
    result = wake.handle(event, ctx)
    left = ctx.get_remaining_time_in_millis()
    assert 0 < left <= 5_000, f"returned with {left} ms left (timeout 30 s, margin 5 s)"
    failed = [f["itemIdentifier"] for f in result["batchItemFailures"]]
    not_reached = {r.key for r in _rows(lam, 10) if r.attempts == 1}
    assert len(failed) == 3 and {message_of[m] for m in failed} == not_reached


def test_a_deadline_asks_the_invocation_only_when_its_estimate_says_time_is_up(lam):
    """Between readings a Deadline follows the clock; the invocation has the last word."""
    clock = lam.clock
    asked: list[int] = []
    ctx = ClockContext(clock, 20_000)

    def remaining() -> int:
        asked.append(clock.now_ms())
        return ctx.get_remaining_time_in_millis()

    deadline = Deadline(remaining, 5_000, clock=clock)
    assert deadline() is False and len(asked) == 1        # the first call reads the invocation
    clock.advance(14_000)
    assert deadline() is False and len(asked) == 1        # 6 s left by the clock: no need to ask
    clock.advance(1_000)
    assert deadline() is True and len(asked) == 2         # 5 s left: asked, and it agrees
    clock.advance(1_000)
    assert deadline() is True and deadline.check() is True and len(asked) == 2   # reached stays reached

    generous = Deadline(lambda: 60_000, 5_000, clock=clock)   # more time than the clock suggests
    generous.check()
    clock.advance(120_000)
    assert generous() is False                            # asked again, and the invocation wins


def test_a_deadline_follows_the_monotonic_clock_when_the_hosts_does_not_move(lam, monkeypatch):
    """In a real invocation with a host clock that stands still (the repro ran the example
    on a ManualClock), the monotonic clock carries the deadline."""
    seconds = [100.0]
    monkeypatch.setattr(lambda_handlers, "_monotonic", lambda: seconds[0])
    asked: list[float] = []

    def remaining() -> int:
        asked.append(seconds[0])
        return int(20_000 - (seconds[0] - 100.0) * 1000)

    deadline = Deadline(remaining, 5_000, clock=lam.clock)
    assert deadline() is False
    seconds[0] += 14.0
    assert deadline() is False and len(asked) == 1
    seconds[0] += 1.5
    assert deadline() is True and len(asked) == 2


@pytest.mark.parametrize("margin", [-1, 1.5, True, "5000", None])
def test_a_deadline_refuses_a_margin_it_cannot_use(margin):
    with pytest.raises(InvalidArgument):
        Deadline(lambda: 1_000, margin)


def test_the_handlers_start_nothing_when_the_invocation_starts_inside_its_margin(lam, monkeypatch):
    _owed(lam, monkeypatch, 2, wakeups=True)
    rows = _rows(lam, 2)
    body = lam.host.wakeup.messages([WakeupRequest(r.instance_id, r.ordinal, r.due_at_ms) for r in rows],
                                    lam.clock.now_ms())[0][1]
    sweeper = sb.Sweeper(lam.host)
    result = lambda_handlers.handle_wakeup_event({"Records": [{"messageId": "m0", "body": body}]}, sweeper,
                                                 remaining_ms=lambda: 4_000)
    assert result == {"batchItemFailures": [{"itemIdentifier": "m0"}]}
    out = lambda_handlers.fallback_sweep(sweeper, period_ms=300_000, remaining_ms=lambda: 4_000)
    assert (out["more"], out["failed"]) == (True, 0)
    assert sorted(r.attempts for r in _rows(lam, 2)) == [1, 1]   # nothing read, fired or claimed


def test_a_margin_that_leaves_no_time_to_sweep_is_logged(caplog):
    # every run then fired nothing and said more, with nothing to tell why
    import logging

    import statebound as sb
    from statebound.dynamodb.lambda_handlers import fallback_sweep
    host = sb.Host([], store=sb.MemoryStore(), clock=sb.ManualClock(0))
    with caplog.at_level(logging.WARNING, logger="statebound"):
        out = fallback_sweep(sb.Sweeper(host), period_ms=300_000, remaining_ms=lambda: 1_000, margin_ms=5_000)
    assert out["fired"] == 0 and out["more"] is True
    assert any("no time to sweep" in r.getMessage() for r in caplog.records)
