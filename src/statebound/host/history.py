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

A drive's result also depends on what its host offered it: the I/O processors its
``_ioprocessors`` names (with its Basic HTTP location) and the invoke types it may use. A
record that drives names them (``"world"``, see :func:`records`), so any host, the command
line's included, replays an instance as the host that ran it drove it. An event the host
gave up on for lack of budget left the position unchanged: its step is marked
``"abandoned"`` and replay skips it.

Retention is bounded per host: ``history=N`` keeps the last N records of each instance
(SQLite and memory delete older ones in the same commit); ``history_ttl_s`` stamps each
record with an expiry (DynamoDB's TTL deletes it; SQLite and memory drop expired records
as they write). On DynamoDB each record is one more item in the commit's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..effects import BudgetExhausted, Cancel, CancelInvoke, Done, Invoke, Log, Send, SendDelayed
from ..events import BASICHTTP_PROCESSOR, Event
from ..exceptions import InvalidArgument, StateboundError
from ..interpreter import Interpreter, Position
from ..position import import_, read_header
from .routing import driver, restamp
from .store import SUSPENDED, HistoryRecord, PositionWrite, live, purges
from .unit import Entry, Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["HistoryPolicy", "ReplayReport", "policy", "summarize", "records", "replay", "DEFAULT_KEEP"]

#: How many records ``Host(history=True)`` keeps per instance.
DEFAULT_KEEP = 1_000

#: The fewest microsteps replay allows a drive. Every recorded drive settled within its
#: host's ``max_rounds`` (one that did not is marked abandoned), and a larger bound changes
#: nothing for a drive that settles, so replay need not know that host's bound, only be
#: at least as generous.
REPLAY_ROUNDS = 1_000_000

#: The ``_ioprocessors`` keys of the Basic HTTP processor (``routing.ioprocessors``).
_HTTP_KEYS = (BASICHTTP_PROCESSOR, "basichttp")


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


def _world(e: Entry) -> dict[str, Any]:
    """What the host offered the entry's drives in this unit: the ``_ioprocessors`` keys in
    their order (``io``; the Basic HTTP ones implied by ``http`` when last), the Basic HTTP
    location (``http``) and the invoke types (``inv``), each left out when there is none.
    The routes are not here: replay checks sessions against the store as it is
    (docs/operations.md)."""
    if e.driver is not None:
        _, iop, inv = e.driver()
    else:   # started in this unit: the position carries what the start was offered
        assert e.position is not None
        iop, inv = e.position.ioprocessors, e.position.invokers
    w: dict[str, Any] = {}
    if iop:
        io = list(iop)
        http = next((iop[k].get("location") for k in _HTTP_KEYS if iop.get(k)), None)
        if http is not None:
            w["http"] = http
            if tuple(io[-2:]) == _HTTP_KEYS:   # where the host puts them: implied (see _offer)
                del io[-2:]
        if io:
            w["io"] = io
    if inv:
        w["inv"] = sorted(inv)   # a frozenset's order is the process's
    return w


def _with_world(e: Entry) -> tuple[dict[str, Any], ...]:
    """The entry's steps, the first one that drives naming the host's offer (:func:`_world`):
    a start's offer in a step of its own before the rest, an event's on the event's step. A
    record that drives nothing (a suspend, a row kept) names none."""
    steps = e.steps or []
    if e.started is not None:
        return ({"world": _world(e)}, *steps)
    for i, s in enumerate(steps):
        if "event" in s:
            return (*steps[:i], {**s, "world": _world(e)}, *steps[i + 1:])
    return tuple(steps)


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
            _with_world(e), tuple(sorted(e.position.configuration)),
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


def _offer(world: dict[str, Any]) -> tuple[dict[str, Any] | None, frozenset[str] | None]:
    """``(ioprocessors, invokers)`` as the host that wrote ``world`` (:func:`_world`) built them."""
    http = world.get("http")
    io = world.get("io", ())
    loc = None
    if http is not None:
        loc = {"location": http}
        if _HTTP_KEYS[0] not in io:
            io = [*io, *_HTTP_KEYS]
    iop = {k: loc if loc is not None and k in _HTTP_KEYS else {} for k in io}
    inv = world.get("inv")
    return iop or None, frozenset(inv) if inv else None


def _offered(host: Host, u: Unit, pos: Position, world: dict[str, Any] | None) -> Position:
    """``pos`` stamped for a replayed drive: the sessions as they are now, the rest as the
    record's ``world`` names it (``host``'s own offer when it names none)."""
    routes, iop, inv = driver(host, u, pos)
    return restamp(pos, routes, *_offer(world)) if world is not None else restamp(pos, routes, iop, inv)


def _versions(vs: list[int]) -> str:
    return f"record {vs[0]}" if len(vs) == 1 else f"{len(vs)} records (v{vs[0]}..v{vs[-1]})"


def _hints(host: Host, unrecorded: list[int], unmarked: list[int]) -> str:
    """What a divergence may come from that replay could not rule out: records written before
    statebound recorded what their host offered, or which events it gave up on."""
    out = []
    if unrecorded:
        out.append(f"{_versions(unrecorded)} name no host settings (written before statebound recorded them), so "
                   f"they were replayed with this host's: I/O processors {sorted(host.processors) or 'none'}, "
                   f"invoke handlers {sorted(host.invokers) or 'none'}, Basic HTTP base {host.http_base!r}; "
                   "a host that offered others ran them differently")
    if unmarked:
        out.append(f"{_versions(unmarked)} ran an event out of its budget on the host that ran it, recorded before "
                   "statebound marked such an event abandoned: replay cannot tell which one to skip")
    return "".join(f"; {h}" for h in out)


def _difference(stored: bytes, replayed: Position) -> str:
    """Which parts of the position differ (export's keys, and the variables or counters)."""
    try:
        a = Position.from_bytes(stored, replayed.chart).export()
    except StateboundError:
        return "other bytes"
    b = replayed.export()
    parts = []
    for k, v in a.items():
        w = b.get(k)
        if v == w:
            continue
        if isinstance(v, dict) and isinstance(w, dict):
            parts.append(f"{k} " + ", ".join(sorted(str(n) for n in v.keys() | w.keys() if v.get(n) != w.get(n))))
        else:
            parts.append(k)
    return "; ".join(parts) or "the encoding alone"


def replay(host: Host, instance_id: str) -> ReplayReport:
    """Re-drive an instance's recorded steps from its ``start`` record and compare.

    Needs every record since the start (retention must not have dropped any) and every
    chart revision they name registered on ``host``. Each record is re-driven with what its
    own host offered (the ``world`` it names; ``host``'s for a record written before
    statebound recorded it), steps marked abandoned are skipped, and the result is encoded
    in the stored blob's codec. Sends to other sessions are checked against the sessions
    that exist now, which is where a replay can differ from the original run; everything
    else is the deterministic interpreter.
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
    interps: dict[str, Interpreter] = {}
    unrecorded: list[int] = []
    unmarked: list[int] = []
    for r in history:
        if r.call.get("truncated"):
            return ReplayReport(instance_id, False, 0, f"record {r.version} was stored without its data (too large)")
        chart = host._revisions.get(r.chart, {}).get(r.revision)
        if chart is None:
            return ReplayReport(instance_id, False, 0, f"chart {r.chart!r} revision {r.revision} is not registered")
        interp = interps.get(chart.identity)
        if interp is None:
            interp = interps[chart.identity] = Interpreter(chart, max_rounds=max(host.max_rounds, REPLAY_ROUNDS))
        world = next((s["world"] for s in r.steps if "world" in s), None)
        if world is None and (r.kind == "start" or any("event" in s for s in r.steps)):
            unrecorded.append(r.version)
        if r.effects.get("budget_exhausted") and not any("abandoned" in s for s in r.steps):
            unmarked.append(r.version)
        try:
            if r.kind == "start":
                s = r.start or {}
                seed = _offered(host, u, Position(chart, instance_id, "running", ()), world)
                pos, _ = interp.start(instance_id, s.get("data"), parent=s.get("parent"), invokeid=s.get("invokeid"),
                                      routes=seed.routes, ioprocessors=seed.ioprocessors,
                                      caller_context=r.caller_context, only_declared=s.get("parent") is not None,
                                      invokers=seed.invokers, ordinal=s.get("ordinal", 0))
            elif r.kind == "migrate" and pos is not None:
                pos = import_(pos.export(), chart, mapping=(r.start or {}).get("mapping"))
            assert pos is not None
            for step in r.steps:
                if "event" in step:
                    if "abandoned" in step:
                        continue   # the host gave up on it: it left the position as it was
                    before = pos
                    pos, effects = interp.drive(_offered(host, u, pos, world), Event.from_dict(step["event"]),
                                                caller_context=step.get("context"))
                    if effects and type(effects[0]) is BudgetExhausted:
                        if r.version in unmarked:   # (the one its host gave up on, perhaps)
                            pos = before
                            continue
                        limit = (f"max_rounds ({interp.max_rounds})" if effects[0].reason == "rounds"
                                 else f"its {effects[0].reason} budget")
                        return ReplayReport(instance_id, False, len(history),
                                            f"record {r.version}: replaying {step['event'].get('name')!r} ran out "
                                            f"of {limit}, though the host that ran it settled it", r.version)
                elif "ordinal" in step:
                    pos = replace(pos, ordinal=pos.ordinal + int(step["ordinal"]))
        except StateboundError as exc:
            return ReplayReport(instance_id, False, 0, f"record {r.version} could not be replayed: {exc}"
                                + _hints(host, unrecorded, unmarked), r.version)
        if tuple(sorted(pos.configuration)) != tuple(r.configuration):
            return ReplayReport(instance_id, False, len(history),
                                f"record {r.version}: replay reached {sorted(pos.configuration)}, the record says "
                                f"{list(r.configuration)}" + _hints(host, unrecorded, unmarked), r.version)
    assert pos is not None
    try:
        # in the stored blob's own codec: the host that wrote it may use another than this one
        codec = read_header(rec.blob).codec
        blob = pos.to_bytes(codec)
    except StateboundError as exc:
        return ReplayReport(instance_id, False, len(history), f"the replayed position cannot be encoded as the "
                                                              f"stored one is: {exc}")
    if blob != rec.blob:
        return ReplayReport(instance_id, False, len(history),
                            f"the replayed position differs from the stored one in {_difference(rec.blob, pos)} "
                            f"(same configuration)" + _hints(host, unrecorded, unmarked), size=len(blob))
    return ReplayReport(instance_id, True, len(history), size=len(blob))
