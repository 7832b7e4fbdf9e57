"""Position blob commands: ``inspect``, and ``migrate BLOB`` (one blob, no store; its parser is
in ``migrate.py``, beside the bulk migration of a store)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import Position, jsonio
from ._base import EXIT_USAGE, CliError, emit, jsonable, load_chart_file

__all__ = ["register", "parse_map", "cmd_migrate_blob"]


def _read_blob(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read blob {path!r}: {exc.strerror or exc}") from None


def parse_map(pairs: list[str] | None) -> dict[str, str]:
    """``--map old=new`` options as a dict."""
    mapping = {}
    for m in pairs or []:
        if "=" not in m:
            raise CliError(f"--map takes old=new, not {m!r}", EXIT_USAGE)
        a, b = m.split("=", 1)
        mapping[a] = b
    return mapping


def cmd_inspect(args: argparse.Namespace) -> int:
    from .. import position as codec
    blob = _read_blob(args.blob)
    h = codec.read_header(blob)
    header = {"format_version": h.version, "codec": h.codec, "chart_identity": h.identity,
              "chart_name": h.name, "chart_version": h.chart_version, "size": len(blob),
              "payload_offset": h.payload_offset}
    data: dict[str, Any] = {"header": header}
    if args.chart:
        chart, _ = load_chart_file(args.chart)
        data["position"] = jsonable(Position.from_bytes(blob, chart).export())
    if args.json:
        print(jsonio.dumps(data, indent=2, sort_keys=True, default=str))
        return 0
    lines = [f"statebound position, format v{h.version}, codec {h.codec}, {len(blob)} bytes",
             f"  chart:    {h.name!r} version {h.chart_version!r}",
             f"  identity: {h.identity}"]
    if "position" in data:
        p = data["position"]
        lines += [f"  session:  {p['session_id']}  status {p['status']}",
                  f"  configuration: {', '.join(p['configuration'])}",
                  f"  datamodel:     {json.dumps(p['datamodel'], default=str)}",
                  f"  counters:      {json.dumps(p['counters'])}"]
        if p.get("history"):
            lines.append(f"  history:       {json.dumps(p['history'])}")
    else:
        lines.append("  (pass --chart FILE to decode the payload)")
    print("\n".join(lines))
    return 0


def cmd_migrate_blob(args: argparse.Namespace) -> int:
    """``statebound migrate BLOB --from OLD --to NEW``: one blob onto a new chart revision."""
    from .. import position as codec
    blob = _read_blob(args.blob)
    old, _ = load_chart_file(args.from_chart)
    new, _ = load_chart_file(args.to_chart)
    mapping = parse_map(args.map)
    d = codec.diff(old, new, mapping or None)
    if not d.migratable:
        raise CliError("the revision is breaking: " + "; ".join(d.reasons))
    moved = codec.import_(Position.from_bytes(blob, old).export(), new, mapping=mapping or None)
    out = moved.to_bytes(args.codec)
    if args.output and args.output != "-":
        Path(args.output).write_bytes(out)
        emit(args, {"diff": d.kind, "reasons": list(d.reasons), "bytes": len(out), "output": args.output},
             f"migrated ({d.kind}) to {args.output}, {len(out)} bytes")
    else:
        sys.stdout.buffer.write(out)
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("inspect", help="decode a position blob")
    s.add_argument("blob", help="file, or - for stdin")
    s.add_argument("--chart", help="the chart, to decode the payload")
    s.set_defaults(fn=cmd_inspect)
