"""The ``statebound`` command.

One module per command group: ``instances`` (start, send, show, suspend, resume, delete), ``timers``
(timers, redrive, sweep, purge), ``history`` (history, replay), ``charts`` (validate, diagram), ``drive``, ``migrate``
(a store's instances, or one blob with ``blobs``), ``blobs`` (inspect) and ``dynamodb``
(create-table). ``_store`` opens the store and its
chart registry for all of them; ``_base`` holds output and errors.

Instances live in the store named by ``--store URL`` (alias ``--db``; default
``$STATEBOUND_STORE``, ``$STATEBOUND_DB`` or ``statebound.db``): a SQLite path,
``sqlite:///path`` or ``dynamodb://TABLE?region=...&endpoint_url=...``. Every command
that touches instances works on every store with the same output. Charts given to
``start`` are remembered in the same store (their source and location), so later
commands need only the instance id.

Every error prints one line on stderr and exits non-zero; output is for humans unless
``--json`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..exceptions import (ChartError, InstanceExists, InstanceNotFound, InstanceSuspended, InvalidArgument, InvalidEvent,
                          InvalidInstanceId, InvalidStoreURL, InvalidTrustLevel, NotRunning, PositionError,
                          StateboundError, UnknownChart)
from . import blobs, charts, drive, dynamodb, history, instances, migrate, timers
from ._store import default_store
from ._base import (EXIT_ERROR, EXIT_EXISTS, EXIT_INTERRUPTED, EXIT_NOT_FOUND, EXIT_NOT_RUNNING, EXIT_SUSPENDED,
                    EXIT_USAGE, CliError, command_options)
from .charts import mermaid

__all__ = ["main", "mermaid", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (``statebound send: error: ...``), exit code 2."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message.splitlines()[0] if message else ''}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = _Parser(prog="statebound", description="Durable SCXML statecharts.")
    p.add_argument("--store", "--db", dest="store", metavar="URL", default=default_store(),
                   help="a SQLite path, sqlite:///PATH or dynamodb://TABLE?region=...&endpoint_url=... "
                        "(default: $STATEBOUND_STORE, $STATEBOUND_DB or statebound.db); --db is an alias")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--history", type=int, metavar="N", default=None,
                   help="record execution history, keeping N records per instance "
                        "(default: $STATEBOUND_HISTORY, or 0: off)")
    # --store and --json are also accepted after the command (`statebound show ID --json`)
    sub = command_options(p.add_subparsers(dest="cmd", required=True))
    for module in (instances, timers, history, charts, drive, migrate, blobs, dynamodb):
        module.register(sub)
    return p


# usage errors first: InvalidTrustLevel is a ChartError too
_CODES = ((InvalidEvent, EXIT_USAGE), (InvalidTrustLevel, EXIT_USAGE), (InstanceNotFound, EXIT_NOT_FOUND), (UnknownChart, EXIT_NOT_FOUND), (InstanceExists, EXIT_EXISTS),
          (NotRunning, EXIT_NOT_RUNNING), (ChartError, EXIT_ERROR), (PositionError, EXIT_ERROR),
          (InvalidStoreURL, EXIT_USAGE), (InstanceSuspended, EXIT_SUSPENDED),
          (InvalidArgument, EXIT_USAGE), (InvalidInstanceId, EXIT_USAGE))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed on one line
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return args.fn(args)
    except CliError as exc:
        print(f"statebound: error: {exc}", file=sys.stderr)
        return exc.code
    except StateboundError as exc:
        code = next((c for t, c in _CODES if isinstance(exc, t)), EXIT_ERROR)
        first = str(exc).splitlines()
        msg = first[0] if len(first) == 1 else "; ".join(x.strip(" -") for x in first)
        print(f"statebound: error: {msg}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except ValueError as exc:  # a ValueError from outside the library, as before
        print(f"statebound: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # never a traceback; STATEBOUND_TRACEBACK=1 shows it
        if os.environ.get("STATEBOUND_TRACEBACK"):
            raise
        text = str(exc).splitlines()[0] if str(exc) else ""
        print(f"statebound: error: {type(exc).__name__}: {text}", file=sys.stderr)
        return EXIT_ERROR


