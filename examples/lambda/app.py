"""Shared set-up for the two Lambda handlers: one Host per execution environment.

Built on first use (not at import) so a test can configure it first, and cached for the
life of the warm environment so charts are compiled once per cold start.

Environment:
  TABLE_NAME        the DynamoDB table (created by template.yaml)
  CHARTS_DIR        where the *.scxml charts live (default: charts/ beside this file)
  DUE_SHARDS        due-index shards; must match across all writers and sweepers (default 16)
  HTTP_BASE         public base URL of the HTTP API, offered to charts as their Basic HTTP
                    location (optional)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import statebound as sb
from statebound.dynamodb import DynamoStore

_host: sb.Host | None = None


def load_charts(charts_dir: str | None = None) -> list[sb.Chart]:
    """Compile every chart in the charts directory (the chart name is the file stem)."""
    d = Path(charts_dir or os.environ.get("CHARTS_DIR") or Path(__file__).with_name("charts"))
    return [sb.Chart.from_file(p, name=p.stem) for p in sorted(d.glob("*.scxml"))]


def build_host(*, client: Any = None, clock: Any = None, table_name: str | None = None,
               charts_dir: str | None = None) -> sb.Host:
    """A Host over the DynamoDB table named by ``TABLE_NAME``."""
    table = table_name or os.environ["TABLE_NAME"]
    store = DynamoStore(table, client=client, shards=int(os.environ.get("DUE_SHARDS", "16")))
    return sb.Host(load_charts(charts_dir), store=store, clock=clock or sb.SystemClock(),
                   http_base=os.environ.get("HTTP_BASE") or "http://statebound.invalid")


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
