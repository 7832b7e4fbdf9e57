"""Fixtures for the built-in AWS processors: moto in-process (``mock_aws``), never real AWS.

SQS is emulated in full (FIFO deduplication included). EventBridge and Lambda are API
surfaces only (``shared/notes/moto.md``): moto routes an event to an SQS rule target,
and with ``use_docker`` off it answers every Lambda invoke by echoing the payload,
running no code. Tests of a function's own result or error therefore use botocore's
``Stubber`` on a client and say so.
"""

from __future__ import annotations

import os

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from .helpers import REGION  # noqa: E402


@pytest.fixture
def aws(monkeypatch):
    """moto's in-process mock, with a region and fake credentials, and no real AWS settings."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    with moto.mock_aws(config={"lambda": {"use_docker": False}}):
        yield


@pytest.fixture
def client(aws):
    """A client factory inside the mock: ``client("sqs")``."""
    return lambda service: boto3.client(service, region_name=REGION)
