"""The one place commands open the store, its chart registry and a host on them.

The store comes from ``--store URL`` (or its alias ``--db``, or ``$STATEBOUND_STORE``, or
``$STATEBOUND_DB``): a SQLite path, ``sqlite:///path`` or ``dynamodb://TABLE?...``, parsed
by :func:`statebound.open_store`. The chart registry lives in the same store, so every
command that names only an instance finds its chart.

Only the commands that can put something into a store (``start``, ``drive``, ``sweep``,
``migrate``) create a SQLite file that is not there; the others, which act on what a store
already holds, refuse a missing one (exit 3) rather than leave an empty database behind a
mistyped path.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from .. import Chart, Host, SystemClock
from ..storeurl import open_store as open_url
from ..storeurl import parse_store_url
from ._base import EXIT_NOT_FOUND, EXIT_USAGE, CliError, log_printer
from .registry import ChartRegistry, SQLiteChartRegistry

__all__ = ["DEFAULT_STORE", "default_store", "default_history", "history_keep", "is_digits", "open_location",
           "open_store", "open_host"]

DEFAULT_STORE = "statebound.db"


def default_store() -> str:
    """``$STATEBOUND_STORE``, else ``$STATEBOUND_DB``, else ``statebound.db``."""
    return os.environ.get("STATEBOUND_STORE") or os.environ.get("STATEBOUND_DB") or DEFAULT_STORE


def default_history() -> int:
    """``$STATEBOUND_HISTORY`` (records kept per instance), else 0: no history."""
    raw = os.environ.get("STATEBOUND_HISTORY", "").strip()
    if not raw:
        return 0
    if not is_digits(raw):
        raise CliError(f"$STATEBOUND_HISTORY must be a number of records, not {raw!r}", EXIT_USAGE)
    return int(raw)


def is_digits(text: str) -> bool:
    """``text`` is a whole number written in ASCII digits: ``str.isdigit`` also takes ``²``
    and other digits ``int()`` refuses."""
    return text.isascii() and text.isdigit()


def open_location(location: str, *, create: bool = True) -> tuple[Any, ChartRegistry]:
    """The store at ``location`` (a store URL) and the chart registry kept in it.

    :param create: create a SQLite file that does not exist; when false, raise a
        :class:`CliError` (exit 3) instead, and create nothing.
    """
    parsed = parse_store_url(location)
    if parsed.scheme == "memory":
        raise CliError("memory:// keeps nothing between two commands; use a SQLite path or dynamodb://TABLE",
                       EXIT_USAGE)
    if parsed.scheme == "sqlite" and not create and parsed.location != ":memory:" \
            and not os.path.exists(parsed.location):
        raise CliError(f"no such database: {parsed.location!r} (check --store; start creates it)", EXIT_NOT_FOUND)
    store = open_url(location)
    if parsed.scheme == "sqlite":
        try:
            return store, SQLiteChartRegistry(parsed.location, timeout_s=store.timeout_s)
        except BaseException:
            store.close()
            raise
    from .registry import DynamoChartRegistry
    return store, DynamoChartRegistry(store.client, store.table_name)


def open_store(args: argparse.Namespace, *, create: bool = True) -> tuple[Any, ChartRegistry]:
    """The store named on the command line and the chart registry kept in it (``create``:
    as for :func:`open_location`)."""
    return open_location(args.store, create=create)


def open_host(args: argparse.Namespace, *, create: bool = True) -> tuple[Host, ChartRegistry]:
    """A host on the command line's store, running every chart revision remembered there
    (recording history when ``--history N`` asks for it; ``create``: as for :func:`open_location`)."""
    store, reg = open_store(args, create=create)
    host = Host(reg.load_all(), store=store, clock=SystemClock(), on_log=log_printer(args),
                history=history_keep(args) or False, find_revision=_RegistryLookup(reg))
    return host, reg


class _RegistryLookup:
    """``Host(find_revision=...)`` for a command that runs on: a ``statebound sweep`` started
    before a ``migrate`` registered the new revision read the moved blobs against the old
    one, failed every fire of them, and parked their timers as dead. It re-reads the
    registry for a revision it does not know, at most once a minute per revision it did not
    find there."""

    RETRY_S = 60.0

    def __init__(self, reg: ChartRegistry) -> None:
        self.reg = reg
        self.missed: dict[tuple[str, str], float] = {}

    def __call__(self, name: str, identity: str) -> Chart | None:
        now = time.monotonic()
        if now - self.missed.get((name, identity), -self.RETRY_S) < self.RETRY_S:
            return None
        for chart in self.reg.load_all():
            if chart.name == name and chart.identity == identity:
                self.missed.pop((name, identity), None)
                return chart
        self.missed[(name, identity)] = now
        return None


def history_keep(args: argparse.Namespace) -> int:
    """How many history records per instance the command's hosts keep (0: no history)."""
    keep = getattr(args, "history", None)
    keep = default_history() if keep is None else keep
    if keep < 0:
        raise CliError("--history takes a number of records to keep (0: off)", EXIT_USAGE)
    return int(keep)
