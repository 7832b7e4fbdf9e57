"""A deleted instance leaves a tombstone; a new one under its id goes on from it (ADR 0028).

The cases are in ``tombstone_cases.py``; here they run on the MemoryStore and SQLite
(``tests/dynamo/test_dynamo_tombstone.py`` runs them on DynamoDB).
"""

from __future__ import annotations

import pytest

import statebound as sb
import tombstone_cases as cases
from statebound.host import tombstone
from statebound.host.store import DELETED, PositionRecord

CASES = [cases.a_claim_from_before_the_delete_never_fires_into_the_new_instance,
         cases.a_new_instance_never_repeats_a_key_or_token_of_the_old,
         cases.a_call_that_loaded_the_old_instance_never_writes_over_the_new,
         cases.a_deleted_instance_is_gone_to_every_reader,
         cases.a_child_invoked_again_in_one_call_never_repeats_the_old_childs_keys_or_rows]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_delete_and_start_again(store, case):
    case(store)


def test_history_of_a_deleted_instance_is_not_the_new_ones(tmp_path):
    with sb.SQLiteStore(tmp_path / "h.db") as store:
        host = sb.Host([sb.Chart.from_scxml(cases.TICKS)], store=store, clock=sb.ManualClock(cases.T0),
                       history=True)
        host.start("c", "x", {"owner": "alice"})
        host.send("x", "inc")
        host.delete("x")
        host.start("c", "x", {"owner": "bob"})
        records = store.history("x")
        assert [r.kind for r in records] == ["start"]
        assert records[0].version == store.load("x").version
        assert host.replay("x").identical


def test_a_damaged_tombstone_is_a_store_error_not_a_fresh_start():
    rec = PositionRecord("x", "c", 4, b"not a tombstone", DELETED)
    with pytest.raises(sb.StoreError, match="damaged"):
        tombstone.last_ordinal(rec)
    assert tombstone.last_ordinal(PositionRecord("x", "c", 4, tombstone.blob(17), DELETED)) == 17
    assert tombstone.last_ordinal(PositionRecord("x", "c", 4, b"SB\x00P...", "running")) == 0
