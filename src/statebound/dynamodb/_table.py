"""The statebound table's schema: ``table_spec`` for infrastructure code, and an
idempotent ``create_table`` for scripts and tests (``DynamoStore.create_table``)."""

from __future__ import annotations

import time
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from ..exceptions import StoreError
from . import _codec as codec
from ._errors import error_code, map_dynamodb_errors
from ._migrate import layout_item

__all__ = ["table_spec", "create_table", "default_client", "DYNAMODB_CALL"]


#: DynamoDB answers a statebound request in milliseconds. botocore's defaults (60 s to
#: connect, 60 s to read) held a call to an endpoint that hangs past any Lambda function's
#: timeout (the function was killed, and API Gateway answered with its own bare 5xx) and past
#: a sweeper's claims. Here one attempt gives up within 8 s, two within 16 s; throttling is
#: retried by the store itself, with backoff (``DynamoStore(retries=...)``).
DYNAMODB_CALL = Config(connect_timeout=3, read_timeout=5, retries={"total_max_attempts": 2, "mode": "standard"})


def default_client() -> Any:
    """``boto3.client("dynamodb")`` with :data:`DYNAMODB_CALL`'s timeouts, and botocore's
    errors translated."""
    with map_dynamodb_errors():
        return boto3.client("dynamodb", config=DYNAMODB_CALL)


def table_spec(table_name: str) -> dict[str, Any]:
    """The ``create_table`` arguments of the statebound schema (for IaC tools too)."""
    def key(name: str, kind: str) -> dict[str, str]:
        return {"AttributeName": name, "KeyType": kind}

    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [key("pk", "HASH"), key("sk", "RANGE")],
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": kind}
            for name, kind in (("pk", "S"), ("sk", "S"), ("gsi_pk", "S"), ("gsi_due", "N"),
                               ("dead_pk", "S"), ("dead_sk", "S"))],
        "GlobalSecondaryIndexes": [
            {"IndexName": codec.DUE_INDEX, "KeySchema": [key("gsi_pk", "HASH"), key("gsi_due", "RANGE")],
             "Projection": {"ProjectionType": "ALL"}},
            {"IndexName": codec.DEAD_INDEX, "KeySchema": [key("dead_pk", "HASH"), key("dead_sk", "RANGE")],
             "Projection": {"ProjectionType": "ALL"}},
        ],
    }


def create_table(table_name: str, client: Any = None, *, wait: bool = True, timeout_s: float = 600.0) -> None:
    """Create the table with both indexes and TTL on ``expires_at``; idempotent.

    An existing table is accepted if it has the two indexes (else :class:`StoreError`).
    With ``wait``, returns once the table and its indexes are ``ACTIVE``, and a table this
    call created gets the layout marker (``_migrate.py``), so no sweeper ever has to look
    for 0.1 rows in it.
    """
    client = client if client is not None else default_client()
    with map_dynamodb_errors():
        created = True
        try:
            client.create_table(**table_spec(table_name))
        except ClientError as exc:
            # ResourceInUse: it exists (or is being created): idempotent by design
            if error_code(exc) != "ResourceInUseException":
                raise
            created = False
        if not wait:
            return   # not ACTIVE yet, so no marker: the first sweeper's one look writes it
        deadline = time.monotonic() + timeout_s
        client.get_waiter("table_exists").wait(
            TableName=table_name, WaiterConfig={"Delay": 2, "MaxAttempts": int(timeout_s // 2) + 1})
        while True:
            table = client.describe_table(TableName=table_name)["Table"]
            indexes = {g["IndexName"]: g.get("IndexStatus", "ACTIVE")
                       for g in table.get("GlobalSecondaryIndexes", [])}
            missing = {codec.DUE_INDEX, codec.DEAD_INDEX} - set(indexes)
            if missing:
                raise StoreError(f"table {table_name!r} exists without the index(es) "
                                 f"{sorted(missing)}; it was not created by statebound")
            if table["TableStatus"] == "ACTIVE" and all(s == "ACTIVE" for s in indexes.values()):
                break
            if time.monotonic() > deadline:
                raise StoreError(f"table {table_name!r} not ACTIVE after {timeout_s} s")
            time.sleep(2)
        ttl = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") == "DISABLED":
            client.update_time_to_live(TableName=table_name, TimeToLiveSpecification={
                "Enabled": True, "AttributeName": "expires_at"})
        if created:
            # Only a table this call made is known to hold no 0.1 row: an existing one (a
            # deploy script calling this at every start) may be a 0.1 table, and marking it
            # would hide its rows from the sweeper's look.
            client.put_item(TableName=table_name, Item=layout_item())
