"""The sweep half of :class:`~statebound.dynamodb.DynamoStore`: what is due, and when to look.

The due index is partitioned by shard (``gsi_pk = "due#<shard>"``) and sorted by ready
time, so one ``Query`` of a shard, earliest first, answers both questions a sweeper asks:
which rows are ready now (the items up to now), and when the shard is next due (the first
item after them). The second answer is kept per shard as its **hint**, and a shard is read
only when

* its hint says a row is ready (``hint <= now``),
* this store object has not read it yet (a new sweeper, a shard just leased), or
* it was last read ``fallback_ms`` ago: the slow fallback, which finds rows that other
  processes wrote without a wake-up.

So an idle sweeper sends no request per sweep: one ``Query`` per shard per ``fallback_ms``,
whatever the number of pending rows, and never a ``Scan``.

A hint is a lower bound (no pending row of the shard is ready before it, as far as this
store object knows), one integer per shard in memory. Everything the store object learns
lowers it: its own commits, releases and retries, and the rows it soft-claimed (at their
claim expiry). A row written by another process is found at the next fallback read of its
shard, or at once by a wake-up (``host/wakeup.py``), which fires the row by its key and
never consults a hint.

**Index lag.** A GSI trails its table by up to about a second, so a ``Query`` just after
a write may miss the new row. A row this store wrote less than :data:`GSI_LAG_S` ago that
a read did not return holds the shard's hint at its ready time, so the shard is read again
then rather than at the next fallback.

**Soft claims.** ``claim_due`` writes no claim of a timer row to DynamoDB: the commit that
completes a row is what makes it fire once (its completion condition refuses a second
commit). Within one store object claims are still exclusive, kept in memory until
``claim_expires_ms``, so threads of one sweeper never fire a row twice. Other processes see
a soft-claimed timer row as ``pending``.

**Stored claims.** An outbox row (send, invoke, cancel) is handed to the outside world
before its completion, so a completion condition cannot keep two processes from both
calling out. Its claim is written: ``claim_due`` and ``claim_rows`` (a wake-up's rows)
set ``state = claimed``, ``claimed_by`` and ``claim_expires_ms`` with one conditional
``UpdateItem`` per outbox row, which only one process can win while the claim lives. The
row keeps its due-index attributes, so a claim whose holder died is found by the next
read of its shard once it lapses; until then the shard reads skip it, and take its expiry
as the shard's hint. The fire reads the row again before calling out (``host/outbox.py``)
and finds it claimed by another node if it lost, and the completion condition
(``row_pending_or_mine``) refuses another node's stored claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..exceptions import ConflictError, StoreError, StoreUnavailable
from ..host.store import CLAIMED, DEAD, DONE, PENDING, SUSPENDED, TIMER, Commit, TimerCompletion, TimerKey, TimerRow
from . import _codec as codec
from ._codec import N, S
from ._migrate import layout_key, legacy_rows_left, mark_layout

if TYPE_CHECKING:
    from .store import DynamoStore

__all__ = ["Sweep", "GSI_LAG_S", "NEVER", "MAX_ERROR_CHARS", "error_text", "cut_utf8"]

log = logging.getLogger(__name__)

#: How long (wall seconds) DynamoDB's GSIs may trail the table: rows this store completed
#: are hidden from its index reads, and rows it wrote hold their shard's hint, that long.
GSI_LAG_S = 5.0
#: A hint meaning "nothing pending was seen in this shard".
NEVER = 1 << 62
#: ``last_error`` is truncated to this many characters and, encoded, to as many bytes, so a
#: long traceback cannot push a timer row over the item limit on the failure path (a row is
#: written with room for it: ``store.TIMER_HEADROOM_BYTES``).
MAX_ERROR_CHARS = 8_000


def error_text(error: str | None) -> str:
    """``error`` cut to at most :data:`MAX_ERROR_CHARS` characters and as many UTF-8 bytes."""
    return cut_utf8((error or "")[:MAX_ERROR_CHARS], MAX_ERROR_CHARS)


def cut_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return text
    return raw[:max(0, max_bytes)].decode("utf-8", "ignore")
#: Soft claims kept at most (they are an optimisation: the oldest go first).
MAX_CLAIMS = 100_000
#: Extra items a shard read asks for beyond what it wants, for rows it must skip
#: (soft-claimed here, or completed and still in the lagging index).
_SLACK = 8
#: The first page of a shard read: the due row and the one past it, when all is quiet.
_FIRST_PAGE = 2

# Named clauses of the conditions used here.
row_is_dead = "#state = :dead"
row_unchanged = "#state = :seen_state AND #attempts = :seen_attempts"
# A stored claim may be taken from a row that is pending and ready (its due time and any
# backoff past), or claimed with a lease that has run out (or by the same node: a retried
# request whose first attempt landed must not lose its own claim).
row_ready = "#state = :pending AND #due <= :now AND (attribute_not_exists(#next) OR #next <= :now)"
claim_lapsed_or_mine = ("#state = :claimed AND (attribute_not_exists(#claim_expires) OR #claim_expires <= :now "
                        "OR #claimed_by = :node)")
row_claimable = f"attribute_exists(#pk) AND (({row_ready}) OR ({claim_lapsed_or_mine}))"


@dataclass(slots=True)
class _Claim:
    """A soft claim: this store handed the row to ``node_id`` until ``expires_ms``."""

    node_id: str
    expires_ms: int
    shard: int


@dataclass(slots=True)
class _Shard:
    """What this store object knows of one shard."""

    hint: int      # no pending row (not soft-claimed here) is ready before this; NEVER: none seen
    read_at: int   # the now_ms of the last read; -NEVER: never read at a known time
    hint_key: TimerKey | None = None   # the row the hint came from, while it is exact
    exact: bool = True                 # False once that row is gone: still a bound, no longer the earliest


def _order(row: TimerRow) -> tuple[int, str, int]:
    return (row.ready_at_ms, row.instance_id, row.ordinal)


class Sweep:
    """The sweep state of one :class:`DynamoStore` object, shared by its threads."""

    def __init__(self, store: DynamoStore, fallback_ms: int) -> None:
        self.store = store
        self.fallback_ms = fallback_ms
        self.lock = threading.RLock()
        self._claims: OrderedDict[TimerKey, _Claim] = OrderedDict()
        self._gone: OrderedDict[TimerKey, float] = OrderedDict()
        # rows written here lately: key -> (shard, ready_at_ms, monotonic time written)
        self._recent: OrderedDict[TimerKey, tuple[int, int, float]] = OrderedDict()
        self._shards: dict[int, _Shard] = {}
        self._legacy_checked = False

    # ------------------------------------------------------------------ local knowledge
    def hidden(self, key: TimerKey, now_ms: int | None) -> bool:
        """Whether an index hit must be skipped: soft-claimed here, or gone (index lag)."""
        with self.lock:
            claim = self._claims.get(key)
            if claim is not None and (now_ms is None or claim.expires_ms > now_ms):
                return True
            gone = self._gone.get(key)
            return gone is not None and time.monotonic() - gone < GSI_LAG_S

    def overlay(self, row: TimerRow) -> TimerRow:
        """Show this store's soft claim on a row the table says is pending."""
        with self.lock:
            claim = self._claims.get(row.key)
        if claim is None or row.state != PENDING:
            return row
        return replace(row, state=CLAIMED, claimed_by=claim.node_id, claim_expires_ms=claim.expires_ms)

    def check_claim(self, complete: TimerCompletion | None) -> None:
        """A soft claim is invisible to DynamoDB, so a commit checks its owner here."""
        if complete is None or complete.node_id is None:
            return
        with self.lock:
            claim = self._claims.get(complete.key)
        if claim is not None and claim.node_id != complete.node_id:
            raise ConflictError(f"timer {complete.key} is claimed by {claim.node_id!r}")

    def forget(self, keys: Collection[TimerKey], *, gone: bool) -> None:
        """Drop the soft claims of ``keys``; with ``gone``, hide them from index reads a while."""
        with self.lock:
            now = time.monotonic()
            for key in keys:
                self._claims.pop(key, None)
                self._recent.pop(key, None)
                if gone:
                    self._gone[key] = now
                    self._gone.move_to_end(key)
                else:
                    self._gone.pop(key, None)
            while self._gone and now - next(iter(self._gone.values())) >= GSI_LAG_S:
                self._gone.popitem(last=False)
            if gone:
                for state in self._shards.values():
                    if state.hint_key is not None and state.hint_key in keys:
                        # the earliest row went: the hint stays a safe bound, but next_due re-reads
                        state.hint_key, state.exact = None, False

    def note_write(self, key: TimerKey, ready_ms: int) -> None:
        """A pending row was written here: lower its shard's hint, and remember it while
        the index may not show it yet."""
        shard = self.store.shard_of(key)
        with self.lock:
            state = self._shards.get(shard)
            if state is not None and ready_ms <= state.hint:
                state.hint, state.hint_key = ready_ms, key
            now = time.monotonic()
            self._recent[key] = (shard, ready_ms, now)
            self._recent.move_to_end(key)
            while self._recent and now - next(iter(self._recent.values()))[2] >= GSI_LAG_S:
                self._recent.popitem(last=False)

    def after_commit(self, commit: Commit, purged: Collection[TimerKey]) -> None:
        """Fold a landed commit into the local state."""
        gone = set(commit.timers_delete) | set(purged)
        if commit.complete is not None:
            gone.add(commit.complete.key)
        put_keys = {row.key for row in commit.timers_put}
        self.forget(gone - put_keys, gone=True)
        self.forget(put_keys, gone=False)
        for row in commit.timers_put:
            if row.state in (PENDING, CLAIMED):
                self.note_write(row.key, row.ready_at_ms)

    def reset(self) -> None:
        """Forget every hint: the next sweep reads every shard."""
        with self.lock:
            self._shards.clear()

    def hints(self) -> dict[int, int | None]:
        """The hint of each shard read so far (``None``: nothing pending seen)."""
        with self.lock:
            return {s: (None if st.hint >= NEVER else st.hint) for s, st in sorted(self._shards.items())}

    # ------------------------------------------------------------------ shards
    def owned(self, *, refresh: bool) -> list[int]:
        """The shards to sweep: all, or the ``owned_shards`` of the store. With ``refresh``,
        an owner that renews on its own schedule (``ShardLeases.maybe_acquire``) may do so."""
        store = self.store
        owned = store.owned_shards
        if owned is None:
            return list(range(store.shards))
        if refresh:
            renew = getattr(owned, "maybe_acquire", None)
            if callable(renew):
                renew()
        held = getattr(owned, "held", owned)
        return sorted(s for s in held if 0 <= s < store.shards)

    def _claim_minima(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for claim in self._claims.values():
            if claim.expires_ms < out.get(claim.shard, NEVER):
                out[claim.shard] = claim.expires_ms
        return out

    def _stale(self, shard: int, now_ms: int, claim_min: dict[int, int]) -> bool:
        state = self._shards.get(shard)
        if state is None or now_ms - state.read_at >= self.fallback_ms:
            return True
        return min(state.hint, claim_min.get(shard, NEVER)) <= now_ms

    def read(self, shard: int, now_ms: int | None, want: int) -> list[TimerRow]:
        """One ``Query`` of a shard, earliest first: up to ``want`` visible rows ready by
        ``now_ms``, and the shard's new hint. With ``now_ms=None`` (a peek), no rows, and the
        hint is the first visible row's ready time."""
        due: list[TimerRow] = []
        hint = NEVER
        hint_key: TimerKey | None = None
        seen: set[TimerKey] = set()
        held, held_key = NEVER, None   # the earliest lapse of a live stored claim passed over
        started = time.monotonic()
        for item in self._shard_items(shard, want + 1 + _SLACK):
            try:
                row = codec.row_from_item(item)
            except StoreUnavailable:
                raise
            except StoreError as exc:
                self._park_unreadable(item, shard, str(exc))
                continue
            seen.add(row.key)
            if row.state not in (PENDING, CLAIMED):
                continue  # a stale index entry
            if now_ms is not None and row.ready_at_ms > now_ms:
                hint, hint_key = row.ready_at_ms, row.key
                break
            if row.state == CLAIMED:
                # an outbox row some process is firing under a stored claim: not due before it
                # lapses (a claim without a lease counts as lapsed, as in MemoryStore)
                lapse = row.claim_expires_ms or 0
                if now_ms is None or lapse > now_ms:
                    if lapse < held:
                        held, held_key = lapse, row.key
                    continue
            if self.hidden(row.key, now_ms):
                continue
            if now_ms is None or len(due) >= want:
                hint, hint_key = row.ready_at_ms, row.key   # a peek, or more ready than wanted
                break
            due.append(row)
        if held < hint:
            hint, hint_key = held, held_key
        with self.lock:
            for key, (s, ready, written) in self._recent.items():
                if s == shard and key not in seen and started - written < GSI_LAG_S and ready <= hint:
                    hint, hint_key = ready, key   # the index may not show it yet
            if now_ms is not None:
                read_at = now_ms
            else:
                known = self._shards.get(shard)
                read_at = known.read_at if known is not None else -NEVER
            self._shards[shard] = _Shard(hint, read_at, hint_key)
        return due

    def _park_unreadable(self, item: dict[str, Any], shard: int, why: str) -> None:
        """Take a due item that cannot be read out of the due index, as dead, with the
        reason: it cannot fire, now or on any retry, and left there it failed every read of
        its shard, so that no sweeper fired anything of that shard again."""
        pk, sk = item.get("pk", {}).get("S"), item.get("sk", {}).get("S")
        log.error("timer item %r/%r cannot be read; parking it as dead: %s", pk, sk, why)
        if not isinstance(pk, str) or not isinstance(sk, str):
            return
        try:
            dead_sk = codec.dead_sort_key((pk, int(sk[len(codec.TIMER_PREFIX):])))
        except ValueError:
            dead_sk = f"{pk}{codec.KEY_SEPARATOR}{sk}"
        store = self.store
        try:
            store._call(
                "update_item", TableName=store.table_name, Key={"pk": S(pk), "sk": S(sk)},
                UpdateExpression=("SET #state = :dead, #last_error = :why, #dead_pk = :dead_pk, "
                                  "#dead_sk = :dead_sk REMOVE #gsi_pk, #gsi_due, #claimed_by, #claim_expires"),
                ConditionExpression="attribute_exists(#pk)",
                ExpressionAttributeNames={
                    "#pk": "pk", "#state": "state", "#last_error": "last_error", "#dead_pk": "dead_pk",
                    "#dead_sk": "dead_sk", "#gsi_pk": "gsi_pk", "#gsi_due": "gsi_due",
                    "#claimed_by": "claimed_by", "#claim_expires": "claim_expires_ms"},
                ExpressionAttributeValues={
                    ":dead": S(DEAD), ":why": S(error_text(f"the stored row cannot be read: {why}")),
                    ":dead_pk": S(codec.dead_partition(shard)), ":dead_sk": S(dead_sk)})
        except ConflictError:
            pass   # gone meanwhile
        except StoreError as exc:
            if isinstance(exc, StoreUnavailable):
                raise
            log.error("timer item %r/%r could not be parked: %s", pk, sk, exc)

    def _shard_items(self, shard: int, cap: int) -> Iterator[dict[str, Any]]:
        """A shard's index items, earliest first, in pages of 2, 4, 8... up to ``cap``.

        DynamoDB bills every item a page reads, and a read stops at the first row past
        now, so small first pages keep an idle or lightly loaded shard at half a read unit
        while a busy one still needs only a few requests.
        """
        store = self.store
        kwargs: dict[str, Any] = {
            "TableName": store.table_name, "IndexName": codec.DUE_INDEX,
            "KeyConditionExpression": "#gsi_pk = :p", "ExpressionAttributeNames": {"#gsi_pk": "gsi_pk"},
            "ExpressionAttributeValues": {":p": S(codec.due_partition(shard))}}
        limit = min(_FIRST_PAGE, cap)
        while True:
            page = store._call("query", Limit=limit, **kwargs)
            yield from page.get("Items", [])
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last
            limit = min(2 * limit, cap)

    # ------------------------------------------------------------------ the Store verbs
    def claim_due(self, now_ms: int, limit: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Up to ``limit`` rows ready by ``now_ms``, earliest first, soft-claimed.

        Reads only the shards that are due, new to this store object, or past their
        fallback (see the module doc); writes nothing to DynamoDB.
        """
        if limit <= 0:
            return []
        self.check_legacy()
        shards = self.owned(refresh=True)
        with self.lock:
            claim_min = self._claim_minima()
            wanted = [s for s in shards if self._stale(s, now_ms, claim_min)]
        found: list[TimerRow] = []
        for shard in wanted:
            found.extend(self.read(shard, now_ms, limit))
        found.sort(key=_order)
        expires = now_ms + lease_ms
        out: list[TimerRow] = []
        with self.lock:
            # The shards just read show every row still due in them, so a lapsed claim there
            # has done its job (it made the shard due again). Kept, the claim of a row another
            # sweeper fired meanwhile stayed for ever: its shard was re-read on every sweep,
            # and next_due() answered a time in the past, so run_forever never slept.
            read = set(wanted)
            for key in [k for k, c in self._claims.items() if c.expires_ms <= now_ms and c.shard in read]:
                del self._claims[key]
            for row in found[limit:]:
                # ready rows left for the next call: keep their shards due
                state = self._shards[self.store.shard_of(row.key)]
                if row.ready_at_ms <= state.hint:
                    state.hint, state.hint_key = row.ready_at_ms, row.key
            for row in found[:limit]:
                if self.hidden(row.key, now_ms):
                    continue  # another thread of this store claimed it while we read
                self._claims[row.key] = _Claim(node_id, expires, self.store.shard_of(row.key))
                self._claims.move_to_end(row.key)
                out.append(replace(row, state=CLAIMED, claimed_by=node_id, claim_expires_ms=expires))
            while len(self._claims) > MAX_CLAIMS:
                self._claims.popitem(last=False)
        if any(row.kind != TIMER for row in out):
            out = self._store_claims(out, now_ms, node_id, expires)
        return out

    def _store_claims(self, rows: list[TimerRow], now_ms: int, node_id: str, expires: int) -> list[TimerRow]:
        """``rows``, soft-claimed, with the claims of their outbox rows written (see the
        module doc); an outbox row whose claim another process holds, or that is gone or
        done (the index lags), is left out and its soft claim dropped."""
        out: list[TimerRow] = []
        for row in rows:
            if row.kind == TIMER:
                out.append(row)
                continue
            try:
                stored = self._claim_item(row.key, now_ms, node_id, expires)
            except BaseException:
                # the sweep gets none of its rows: give their soft claims back (a claim
                # already written lapses with its lease)
                for left in rows:
                    self._unclaim(left.key, node_id, expires)
                raise
            if stored is None:
                self._unclaim(row.key, node_id, expires)
            else:
                out.append(stored)
        return out

    def claim_rows(self, keys: Sequence[TimerKey], now_ms: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim the named rows with a stored claim each (see :meth:`DynamoStore.claim_rows`)."""
        expires = now_ms + lease_ms
        out: list[TimerRow] = []
        for key in dict.fromkeys(keys):
            with self.lock:
                before = self._claims.get(key)
                if before is not None and before.node_id != node_id and before.expires_ms > now_ms:
                    continue   # a thread of this process holds it for another sweeper: no request
                self._claims[key] = _Claim(node_id, expires, self.store.shard_of(key))
                self._claims.move_to_end(key)
            try:
                row = self._claim_item(key, now_ms, node_id, expires)
            except BaseException:
                self._unclaim(key, node_id, expires, before)
                raise
            if row is None:
                self._unclaim(key, node_id, expires, before)
            else:
                out.append(row)
        with self.lock:
            while len(self._claims) > MAX_CLAIMS:
                self._claims.popitem(last=False)
        return out

    def _unclaim(self, key: TimerKey, node_id: str, expires: int, before: _Claim | None = None) -> None:
        """Drop this call's soft claim of ``key`` (putting back ``before``), unless another
        thread has claimed the row since."""
        with self.lock:
            claim = self._claims.get(key)
            if claim is not None and claim.node_id == node_id and claim.expires_ms == expires:
                if before is None:
                    del self._claims[key]
                else:
                    self._claims[key] = before

    def _claim_item(self, key: TimerKey, now_ms: int, node_id: str, expires: int) -> TimerRow | None:
        """One conditional ``UpdateItem`` writing ``node_id``'s claim on the row, if it is
        claimable (``row_claimable``); the row as stored after it, or ``None``."""
        store = self.store
        try:
            response = store._call(
                "update_item", TableName=store.table_name, Key=store._timer_key(key),
                UpdateExpression="SET #state = :claimed, #claimed_by = :node, #claim_expires = :expires",
                ConditionExpression=row_claimable,
                ExpressionAttributeNames={"#pk": "pk", "#state": "state", "#due": "due_at_ms",
                                          "#next": "next_attempt_at_ms", "#claimed_by": "claimed_by",
                                          "#claim_expires": "claim_expires_ms"},
                ExpressionAttributeValues={":pending": S(PENDING), ":claimed": S(CLAIMED), ":now": N(now_ms),
                                           ":node": S(node_id), ":expires": N(expires)},
                ReturnValues="ALL_NEW")
        except ConflictError:
            return None
        item = response.get("Attributes") or {}
        try:
            return codec.row_from_item(item)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            self._park_unreadable(item, store.shard_of(key), str(exc))
            return None

    def next_due(self) -> int | None:
        """The earliest hint among the owned shards, or a soft claim's expiry if sooner;
        ``None`` if neither. A shard not read yet, or whose earliest row this store has
        since completed or deleted, is peeked at with one ``Query``."""
        shards = self.owned(refresh=False)
        with self.lock:
            unknown = [s for s in shards if s not in self._shards or not self._shards[s].exact]
        for shard in unknown:
            self.read(shard, None, 0)
        with self.lock:
            times = [self._shards[s].hint for s in shards if s in self._shards]
            times += [c.expires_ms for c in self._claims.values()]
        best = min(times, default=NEVER)
        return None if best >= NEVER else best

    def pending_between(self, after_ms: int, until_ms: int, limit: int) -> list[TimerRow]:
        """Pending rows of the owned shards with ``after_ms < ready <= until_ms``, earliest
        first, without claiming them: one ``Query`` per shard, reading only those rows."""
        rows: list[TimerRow] = []
        if limit <= 0 or until_ms <= after_ms:
            return rows
        for shard in self.owned(refresh=False):
            got = 0
            for item in self.store._pages(
                    "query", IndexName=codec.DUE_INDEX,
                    KeyConditionExpression="#gsi_pk = :p AND #gsi_due BETWEEN :lo AND :hi",
                    ExpressionAttributeNames={"#gsi_pk": "gsi_pk", "#gsi_due": "gsi_due"},
                    ExpressionAttributeValues={":p": S(codec.due_partition(shard)), ":lo": N(after_ms + 1),
                                               ":hi": N(until_ms)},
                    Limit=min(limit, 1_000)):
                try:
                    row = codec.row_from_item(item)
                except StoreUnavailable:
                    raise
                except StoreError:
                    continue   # unreadable: the sweep that meets it parks it dead; arm nothing
                if row.state in (PENDING, CLAIMED) and not self.hidden(row.key, None):
                    rows.append(row)
                    got += 1
                    if got >= limit:
                        break
        rows.sort(key=_order)
        return rows[:limit]

    def release(self, key: TimerKey, node_id: str, *, error: str, next_attempt_at_ms: int | None,
                dead: bool, attempt: bool = True) -> None:
        """Give a row back after a failed delivery (see :meth:`DynamoStore.release`)."""
        store = self.store
        with self.lock:
            claim = self._claims.get(key)
        if claim is not None and claim.node_id != node_id:
            return
        response = store._call("get_item", TableName=store.table_name, Key=store._timer_key(key),
                               ConsistentRead=True)
        item = response.get("Item")
        if item is None:
            self.forget([key], gone=True)
            return
        row = codec.row_from_item(item)
        if row.state not in (PENDING, CLAIMED, SUSPENDED) or (
                row.state == CLAIMED and row.claimed_by not in (None, node_id)):
            # done, dead or waiting meanwhile, or another node's claim: not ours to release
            self.forget([key], gone=row.state == DONE)
            return
        if row.state == SUSPENDED:
            dead = False   # parked until resume, which sends it back to pending
        new = replace(row, state=SUSPENDED if row.state == SUSPENDED else DEAD if dead else PENDING,
                      attempts=row.attempts + attempt,
                      last_error=error_text(error) if attempt else row.last_error, next_attempt_at_ms=next_attempt_at_ms,
                      claimed_by=None, claim_expires_ms=None)
        try:
            store._call("put_item", TableName=store.table_name, Item=store._failed_row_item(new),
                        ConditionExpression=row_unchanged,
                        ExpressionAttributeNames={"#state": "state", "#attempts": "attempts"},
                        ExpressionAttributeValues={":seen_state": S(row.state),
                                                   ":seen_attempts": N(row.attempts)})
        except ConflictError:
            pass  # someone else released or completed it first
        self.forget([key], gone=dead)
        if not dead:
            self.note_write(key, new.ready_at_ms)

    def retry_timer(self, key: TimerKey, now_ms: int) -> bool:
        """Revive a dead row: one conditional ``UpdateItem`` back into the due index."""
        store = self.store
        try:
            store._call(
                "update_item", TableName=store.table_name, Key=store._timer_key(key),
                UpdateExpression=("SET #state = :pending, #attempts = :zero, #due = :now, "
                                  "#gsi_pk = :partition, #gsi_due = :now "
                                  "REMOVE #next, #last_error, #dead_pk, #dead_sk"),
                ConditionExpression=row_is_dead,
                ExpressionAttributeNames={
                    "#state": "state", "#attempts": "attempts", "#due": "due_at_ms",
                    "#gsi_pk": "gsi_pk", "#gsi_due": "gsi_due", "#next": "next_attempt_at_ms",
                    "#last_error": "last_error", "#dead_pk": "dead_pk", "#dead_sk": "dead_sk"},
                ExpressionAttributeValues={
                    ":pending": S(PENDING), ":zero": N(0), ":now": N(now_ms), ":dead": S(DEAD),
                    ":partition": S(codec.due_partition(store.shard_of(key)))})
        except ConflictError:
            return False
        self.forget([key], gone=False)
        self.note_write(key, now_ms)
        return True

    def dead_timers(self, limit: int) -> Sequence[TimerRow]:
        """Dead rows by key: one ``Query`` per shard's dead partition (and 0.1's), merged."""
        if limit <= 0:
            return []
        out: list[TimerRow] = []
        partitions = [codec.dead_partition(s) for s in range(self.store.shards)]
        for partition in [*partitions, codec.LEGACY_DEAD_PARTITION]:
            got = 0
            for item in self.store._pages("query", IndexName=codec.DEAD_INDEX,
                                          KeyConditionExpression="#dead_pk = :dead",
                                          ExpressionAttributeNames={"#dead_pk": "dead_pk"},
                                          ExpressionAttributeValues={":dead": S(partition)},
                                          Limit=limit):
                row = codec.listed_row(item)
                if row.state == DEAD:
                    out.append(row)
                    got += 1
                    if got >= limit:
                        break
        out.sort(key=lambda r: r.key)
        return out[:limit]

    # ------------------------------------------------------------------ 0.1 tables
    def check_legacy(self) -> None:
        """Once per store object: if the table still holds 0.1-keyed rows, migrate it.

        0.1 left two traces, and either may be alone: its sweepers' cursors, and rows whose
        due partition is ``"<bucket>#<shard>"``. A table only 0.1 *writers* touched has rows
        and no cursor, and a sweeper that looked for cursors alone never read those rows.
        So one ``BatchGetItem`` reads the cursor keys and the layout marker together (the
        request the cursor check always cost), and

        * a cursor found: migrate (a 0.1 sweeper ran, perhaps after an earlier migration);
        * else the marker found: nothing to do (this version created the table, or a
          sweeper already migrated it or found no 0.1 row);
        * else look for 0.1 rows (``legacy_rows_left``): migrate if there are any,
          otherwise write the marker. That look reads the pending rows once per table, not
          per process, since the marker then answers every later sweeper.

        Sweepers starting together on an unmarked table may each look and migrate: the
        migration's updates are conditional and the fires complete conditionally, so that
        costs reads, never a double fire.
        """
        with self.lock:
            if self._legacy_checked:
                return
        # Marked checked only once the answer is known and acted on: a read that failed or
        # left keys unread (throttled), or a migration that failed, is tried again by the
        # next sweep, instead of leaving 0.1-keyed rows unfired for the life of the process.
        store = self.store
        keys: list[dict[str, Any]] = [store._key(f"{codec.LEGACY_CURSOR_PREFIX}{s}", codec.LEGACY_CURSOR_SK)
                                      for s in range(store.shards)]
        keys.append(layout_key())
        cursor = marked = False
        for start in range(0, len(keys), 100):  # BatchGetItem takes 100 keys
            batch = keys[start:start + 100]
            for _ in range(store._retries):
                response = store._call("batch_get_item", RequestItems={
                    store.table_name: {"Keys": batch, "ProjectionExpression": "#pk",
                                       "ExpressionAttributeNames": {"#pk": "pk"}}})
                for item in response.get("Responses", {}).get(store.table_name, []):
                    # asked by full key: the one item under the marker's pk is the marker
                    if item["pk"]["S"] == codec.LAYOUT_PK:
                        marked = True
                    else:
                        cursor = True
                batch = response.get("UnprocessedKeys", {}).get(store.table_name, {}).get("Keys", [])
                if not batch:
                    break
            if batch and not cursor:
                log.warning("table %r: %d layout key(s) left unread (throttled); checking again "
                            "at the next sweep", store.table_name, len(batch))
                return
        if cursor:
            log.warning("table %r has 0.1 sweep cursors: migrating its index layout once",
                        store.table_name)
            store.migrate()
        elif not marked:
            if legacy_rows_left(store):
                log.warning("table %r holds rows keyed the 0.1 way (no 0.1 sweeper ran on it): "
                            "migrating its index layout once", store.table_name)
                store.migrate()
            else:
                mark_layout(store)
        with self.lock:
            self._legacy_checked = True
