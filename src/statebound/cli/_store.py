"""The one place commands open the store, its chart registry and a host on them.

The store comes from ``--store URL`` (or its alias ``--db``, or ``$STATEBOUND_STORE``, or
``$STATEBOUND_DB``): a SQLite path, ``sqlite:///path`` or ``dynamodb://TABLE?...``, parsed
by :func:`statebound.open_store`. The chart registry lives in the same store, so every
command that names only an instance finds its chart.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import Host, SystemClock
from ..storeurl import open_store as open_url
from ..storeurl import parse_store_url
from ._base import EXIT_USAGE, CliError, log_printer
from .registry import ChartRegistry, SQLiteChartRegistry

__all__ = ["DEFAULT_STORE", "default_store", "default_history", "history_keep", "open_location", "open_store", "open_host"]

DEFAULT_STORE = "statebound.db"


def default_store() -> str:
    """``$STATEBOUND_STORE``, else ``$STATEBOUND_DB``, else ``statebound.db``."""
    return os.environ.get("STATEBOUND_STORE") or os.environ.get("STATEBOUND_DB") or DEFAULT_STORE


def default_history() -> int:
    """``$STATEBOUND_HISTORY`` (records kept per instance), else 0: no history."""
    raw = os.environ.get("STATEBOUND_HISTORY", "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise CliError(f"$STATEBOUND_HISTORY must be a number of records, not {raw!r}", EXIT_USAGE)
    return int(raw)


def open_location(location: str) -> tuple[Any, ChartRegistry]:
    """The store at ``location`` (a store URL) and the chart registry kept in it."""
    parsed = parse_store_url(location)
    if parsed.scheme == "memory":
        raise CliError("memory:// keeps nothing between two commands; use a SQLite path or dynamodb://TABLE",
                       EXIT_USAGE)
    store = open_url(location)
    if parsed.scheme == "sqlite":
        return store, SQLiteChartRegistry(parsed.location)
    from .registry import DynamoChartRegistry
    return store, DynamoChartRegistry(store.client, store.table_name)


def open_store(args: argparse.Namespace) -> tuple[Any, ChartRegistry]:
    """The store named on the command line and the chart registry kept in it."""
    return open_location(args.store)


def open_host(args: argparse.Namespace) -> tuple[Host, ChartRegistry]:
    """A host on the command line's store, running every chart revision remembered there
    (recording history when ``--history N`` asks for it)."""
    store, reg = open_store(args)
    host = Host(reg.load_all(), store=store, clock=SystemClock(), on_log=log_printer(args),
                history=history_keep(args) or False)
    return host, reg


def history_keep(args: argparse.Namespace) -> int:
    """How many history records per instance the command's hosts keep (0: no history)."""
    keep = getattr(args, "history", None)
    keep = default_history() if keep is None else keep
    if keep < 0:
        raise CliError("--history takes a number of records to keep (0: off)", EXIT_USAGE)
    return int(keep)
