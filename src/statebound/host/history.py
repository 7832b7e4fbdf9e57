"""Execution history: what the host records about each unit of work, and replaying it.

With ``Host(history=True)`` (or a count, or ``history_ttl_s=``) every commit appends one
:class:`~statebound.host.store.HistoryRecord` per instance it writes, **in the same commit**,
keyed by the version that commit writes. A crash before the commit leaves no record of the
event; a conflict re-runs the unit and records what finally committed.

A record keeps the steps the host took (each event delivered, each ordinal the host took
for a row of its own), the configuration after, a summary of the effects, the chart
revision and the call (``start``, ``send``, ``fire``... with its idempotency key or timer).
Because the interpreter is deterministic, :func:`replay` can re-drive the steps from the
``start`` record and check that it reaches the stored position **byte for byte**.

Retention is bounded per host: ``history=N`` keeps the last N records of each instance
(SQLite and memory delete older ones in the same commit); ``history_ttl_s`` stamps each
record with an expiry (DynamoDB's TTL deletes it; SQLite and memory drop expired records
as they write). On DynamoDB each record is one more item in the commit's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..effects import BudgetExhausted, Cancel, CancelInvoke, Done, Invoke, Log, Send, SendDelayed
from ..events import Event
from ..exceptions import InvalidArgument, StateboundError
from ..interpreter import Position
from ..position import import_
from .routing import stamp
from .store import SUSPENDED, HistoryRecord, PositionWrite, live, purges
from .unit import Entry, Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["HistoryPolicy", "ReplayReport", "policy", "summarize", "records", "replay", "DEFAULT_KEEP"]

#: How many records ``Host(history=True)`` keeps per instance.
DEFAULT_KEEP = 1_000


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    """How much history a host keeps: ``keep`` records per instance (``None``: no count
    bound) and records expiring ``ttl_s`` seconds after they are written (``None``: never)."""

    keep: int | None
    ttl_s: int | None


def policy(history: bool | int, ttl_s: int | None) -> HistoryPolicy | None:
    """The policy for ``Host(history=..., history_ttl_s=...)``, or ``None`` when off."""
    if isinstance(history, bool):
        keep: int | None = DEFAULT_KEEP if history else None
        on = history or ttl_s is not None
    elif isinstance(history, int):
        if history < 1:
            raise InvalidArgument("history= takes True, False or a number of records to keep (>= 1)")
        keep, on = history, True
    else:
        raise InvalidArgument(f"history= takes a bool or an int, not {type(history).__name__}")
    if ttl_s is not None and ttl_s < 1:
        raise InvalidArgument("history_ttl_s must be at least 1 second")
    return HistoryPolicy(keep, ttl_s) if on else None


def summarize(summary: dict[str, Any], effects: tuple[Any, ...]) -> None:
    """Add what ``effects`` did to a record's effect summary."""
    for eff in effects:
        t = type(eff)
        if t is SendDelayed:
            summary.setdefault("armed", []).append({"send_id": eff.send_id, "event": eff.event, "name": eff.name,
                                                    "ordinal": eff.ordinal, "delay_ms": eff.delay_ms,
                                                    "at_ms": eff.at_ms})
        elif t is Cancel:
            summary.setdefault("cancelled", []).append(eff.send_id)
        elif t is Send:
            summary.setdefault("sent", []).append({"event": eff.event, "target": eff.target, "type": eff.type})
        elif t is Invoke:
            summary.setdefault("invoked", []).append({"invokeid": eff.invokeid, "type": eff.type})
        elif t is CancelInvoke:
            summary.setdefault("invokes_cancelled", []).append(eff.invokeid)
        elif t is Done:
            summary["done"] = True
        elif t is BudgetExhausted:
            summary["budget_exhausted"] = True
        elif t is Log:
            summary["logs"] = summary.get("logs", 0) + 1


def _kind(e: Entry, op: str | None) -> str:
    if e.started is not None:
        return "start"
    if any("event" in s for s in e.steps or ()):
        return "event"
    return op if op in ("suspend", "resume", "migrate") else "write"


def records(p: HistoryPolicy, u: Unit, writes: list[PositionWrite], now_ms: int) -> tuple[HistoryRecord, ...]:
    """One record per position this unit writes (deletes excepted: they drop the history)."""
    out = []
    for w in writes:
        e = u.entries.get(w.instance_id)
        if purges(w) or e is None or e.steps is None or e.position is None:
            continue
        ctx = next((s["context"] for s in e.steps if "context" in s), u.call.get("caller_context"))
        call = {k: v for k, v in u.call.items() if k != "caller_context" and v is not None}
        out.append(HistoryRecord(
            w.instance_id, 1 if w.expected_version is None else w.expected_version + 1, now_ms, _kind(e, call.get("op")),
            tuple(e.steps), tuple(sorted(e.position.configuration)),
            SUSPENDED if e.suspended else e.position.status, dict(e.effects or {}), w.chart,
            e.position.chart.identity, call, ctx, e.started,
            None if p.ttl_s is None else now_ms + p.ttl_s * 1000))
    return tuple(out)


# --------------------------------------------------------------------------- replay


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What :func:`replay` found.

    :ivar identical: the replayed position's bytes equal the stored blob's.
    :ivar records: how many records were replayed.
    :ivar reason: why not, when not identical (a gap, a divergence, a missing revision).
    :ivar diverged_at: the version of the first record whose configuration differed.
    """

    instance_id: str
    identical: bool
    records: int
    reason: str | None = None
    diverged_at: int | None = None
    size: int = 0


def _all(host: Host, instance_id: str) -> list[HistoryRecord]:
    out: list[HistoryRecord] = []
    while True:
        page = host.store.history(instance_id, after_version=out[-1].version if out else 0, limit=1_000)
        if not page:
            return out
        out.extend(page)


def replay(host: Host, instance_id: str) -> ReplayReport:
    """Re-drive an instance's recorded steps from its ``start`` record and compare.

    Needs every record since the start (retention must not have dropped any) and every
    chart revision they name registered on ``host``. Sends to other sessions are checked
    against the sessions that exist now, which is where a replay can differ from the
    original run; everything else is the deterministic interpreter.
    """
    rec = live(host.store.load(instance_id))
    history = _all(host, instance_id)
    if rec is None:
        return ReplayReport(instance_id, False, 0, "the instance does not exist")
    starts = [i for i, r in enumerate(history) if r.kind == "start"]
    if not starts:
        return ReplayReport(instance_id, False, 0, "no start record: retention dropped it, or history was off")
    history = history[starts[-1]:]
    expected = list(range(history[0].version, history[0].version + len(history)))
    if [r.version for r in history] != expected or history[-1].version != rec.version:
        have = [r.version for r in history]
        return ReplayReport(instance_id, False, 0, f"records {have[0]}..{have[-1]} do not cover every commit up "
                                                   f"to version {rec.version} (written by a host without history?)")
    pos: Position | None = None
    u = Unit()
    for r in history:
        if r.call.get("truncated"):
            return ReplayReport(instance_id, False, 0, f"record {r.version} was stored without its data (too large)")
        chart = host._revisions.get(r.chart, {}).get(r.revision)
        if chart is None:
            return ReplayReport(instance_id, False, 0, f"chart {r.chart!r} revision {r.revision} is not registered")
        interp = host._interpreters[chart.identity]
        try:
            if r.kind == "start":
                s = r.start or {}
                seed = stamp(host, u, Position(chart, instance_id, "running", ()))
                pos, _ = interp.start(instance_id, s.get("data"), parent=s.get("parent"), invokeid=s.get("invokeid"),
                                      routes=seed.routes, ioprocessors=seed.ioprocessors,
                                      caller_context=r.caller_context, only_declared=s.get("parent") is not None,
                                      invokers=seed.invokers, ordinal=s.get("ordinal", 0))
            elif r.kind == "migrate" and pos is not None:
                pos = import_(pos.export(), chart, mapping=(r.start or {}).get("mapping"))
            assert pos is not None
            for step in r.steps:
                if "event" in step:
                    pos, _ = interp.drive(stamp(host, u, pos), Event.from_dict(step["event"]),
                                          caller_context=step.get("context"))
                else:
                    pos = replace(pos, ordinal=pos.ordinal + int(step.get("ordinal", 1)))
        except StateboundError as exc:
            return ReplayReport(instance_id, False, 0, f"record {r.version} could not be replayed: {exc}",
                                r.version)
        if tuple(sorted(pos.configuration)) != tuple(r.configuration):
            return ReplayReport(instance_id, False, len(history),
                                f"record {r.version}: replay reached {sorted(pos.configuration)}, the record says "
                                f"{list(r.configuration)}", r.version)
    assert pos is not None
    blob = pos.to_bytes(host.codec)
    if blob != rec.blob:
        return ReplayReport(instance_id, False, len(history), "the replayed position differs from the stored one "
                                                              "(same configuration, other bytes)", size=len(blob))
    return ReplayReport(instance_id, True, len(history), size=len(blob))
