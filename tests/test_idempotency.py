"""Idempotent inbound events: ``idempotency_key=`` on ``send``, ``start`` and ``Event``.

The key is recorded beside the position in the same commit as the event, so a repeat
applies nothing; a key reused for something else is refused; retention is the last N
keys per instance; and racing processes apply each key once (SQLite here; DynamoDB in
``tests/dynamo/test_dynamo_idempotency.py``).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

import statebound as sb
from statebound.exceptions import ConflictError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _idem_child import BAG  # noqa: E402
from test_host_concurrency import _collect, _release  # noqa: E402

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"'
COUNTER = f"""<scxml {NS} name="counter" initial="s">
  <datamodel><data id="n" expr="0"/><data id="last" expr="None"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/><assign location="last" expr="_event.data"/>
    </transition>
    <transition event="stop" target="end"/>
  </state>
  <final id="end"/>
</scxml>"""


@pytest.fixture(params=["sqlite", "memory"])
def host(request, tmp_path):
    store = sb.SQLiteStore(tmp_path / "idem.db") if request.param == "sqlite" else sb.MemoryStore()
    h = sb.Host([sb.Chart.from_scxml(COUNTER), sb.Chart.from_scxml(BAG)], store=store,
                clock=sb.ManualClock(1_700_000_000_000), idempotency_retention=3)
    h.start("counter", "c")
    yield h
    if hasattr(store, "close"):
        store.close()


def n(host) -> int:
    return host.get("c").datamodel["n"]


def test_a_repeated_key_applies_once_and_writes_nothing(host):
    first = host.send("c", "inc", {"amount": 5}, idempotency_key="req-17")
    commits = host.metrics["commits"]
    again = host.send("c", "inc", {"amount": 5}, idempotency_key="req-17")
    assert n(host) == 1 and host.metrics["commits"] == commits and host.metrics["duplicates"] == 1
    assert again == first                                 # nothing happened since: the same answer
    host.send("c", "inc", {"amount": 5}, idempotency_key="req-18")
    assert n(host) == 2


def test_a_key_with_data_too_deep_to_store_is_a_serialization_error(host):
    """It was a bare RecursionError out of host.send (the fingerprint recursed per level)."""
    deep: object = 1
    for _ in range(2_000):
        deep = [deep]
    version = host.store.load("c").version
    with pytest.raises(sb.SerializationError, match="nests too deeply"):
        host.send("c", "inc", {"d": deep}, idempotency_key="k-deep")
    assert host.store.load("c").version == version


def test_data_order_does_not_make_another_request(host):
    host.send("c", "inc", {"a": 1, "b": [1, {"x": 2, "y": 3}]}, idempotency_key="k")
    host.send("c", "inc", {"b": [1, {"y": 3, "x": 2}], "a": 1}, idempotency_key="k")
    assert n(host) == 1


@pytest.mark.parametrize("other", [("inc", {"amount": 6}), ("inc", None), ("stop", {"amount": 5})])
def test_a_key_reused_with_other_data_is_refused_and_writes_nothing(host, other):
    host.send("c", "inc", {"amount": 5}, idempotency_key="req-17")
    version = host.store.load("c").version
    with pytest.raises(sb.IdempotencyKeyReused) as err:
        host.send("c", other[0], other[1], idempotency_key="req-17")
    assert (err.value.instance_id, err.value.key) == ("c", "req-17")
    assert "already used on instance 'c'" in str(err.value)
    assert host.store.load("c").version == version and n(host) == 1


def test_an_event_carries_its_own_key(host):
    host.send("c", sb.Event("inc", {"x": 1}, idempotency_key="e-1"))
    host.send("c", sb.Event("inc", {"x": 1}, idempotency_key="e-1"))
    host.send("c", "inc", {"x": 1}, idempotency_key="e-1")            # the same request either way
    assert n(host) == 1
    assert host.get("c").datamodel["last"] == {"x": 1}
    with pytest.raises(ValueError, match="another idempotency key"):
        host.send("c", sb.Event("inc", idempotency_key="a"), idempotency_key="b")


def test_a_repeat_after_the_event_halted_the_instance_returns_its_position(host):
    host.send("c", "stop", idempotency_key="stop-1")
    assert host.send("c", "stop", idempotency_key="stop-1").status == "done"
    with pytest.raises(sb.NotRunning):
        host.send("c", "stop", idempotency_key="stop-2")


def test_retention_keeps_the_last_n_keys(host):
    for k in ("a", "b", "c", "d"):
        host.send("c", "inc", idempotency_key=k)
    assert [r.key for r in host.store.load("c").idempotency] == ["b", "c", "d"]
    host.send("c", "inc", idempotency_key="d")
    assert n(host) == 4
    host.send("c", "inc", idempotency_key="a")      # forgotten: applied again, as documented
    assert n(host) == 5
    assert [r.key for r in host.store.load("c").idempotency] == ["c", "d", "a"]


def test_keys_are_checked(host):
    for bad in ("", 42, "x" * 257):
        with pytest.raises(ValueError, match="idempotency key"):
            host.send("c", "inc", idempotency_key=bad)
    with pytest.raises(sb.SerializationError):
        host.send("c", "inc", {"x": object()}, idempotency_key="k")
    assert n(host) == 0


def test_start_with_a_key_is_safe_to_retry(host):
    pos = host.start("counter", "s1", {"n": 7}, idempotency_key="create-s1")
    assert host.start("counter", "s1", {"n": 7}, idempotency_key="create-s1") == pos
    with pytest.raises(sb.IdempotencyKeyReused):
        host.start("counter", "s1", {"n": 8}, idempotency_key="create-s1")
    with pytest.raises(sb.IdempotencyKeyReused):
        host.start("bag", "s1", {"n": 7}, idempotency_key="create-s1")
    with pytest.raises(sb.InstanceExists):
        host.start("counter", "s1", {"n": 7})
    with pytest.raises(sb.InstanceExists):
        host.start("counter", "s1", {"n": 7}, idempotency_key="another")
    assert host.get("s1").datamodel["n"] == 7 and host.store.load("s1").version == 1


def test_threads_racing_one_key_apply_it_once(tmp_path):
    """Eight threads, each with its own SQLiteStore on one file, send one key at once."""
    path = tmp_path / "race.db"
    seed = sb.SQLiteStore(path)
    sb.Host([sb.Chart.from_scxml(COUNTER)], store=seed).start("counter", "c")
    barrier = threading.Barrier(8)
    results: list[str] = []

    def racer():
        store = sb.SQLiteStore(path)
        host = sb.Host([sb.Chart.from_scxml(COUNTER)], store=store)
        barrier.wait()
        host.send("c", "inc", idempotency_key="once")
        results.append("duplicate" if host.metrics.get("duplicates") else "applied")
        store.close()
    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert Counter(results) == {"applied": 1, "duplicate": 7}
    assert sb.Host([sb.Chart.from_scxml(COUNTER)], store=seed).get("c").datamodel["n"] == 1
    seed.close()


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "_idem_child.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_four_processes_200_sends_of_50_keys_apply_exactly_50_on_sqlite(tmp_path, capsys):
    db = str(tmp_path / "idem.db")
    go = str(tmp_path / "go")
    store = sb.SQLiteStore(db)
    host = sb.Host([sb.Chart.from_scxml(BAG)], store=store)
    host.start("bag", "c")
    procs = [_spawn("sqlite", db, go, str(seed), "200", "50") for seed in range(4)]
    _release(go, procs)
    results = _collect(procs)
    keys = host.get("c").datamodel["keys"]
    assert sorted(keys) == sorted(f"k{i}" for i in range(50))     # each of the 50, exactly once
    assert sum(r["applied"] for r in results) == 50
    assert sum(r["duplicates"] for r in results) == 750
    assert store.load("c").version == 51                            # one commit per applied key
    with capsys.disabled():
        print(f"\nSQLite, 4 x 200 keyed sends of 50 keys: 50 applied, 750 repeats, "
              f"{sum(r['conflicts'] for r in results)} conflicts retried")
    store.close()


def test_a_conflict_that_outlasts_the_retries_is_still_applied_once(tmp_path):
    """A caller that gives up on ConflictError and retries the same key cannot double-apply."""
    store = sb.MemoryStore()
    host = sb.Host([sb.Chart.from_scxml(COUNTER)], store=store, max_conflict_retries=1)
    host.start("counter", "c")
    orig = store.commit
    calls = {"n": 0}

    def commit_then_lose(c):
        orig(c)                   # the write lands, but the answer is lost
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConflictError("timed out; did it land?", "c", None)
    store.commit = commit_then_lose
    with pytest.raises(ConflictError):
        host.send("c", "inc", idempotency_key="k")
    host.send("c", "inc", idempotency_key="k")                 # the client's retry
    assert host.get("c").datamodel["n"] == 1
