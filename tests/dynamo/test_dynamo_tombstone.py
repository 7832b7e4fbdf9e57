"""Delete and start again under the same id, on DynamoDB (in-process moto): ADR 0028's cases
(``tests/tombstone_cases.py``), which the memory and SQLite stores run in ``tests/test_tombstone.py``."""

from __future__ import annotations

import pytest

import tombstone_cases as cases

CASES = [cases.a_claim_from_before_the_delete_never_fires_into_the_new_instance,
         cases.a_new_instance_never_repeats_a_key_or_token_of_the_old,
         cases.a_call_that_loaded_the_old_instance_never_writes_over_the_new,
         cases.a_deleted_instance_is_gone_to_every_reader]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_delete_and_start_again(dstore, case):
    case(dstore)
