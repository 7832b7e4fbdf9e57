"""The backend-agnostic Store contract, run against DynamoStore on in-process moto (``mock_aws``)."""

from __future__ import annotations

import pytest

from store_contract import StoreContract

from .helpers import make_store


class TestDynamoContract(StoreContract):
    """StoreContract on DynamoStore (in-process moto).

    ``claims_are_exclusive`` stays on: DynamoStore keeps claims in the store object
    ("soft claims"), so within one store, which is what these tests use, a claimed row is
    not handed out again until its lease runs out. Across processes the claim is not
    written; ``test_dynamo_server.py`` shows the commit condition keeps fires exactly-once.
    """

    claims_are_exclusive = True
    history_bounded_on_write = False   # TTL (expires_at) bounds history on DynamoDB

    @pytest.fixture
    def store(self, mock_client, table):
        return make_store(mock_client, table)

    @pytest.fixture
    def store_drop_done(self, mock_client, table):
        return make_store(mock_client, table, keep_done=False)
