"""The Store contract, as tests any backend must pass.

``StoreContract`` is a plain class (pytest does not collect it). A backend's test module
subclasses it as ``Test<Backend>`` and provides the fixtures:

* ``store`` (required): a fresh, empty store with ``keep_done=True``;
* ``store_drop_done`` (optional): a fresh store that deletes rows on completion
  (``keep_done=False``); the tests that need it skip when it is not overridden.

Capability flags a subclass may turn off:

* ``claims_are_exclusive``: ``claim_due`` writes a claim (``claimed_by``, lease) so that
  another node cannot claim the row until the lease runs out. The protocol lets a backend
  whose commit already guards the fire (DynamoDB) skip that write.

Nothing here knows about a particular backend: time is passed in explicitly, and the
only assertions are on the :class:`~statebound.host.store.Store` methods' results.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebound.exceptions import ConflictError, InvalidArgument, InvalidInstanceId
from statebound.host.store import (CANCEL, CLAIMED, DEAD, DONE, INVOKE, PENDING, SEND, SUSPENDED, TIMER, WAITING,
                                   BatchStore, Commit, KeyRecord, PositionWrite, Store, TimerCompletion, TimerRef,
                                   TimerRow)

__all__ = ["StoreContract", "create", "update", "delete", "timer", "put", "hostile_ids",
           "PORTABLE_ID_BYTES"]

#: Every store keys any non-empty, valid-Unicode id up to this many UTF-8 bytes; a store
#: may accept longer ones (SQLite, memory) or refuse them (DynamoDB's key limits).
PORTABLE_ID_BYTES = 1_000

# Names that internal records of some backend use or used, and pieces of key syntax.
_RESERVED_LOOKING = ["lease#members", "lease#0", "lease#1", "lease#board", "sweep#0", "sweep#3",
                     "cursor#0", "dead", "dead#0", "due#0", "0#0", "P", "T#00000000000000000001",
                     "C", "L", "N#node", "meta", "schema_version", "cli#charts", "R#order", "history",
                     "H#00000000000000000001"]
_FRAGMENTS = ["#", "::", "lease#", "sweep#", "cursor#", "members", "N#", "T#", "H#", "P", "\x1f", "\x00",
              "/", "%23", " ", "'", '"', ";", "--", "é", "€", "😀", "\u202e", "\ufeff"]


def _of_bytes(target: int, char: str) -> str:
    """An id of ``char`` repeated to as near ``target`` UTF-8 bytes as the width allows."""
    return char * max(1, target // len(char.encode()))


def hostile_ids() -> st.SearchStrategy[str]:
    """Instance ids an attacker or an unlucky user could send: internal-looking names, key
    syntax, unicode, control characters, lone surrogates, and lengths around the 1,000-,
    1,024- and 2,048-byte edges."""
    return st.one_of(
        st.sampled_from(_RESERVED_LOOKING),
        st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), min_size=1,
                 max_size=6).map("".join),
        st.text(max_size=40),
        st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
        st.builds(_of_bytes, st.one_of(st.integers(990, 1010), st.integers(1018, 1030),
                                       st.integers(2040, 2052)),
                  st.sampled_from(["x", "é", "€", "😀"])),
    )


def portable(instance_id: str) -> bool:
    """Whether every store must accept this id (see :data:`PORTABLE_ID_BYTES`)."""
    try:
        return 0 < len(instance_id.encode()) <= PORTABLE_ID_BYTES
    except UnicodeEncodeError:
        return False


def create(store, iid, *, blob=b"blob-1", status="running", timers=(), chart="chart",
           parent=None, timers_put=()):
    """Create ``iid`` (expected version ``None``), optionally with timer rows."""
    store.commit(Commit(writes=(PositionWrite(iid, chart, None, blob, status, tuple(timers),
                                              parent),), timers_put=tuple(timers_put)))


def update(iid, expected, *, blob=b"blob-n", status="running", timers=(), chart="chart",
           parent=None):
    """A PositionWrite replacing ``iid`` at ``expected`` version."""
    return PositionWrite(iid, chart, expected, blob, status, tuple(timers), parent)


def delete(iid, expected):
    """A PositionWrite deleting ``iid`` (and purging its timer rows)."""
    return PositionWrite(iid, "chart", expected, None, "cancelled")


def timer(iid, ordinal, due, **kw):
    """A pending TimerRow with plausible defaults."""
    kw.setdefault("target_id", iid)
    kw.setdefault("send_id", f"send-{ordinal}")
    kw.setdefault("event", {"name": f"tick.{ordinal}", "data": {"n": ordinal}})
    return TimerRow(instance_id=iid, ordinal=ordinal, due_at_ms=due, **kw)


def put(store, *rows):
    """Commit timer rows on their own."""
    store.commit(Commit(timers_put=tuple(rows)))


def keys(rows):
    """The keys of some rows, in order."""
    return [r.key for r in rows]


class StoreContract:
    """Backend-agnostic tests of the Store protocol (see the module docstring)."""

    claims_are_exclusive = True
    #: the backend drops history records past ``Commit.history_keep`` and past their
    #: ``expires_at_ms`` as it writes (DynamoDB leaves both to TTL)
    history_bounded_on_write = True

    @pytest.fixture
    def store_drop_done(self):
        """Override to return a ``keep_done=False`` store."""
        pytest.skip("this backend's tests provide no keep_done=False store")

    def _needs_exclusive_claims(self):
        if not self.claims_are_exclusive:
            pytest.skip("backend does not write claims")

    # ------------------------------------------------------------------ positions

    def test_is_a_store(self, store):
        assert isinstance(store, Store)

    def test_load_missing_is_none(self, store):
        assert store.load("nope") is None

    def test_create_round_trips_every_field_at_version_1(self, store):
        refs = (TimerRef(3, "s3"), TimerRef(7, "s7", "payment_timeout"))
        blob = bytes(range(256))  # NULs and high bytes must survive
        create(store, "order-1", blob=blob, status="running", timers=refs, chart="order",
               parent="parent-9")
        rec = store.load("order-1")
        assert rec.instance_id == "order-1"
        assert rec.chart == "order"
        assert rec.version == 1
        assert rec.blob == blob
        assert rec.status == "running"
        assert rec.timers == refs
        assert rec.parent == "parent-9"

    def test_update_increments_version_and_replaces_fields(self, store):
        create(store, "a")
        store.commit(Commit(writes=(update("a", 1, blob=b"two", status="done", chart="other",
                                           timers=(TimerRef(1, "x"),), parent="p"),)))
        rec = store.load("a")
        assert (rec.version, rec.blob, rec.status, rec.chart, rec.parent) == (
            2, b"two", "done", "other", "p")
        assert rec.timers == (TimerRef(1, "x"),)
        store.commit(Commit(writes=(update("a", 2, blob=b"three"),)))
        rec = store.load("a")
        assert (rec.version, rec.blob, rec.timers, rec.parent) == (3, b"three", (), None)

    def test_stale_version_conflicts_and_writes_nothing(self, store):
        create(store, "a", timers_put=[timer("a", 1, 100), timer("a", 2, 200)])
        store.commit(Commit(writes=(update("a", 1, blob=b"v2"),)))
        before = [store.get_timer(("a", 1)), store.get_timer(("a", 2))]
        stale = Commit(writes=(update("a", 1, blob=b"stale"),),
                       timers_put=(timer("a", 3, 300),), timers_delete=(("a", 1),),
                       complete=TimerCompletion(("a", 2), "fired"))
        with pytest.raises(ConflictError) as err:
            store.commit(stale)
        assert err.value.instance_id == "a"
        assert err.value.current in (None, 2)
        rec = store.load("a")
        assert (rec.version, rec.blob) == (2, b"v2")
        assert store.get_timer(("a", 3)) is None
        assert [store.get_timer(("a", 1)), store.get_timer(("a", 2))] == before

    def test_update_of_missing_instance_conflicts(self, store):
        with pytest.raises(ConflictError):
            store.commit(Commit(writes=(update("ghost", 1),), timers_put=(timer("ghost", 1, 5),)))
        assert store.load("ghost") is None
        assert store.get_timer(("ghost", 1)) is None

    def test_create_of_existing_conflicts_and_writes_nothing(self, store):
        create(store, "a", blob=b"first")
        with pytest.raises(ConflictError) as err:
            store.commit(Commit(writes=(PositionWrite("a", "chart", None, b"second", "running"),),
                                timers_put=(timer("a", 1, 10),)))
        assert err.value.instance_id == "a"
        rec = store.load("a")
        assert (rec.version, rec.blob) == (1, b"first")
        assert store.get_timer(("a", 1)) is None

    def test_one_commit_writes_several_positions(self, store):
        create(store, "parent")
        store.commit(Commit(writes=(update("parent", 1, blob=b"p2"),
                                    PositionWrite("child", "c", None, b"c1", "running",
                                                  parent="parent"))))
        assert store.load("parent").version == 2
        assert store.load("child").parent == "parent"

    def test_conflict_on_any_write_writes_none_of_them(self, store):
        create(store, "a")
        create(store, "b")
        with pytest.raises(ConflictError):
            store.commit(Commit(writes=(update("a", 1, blob=b"new-a"), update("b", 7))))
        assert store.load("a").version == 1
        assert store.load("a").blob == b"blob-1"

    def test_delete_purges_its_timers_and_only_its_timers(self, store):
        create(store, "a", timers_put=[timer("a", 1, 10), timer("a", 2, 20)])
        create(store, "b", timers_put=[timer("b", 1, 10, target_id="a")])
        # a done row of "a" is purged too
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
        store.commit(Commit(writes=(delete("a", 1),)))
        assert store.load("a") is None
        assert store.get_timer(("a", 1)) is None
        assert store.get_timer(("a", 2)) is None
        assert store.pending_timers("a") == []
        assert keys(store.pending_timers("b")) == [("b", 1)]
        assert store.load("b").version == 1

    def test_delete_with_stale_version_conflicts(self, store):
        create(store, "a", timers_put=[timer("a", 1, 10)])
        with pytest.raises(ConflictError):
            store.commit(Commit(writes=(delete("a", 5),)))
        assert store.load("a").version == 1
        assert store.get_timer(("a", 1)) is not None

    def test_idempotency_keys_round_trip_and_each_write_replaces_them(self, store):
        keys1 = (KeyRecord("req-1", bytes(range(16))), KeyRecord("réq-2", b"\x00" * 16))
        store.commit(Commit(writes=(PositionWrite("a", "chart", None, b"b", "running",
                                                  idempotency=keys1),)))
        assert store.load("a").idempotency == keys1
        keys2 = (keys1[1], KeyRecord("req-3", b"\xff" * 16))
        store.commit(Commit(writes=(PositionWrite("a", "chart", 1, b"b2", "running",
                                                  idempotency=keys2),)))
        assert store.load("a").idempotency == keys2
        store.commit(Commit(writes=(update("a", 2),)))
        assert store.load("a").idempotency == ()

    def test_stale_write_keeps_the_recorded_keys(self, store):
        # Two racers with one key: the loser's write fails, so the winner's key stays.
        won = (KeyRecord("k", b"1" * 16),)
        store.commit(Commit(writes=(PositionWrite("a", "chart", None, b"b", "running"),)))
        store.commit(Commit(writes=(PositionWrite("a", "chart", 1, b"w", "running", idempotency=won),)))
        with pytest.raises(ConflictError):
            store.commit(Commit(writes=(PositionWrite("a", "chart", 1, b"l", "running",
                                                      idempotency=(KeyRecord("k", b"2" * 16),)),)))
        assert store.load("a").idempotency == won

    def test_deleted_id_can_be_created_again(self, store):
        create(store, "a")
        store.commit(Commit(writes=(delete("a", 1),)))
        create(store, "a", blob=b"again")
        assert (store.load("a").version, store.load("a").blob) == (1, b"again")

    def test_a_tombstone_purges_rows_and_history_is_not_listed_and_is_written_over(self, store):
        # ADR 0028: the host deletes by writing a tombstone (status DELETED); the next
        # instance of the id is an update of it, so versions go on
        from statebound.host.store import DELETED
        create(store, "a", timers_put=[timer("a", 1, 10)])
        create(store, "b")
        store.commit(Commit(writes=(PositionWrite("a", "chart", 1, b"tomb", DELETED),)))
        rec = store.load("a")
        assert (rec.version, rec.status, rec.blob) == (2, DELETED, b"tomb")
        assert store.get_timer(("a", 1)) is None and store.pending_timers("a") == []
        assert [r.instance_id for r in store.list_positions()] == ["b"]
        assert [r.instance_id for r in store.list_positions("chart", after="a")] == ["b"]
        store.commit(Commit(writes=(update("a", 2, blob=b"again"),), timers_put=(timer("a", 2, 10),)))
        assert (store.load("a").version, store.load("a").blob) == (3, b"again")
        assert sorted(r.instance_id for r in store.list_positions()) == ["a", "b"]
        assert keys(store.pending_timers("a")) == [("a", 2)]

    # ------------------------------------------------------------------ timer rows

    def test_timer_row_round_trips_every_field(self, store):
        row = TimerRow(
            instance_id="a", ordinal=42, target_id="parent-1", due_at_ms=1_700_000_000_123,
            send_id="s-42", event={"name": "pay.timeout", "data": {"amount": 10.5, "ok": True,
                                                                   "tags": ["x", None],
                                                                   "raw": b"\x00\xff"},
                                   "type": "external", "sendid": "s-42", "origin": None,
                                   "origintype": None, "invokeid": None},
            name="payment_timeout",
            dedup={"macrostep": 3, "microstep": 1, "round": 0, "c_index": 2,
                   "owner": "Pending", "id_from_author": True},
            caller_context={"request": "r-1", "n": [1, 2]})
        put(store, row)
        assert store.get_timer(("a", 42)) == row

    @pytest.mark.parametrize("kind", [TIMER, SEND, INVOKE, CANCEL])
    def test_row_kind_round_trips(self, store, kind):
        row = timer("a", 5, 10, kind=kind, event={"type": "sqs", "target": "q", "data": [1, {"x": b"y"}]})
        put(store, row)
        assert store.get_timer(("a", 5)) == row
        [claimed] = store.claim_due(10, 10, "n1", 100)
        assert claimed.kind == kind
        assert store.pending_timers("a")[0].kind == kind

    def test_get_timer_missing_is_none(self, store):
        assert store.get_timer(("a", 1)) is None

    def test_timers_put_overwrites_same_key(self, store):
        put(store, timer("a", 1, 10, send_id="old"))
        put(store, timer("a", 1, 99, send_id="new"))
        row = store.get_timer(("a", 1))
        assert (row.send_id, row.due_at_ms) == ("new", 99)
        assert len(store.pending_timers("a")) == 1

    def test_timers_delete_removes_rows_and_ignores_missing(self, store):
        put(store, timer("a", 1, 10), timer("a", 2, 20))
        store.commit(Commit(timers_delete=(("a", 1), ("a", 99), ("zz", 1))))
        assert store.get_timer(("a", 1)) is None
        assert keys(store.pending_timers("a")) == [("a", 2)]

    def test_position_and_timers_commit_together(self, store):
        create(store, "a")
        put(store, timer("a", 1, 10))
        store.commit(Commit(writes=(update("a", 1, timers=(TimerRef(2, "send-2"),)),),
                            timers_put=(timer("a", 2, 20),), timers_delete=(("a", 1),)))
        assert store.load("a").timers == (TimerRef(2, "send-2"),)
        assert keys(store.pending_timers("a")) == [("a", 2)]

    def test_empty_commit_is_harmless(self, store):
        store.commit(Commit())
        assert store.next_due() is None

    # ------------------------------------------------------------------ completion

    def test_completion_marks_done_with_outcome_and_reason(self, store):
        create(store, "a", timers_put=[timer("a", 1, 10)])
        [claimed] = store.claim_due(10, 10, "n1", 1000)
        store.commit(Commit(writes=(update("a", 1),),
                            complete=TimerCompletion(claimed.key, "discarded",
                                                     "instance not running", node_id="n1")))
        row = store.get_timer(("a", 1))
        assert row.state == DONE
        assert (row.outcome, row.reason) == ("discarded", "instance not running")
        assert row.claimed_by is None and row.claim_expires_ms is None
        assert store.pending_timers("a") == []
        assert store.claim_due(10_000, 10, "n2", 1000) == []
        assert store.next_due() is None
        assert store.load("a").version == 2

    def test_second_completion_conflicts(self, store):
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 1000)
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired", node_id="n1")))
        with pytest.raises(ConflictError):
            store.commit(Commit(complete=TimerCompletion(("a", 1), "fired", node_id="n1")))
        assert store.get_timer(("a", 1)).outcome == "fired"

    def test_completion_of_missing_row_conflicts(self, store):
        with pytest.raises(ConflictError):
            store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))

    def test_completion_by_wrong_claimant_conflicts(self, store):
        self._needs_exclusive_claims()
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 1000)
        with pytest.raises(ConflictError):
            store.commit(Commit(complete=TimerCompletion(("a", 1), "fired", node_id="n2")))
        row = store.get_timer(("a", 1))
        assert (row.state, row.claimed_by) == (CLAIMED, "n1")

    def test_completion_of_unclaimed_pending_row_is_allowed(self, store):
        # A backend without claim writes completes straight from pending.
        put(store, timer("a", 1, 10))
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired", node_id="n1")))
        assert store.get_timer(("a", 1)).state == DONE

    def test_completion_of_dead_row_conflicts(self, store):
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 1000)
        store.release(("a", 1), "n1", error="boom", next_attempt_at_ms=20, dead=True)
        with pytest.raises(ConflictError):
            store.commit(Commit(complete=TimerCompletion(("a", 1), "fired", node_id="n1")))
        assert store.get_timer(("a", 1)).state == DEAD

    def test_failing_completion_writes_nothing(self, store):
        create(store, "a", timers_put=[timer("a", 1, 10)])
        create(store, "b")
        bad = Commit(writes=(update("a", 1, blob=b"moved"),
                             PositionWrite("c", "chart", None, b"new", "running")),
                     timers_put=(timer("a", 2, 20),), timers_delete=(("a", 1),),
                     complete=TimerCompletion(("b", 9), "fired"))
        with pytest.raises(ConflictError):
            store.commit(bad)
        assert (store.load("a").version, store.load("a").blob) == (1, b"blob-1")
        assert store.load("c") is None
        assert keys(store.pending_timers("a")) == [("a", 1)]

    def test_completion_with_delete_of_same_row_in_one_commit(self, store):
        # The completion is checked against the rows as they were before the commit.
        put(store, timer("a", 1, 10))
        store.commit(Commit(timers_delete=(("a", 1),),
                            complete=TimerCompletion(("a", 1), "fired")))
        assert store.get_timer(("a", 1)) is None

    def test_completion_drops_row_when_not_keeping_done(self, store_drop_done):
        store = store_drop_done
        put(store, timer("a", 1, 10), timer("a", 2, 20))
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
        assert store.get_timer(("a", 1)) is None
        assert keys(store.pending_timers("a")) == [("a", 2)]
        with pytest.raises(ConflictError):
            store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))

    def test_completion_to_waiting_leaves_the_sweep_but_stays_completable(self, store):
        put(store, timer("a", 1, 10, kind=INVOKE), timer("a", 2, 50))
        store.claim_due(10, 1, "n1", 100)
        store.commit(Commit(complete=TimerCompletion(("a", 1), None, node_id="n1", state=WAITING)))
        row = store.get_timer(("a", 1))
        assert (row.state, row.claimed_by, row.claim_expires_ms, row.attempts) == (WAITING, None, None, 0)
        assert store.next_due() == 50                              # in no due index
        assert keys(store.claim_due(10_000, 10, "n2", 100)) == [("a", 2)]
        assert keys(store.pending_timers("a")) == [("a", 1), ("a", 2)]   # waiting is not done
        assert list(store.dead_timers()) == []
        # anyone may finish it later (a complete_invoke carries no claim)
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
        assert (store.get_timer(("a", 1)).state, store.get_timer(("a", 1)).outcome) == (DONE, "fired")

    def test_waiting_row_is_kept_when_not_keeping_done(self, store_drop_done):
        store = store_drop_done
        put(store, timer("a", 1, 10, kind=INVOKE))
        store.commit(Commit(complete=TimerCompletion(("a", 1), None, state=WAITING)))
        assert store.get_timer(("a", 1)).state == WAITING
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
        assert store.get_timer(("a", 1)) is None

    def test_completion_to_dead_counts_the_attempt_and_keeps_the_error(self, store):
        create(store, "a", timers_put=[timer("a", 1, 10, kind=SEND)])
        store.claim_due(10, 10, "n1", 100)
        store.release(("a", 1), "n1", error="first", next_attempt_at_ms=20, dead=False)
        store.claim_due(20, 10, "n1", 100)
        store.commit(Commit(writes=(update("a", 1),),
                            complete=TimerCompletion(("a", 1), None, node_id="n1", state=DEAD,
                                                     error="RuntimeError: gave up")))
        row = store.get_timer(("a", 1))
        assert (row.state, row.attempts, row.last_error, row.claimed_by) == (
            DEAD, 2, "RuntimeError: gave up", None)
        assert keys(store.dead_timers()) == [("a", 1)]
        assert store.next_due() is None
        assert store.load("a").version == 2
        with pytest.raises(ConflictError):
            store.commit(Commit(complete=TimerCompletion(("a", 1), "delivered")))
        assert store.retry_timer(("a", 1), 500) is True
        assert keys(store.claim_due(500, 10, "n2", 100)) == [("a", 1)]

    # ------------------------------------------------------------------ claims

    def test_claim_due_earliest_first_and_respects_limit(self, store):
        put(store, timer("a", 1, 30), timer("b", 1, 10), timer("c", 1, 20), timer("d", 1, 40))
        first = store.claim_due(35, 2, "n1", 10_000)
        assert keys(first) == [("b", 1), ("c", 1)]
        assert keys(store.claim_due(35, 2, "n1", 10_000)) == [("a", 1)]
        assert store.claim_due(35, 2, "n1", 10_000) == []

    def test_claim_due_is_inclusive_of_now_and_skips_future_rows(self, store):
        put(store, timer("a", 1, 100))
        assert store.claim_due(99, 10, "n1", 1000) == []
        assert keys(store.claim_due(100, 10, "n1", 1000)) == [("a", 1)]

    def test_claimed_row_carries_the_claim(self, store):
        row = timer("a", 1, 10, caller_context={"k": "v"})
        put(store, row)
        [claimed] = store.claim_due(50, 10, "n1", 500)
        assert claimed.event == row.event and claimed.caller_context == {"k": "v"}
        assert claimed.due_at_ms == 10
        if self.claims_are_exclusive:
            assert (claimed.state, claimed.claimed_by, claimed.claim_expires_ms) == (
                CLAIMED, "n1", 550)
            assert store.get_timer(("a", 1)) == claimed

    def test_claimed_rows_not_reclaimed_until_lease_expires(self, store):
        self._needs_exclusive_claims()
        put(store, timer("a", 1, 10), timer("a", 2, 10))
        assert len(store.claim_due(10, 1, "n1", 100)) == 1
        assert keys(store.claim_due(50, 10, "n2", 100)) == [("a", 2)]
        assert store.claim_due(109, 10, "n3", 100) == []
        [again] = store.claim_due(110, 10, "n3", 100)   # n1's lease ran out at 110
        assert again.key == ("a", 1)
        assert (again.claimed_by, again.claim_expires_ms) == ("n3", 210)

    def test_next_due_while_claimed_is_lease_expiry(self, store):
        self._needs_exclusive_claims()
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 100)
        assert store.next_due() == 110

    def test_claim_due_with_zero_limit_claims_nothing(self, store):
        put(store, timer("a", 1, 10))
        assert store.claim_due(10, 0, "n1", 100) == []
        assert store.get_timer(("a", 1)).state == PENDING

    # ------------------------------------------------------------------ release, dead, retry

    def test_release_counts_attempts_and_backs_off(self, store):
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 100)
        store.release(("a", 1), "n1", error="send failed", next_attempt_at_ms=500, dead=False)
        row = store.get_timer(("a", 1))
        assert (row.state, row.attempts, row.last_error, row.next_attempt_at_ms) == (
            PENDING, 1, "send failed", 500)
        assert row.claimed_by is None and row.claim_expires_ms is None
        assert row.due_at_ms == 10
        assert store.next_due() == 500
        assert store.claim_due(499, 10, "n1", 100) == []
        [again] = store.claim_due(500, 10, "n2", 100)
        assert again.attempts == 1
        store.release(("a", 1), "n2", error="again", next_attempt_at_ms=900, dead=False)
        assert store.get_timer(("a", 1)).attempts == 2

    def test_release_by_another_node_is_a_noop(self, store):
        self._needs_exclusive_claims()
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 100)
        store.release(("a", 1), "n2", error="x", next_attempt_at_ms=500, dead=True)
        row = store.get_timer(("a", 1))
        assert (row.state, row.claimed_by, row.attempts) == (CLAIMED, "n1", 0)

    def test_release_of_missing_or_done_row_is_a_noop(self, store):
        store.release(("a", 1), "n1", error="x", next_attempt_at_ms=5, dead=False)
        put(store, timer("a", 1, 10))
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
        store.release(("a", 1), "n1", error="x", next_attempt_at_ms=5, dead=False)
        row = store.get_timer(("a", 1))
        assert (row.state, row.attempts, row.last_error) == (DONE, 0, None)

    def test_release_keeps_a_suspended_row_parked_and_leaves_waiting_and_dead_rows(self, store):
        """A delivery that fails after its instance was suspended records the failure and
        keeps the row suspended (before, it went back to pending and the next sweep
        delivered it while the instance was suspended); a waiting or dead row is not the
        releaser's any more and is left as it is."""
        put(store, timer("a", 1, 10), timer("a", 2, 10), timer("a", 3, 10))
        store.claim_due(10, 10, "n1", 100)
        store.release(("a", 3), "n1", error="gave up", next_attempt_at_ms=11, dead=True)
        put(store, replace(store.get_timer(("a", 1)), state=SUSPENDED, claimed_by=None, claim_expires_ms=None),
            replace(store.get_timer(("a", 2)), state=WAITING, claimed_by=None, claim_expires_ms=None))
        for key, dead in ((("a", 1), False), (("a", 1), True), (("a", 2), False), (("a", 3), False)):
            store.release(key, "n1", error="late failure", next_attempt_at_ms=500, dead=dead)
        r1, r2, r3 = (store.get_timer(("a", i)) for i in (1, 2, 3))
        assert (r1.state, r1.attempts, r1.last_error) == (SUSPENDED, 2, "late failure")
        assert (r2.state, r2.attempts, r2.last_error) == (WAITING, 0, None)
        assert (r3.state, r3.attempts, r3.last_error) == (DEAD, 1, "gave up")
        assert store.claim_due(10_000, 10, "n2", 100) == []

    def test_a_put_that_expects_a_rows_state_writes_nothing_if_it_moved(self, store):
        """``Commit.timers_expect``: suspend and resume rewrite rows they read outside the
        commit; a row a sweeper completed meanwhile (an outbox send's completion writes no
        position, so no version shows it) must refuse the whole commit."""
        create(store, "a")
        put(store, timer("a", 1, 10, kind=SEND), timer("a", 2, 10))
        read = store.get_timer(("a", 1))
        parked = replace(read, state=SUSPENDED)
        store.commit(Commit(writes=(update("a", 1),), timers_put=(parked,),
                            timers_expect=((("a", 1), (PENDING, CLAIMED)),)))
        assert store.get_timer(("a", 1)).state == SUSPENDED and store.load("a").version == 2
        # a sweeper completes row 2 between the host's read and its commit
        read2 = store.get_timer(("a", 2))
        store.commit(Commit(complete=TimerCompletion(("a", 2), "delivered")))
        with pytest.raises(ConflictError):
            store.commit(Commit(writes=(update("a", 2),), timers_put=(replace(read2, state=SUSPENDED),),
                                timers_expect=((("a", 2), (PENDING, CLAIMED)),)))
        assert store.get_timer(("a", 2)).state == DONE and store.load("a").version == 2
        with pytest.raises(ConflictError):   # a row that is not there at all
            store.commit(Commit(timers_put=(timer("a", 9, 10),), timers_expect=((("a", 9), (SUSPENDED,)),)))
        assert store.get_timer(("a", 9)) is None

    def test_release_without_an_attempt_gives_the_claim_back_as_it_was(self, store):
        # a sweep stopped by its deadline before the row: ready again at once, attempts and
        # last error untouched (counted, a row cut short often enough would have died)
        self._needs_exclusive_claims()
        put(store, timer("a", 1, 10))
        (row,) = store.claim_due(100, 10, "n1", 1000)
        store.release(row.key, "n1", error="boom", next_attempt_at_ms=200, dead=False)   # a real failure first
        (row,) = store.claim_due(300, 10, "n1", 1000)
        store.release(row.key, "n2", error="", next_attempt_at_ms=None, dead=False, attempt=False)
        assert store.get_timer(row.key).state == CLAIMED           # not n2's claim to give back
        store.release(row.key, "n1", error="", next_attempt_at_ms=None, dead=False, attempt=False)
        back = store.get_timer(row.key)
        assert (back.state, back.attempts, back.last_error, back.claimed_by) == (PENDING, 1, "boom", None)
        assert keys(store.claim_due(300, 10, "n2", 1000)) == [("a", 1)]   # at once, no lease to wait out

    def test_release_dead_parks_the_row(self, store):
        put(store, timer("a", 1, 10), timer("a", 2, 10))
        store.claim_due(10, 10, "n1", 100)
        store.release(("a", 1), "n1", error="gave up", next_attempt_at_ms=20, dead=True)
        row = store.get_timer(("a", 1))
        assert (row.state, row.attempts, row.last_error) == (DEAD, 1, "gave up")
        assert keys(store.dead_timers()) == [("a", 1)]
        assert keys(store.pending_timers("a")) == [("a", 1), ("a", 2)]  # dead is not done
        store.release(("a", 2), "n1", error="fine", next_attempt_at_ms=20, dead=False)
        assert keys(store.claim_due(10_000, 10, "n1", 100_000)) == [("a", 2)]  # not the dead one
        assert store.claim_due(20_000, 10, "n1", 100) == []

    def test_next_due_ignores_dead_and_done(self, store):
        put(store, timer("a", 1, 10), timer("a", 2, 20), timer("a", 3, 30))
        store.claim_due(10, 1, "n1", 100)
        store.release(("a", 1), "n1", error="x", next_attempt_at_ms=11, dead=True)
        store.commit(Commit(complete=TimerCompletion(("a", 2), "fired")))
        assert store.next_due() == 30

    def test_dead_timers_respects_limit(self, store):
        put(store, *[timer("a", i, 10) for i in range(5)])
        store.claim_due(10, 10, "n1", 100)
        for i in range(5):
            store.release(("a", i), "n1", error="x", next_attempt_at_ms=20, dead=True)
        assert len(store.dead_timers(limit=3)) == 3
        assert len(store.dead_timers()) == 5
        assert all(r.state == DEAD for r in store.dead_timers())

    def test_retry_timer_revives_a_dead_row(self, store):
        put(store, timer("a", 1, 10))
        store.claim_due(10, 10, "n1", 100)
        store.release(("a", 1), "n1", error="x", next_attempt_at_ms=5000, dead=True)
        assert store.retry_timer(("a", 1), 1000) is True
        row = store.get_timer(("a", 1))
        assert (row.state, row.attempts, row.due_at_ms, row.next_attempt_at_ms,
                row.last_error) == (PENDING, 0, 1000, None, None)
        assert list(store.dead_timers()) == []
        assert store.next_due() == 1000
        assert keys(store.claim_due(1000, 10, "n2", 100)) == [("a", 1)]

    def test_retry_timer_of_live_or_missing_row_is_false(self, store):
        put(store, timer("a", 1, 10))
        assert store.retry_timer(("a", 1), 1000) is False
        assert store.retry_timer(("zz", 1), 1000) is False
        assert store.get_timer(("a", 1)).due_at_ms == 10

    # ------------------------------------------------------------------ queries

    def test_next_due_is_earliest_ready_time(self, store):
        assert store.next_due() is None
        put(store, timer("a", 1, 300), timer("b", 1, 100), timer("c", 1, 200))
        assert store.next_due() == 100

    def test_pending_timers_by_ordinal_excluding_done_and_others(self, store):
        put(store, timer("a", 3, 10), timer("a", 1, 30), timer("a", 2, 20), timer("b", 1, 5))
        store.commit(Commit(complete=TimerCompletion(("a", 2), "fired")))
        assert keys(store.pending_timers("a")) == [("a", 1), ("a", 3)]
        assert store.pending_timers("nobody") == []

    # ------------------------------------------------------------------ hostile ids

    # one store per backend subclass: the differing executors are the point of a contract
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors])
    @given(iid=hostile_ids())
    def test_any_instance_id_works_or_is_refused_with_a_typed_error(self, store, iid):
        """An id either goes through the whole life of an instance, leaving every other
        record alone, or is refused with InvalidInstanceId before anything is written."""
        if store.load("bystander") is None:
            create(store, "bystander", timers_put=[timer("bystander", 1, 10**12)])
        before = store.load("bystander")
        try:
            create(store, iid, timers_put=[timer(iid, 1, 10)])
        except InvalidInstanceId as exc:
            assert not portable(iid), f"{iid!r} is portable but was refused: {exc}"
            assert exc.instance_id == iid
            with pytest.raises(InvalidInstanceId):
                store.load(iid)
            assert store.claim_due(10, 10, "n1", 100) == []
        else:
            try:
                rec = store.load(iid)
                assert (rec.instance_id, rec.version, rec.blob) == (iid, 1, b"blob-1")
                assert keys(store.pending_timers(iid)) == [(iid, 1)]
                [claimed] = store.claim_due(10, 10, "n1", 100)
                assert claimed.key == (iid, 1) and claimed.target_id == iid
                store.release((iid, 1), "n1", error="boom", next_attempt_at_ms=20, dead=True)
                assert [r.key for r in store.dead_timers() if r.instance_id == iid] == [(iid, 1)]
                assert store.retry_timer((iid, 1), 10) is True
                [again] = store.claim_due(10, 10, "n2", 100)
                store.commit(Commit(writes=(update(iid, 1, blob=b"fired"),),
                                    complete=TimerCompletion(again.key, "fired", node_id="n2")))
                assert store.get_timer((iid, 1)).state == DONE
                assert store.load(iid).blob == b"fired"
            finally:
                current = store.load(iid)
                if current is not None:
                    store.commit(Commit(writes=(delete(iid, current.version),)))
            assert store.load(iid) is None and store.get_timer((iid, 1)) is None
        assert store.load("bystander") == before
        assert keys(store.pending_timers("bystander")) == [("bystander", 1)]

    # ------------------------------------------------------------------ operator reads

    def test_due_timers_across_instances_earliest_first(self, store):
        put(store, timer("b", 1, 300), timer("a", 1, 100), timer("c", 7, 200), timer("a", 2, 5_000),
            timer("d", 1, 150), timer("e", 1, 120))
        store.commit(Commit(complete=TimerCompletion(("d", 1), "fired")))          # done: never listed
        assert keys(store.due_timers(250)) == [("a", 1), ("e", 1), ("c", 7)]
        assert keys(store.due_timers(300, limit=2)) == [("a", 1), ("e", 1)]
        assert keys(store.due_timers(10_000)) == [("a", 1), ("e", 1), ("c", 7), ("b", 1), ("a", 2)]
        assert store.due_timers(99) == [] and store.due_timers(10_000, limit=0) == []
        # a claimed row is still going to fire; a dead one is not; a released one counts at its backoff
        store.claim_due(130, 2, "n1", 60_000)                                      # claims a1 and e1
        store.release(("e", 1), "n1", error="boom", next_attempt_at_ms=260, dead=False)
        store.claim_due(210, 1, "n1", 60_000)                                      # c7
        store.release(("c", 7), "n1", error="gave up", next_attempt_at_ms=999, dead=True)
        rows = store.due_timers(1_000)
        assert keys(rows) == [("a", 1), ("e", 1), ("b", 1)]
        assert [r.ready_at_ms for r in rows] == [100, 260, 300]
        assert rows[1].attempts == 1 and rows[1].last_error == "boom"
        assert keys(store.due_timers(250)) == [("a", 1)]

    def test_suspended_rows_wait_out_of_every_sweep_until_made_pending_again(self, store):
        from dataclasses import replace
        from statebound.host.store import SUSPENDED
        put(store, timer("a", 1, 10), timer("a", 2, 20), timer("b", 1, 30))
        parked = replace(store.get_timer(("a", 1)), state=SUSPENDED)
        put(store, parked)
        assert store.get_timer(("a", 1)).state == SUSPENDED
        assert keys(store.pending_timers("a")) == [("a", 1), ("a", 2)]       # listed: it is not done
        assert store.next_due() == 20
        assert keys(store.due_timers(1_000)) == [("a", 2), ("b", 1)]
        assert keys(store.claim_due(1_000, 10, "n1", 100)) == [("a", 2), ("b", 1)]
        assert store.dead_timers() == [] and store.retry_timer(("a", 1), 50) is False
        put(store, replace(parked, state=PENDING, next_attempt_at_ms=500))
        assert keys(store.claim_due(1_000, 10, "n2", 100)) == [("a", 1)]
        assert store.get_timer(("a", 1)).ready_at_ms == 500

    # ------------------------------------------------------------------ history

    def test_history_records_commit_with_their_writes_and_page_oldest_first(self, store):
        from statebound.host.store import HistoryRecord

        def rec(iid, version, **kw):
            return HistoryRecord(iid, version, 1_000 + version, kw.pop("kind", "event"), **kw)
        first = rec("a", 1, kind="start", steps=({"event": {"name": "go", "data": {"n": [1, 2]}}}, {"ordinal": 1}),
                    configuration=("s", "t"), effects={"armed": [{"send_id": "x"}]}, chart="c", revision="sha256:1",
                    call={"op": "start", "instance": "a", "idempotency_key": "k"}, caller_context={"tp": "00-ab"},
                    start={"data": {"n": 1}, "parent": None, "invokeid": None}, expires_at_ms=10 ** 12)
        store.commit(Commit(writes=(PositionWrite("a", "c", None, b"v1", "running"),), history=(first,)))
        for v in range(2, 7):
            store.commit(Commit(writes=(update("a", v - 1, blob=f"v{v}".encode()),), history=(rec("a", v),)))
        assert store.history("a") == [first, *[rec("a", v) for v in range(2, 7)]]      # every field round-trips
        assert [r.version for r in store.history("a", after_version=2, limit=3)] == [3, 4, 5]
        assert store.history("a", after_version=6) == [] and store.history("nobody") == []
        assert store.history("a", limit=0) == []
        # a commit that fails writes no record
        with pytest.raises(ConflictError):
            store.commit(Commit(writes=(update("a", 3, blob=b"stale"),), history=(rec("a", 4, kind="write"),)))
        assert store.history("a", after_version=3, limit=1)[0].kind == "event"
        # deleting the instance deletes its history; a new life starts a new one
        store.commit(Commit(writes=(delete("a", 6),), history_in_use=True))
        assert store.history("a") == []
        create(store, "a")
        assert store.history("a") == []

    def test_history_is_bounded_by_count_and_expiry(self, store):
        if not self.history_bounded_on_write:
            pytest.skip("this backend bounds history by TTL, asynchronously")
        from statebound.host.store import HistoryRecord
        create(store, "a")
        for v in range(2, 9):
            expiry = 1_000 + 5 if v == 2 else None          # v2 expires before v8 is written
            store.commit(Commit(writes=(update("a", v - 1),), history_keep=4,
                                history=(HistoryRecord("a", v, 1_000 + v, "event", expires_at_ms=expiry),)))
        assert [r.version for r in store.history("a")] == [5, 6, 7, 8]
        store.commit(Commit(writes=(update("a", 8),), history=(HistoryRecord("a", 9, 1_009, "event"),)))
        assert [r.version for r in store.history("a")] == [5, 6, 7, 8, 9]              # no bound given

    # ------------------------------------------------------------------ operator batch jobs

    def test_list_positions_pages_through_every_instance_once(self, store):
        ids = [f"i{n:02d}" for n in range(23)]
        for n, iid in enumerate(ids):
            create(store, iid, chart="even" if n % 2 == 0 else "odd", blob=f"b{n}".encode(),
                   timers_put=[timer(iid, 1, 10)])
        store.commit(Commit(writes=(update("i03", 1, blob=b"moved", chart="odd"),)))

        def page_all(chart=None, size=5):
            seen, after = [], None
            while True:
                page = store.list_positions(chart, after=after, limit=size)
                assert len(page) <= size
                if not page:
                    return seen
                seen += page
                after = page[-1].instance_id
        every = page_all()
        assert sorted(r.instance_id for r in every) == ids                 # each once, in any stable order
        assert {r.instance_id: (r.version, r.blob) for r in every}["i03"] == (2, b"moved")
        odd = page_all("odd", size=4)
        assert sorted(r.instance_id for r in odd) == ids[1::2] and all(r.chart == "odd" for r in odd)
        assert page_all("none-such") == [] and store.list_positions(limit=0) == []

    def test_purge_done_deletes_old_done_rows_only_in_bounded_calls(self, store):
        put(store, *[timer("a", i, 10 * i) for i in range(1, 6)], timer("b", 1, 15))
        for i in (1, 2, 3, 5):
            store.commit(Commit(complete=TimerCompletion(("a", i), "fired")))
        # done and due before 45: a1, a2, a3; a4 is pending, a5 is due at 50, b1 pending
        total, calls = 0, 0
        while True:
            n = store.purge_done(45, limit=2)
            assert n <= 2
            total, calls = total + n, calls + 1
            if n < 2:
                break
        assert total == 3 and calls == 2
        assert [store.get_timer(("a", i)) for i in (1, 2, 3)] == [None, None, None]
        assert store.get_timer(("a", 5)).state == DONE
        assert keys(store.pending_timers("a")) == [("a", 4)]
        assert keys(store.pending_timers("b")) == [("b", 1)]
        assert store.purge_done(1_000, limit=0) == 0
        assert store.purge_done(1_000) == 1          # a5

    @pytest.mark.parametrize("call", [
        lambda s: s.purge_done("x"), lambda s: s.purge_done(1_000, "2"), lambda s: s.purge_done(1.5),
        lambda s: s.purge_done(True), lambda s: s.due_timers("x"), lambda s: s.due_timers(1_000, None),
        lambda s: s.dead_timers("3"), lambda s: s.list_positions(limit="x"), lambda s: s.list_positions(after=1),
        lambda s: s.list_positions(chart=b"c"), lambda s: s.history("a", after_version="0"),
        lambda s: s.history("a", limit=2.0), lambda s: s.claim_due("x", 1, "n", 1),
        lambda s: s.claim_due(100, "1", "n", 1), lambda s: s.claim_due(100, 1, "n", None),
    ])
    def test_operator_calls_refuse_wrong_typed_numbers_before_touching_rows(self, store, call):
        # SQLite sorts any integer below any text: a cutoff of "x" used to match, and purge,
        # every done row; elsewhere these were raw TypeErrors or a retryable StoreUnavailable.
        put(store, timer("a", 1, 10), timer("a", 2, 20))
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))
        with pytest.raises(InvalidArgument):
            call(store)
        assert store.get_timer(("a", 1)).state == DONE
        assert store.get_timer(("a", 2)).state == PENDING

    # ------------------------------------------------------------------ group commit (optional)

    def _needs_batch(self, store):
        if not hasattr(store, "commit_many"):
            pytest.skip("backend has no group commit")

    def test_is_a_batch_store(self, store):
        self._needs_batch(store)
        assert isinstance(store, BatchStore)

    def test_load_many_returns_the_existing_records_by_id(self, store):
        self._needs_batch(store)
        create(store, "a", blob=b"A")
        create(store, "b", blob=b"B", parent="a")
        got = store.load_many(["b", "ghost", "a", "b"])
        assert set(got) == {"a", "b"}
        assert got["a"] == store.load("a") and got["b"] == store.load("b")
        assert store.load_many([]) == {}

    def test_load_many_of_more_ids_than_one_request_takes(self, store):
        self._needs_batch(store)
        ids = [f"i{k:04d}" for k in range(250)]
        store.commit_many([Commit(writes=(PositionWrite(i, "c", None, i.encode(), "running"),)) for i in ids])
        got = store.load_many(ids + ["ghost"])
        assert sorted(got) == ids and all(got[i].blob == i.encode() for i in ids)

    def test_commit_many_applies_each_commit_and_reports_failures_per_slot(self, store):
        self._needs_batch(store)
        create(store, "b")
        store.commit(Commit(writes=(update("b", 1, blob=b"b2"),)))
        out = store.commit_many([
            Commit(writes=(PositionWrite("a", "c", None, b"a1", "running"),), timers_put=(timer("a", 1, 10),)),
            Commit(writes=(update("b", 1, blob=b"stale"),), timers_put=(timer("b", 1, 10),)),
            Commit(),
            Commit(writes=(PositionWrite("c", "c", None, b"c1", "running"),)),
        ])
        assert out[0] is None and out[2] is None and out[3] is None
        assert isinstance(out[1], ConflictError) and out[1].instance_id == "b"
        assert store.load("a").blob == b"a1" and store.get_timer(("a", 1)) is not None
        assert (store.load("b").version, store.load("b").blob) == (2, b"b2")
        assert store.get_timer(("b", 1)) is None                    # nothing of the failed commit
        assert store.load("c").blob == b"c1"

    def test_commit_many_failed_completion_undoes_that_commits_position_write(self, store):
        self._needs_batch(store)
        create(store, "a", timers_put=[timer("a", 1, 10)])
        create(store, "b", timers_put=[timer("b", 1, 10)])
        store.commit(Commit(complete=TimerCompletion(("a", 1), "fired")))      # fired elsewhere
        out = store.commit_many([
            Commit(writes=(update("a", 1, blob=b"again"),), timers_put=(timer("a", 2, 20),),
                   complete=TimerCompletion(("a", 1), "fired")),
            Commit(writes=(update("b", 1, blob=b"b2"),), complete=TimerCompletion(("b", 1), "fired")),
        ])
        assert isinstance(out[0], ConflictError) and out[1] is None
        assert (store.load("a").version, store.load("a").blob) == (1, b"blob-1")
        assert store.get_timer(("a", 2)) is None
        assert store.get_timer(("b", 1)).state == DONE and store.load("b").blob == b"b2"

    def test_commit_many_refuses_an_unstorable_id_in_its_slot_only(self, store):
        self._needs_batch(store)
        out = store.commit_many([Commit(writes=(PositionWrite("", "c", None, b"x", "running"),)),
                                 Commit(writes=(PositionWrite("ok", "c", None, b"y", "running"),))])
        assert isinstance(out[0], InvalidInstanceId) and out[1] is None
        assert store.load("ok").blob == b"y"

    def test_commit_many_writes_each_commits_history_with_it(self, store):
        self._needs_batch(store)
        from statebound.host.store import HistoryRecord
        create(store, "b")
        store.commit(Commit(writes=(update("b", 1, blob=b"b2"),)))
        out = store.commit_many([
            Commit(writes=(PositionWrite("a", "c", None, b"a1", "running"),),
                   history=(HistoryRecord("a", 1, 5, "start"),)),
            Commit(writes=(update("b", 1, blob=b"stale"),), history=(HistoryRecord("b", 2, 5, "event"),)),
        ])
        assert out[0] is None and isinstance(out[1], ConflictError)
        assert [(r.instance_id, r.version, r.kind) for r in store.history("a")] == [("a", 1, "start")]
        assert store.history("b") == []

    # ------------------------------------------------------------------ claims by key (optional)
    # claim_rows: what a sweeper claims the outbox rows a wake-up names with, so that two
    # sweepers given one wake-up do not both call the outside world (ADR 0022).

    #: the backend offers ``claim_rows`` (:class:`~statebound.host.store.RowClaimStore`); a
    #: third-party store without it turns this off, and the sweeper fires its woken outbox
    #: rows unclaimed (at least once)
    has_claim_rows = True

    def _needs_claim_rows(self, store):
        if not self.has_claim_rows:
            pytest.skip("backend has no claim_rows")

    def test_is_a_row_claim_store(self, store):
        self._needs_claim_rows(store)
        from statebound.host.store import RowClaimStore
        assert isinstance(store, RowClaimStore)

    def test_claim_rows_claims_pending_ready_rows_by_key_and_stores_the_claim(self, store):
        self._needs_claim_rows(store)
        send = timer("a", 1, 10, kind=SEND, caller_context={"k": "v"})
        put(store, send, timer("b", 2, 50), timer("c", 3, 10, kind=INVOKE))
        got = store.claim_rows([("b", 2), ("a", 1), ("b", 2)], 50, "n1", 500)
        assert keys(got) == [("b", 2), ("a", 1)]                      # in the order asked, once each
        for row in got:
            assert (row.state, row.claimed_by, row.claim_expires_ms) == (CLAIMED, "n1", 550)
            assert store.get_timer(row.key) == row                      # what every reader sees
        assert (got[1].event, got[1].kind, got[1].caller_context) == (send.event, SEND, {"k": "v"})
        assert store.get_timer(("c", 3)).state == PENDING              # not named: not claimed
        assert store.claim_rows([], 50, "n1", 500) == []

    def test_claim_rows_refuses_a_live_claim_of_another_node_and_takes_a_lapsed_one(self, store):
        self._needs_claim_rows(store)
        put(store, timer("a", 1, 10, kind=SEND))
        [first] = store.claim_rows([("a", 1)], 10, "n1", 100)
        assert store.claim_rows([("a", 1)], 109, "n2", 100) == []
        assert store.get_timer(("a", 1)) == first                      # untouched by the refusal
        [renewed] = store.claim_rows([("a", 1)], 50, "n1", 100)        # its own claim: renewed
        assert (renewed.claimed_by, renewed.claim_expires_ms) == ("n1", 150)
        assert store.claim_rows([("a", 1)], 149, "n2", 100) == []
        [taken] = store.claim_rows([("a", 1)], 150, "n2", 100)         # n1's lease ran out at 150
        assert (taken.state, taken.claimed_by, taken.claim_expires_ms) == (CLAIMED, "n2", 250)
        with pytest.raises(ConflictError):                              # n1 may no longer finish it
            store.commit(Commit(complete=TimerCompletion(("a", 1), "delivered", node_id="n1")))
        store.commit(Commit(complete=TimerCompletion(("a", 1), "delivered", node_id="n2")))
        assert store.get_timer(("a", 1)).state == DONE

    @pytest.mark.parametrize("kind", [SEND, TIMER])
    def test_claim_rows_refuses_a_row_claim_due_handed_to_another_node(self, store, kind):
        self._needs_claim_rows(store)
        put(store, timer("a", 1, 10, kind=kind))
        assert keys(store.claim_due(10, 10, "n1", 100)) == [("a", 1)]
        assert store.claim_rows([("a", 1)], 50, "n2", 100) == []
        [taken] = store.claim_rows([("a", 1)], 110, "n2", 100)
        assert taken.claimed_by == "n2"

    def test_claim_due_skips_a_row_claimed_by_key_until_its_lease_lapses(self, store):
        self._needs_claim_rows(store)
        put(store, timer("a", 1, 10, kind=SEND), timer("b", 1, 10, kind=SEND))
        store.claim_rows([("a", 1)], 10, "n1", 500)
        assert keys(store.claim_due(100, 10, "n2", 1_000)) == [("b", 1)]
        assert store.next_due() == 510                                 # a's lease; b's lapses at 1,100
        assert store.claim_due(509, 10, "n2", 100) == []
        assert keys(store.claim_due(510, 10, "n2", 100)) == [("a", 1)]
        assert store.get_timer(("a", 1)).claimed_by == "n2"

    def test_claim_rows_leaves_out_rows_not_ready_finished_parked_or_missing(self, store):
        self._needs_claim_rows(store)
        put(store, timer("a", 1, 100, kind=SEND),                             # not due yet
            timer("a", 2, 10, kind=SEND, next_attempt_at_ms=100),             # backing off
            timer("a", 3, 10, kind=SEND), timer("a", 4, 10, kind=SEND), timer("a", 5, 10, kind=INVOKE),
            timer("a", 6, 10, kind=SEND, state=SUSPENDED))
        store.commit(Commit(complete=TimerCompletion(("a", 3), "delivered")))
        store.commit(Commit(complete=TimerCompletion(("a", 4), None, state=DEAD, error="gave up")))
        store.commit(Commit(complete=TimerCompletion(("a", 5), None, state=WAITING)))
        named = [("a", o) for o in range(1, 8)]                              # ("a", 7) was never written
        before = {key: store.get_timer(key) for key in named}
        assert store.claim_rows(named, 50, "n1", 500) == []
        assert {key: store.get_timer(key) for key in named} == before
        assert keys(store.claim_rows(named, 100, "n1", 500)) == [("a", 1), ("a", 2)]   # ready now

    def test_claim_rows_refuses_bad_arguments_before_claiming(self, store):
        self._needs_claim_rows(store)
        put(store, timer("a", 1, 10, kind=SEND))
        with pytest.raises(InvalidInstanceId):
            store.claim_rows([("a", 1), ("", 1)], 50, "n1", 500)
        with pytest.raises(InvalidArgument):
            store.claim_rows([("a", 1)], "50", "n1", 500)
        assert store.get_timer(("a", 1)).state == PENDING

    def test_claim_rows_racing_callers_one_gets_each_row(self, store):
        self._needs_claim_rows(store)
        import threading
        rows = [timer(f"r{i}", 1, 10, kind=SEND) for i in range(5)]
        put(store, *rows)
        for row in rows:
            start = threading.Barrier(6, timeout=30)
            won: list[tuple[str, list]] = []

            def claim(node, key=row.key, start=start, won=won):
                start.wait()
                won.append((node, store.claim_rows([key], 50, node, 60_000)))
            threads = [threading.Thread(target=claim, args=(f"n{i}",), daemon=True) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads) and len(won) == 6
            winners = [node for node, got in won if got]
            assert len(winners) == 1
            assert store.get_timer(row.key).claimed_by == winners[0]
