"""Fixtures of the CLI tests: every store-touching command runs against SQLite **and**
against moto's server with the same assertions.

The DynamoDB case uses the serialised moto server of ``tests/dynamo/conftest.py`` (one
request at a time, so conditional writes are atomic as on DynamoDB), reached through a
``dynamodb://TABLE?region=...&endpoint_url=...`` store URL exactly as an operator would
write it, with a fresh table per test. Credentials are fake and no real AWS setting leaks in.
"""

from __future__ import annotations

import os
import uuid

import pytest

from dynamo.conftest import FAKE_CREDENTIALS, moto_endpoint  # noqa: F401  (the shared server fixture)
from dynamo.helpers import REGION, server_client
from statebound.dynamodb import DynamoStore


def _aws_env(monkeypatch):
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


def dynamo_url(endpoint: str, monkeypatch) -> str:
    """A fresh statebound table on the moto server, as a store URL."""
    _aws_env(monkeypatch)
    name = f"sb-cli-{uuid.uuid4().hex[:10]}"
    DynamoStore.create_table(name, server_client(endpoint))
    return f"dynamodb://{name}?region={REGION}&endpoint_url={endpoint}"


@pytest.fixture(params=["sqlite", "dynamodb"])
def store_url(request, tmp_path, monkeypatch):
    """The store URL of a fresh, empty store, set as ``$STATEBOUND_STORE``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATEBOUND_DB", raising=False)
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'cli.db'}"          # sqlite:////abs/path: four slashes
    else:
        url = dynamo_url(request.getfixturevalue("moto_endpoint"), monkeypatch)
    monkeypatch.setenv("STATEBOUND_STORE", url)
    return url
