"""Delete and start again under the same id, on DynamoDB (in-process moto): ADR 0028's cases
(``tests/tombstone_cases.py``), which the memory and SQLite stores run in ``tests/test_tombstone.py``."""

from __future__ import annotations

import pytest

import tombstone_cases as cases

CASES = [cases.a_claim_from_before_the_delete_never_fires_into_the_new_instance,
         cases.a_new_instance_never_repeats_a_key_or_token_of_the_old,
         cases.a_call_that_loaded_the_old_instance_never_writes_over_the_new,
         cases.a_deleted_instance_is_gone_to_every_reader,
         cases.a_child_invoked_again_in_one_call_never_repeats_the_old_childs_keys_or_rows]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_delete_and_start_again(dstore, case):
    case(dstore)


def test_a_deletes_history_purge_leaves_a_new_instances_records(dstore, monkeypatch):
    # the purge runs after the delete's commit; a new instance started over the tombstone in
    # between lost its own records with the old one's ("an erasure" of the wrong instance)
    import statebound as sb
    from statebound.dynamodb import _operator
    chart = sb.Chart.from_scxml(cases.TICKS)
    a = sb.Host([chart], store=dstore, clock=sb.ManualClock(cases.T0), history=True)
    b = sb.Host([chart], store=dstore, clock=sb.ManualClock(cases.T0), history=True)
    a.start("c", "x")
    a.send("x", "inc")
    real = _operator.purge_history

    def purge_later(store, iid, *args):
        b.start("c", "x")          # another host takes the id between the commit and the purge
        b.send("x", "inc")
        return real(store, iid, *args)
    monkeypatch.setattr(_operator, "purge_history", purge_later)
    a.delete("x")
    monkeypatch.setattr(_operator, "purge_history", real)
    assert [r.kind for r in dstore.history("x")] == ["start", "event"]
    assert b.replay("x").identical
