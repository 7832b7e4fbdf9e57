"""Runs the backend-agnostic Store contract against MemoryStore and SQLiteStore."""

from __future__ import annotations

import pytest

from statebound.host.memory import MemoryStore
from statebound.host.sqlite import SQLiteStore
from store_contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore()

    @pytest.fixture
    def store_drop_done(self):
        return MemoryStore(keep_done=False)


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        with SQLiteStore(tmp_path / "contract.db") as store:
            yield store

    @pytest.fixture
    def store_drop_done(self, tmp_path):
        with SQLiteStore(tmp_path / "contract-drop.db", keep_done=False) as store:
            yield store
