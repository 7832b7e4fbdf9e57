"""What a caller hands the host to keep beside an event (``caller_context``, an invocation's
result) must read back from its bytes: msgpack packs a map keyed by a tuple but cannot
unpack it, and such a value used to reach a timer row no sweep could read, on SQLite only."""

from __future__ import annotations

import pytest

import statebound as sb
from statebound.exceptions import SerializationError

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="c" initial="s">
  <state id="s">
    <transition event="arm"><send event="ring" delay="1s"/></transition>
    <transition event="ring" target="rang"/>
  </state>
  <state id="rang"/>
</scxml>"""

UNREADABLE = [{("trace", 1): "abc"}, [{(1, 2): 3}], {"ok": {(0,): None}}]


@pytest.fixture
def host(store):
    h = sb.Host([sb.Chart.from_scxml(CHART)], store=store, clock=sb.ManualClock(1_000_000))
    h.start("c", "i")
    return h


@pytest.mark.parametrize("ctx", UNREADABLE)
@pytest.mark.parametrize("call", [
    lambda h, ctx: h.send("i", "arm", caller_context=ctx),
    lambda h, ctx: h.send_many([("i", "arm")], caller_context=ctx),
    lambda h, ctx: h.start("c", "j", caller_context=ctx),
    lambda h, ctx: h.cancel("i", caller_context=ctx),
    lambda h, ctx: h.complete_invoke("i", "inv", caller_context=ctx),
    lambda h, ctx: h.fail_invoke("i", "inv", caller_context=ctx),
], ids=["send", "send_many", "start", "cancel", "complete_invoke", "fail_invoke"])
def test_a_context_that_does_not_read_back_is_refused_with_nothing_written(host, store, call, ctx):
    before = store.load("i").version
    with pytest.raises(SerializationError, match="caller_context"):
        call(host, ctx)
    assert store.load("i").version == before
    assert store.pending_timers("i") == [] and not host.exists("j")


@pytest.mark.parametrize("call", [
    lambda h: h.complete_invoke("i", "inv", {("a", 1): 1}),
    lambda h: h.fail_invoke("i", "inv", cause={("a", 1): 1}),
], ids=["result", "cause"])
def test_an_invocation_result_that_does_not_read_back_is_refused(host, call):
    with pytest.raises(SerializationError, match="read back"):
        call(host)


def test_a_context_that_reads_back_rides_on_the_row_and_the_row_fires(host, store):
    ctx = {"trace": [1, 2], 3: b"x", None: True}
    host.send("i", "arm", caller_context=ctx)
    (row,) = store.pending_timers("i")
    assert row.caller_context == ctx
    host.clock.advance(1_000)
    assert sb.Sweeper(host).run_until_idle().fired == 1
    assert host.get("i").configuration == {"rang"}
