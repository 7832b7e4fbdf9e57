"""The boto3 clients the AWS processors (and the SQS wake-ups) build when given none."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

__all__ = ["QUICK_CALL", "quick_client"]

#: A send to SQS or EventBridge, or an asynchronous Lambda invoke, answers in milliseconds.
#: botocore's defaults (60 s to connect, 60 s to read, up to 5 attempts) would hold a host
#: call that hands an outbox row over after its commit for minutes, and outlast the row's
#: 30 s claim, so that a sweeper sends the row again meanwhile. Here an attempt gives up
#: within 16 s at worst (2 x (3 + 5)); a delivery that gives up is not lost: its row is
#: retried with backoff, and the receiver dedups on the idempotency key.
QUICK_CALL = Config(connect_timeout=3, read_timeout=5, retries={"total_max_attempts": 2, "mode": "standard"})


def quick_client(service: str, region: str | None = None) -> Any:
    """``boto3.client(service)`` with :data:`QUICK_CALL`'s timeouts and retries."""
    if region:
        return boto3.client(service, region_name=region, config=QUICK_CALL)
    return boto3.client(service, config=QUICK_CALL)
