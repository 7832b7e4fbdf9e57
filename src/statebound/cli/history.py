"""``statebound history ID`` (the timeline of an instance) and ``statebound replay ID``.

History is recorded by hosts created with ``Host(history=...)``; the CLI's own hosts record
it when given ``--history N`` (or ``$STATEBOUND_HISTORY``), keeping N records per instance.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..events import BASICHTTP_PROCESSOR, SCXML_PROCESSOR
from ..exceptions import InstanceNotFound
from ..host.store import HistoryRecord, live
from ._base import EXIT_ERROR, EXIT_USAGE, CliError, emit, iso_ms, jsonable
from ._store import open_host, open_store

__all__ = ["register"]


def _what(r: HistoryRecord) -> str:
    call = r.call
    op = call.get("op", "host")
    # an event the host gave up on (out of budget) left the position as it was: say so
    events = [f"{s['event'].get('name')} (abandoned: {s['abandoned']})" if "abandoned" in s
              else s["event"].get("name") for s in r.steps if "event" in s]
    if r.kind == "start":
        what = f"start {r.chart}"
    elif op == "fire":
        timer = call.get("timer") or ["?", "?"]
        what = f"fire #{timer[1]}" + (f" of {timer[0]}" if timer[0] != r.instance_id else "")
        what += f" {', '.join(map(str, events))}" if events else ""
    elif r.kind in ("suspend", "resume", "migrate"):
        what = r.kind
    elif events:
        what = ("send " if op == "send" and call.get("instance") == r.instance_id else "event ") + \
            ", ".join(map(str, events))
        if op == "send" and call.get("instance") != r.instance_id:
            what += f" (from {call.get('instance')})"
    else:
        what = "write" + (f" (by {op} of {call.get('instance')})" if op != "host" else "")
    if call.get("idempotency_key"):
        what += f"  key={call['idempotency_key']}"
    return what


def _effects(r: HistoryRecord) -> str:
    e = r.effects
    parts = []
    if e.get("armed"):
        parts.append("armed " + ", ".join(a.get("name") or a.get("event") or a.get("send_id") for a in e["armed"]))
    if e.get("cancelled"):
        parts.append("cancelled " + ", ".join(e["cancelled"]))
    if e.get("sent"):
        parts.append("sent " + ", ".join(f"{s['event']}->{_to(s)}" for s in e["sent"]))
    if e.get("invoked"):
        parts.append("invoked " + ", ".join(i["invokeid"] for i in e["invoked"]))
    if e.get("done"):
        parts.append("done")
    return "; ".join(parts)


def _to(sent: dict[str, Any]) -> str:
    """Where a send went: a session (``self`` when it named none), a URL, or a processor."""
    t, target = sent.get("type"), sent.get("target")
    if t in (None, SCXML_PROCESSOR, BASICHTTP_PROCESSOR, "scxml", "basichttp"):
        return target or "self"
    return f"{t}:{target}" if target else str(t)   # a send processor's, not an instance's


def _line(r: HistoryRecord) -> str:
    status = "" if r.status == "running" else f" ({r.status})"
    effects = _effects(r)
    return (f"  v{r.version:<4} {iso_ms(r.at_ms)}  {_what(r):<40} -> {', '.join(r.configuration) or '-'}{status}"
            + (f"   {effects}" if effects else ""))


def cmd_history(args: argparse.Namespace) -> int:
    if args.limit < 1:   # else it reads nothing and says the instance has no history
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    store, _ = open_store(args, create=False)
    records: list[HistoryRecord] = []
    while len(records) < args.limit:
        page = store.history(args.id, after_version=records[-1].version if records else 0,
                             limit=min(1_000, args.limit - len(records)))
        if not page:
            break
        records.extend(page)
    if not records and live(store.load(args.id)) is None:
        raise InstanceNotFound(args.id)
    data: list[dict[str, Any]] = [jsonable(r.to_dict()) for r in records]
    head = f"{args.id}: {len(records)} record(s)" if records else \
        f"{args.id}: no history (recorded only by hosts with history on: --history N)"
    emit(args, data, "\n".join([head, *map(_line, records)]))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    host, _ = open_host(args, create=False)
    if not host.exists(args.id):
        raise InstanceNotFound(args.id)
    rep = host.replay(args.id)
    data = {"instance": rep.instance_id, "identical": rep.identical, "records": rep.records, "reason": rep.reason,
            "diverged_at": rep.diverged_at, "bytes": rep.size}
    human = (f"{args.id}: replayed {rep.records} record(s) from the start: byte-identical ({rep.size} bytes)"
             if rep.identical else f"{args.id}: replay does not reach the stored position: {rep.reason}")
    emit(args, data, human)
    return 0 if rep.identical else EXIT_ERROR


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("history", help="an instance's execution history, oldest first")
    s.add_argument("id")
    s.add_argument("--limit", type=int, default=10_000, help="at most this many records (default 10000)")
    s.set_defaults(fn=cmd_history)

    s = sub.add_parser("replay", help="re-drive an instance's history from its start; check it is byte-identical")
    s.add_argument("id")
    s.set_defaults(fn=cmd_replay)
