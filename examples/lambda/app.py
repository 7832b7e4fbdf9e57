"""Shared set-up for the two Lambda handlers: one Host per execution environment.

Built on first use (not at import) so a test can configure it first, and cached for the
life of the warm environment so charts are compiled once per cold start.

**Chart revisions.** ``charts/<name>/<revision>.scxml`` is one revision of chart
``<name>``: ``charts/order/v1.scxml``, ``charts/order/v2.scxml``. Every revision shipped is
registered, in natural order (``v2`` before ``v10``), so the last one is the one new
instances start on, while each stored position keeps running on the revision whose
identity its blob carries until it finishes: the "drain on the old chart" upgrade of
``docs/persistence.md``. A plain ``charts/<name>.scxml`` is a chart with one unnamed
revision. Remove a revision's file only once ``revisions.py`` counts no running
instance on it (see the README, "Upgrade a chart").

Environment:
  TABLE_NAME        the DynamoDB table (created by template.yaml)
  CHARTS_DIR        where the charts live (default: charts/ beside this file)
  DUE_SHARDS        due-index shards; must match across all writers and sweepers (default 16)
  DONE_TTL_S        completed timer rows expire this many seconds after they fire, through
                    DynamoDB TTL on ``expires_at`` (default: kept; the template sets 7 days)
  HTTP_BASE         public base URL of the HTTP API, offered to charts as their Basic HTTP
                    location (optional)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import statebound as sb
from telemetry import ObservedHost, ObservedStore, chart_log

_host: sb.Host | None = None


def _natural(path: Path) -> list[Any]:
    """Sort key that orders ``v2`` before ``v10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem)]


def chart_files(charts_dir: str | os.PathLike[str] | None = None) -> list[tuple[str, str | None, Path]]:
    """``(name, revision, path)`` of every chart revision shipped, oldest revision first."""
    root = Path(charts_dir or os.environ.get("CHARTS_DIR") or Path(__file__).with_name("charts"))
    found: list[tuple[str, str | None, Path]] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            found += [(entry.name, f.stem, f) for f in sorted(entry.glob("*.scxml"), key=_natural)]
        elif entry.suffix == ".scxml":
            found.append((entry.stem, None, entry))
    return found


def load_charts(charts_dir: str | os.PathLike[str] | None = None) -> list[sb.Chart]:
    """Compile every revision of every chart; for each name, the latest revision comes last."""
    return [sb.Chart.from_file(path, name=name, version=revision)
            for name, revision, path in chart_files(charts_dir)]


def build_host(*, client: Any = None, clock: Any = None, table_name: str | None = None,
               charts_dir: str | os.PathLike[str] | None = None) -> sb.Host:
    """A Host over the DynamoDB table named by ``TABLE_NAME``."""
    table = table_name or os.environ["TABLE_NAME"]
    ttl = os.environ.get("DONE_TTL_S")
    store = ObservedStore(table, client=client, shards=int(os.environ.get("DUE_SHARDS", "16")),
                          done_ttl_s=int(ttl) if ttl else None)
    return ObservedHost(load_charts(charts_dir), store=store, clock=clock or sb.SystemClock(),
                        http_base=os.environ.get("HTTP_BASE") or "http://statebound.invalid", on_log=chart_log)


def get_host() -> sb.Host:
    """The environment's Host, built on first use."""
    global _host
    if _host is None:
        _host = build_host()
    return _host


def configure(host: sb.Host | None) -> None:
    """Install a Host (tests do this with a moto client and a ManualClock); ``None`` resets."""
    global _host
    _host = host
