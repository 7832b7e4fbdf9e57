"""Bench section ``outbox``: what processors, invoke handlers and idempotency keys cost a
``host.send`` on MemoryStore and on a SQLite file, as same-run ratios against a bare host.

Rows: a bare host; the same event on a host given a processor and a handler (nothing is
sent: the ratio should be ~1); the event with an ``idempotency_key`` (a fresh key each time,
100 retained); a repeat of one key (a load, no write); an event whose chart sends to a plain
callable processor (one commit with the outbox row, the call, one completion commit); an
event that enters a state with a handler ``<invoke>`` answered at once and leaves it on the
result (two commits). Numbers are printed only, never asserted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import statebound as sb

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'
CHART = f"""<scxml {NS} name="shop" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
    <transition event="notify"><send type="app" event="x" target="t"/></transition>
    <transition event="pay" target="paying"/>
  </state>
  <state id="paying">
    <invoke type="payment" id="charge"/>
    <transition event="done.invoke.charge" target="s"/>
  </state>
</scxml>"""
T0 = 1_700_000_000_000


class _Handler:
    def start(self, request: Any) -> dict[str, int]:
        return {"ok": 1}


def bench_outbox(ctx: Any) -> list[dict]:
    chart = sb.Chart.from_scxml(CHART)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        for backend in ("MemoryStore", "SQLite"):
            def host(name: str, backend: str = backend, **kw: Any) -> sb.Host:
                store = sb.MemoryStore() if backend == "MemoryStore" else sb.SQLiteStore(Path(tmp) / f"{name}.db")
                h = sb.Host([chart], store=store, clock=sb.ManualClock(T0), **kw)
                h.start("shop", "i")
                return h
            full = {"processors": {"app": lambda d: None}, "invokers": {"payment": _Handler()}}
            fresh = (f"k{i}" for i in range(10**9)).__next__
            dup = host("dup", **full)
            dup.send("i", "inc", idempotency_key="same")
            cases = [  # (label, host, event, key for the n-th call)
                ("bare host, event with no effect", host("bare"), "inc", None),
                ("with processors and handlers, no effect", host("rich", **full), "inc", None),
                ("+ a fresh idempotency_key", host("keyed", **full), "inc", fresh),
                ("a repeated idempotency_key", dup, "inc", lambda: "same"),
                ("send to a callable processor", host("send", **full), "notify", None),
                ("invoke answered at once (enter + result)", host("invoke", **full), "pay", None),
            ]
            base = None
            for label, h, event, key in cases:
                def run(n: int, h: sb.Host = h, event: str = event, key: Any = key) -> None:
                    for _ in range(n):
                        h.send("i", event, idempotency_key=key() if key else None)
                m = ctx.measure(run, key=f"outbox/{backend}/{label}")
                base = base or m.median
                rows.append({"store": backend, "call": label, "calls/s": m.median, "vs bare": m.median / base,
                             "spread": m.spread})
                if hasattr(h.store, "close"):
                    h.store.close()
    ctx.note("SQLite pays one fsync per commit: a send to a processor is two commits (the event with its "
             "row, then the row's completion); a repeated key is a read and no commit")
    return rows


def register(section: Any) -> None:
    """Register the section with run.py's ``@section`` decorator."""
    section("outbox", "host.send with processors, handlers and idempotency keys vs a bare host",
            formats={"vs bare": "{:.2f}x", "spread": "{:.0%}"})(bench_outbox)
