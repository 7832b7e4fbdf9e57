"""The one place commands open the store, its chart registry and a host on them."""

from __future__ import annotations

import argparse

from .. import Host, SystemClock
from ..host.sqlite import SQLiteStore
from ._base import log_printer
from .registry import ChartRegistry, SQLiteChartRegistry

__all__ = ["open_location", "open_store", "open_host"]


def open_location(location: str) -> tuple[SQLiteStore, ChartRegistry]:
    """The store at ``location`` and the chart registry kept in it."""
    return SQLiteStore(location), SQLiteChartRegistry(location)


def open_store(args: argparse.Namespace) -> tuple[SQLiteStore, ChartRegistry]:
    """The store named on the command line and the chart registry kept in it."""
    return open_location(args.db)


def open_host(args: argparse.Namespace) -> tuple[Host, ChartRegistry]:
    """A host on the command line's store, running every chart revision remembered there."""
    store, reg = open_store(args)
    host = Host(reg.load_all(), store=store, clock=SystemClock(), on_log=log_printer(args))
    return host, reg
