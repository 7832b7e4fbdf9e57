"""``statebound dynamodb``: DynamoDB backend tools (the ``aws`` extra)."""

from __future__ import annotations

import argparse
from typing import Any

from ._base import CliError, emit

__all__ = ["register"]


def cmd_dynamodb(args: argparse.Namespace) -> int:
    try:
        from ..dynamodb import DynamoStore
    except ImportError as exc:
        raise CliError(f"the DynamoDB backend needs the 'aws' extra (pip install 'statebound[aws]'): {exc}") from None
    if args.dynamo_cmd == "create-table":
        DynamoStore.create_table(args.name)
        emit(args, {"table": args.name, "created": True}, f"table {args.name} is ready")
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("dynamodb", help="DynamoDB backend tools")
    dsub = s.add_subparsers(dest="dynamo_cmd", required=True)
    c = dsub.add_parser("create-table", help="create the statebound table (idempotent)")
    c.add_argument("name")
    s.set_defaults(fn=cmd_dynamodb)
