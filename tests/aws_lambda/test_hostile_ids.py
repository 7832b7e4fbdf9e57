"""Adversarial instance ids through the HTTP handler, with the sweeper running on shard
leases (the template's setting): every id either gets a 400 before any request, or works
like any other id, start to fired timer; and the sweeper never crashes.

The store's half (internal items in a key space no id reaches) is tested in
tests/dynamo/; this is the half a caller on the public API can reach.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from statebound.dynamodb import MAX_INSTANCE_ID_BYTES

from .harness import TABLE, count_requests

RESERVED_LOOKING = ["lease#members", "lease#0", "lease#15", "sweep#0", "sweep#15", "cursor#0", "cursor#3", "#", "##",
                    "P", "T#00000000000000000001", "N#node", "dead", "due-index", "C", "L"]

ids = st.one_of(
    st.sampled_from(RESERVED_LOOKING),
    st.builds(lambda prefix, rest: prefix + rest,
              st.sampled_from(["lease#", "cursor#", "sweep#", "#", "::", "N#", "T#", "x::", ""]), st.text(max_size=12)),
    st.text(min_size=1, max_size=24),                                  # any Unicode, controls included
    st.integers(330, 345).map(lambda n: "€" * n),                      # 3-byte chars across the 1,000-byte limit
    st.integers(245, 260).map(lambda n: "😀" * n),                     # 4-byte chars across 1,000 and 1,024 bytes
    st.integers(508, 516).map(lambda n: "x" * n),                      # the host's 512-character limit
)


@pytest.fixture()
def few_shards(lam, monkeypatch):
    """Four due-index shards instead of 16: the same lease logic, a quarter of moto's queries."""
    monkeypatch.setenv("DUE_SHARDS", "4")
    lam.rebuild()
    return lam


def _encodable(iid: str) -> bool:
    try:
        iid.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(iid=ids)
@example(iid="lease#members")   # the takeover: every leased sweep used to crash after it
@example(iid="sweep#0")
@example(iid="cursor#0")
@example(iid="a::b")
@example(iid="😀" * 250)        # exactly 1,000 bytes
@example(iid="😀" * 256)        # 1,024 bytes: DynamoDB's sort-key limit
@example(iid="\ud800")
def test_a_hostile_id_is_a_400_or_works_and_the_sweeper_survives(few_shards, monkeypatch, iid):
    lam = few_shards
    monkeypatch.setenv("SWEEP_LEASES", "1")
    with count_requests(lam.client) as calls:
        status, body = lam.call("POST", "/instances/x", {"chart": "order", "data": {"payment_timeout": "1s"}},
                                instance_id=iid)
    fits = bool(iid) and _encodable(iid) and len(iid.encode("utf-8")) <= MAX_INSTANCE_ID_BYTES and len(iid) <= 512
    if status == 400:
        assert calls == [] and body["error"]          # refused before any request: nothing written
        assert not fits or "::" in iid or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in iid)
    else:
        assert fits and status in (201, 409), body    # 409: hypothesis drew an id it had already started
        status, body = lam.call("GET", "/instances/x", instance_id=iid)
        assert status == 200 and body["id"] == iid
        if body["configuration"] == ["Pending"]:
            status, body = lam.call("POST", "/instances/x/events", {"event": "StartPayment"}, instance_id=iid)
            assert status == 200 and body["timeouts"][0]["name"] == "PaymentTimeout"
    lam.clock.advance(1_000)
    report = lam.sweep(8_000, 2_000)                  # raises if the sweeper crashes
    assert report["failed"] == 0 and report["shards"] == lam.host.store.shards
    if status != 400:
        assert lam.call("GET", "/instances/x", instance_id=iid)[1]["configuration"] in (["Overdue"], ["Cancelled"])
    # lease items (sk L) and membership heartbeats (sk N#...), as opposed to instances named lease#...
    leases = lam.client.scan(TableName=TABLE, FilterExpression="begins_with(pk, :p) AND (sk = :l OR begins_with(sk, :n))",
                             ExpressionAttributeValues={":p": {"S": "lease#"}, ":l": {"S": "L"}, ":n": {"S": "N#"}})
    assert leases["Items"] == []                      # every lease given back
