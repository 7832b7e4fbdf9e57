"""Host calls leave no cyclic garbage.

A unit's stamped positions point back at the unit (their ``routes``), so a unit whose
entries outlive its commit is a reference cycle that only the cycle collector frees. On a
group commit of a hundred units that collector work cost more CPU than any stage of the
unit itself (``runner.forget_entries``). These tests run each kind of host call with the
collector saving what it finds (``gc.DEBUG_SAVEALL``) and require that it finds nothing:
everything a call made is freed by reference counting.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import statebound as sb
from statebound.host.processors import Delivery

T0 = 1_700_000_000_000
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'

COUNTER = f"""<scxml {NS} name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
    <transition event="arm"><send event="inc" delay="1ms"/></transition>
    <transition event="tell"><send type="app" event="Told" target="ops"/></transition>
    <transition event="spawn" target="busy"/>
    <transition event="loud"><log label="boom" expr="n"/></transition>
    <transition event="later"><send event="loud" delay="1ms"/></transition>
    <transition event="halt" target="off"/>
  </state>
  <final id="off"/>
  <state id="busy">
    <invoke id="kid" type="scxml"><content><scxml {NS} initial="w"><state id="w">
      <transition event="bye" target="end"/></state><final id="end"/></scxml></content></invoke>
    <transition event="done.invoke.kid" target="s"/>
    <transition event="stop" target="s"/>
  </state>
</scxml>"""


@pytest.fixture(params=["sqlite", "memory"])
def host(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[sb.Host]:
    store = sb.SQLiteStore(tmp_path / "g.db") if request.param == "sqlite" else sb.MemoryStore()
    told: list[Delivery] = []

    def on_log(instance_id: str, label: str, value: Any) -> None:
        if label == "boom":
            raise RuntimeError("log sink down")   # a delivery that fails inside the drive
    h = sb.Host([sb.Chart.from_scxml(COUNTER)], store=store, clock=sb.ManualClock(T0),
                processors={"app": told.append}, on_log=on_log)
    yield h
    if request.param == "sqlite":
        store.close()  # type: ignore[attr-defined]


def _cyclic_garbage(call: Callable[[], Any]) -> list[str]:
    """The types of the objects ``call`` left for the cycle collector."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        call()
        gc.collect()
        found = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    return found


def test_every_kind_of_host_call_is_freed_by_reference_counting(host: sb.Host) -> None:
    clock = host.clock
    assert isinstance(clock, sb.ManualClock)
    n = iter(range(1_000))
    host.start("counter", "c")
    calls: dict[str, Callable[[], Any]] = {
        "start": lambda: host.start("counter", f"x{next(n)}"),
        "send": lambda: host.send("c", "inc"),
        "send with a key": lambda: host.send("c", "inc", idempotency_key=f"k{next(n)}"),
        "send_many": lambda: host.send_many([("c", "inc"), ("x0", "inc"), ("c", "inc")]),
        "a delayed send": lambda: host.send("c", "arm"),
        "fire_due": lambda: (clock.advance(5), host.fire_due(limit=10)),
        "a sweep": lambda: (host.send("c", "arm"), clock.advance(5), sb.Sweeper(host, batch=10).run_once()),
        "an outbox send": lambda: (host.send("c", "tell"), clock.advance(1), host.fire_due(limit=10)),
        "an invoked child": lambda: (host.send("c", "spawn"), host.send("c", "stop")),
        "get": lambda: host.get("c"),
    }
    for name, call in calls.items():
        call()   # first use: caches fill, plans are made
        assert _cyclic_garbage(call) == [], name
    assert host.get("c").datamodel["n"] > 0   # the calls did their work


def test_a_failed_call_or_item_is_freed_by_reference_counting(host: sb.Host) -> None:
    """The error of a failed item is kept in its ``SendResult``, with its traceback, whose
    frames hold the batch's locals; a unit that failed kept its entries, which point back
    at it. Either way, a batch with one bad item used to leave every result and position of
    the batch to the cycle collector."""
    clock = host.clock
    assert isinstance(clock, sb.ManualClock)
    n = iter(range(1_000))
    host.start("counter", "c")
    host.start("counter", "gone")
    host.send("gone", "halt")

    def raises(call: Callable[[], Any], error: type[Exception]) -> Callable[[], None]:
        def run() -> None:
            with pytest.raises(error):
                call()
        return run

    def items_fail(call: Callable[[], list[Any]]) -> Callable[[], None]:
        def run() -> None:
            # only the outcomes outlive the call: a list of results kept in a local of a frame
            # that has returned is in a cycle through the errors' tracebacks (Python keeps the
            # caller's frame in every traceback), whichever library made them
            ok = [r.ok for r in call()]
            assert False in ok and True in ok, ok
        return run

    calls: dict[str, Callable[[], Any]] = {
        "send to no instance": raises(lambda: host.send("ghost", "inc"), sb.InstanceNotFound),
        "send whose delivery fails": raises(lambda: host.send("c", "loud"), RuntimeError),
        "start of an existing id": raises(lambda: host.start("counter", "c"), sb.InstanceExists),
        "send_many with bad items": items_fail(lambda: host.send_many(
            [("c", "inc"), ("ghost", "inc"), ("gone", "inc"), 42, ("", "inc"), (f"x{next(n)}", "inc")])),
        "send_many whose delivery fails": items_fail(lambda: host.send_many([("c", "loud"), ("gone", "inc"),
                                                                             ("c", "inc")])),
        "a fire whose delivery fails": lambda: fires_fail(),
    }

    def fires_fail() -> None:
        host.send("c", "later")
        host.send("c", "arm")
        clock.advance(60_000)   # past the failed row's retry backoff too
        outcomes = {r.outcome for r in host.fire_due(limit=10)}
        assert {"fired", "failed"} <= outcomes, outcomes

    for name, call in calls.items():
        call()
        assert _cyclic_garbage(call) == [], name
    assert host.get("c").datamodel["n"] > 0   # the good items and rows did their work
