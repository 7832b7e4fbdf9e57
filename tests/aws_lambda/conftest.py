"""The ``lam`` fixture for the examples/lambda tests (see harness.py)."""

from __future__ import annotations

import pytest

from .harness import lambda_env


@pytest.fixture()
def lam(monkeypatch):
    yield from lambda_env(monkeypatch)
