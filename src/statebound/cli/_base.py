"""What every command module shares: the error type and exit codes, strict JSON input,
chart files, and the human and ``--json`` renderings of positions and timer rows."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .. import Chart, Position, jsonio
from ..host.store import SEND, TIMER, TimerRow

__all__ = ["CliError", "EXIT_ERROR", "EXIT_USAGE", "EXIT_NOT_FOUND", "EXIT_EXISTS", "EXIT_NOT_RUNNING", "EXIT_SUSPENDED",
           "EXIT_INTERRUPTED",
           "emit", "jsonable", "parse_data", "load_chart_file", "add_trust_option", "position_dict", "timer_dict",
           "human_position", "log_printer", "iso_ms", "command_options"]

EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_EXISTS, EXIT_NOT_RUNNING, EXIT_SUSPENDED = 1, 2, 3, 4, 5, 6
EXIT_INTERRUPTED = 130   # Ctrl-C: what a shell reports for a process SIGINT ended (128 + 2)


class CliError(Exception):
    """A one-line error for the user, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def command_options(sub: Any) -> Any:
    """Make every parser that ``sub.add_parser`` creates accept ``--store``, ``--json`` and
    ``--history`` after the command too (``statebound show ID --store URL``); returns ``sub``.

    A nested group (``statebound dynamodb create-table``) passes its own subparsers through
    this as well, so the options work at every level. ``SUPPRESS`` keeps the value given
    before the command when they are not repeated after it.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", "--db", dest="store", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--history", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add = sub.add_parser
    sub.add_parser = lambda name, **kw: add(name, parents=[common], **kw)
    return sub


def parse_data(text: str | None, what: str = "--data") -> Any:
    """Strict JSON (:mod:`statebound.jsonio`): ``NaN`` and ``Infinity`` are refused."""
    if text is None:
        return None
    try:
        return jsonio.loads(text)
    except ValueError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}", EXIT_USAGE) from None


def load_chart_file(path: str, trust: str = "trusted") -> tuple[Chart, bytes]:
    """Read and compile a chart file (under ``trust``); returns the chart and its source bytes."""
    p = Path(path)
    try:
        source = p.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read chart {path!r}: {exc.strerror or exc}") from None
    return Chart.from_file(p, trust=trust), source


def add_trust_option(parser: argparse.ArgumentParser) -> None:
    """``--trust``: load the chart as ``trusted`` (the default) or ``untrusted`` (docs/security.md)."""
    parser.add_argument("--trust", choices=("trusted", "untrusted"), default="trusted",
                        help="untrusted: ecmascript/null datamodels only, reaches only its own family "
                             "(docs/security.md); remembered with the chart")


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as a UTC ISO-8601 second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def jsonable(v: Any) -> Any:
    """Datamodel values as JSON can carry them (bytes become hex)."""
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def timer_dict(r: TimerRow) -> dict[str, Any]:
    """A timer row as the CLI shows it; an outbox row's ``event`` is the event it sends, or
    the invokeid of the invocation it starts or cancels (its ``kind`` says which)."""
    return {"instance": r.instance_id, "ordinal": r.ordinal, "name": r.name, "event": _row_event(r),
            "send_id": r.send_id, "target": r.target_id, "due_at_ms": r.due_at_ms, "due_at": iso_ms(r.due_at_ms),
            "state": r.state, "attempts": r.attempts, "last_error": r.last_error, "kind": r.kind}


def _row_event(r: TimerRow) -> Any:
    # each kind keeps it under its own key (host/outbox.py): a timer's event dict its name,
    # a send row "event", an invoke or cancel row only the "invokeid"
    if r.kind == TIMER:
        return r.event.get("name")
    return r.event.get("event" if r.kind == SEND else "invokeid")


def position_dict(pos: Position, timers: list[TimerRow] | None = None,
                  instance_id: str | None = None) -> dict[str, Any]:
    """A position (and, if given, its pending timers) as the CLI shows it."""
    d: dict[str, Any] = {
        "instance": instance_id or pos.session_id, "chart": pos.chart.name, "status": pos.status,
        "configuration": sorted(pos.configuration), "datamodel": jsonable(dict(pos.datamodel)),
        "macrostep": pos.macrostep,
    }
    if timers is not None:
        d["timers"] = [timer_dict(r) for r in timers]
    return d


def human_position(d: dict[str, Any]) -> str:
    """The human rendering of :func:`position_dict`."""
    status = f"{d['status']} (suspended)" if d.get("suspended") else d["status"]
    lines = [f"{d['instance']}  [{d['chart']}]  {status}",
             f"  configuration: {', '.join(d['configuration']) or '-'}",
             f"  datamodel:     {json.dumps(d['datamodel'], default=str)}",
             f"  macrostep:     {d['macrostep']}"]
    for t in d.get("timers", []):
        lines.append(f"  timer #{t['ordinal']}: {t['name'] or t['event']} due {t['due_at']} ({t['state']})")
    return "\n".join(lines)


def emit(args: argparse.Namespace, data: Any, human: str) -> None:
    """Print ``data`` as JSON under ``--json``, else the human text."""
    if args.json:
        print(jsonio.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human)


def log_printer(args: argparse.Namespace) -> Any:
    """An ``on_log`` for the host: ``<log>`` goes to stderr, unless output is ``--json``."""
    def on_log(instance_id: str, label: str | None, value: Any) -> None:
        if not args.json:
            print(f"  log [{instance_id}] {label or ''}: {value!r}", file=sys.stderr)
    return on_log
