"""``statebound dynamodb``: DynamoDB backend tools (the ``aws`` extra)."""

from __future__ import annotations

import argparse
from typing import Any

from ..storeurl import open_store, parse_store_url
from ._base import EXIT_USAGE, CliError, command_options, emit

__all__ = ["register"]


def cmd_dynamodb(args: argparse.Namespace) -> int:
    try:
        from ..dynamodb import DynamoStore
    except ImportError as exc:
        raise CliError(f"the DynamoDB backend needs the 'aws' extra (pip install 'statebound[aws]'): {exc}") from None
    if args.dynamo_cmd == "create-table":
        # The table, region and endpoint come from a dynamodb:// --store; NAME overrides the table.
        client, name = None, args.name
        if parse_store_url(args.store).scheme == "dynamodb":
            store = open_store(args.store)
            client, name = store.client, name or store.table_name
        if not name:
            raise CliError("create-table needs a NAME, or --store dynamodb://TABLE", EXIT_USAGE)
        DynamoStore.create_table(name, client)
        emit(args, {"table": name, "created": True}, f"table {name} is ready")
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("dynamodb", help="DynamoDB backend tools")
    dsub = command_options(s.add_subparsers(dest="dynamo_cmd", required=True))
    c = dsub.add_parser("create-table", help="create the statebound table (idempotent)")
    c.add_argument("name", nargs="?", help="the table (default: the one --store names)")
    s.set_defaults(fn=cmd_dynamodb)
