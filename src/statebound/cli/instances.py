"""Instance commands: ``start``, ``send``, ``show``, ``suspend``, ``resume`` and ``delete``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import Event
from ._base import (EXIT_USAGE, CliError, add_trust_option, emit, human_position, load_chart_file, parse_data,
                    position_dict)
from ._store import open_host
from .charts import instance_diagram

__all__ = ["register"]


def cmd_start(args: argparse.Namespace) -> int:
    chart, source = load_chart_file(args.chart, args.trust)
    host, reg = open_host(args)
    reg.remember(chart, str(Path(args.chart).resolve()), source)
    data = parse_data(args.data)
    if data is not None and not isinstance(data, dict):
        raise CliError(f"--data for start must be a JSON object, not {type(data).__name__}", EXIT_USAGE)
    host.register(chart)
    pos = host.start(chart.name, args.id, data, idempotency_key=args.idempotency_key)
    d = position_dict(pos, host.pending_timers(args.id), args.id)
    emit(args, d, human_position(d))
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    host, _ = open_host(args, create=False)
    pos = host.send(args.id, Event(args.event, parse_data(args.data)), idempotency_key=args.idempotency_key)
    d = position_dict(pos, host.pending_timers(args.id), args.id)
    emit(args, d, human_position(d))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    host, _ = open_host(args, create=False)
    pos = host.get(args.id)
    timers = host.pending_timers(args.id)
    d = position_dict(pos, timers, args.id)
    d["suspended"] = host.is_suspended(args.id)
    if args.diagram:
        d["mermaid"] = instance_diagram(pos, timers)
        emit(args, d, d["mermaid"])
    else:
        emit(args, d, human_position(d))
    return 0


def cmd_suspend(args: argparse.Namespace) -> int:
    host, _ = open_host(args, create=False)
    if args.resume:
        host.resume(args.id)
    else:
        host.suspend(args.id)
    d = position_dict(host.get(args.id), host.pending_timers(args.id), args.id)
    d["suspended"] = not args.resume
    emit(args, d, human_position(d))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    host, _ = open_host(args, create=False)
    host.delete(args.id)
    emit(args, {"deleted": args.id}, f"deleted {args.id}")
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("start", help="start an instance of a chart")
    s.add_argument("chart")
    s.add_argument("id")
    s.add_argument("--data", help="initial datamodel values, as a JSON object")
    s.add_argument("--idempotency-key", metavar="KEY", help="a retried start with this key is not an error")
    add_trust_option(s)
    s.set_defaults(fn=cmd_start)

    s = sub.add_parser("send", help="send an event to an instance")
    s.add_argument("id")
    s.add_argument("event")
    s.add_argument("--data", help="event data, as JSON")
    s.add_argument("--idempotency-key", metavar="KEY", help="apply this event once, however often it is sent")
    s.set_defaults(fn=cmd_send)

    s = sub.add_parser("show", help="show an instance")
    s.add_argument("id")
    s.add_argument("--diagram", action="store_true",
                   help="print its chart as Mermaid, active states highlighted, pending timers as notes")
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("suspend", help="suspend an instance: it takes no events, its timers wait")
    s.add_argument("id")
    s.set_defaults(fn=cmd_suspend, resume=False)

    s = sub.add_parser("resume", help="resume a suspended instance: events again, its timers pending again")
    s.add_argument("id")
    s.set_defaults(fn=cmd_suspend, resume=True)

    s = sub.add_parser("delete", help="purge an instance, its timers and children")
    s.add_argument("id")
    s.set_defaults(fn=cmd_delete)
