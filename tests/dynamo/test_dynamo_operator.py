"""DynamoStore's operator reads (``_operator.py``) on in-process moto: which requests they
send. ``due_timers`` reads the due index, never the table; ``purge_done`` is the one
documented table scan."""

from __future__ import annotations

import pytest

from statebound.host.store import Commit, TimerCompletion

from store_contract import put, timer

from .helpers import make_store


class Requests:
    """(operation, IndexName) of every request a client sends."""

    def __init__(self, client):
        self.seen: list[tuple[str, str | None]] = []
        self._client = client
        client.meta.events.register("provide-client-params.dynamodb", self._record)

    def _record(self, params, model, **kwargs):
        self.seen.append((model.name, params.get("IndexName")))

    def take(self):
        seen, self.seen = self.seen, []
        return seen

    def close(self):
        self._client.meta.events.unregister("provide-client-params.dynamodb", self._record)


@pytest.fixture
def requests_(mock_client):
    rec = Requests(mock_client)
    yield rec
    rec.close()


def test_due_timers_queries_each_shard_of_the_due_index_once(mock_client, table, requests_):
    store = make_store(mock_client, table, shards=4)
    # 40 rows, one every 2.5 s, over 100 s
    put(store, *[timer(f"i{n}", 1, 2_500 * n) for n in range(40)])
    requests_.take()
    assert [r.due_at_ms for r in store.due_timers(10_000)] == [0, 2_500, 5_000, 7_500, 10_000]
    assert requests_.take() == [("Query", "due-index")] * 4   # one per shard, whatever the window
    assert [r.due_at_ms for r in store.due_timers(20_000)] == [2_500 * n for n in range(9)]
    assert [r.due_at_ms for r in store.due_timers(3_600_000)] == [2_500 * n for n in range(40)]
    assert requests_.take() == [("Query", "due-index")] * 8
    # a limit stops the reading early
    assert [r.due_at_ms for r in store.due_timers(20_000, limit=2)] == [0, 2_500]
    # rows a sweep completed leave the index, and the listing
    store.commit(Commit(complete=TimerCompletion(("i0", 1), "fired")))
    assert [r.instance_id for r in store.due_timers(3_000)] == ["i1"]


def test_purge_done_is_the_documented_table_scan(mock_client, table, requests_):
    store = make_store(mock_client, table)
    put(store, timer("a", 1, 10), timer("a", 2, 20))
    store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
    requests_.take()
    assert store.purge_done(100) == 1
    assert requests_.take() == [("Scan", None), ("DeleteItem", None)]


# ----------------------------------------------------------------------------- history


class Items:
    """The TransactItems of every TransactWriteItems a client sends."""

    def __init__(self, client):
        self.transactions: list[list[dict]] = []
        self.ops: list[str] = []
        self._client = client
        client.meta.events.register("provide-client-params.dynamodb", self._record)

    def _record(self, params, model, **kwargs):
        self.ops.append(model.name)
        if model.name == "TransactWriteItems":
            self.transactions.append(params["TransactItems"])

    def close(self):
        self._client.meta.events.unregister("provide-client-params.dynamodb", self._record)


def test_history_costs_one_more_put_in_the_same_transaction(mock_client, table):
    from pathlib import Path

    import statebound as sb
    order = sb.Chart.from_file(Path(__file__).resolve().parents[2] / "examples" / "order" / "order.scxml")
    store = make_store(mock_client, table)
    plain = sb.Host([order], store=store, clock=sb.ManualClock(now_ms=10_000))
    recording = sb.Host([order], store=store, clock=sb.ManualClock(now_ms=10_000), history_ttl_s=3_600)
    plain.start("order", "p")
    recording.start("order", "h")
    rec = Items(mock_client)
    try:
        plain.send("p", "Cancel")                      # no timer changes: one conditional PutItem
        assert rec.ops == ["GetItem", "PutItem"] and rec.transactions == []
        rec.ops.clear()
        recording.send("h", "Cancel")                  # the same event, recorded: a 2-item transaction
        assert rec.ops == ["GetItem", "TransactWriteItems"]
        [items] = rec.transactions
        assert [next(iter(a)) for a in items] == ["Put", "Put"]
        position, record = (a["Put"]["Item"] for a in items)
        assert position["sk"] == {"S": "P"} and record["sk"] == {"S": "H#00000000000000000002"}
        assert record["expires_at"] == {"N": str((10_000 + 3_600_000) // 1000)}   # TTL, in seconds
    finally:
        rec.close()
    assert [r.kind for r in store.history("h")] == ["start", "event"]
    assert store.history("p") == []
    assert recording.replay("h").identical


def test_a_host_without_history_still_deletes_an_instances_history(mock_client, table):
    """In-process moto: one host records history, another (without history=) deletes the
    instance. The records stayed, and a new instance of the same id read them as its own,
    the old event data (a card number) included: an erasure that kept the data."""
    import statebound as sb
    chart = sb.Chart.from_scxml("<scxml xmlns=\"http://www.w3.org/2005/07/scxml\" name=\"c\" initial=\"s\" datamodel=\"python\"><state id=\"s\"><transition event=\"go\"/></state></scxml>")
    store = make_store(mock_client, table)
    recording = sb.Host([chart], store=store, history=True)
    plain = sb.Host([chart], store=store)
    recording.start("c", "x")
    recording.send("x", "go", {"card": "4111111111111111"})
    assert len(store.history("x")) == 2
    plain.delete("x")
    assert store.history("x") == []
    recording.start("c", "x")
    assert [r.kind for r in store.history("x")] == ["start"] and recording.replay("x").identical


def test_a_record_too_large_for_an_item_is_kept_without_its_data(mock_client, table):
    import statebound as sb
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="big" initial="s"
      datamodel="python"><state id="s"><transition event="go"/></state></scxml>''')
    store = make_store(mock_client, table)
    host = sb.Host([chart], store=store, history=True)
    host.start("big", "b")
    host.send("b", "go", {"blob": "x" * 420_000})      # the event is delivered, its record is too big...
    host.send("b", "go", {"blob": "y" * 420_000})
    records = store.history("b")
    assert [r.call.get("truncated") for r in records] == [None, True, True]
    assert records[1].steps[0]["event"]["data"] is None and records[1].steps[0]["event"]["name"] == "go"
    report = host.replay("b")                          # ...so replay says it cannot, rather than guess
    assert not report.identical and "without its data" in report.reason


def test_a_caller_context_carried_by_every_step_never_makes_an_event_fail(mock_client, table):
    """Every step of a call records its caller_context, and sends to self carry it again:
    150 KB of context and two sends made a record the truncation (event data only) left
    over the item limit, and DynamoDB refused the whole commit: the event failed, and a
    timer carrying such a context was parked as dead."""
    import statebound as sb
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
      name="fan" initial="s"><datamodel><data id="n" expr="0"/></datamodel><state id="s">
      <transition event="go"><send event="a"/><send event="b"/></transition>
      <transition event="a"><assign location="n" expr="n + 1"/></transition>
      <transition event="b"><assign location="n" expr="n + 1"/></transition></state></scxml>''')
    store = make_store(mock_client, table)
    host = sb.Host([chart], store=store, history=True)
    host.start("fan", "f")
    assert host.send("f", "go", caller_context={"trace": "x" * 150_000}).datamodel["n"] == 2
    assert host.get("f").datamodel["n"] == 2
    last = store.history("f")[-1]
    assert last.call.get("truncated") is True and last.call.get("op") == "send"
    assert not host.replay("f").identical


def test_a_record_of_thousands_of_steps_is_kept_as_a_truncated_stub(mock_client, table):
    import statebound as sb
    chart = sb.Chart.from_scxml('''<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
      name="loop" initial="s"><datamodel><data id="n" expr="0"/></datamodel><state id="s">
      <transition event="go"><foreach array="list(range(3000))" item="k"><send event="a"/></foreach></transition>
      <transition event="a"><assign location="n" expr="n + 1"/></transition></state></scxml>''')
    store = make_store(mock_client, table)
    host = sb.Host([chart], store=store, history=True, max_deliveries=10_000)
    host.start("loop", "l")
    assert host.send("l", "go", caller_context={"t": "y" * 100}).datamodel["n"] == 3000
    last = store.history("l")[-1]
    assert last.call == {"op": "send", "instance": "l", "truncated": True} and last.steps == ()
