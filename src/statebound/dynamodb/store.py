"""DynamoStore: the :class:`~statebound.host.store.Store` protocol on one DynamoDB table.

Layout (see ``_codec.py`` for every attribute): ``pk`` = instance id, ``sk`` = ``"P"``
for the position item and ``"T#<ordinal>"`` for each timer row the instance scheduled.
Pending rows also carry ``gsi_pk = "<bucket>#<shard>"`` and ``gsi_due = ready_at_ms``,
which puts them in the sparse ``due-index``; a fired, cancelled or dead row drops those
attributes and leaves it. Dead rows carry ``dead_pk``/``dead_sk`` instead and sit in the
sparse ``dead-index``, so :meth:`DynamoStore.dead_timers` reads dead rows only, never
the table (a scan would cost the whole table for what is an operator's query).

Costs per operation (one "call" is one HTTP request; botocore's own retries aside):

==========================  ==========================================================
``load``                    1 ``GetItem`` (strongly consistent)
``commit``, one position,   1 ``PutItem`` with ``#version = :expected``
  no timers
``commit``, anything else   1 ``TransactWriteItems`` (position + timer rows + completion)
``commit`` deleting an      1 ``Query`` of the instance's timer rows, then 1
  instance                    ``TransactWriteItems`` (or 1 ``DeleteItem`` if none)
``claim_due``               1 ``Query`` per (bucket, shard) from the shard's cursor to
                            now's bucket, normally 2-3 buckets; **no write**: the claim
                            is the commit's completion condition (see below). Plus, now
                            and then, 1 ``UpdateItem`` per shard whose cursor moves, and
                            after an outage 1 ``Scan`` of the due index (see below)
``load_many``               1 ``BatchGetItem`` per 100 ids (more for unprocessed keys)
``commit_many``             each commit as ``commit``, ``batch_workers`` in parallel
                            (``_batch.py``: why not one transaction)
``release``                 1 ``GetItem`` + 1 conditional ``PutItem``
``retry_timer``             1 conditional ``UpdateItem``
``next_due``                1 ``Query`` per (bucket, shard) up to a horizon, then, only
                            if nothing was found, 1 bounded ``Scan`` of the due index
``pending_timers``          1 ``Query`` of the instance partition (paginated)
``dead_timers``             1 ``Query`` of ``dead-index``
``due_timers``,             operator reads and batch jobs: see ``_operator.py``
``history``,
``list_positions``,
``purge_done``
==========================  ==========================================================

**Claims.** ``claim_due`` writes nothing to DynamoDB. Exactly-once firing comes from the
commit: the fired row is completed in the same transaction as the position, on the
condition that the row still exists and is not done, so of two sweepers that fire the
same row one commits and the other gets :class:`~statebound.ConflictError` with nothing
written. Within one store object, claims are still exclusive ("soft claims" kept in
memory until ``claim_expires_ms``), so threads of one sweeper never fire a row twice, and
shard leases (``leases.py``) keep two processes off the same shards most of the time.
Other processes see a soft-claimed row as ``pending``.

**Sweep cursors.** The due index is partitioned by time bucket, so a sweep has to know
which buckets to read. Each shard has a durable cursor item (``sweep#<shard>``) naming
the oldest bucket that may still hold pending rows. A sweep reads from the cursor up to
now's bucket and moves the cursor past buckets it found empty once they are *settled*
(ended more than ``settle_ms`` ago: rows are written with a ready time of "now or
later", so a settled empty bucket stays empty unless a writer's clock is ``settle_ms``
behind). The cursor is durable so that a restarted sweeper, a Lambda cold start or a
shard that changed hands resumes where the last sweep stopped, instead of rescanning a
fixed look-back (which would be expensive) or missing rows older than it (which would be
wrong). A shard without a cursor (a new table) is bootstrapped once by a scan of the due
index. The same scan serves a shard whose cursor lags now by more than
``catch_up_buckets`` (a sweeper back from an outage): it lists the non-empty buckets, and
since the settled ones can receive no more rows, the sweep skips the empty ones instead of
spending a Query on each. Rows this store writes into a bucket below a cursor it knows
lower that cursor; :meth:`DynamoStore.reset_sweep_cursors` forces a new bootstrap if
clocks were badly off.

**Idempotent commits.** A transaction carries a ``ClientRequestToken``, and every
position item records the ``commit_token`` of the commit that wrote it. When a retried
request (botocore retries timeouts on its own) finds its condition failed because its
own first attempt already landed, the token in the returned item says so and the commit
reports success instead of a conflict that would make the host apply the event twice.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import boto3
from botocore.exceptions import ClientError

from ..exceptions import ConflictError, ItemTooLarge, StateboundError, StoreError
from ..host.store import (CLAIMED, DEAD, DONE, PENDING, WAITING, Commit, PositionRecord, PositionWrite,
                          TimerCompletion, TimerKey, TimerRow, commit_instance_ids)
from . import _batch
from . import _codec as codec
from . import _operator
from ._codec import N, S
from ._errors import ActionInfo, call, error_code, map_dynamodb_errors

__all__ = ["DynamoStore", "MAX_ITEM_BYTES", "MAX_TRANSACTION_ACTIONS", "MAX_TRANSACTION_BYTES",
           "MAX_INSTANCE_ID_BYTES"]

MAX_INSTANCE_ID_BYTES = codec.MAX_INSTANCE_ID_BYTES

log = logging.getLogger(__name__)

#: Largest item we send. DynamoDB's limit is 400 KB (409,600 bytes, names included);
#: we stop short of it so that an estimate a little low still never reaches the service.
MAX_ITEM_BYTES = 400_000
#: Most actions DynamoDB accepts in one ``TransactWriteItems``.
MAX_TRANSACTION_ACTIONS = 100
#: DynamoDB refuses transactions over 4 MB; moto does not check, so we do.
MAX_TRANSACTION_BYTES = 4_000_000
#: ``last_error`` is truncated to this many characters, so a long traceback cannot push a
#: timer row over the item limit on the failure path.
MAX_ERROR_CHARS = 8_000
#: How long (wall seconds) a row this store completed or deleted is hidden from its own
#: index reads: DynamoDB's GSIs lag the table by up to about a second.
GSI_LAG_S = 5.0

# --------------------------------------------------------------------------- conditions
# Each clause is named so the expressions read like the rules they enforce.
position_absent = "attribute_not_exists(#pk)"
version_matches = "#version = :expected"
row_exists = "attribute_exists(#pk)"
row_unfinished = "#state IN (:pending, :claimed, :waiting)"
row_pending_or_mine = "(#state IN (:pending, :waiting) OR (#state = :claimed AND #claimed_by = :node))"
row_is_dead = "#state = :dead"
row_unchanged = "#state = :seen_state AND #attempts = :seen_attempts"
cursor_absent = "attribute_not_exists(#pk)"
cursor_unchanged = "#bucket = :old"
cursor_above = "#bucket > :new"

_CURSOR_SK = "C"


@dataclass(slots=True)
class _Claim:
    """A soft claim: this store handed the row to ``node_id`` until ``expires_ms``."""

    node_id: str
    expires_ms: int


def _default_client() -> Any:
    with map_dynamodb_errors():
        return boto3.client("dynamodb")


def _own_write_landed(exc: BaseException, token: str) -> bool:
    """Whether a failed condition was failed by this commit's own earlier attempt.

    The position item carries the ``commit_token`` of the commit that wrote it; DynamoDB
    returns the item (``ALL_OLD``) with the condition failure.
    """
    cause = exc.__cause__
    if not isinstance(cause, ClientError):
        return False
    response = cause.response
    items = [response.get("Item")]
    items += [r.get("Item") for r in response.get("CancellationReasons") or []]
    return any(item and item.get("commit_token", {}).get("S") == token for item in items)


class DynamoStore:
    """A :class:`~statebound.host.store.Store` on one DynamoDB table (see the module doc).

    :param table_name: the table, created by :meth:`create_table` (or the same schema
        from :meth:`table_spec` in your infrastructure code).
    :param client: a ``boto3`` DynamoDB client; by default ``boto3.client("dynamodb")``.
    :param shards: due-index shards per bucket. Fixed for the life of a table: every
        writer and sweeper must use the same number.
    :param bucket_ms: width of a due-index time bucket. Also fixed per table.
    :param settle_ms: how long after a bucket ends before an empty bucket is skipped for
        good; covers clock skew between writers and sweepers plus index lag.
    :param owned_shards: restrict ``claim_due``/``next_due`` to these shards: a
        collection of ints, or anything with a ``held`` attribute such as a
        :class:`~statebound.dynamodb.ShardLeases` (read at every call). ``None``: all.
    :param keep_done: keep completed rows (state ``done``) for inspection; if ``False``,
        a completion deletes the row.
    :param done_ttl_s: when set, completed rows get an ``expires_at`` attribute (epoch
        seconds, wall clock) so DynamoDB TTL deletes them after this many seconds.
    :param max_scan_buckets: most buckets of a shard one ``claim_due`` reads (a sweeper
        catching up proceeds over several calls instead of one huge one).
    :param catch_up_buckets: when a shard's cursor lags now by more buckets than this
        (after an outage), one scan of the due index finds which old buckets hold rows,
        instead of one Query per empty bucket. The scan costs reads in proportion to the
        pending rows; probing costs one Query per bucket and shard.
    :param next_due_horizon_ms: how far past the last sweep's bucket ``next_due`` probes
        bucket by bucket before falling back to a bounded scan.
    :param next_due_scan_items: most index items that fallback scan reads.
    :param cursor_refresh_ms: re-read the durable sweep cursors this often (in the
        ``now_ms`` of ``claim_due``), to pick up other sweepers' progress.
    :param retries: attempts per call when DynamoDB throttles, before ``StoreUnavailable``.
    :param retry_base_s: first backoff delay, doubled on each retry.
    :param sleep: how to wait between retries (tests pass a no-op).
    """

    def __init__(self, table_name: str, client: Any = None, *, shards: int = 16,
                 bucket_ms: int = 60_000, settle_ms: int = 60_000,
                 owned_shards: Collection[int] | Any | None = None, keep_done: bool = True,
                 done_ttl_s: int | None = None, max_scan_buckets: int = 240,
                 catch_up_buckets: int = 60,
                 next_due_horizon_ms: int = 120_000, next_due_scan_items: int = 1_000,
                 cursor_refresh_ms: int = 300_000, retries: int = 4, retry_base_s: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if shards < 1 or bucket_ms < 1:
            raise ValueError("shards and bucket_ms must be positive")
        if retries < 1 or max_scan_buckets < 1:
            raise ValueError("retries and max_scan_buckets must be positive")
        self.table_name = table_name
        self.client = client if client is not None else _default_client()
        self.shards = shards
        self.bucket_ms = bucket_ms
        self.settle_ms = settle_ms
        #: see the ``owned_shards`` parameter; may be reassigned at any time
        self.owned_shards = owned_shards
        self.keep_done = keep_done
        self.done_ttl_s = done_ttl_s
        self.max_scan_buckets = max_scan_buckets
        self.catch_up_buckets = catch_up_buckets
        self.next_due_horizon_ms = next_due_horizon_ms
        self.next_due_scan_items = next_due_scan_items
        self.cursor_refresh_ms = cursor_refresh_ms
        self._retries = retries
        self._retry_base_s = retry_base_s
        self._sleep = sleep
        # Local state, shared by the threads of one sweeper; never trusted across processes.
        self._lock = threading.RLock()
        self._claims: OrderedDict[TimerKey, _Claim] = OrderedDict()
        self._gone: OrderedDict[TimerKey, float] = OrderedDict()
        self._cursor: dict[int, int] = {}
        self._cursor_gen = 0
        self._cursor_read_now: int | None = None
        self._last_now: int | None = None
        # shard -> (non-empty buckets below horizon, horizon), learnt from an index scan;
        # buckets below the horizon had settled at scan time, so the list is complete there
        self._known: dict[int, tuple[list[int], int]] = {}
        self._purge_resume: dict[str, Any] | None = None   # where purge_done's scan goes on

    # operator reads and batch jobs (see _operator.py for what each costs)
    purge_done = _operator.purge_done
    due_timers = _operator.due_timers
    list_positions = _operator.list_positions
    history = _operator.history

    # ------------------------------------------------------------------ table
    @staticmethod
    def table_spec(table_name: str) -> dict[str, Any]:
        """The ``create_table`` arguments of the statebound schema (for IaC tools too)."""
        def key(name: str, kind: str) -> dict[str, str]:
            return {"AttributeName": name, "KeyType": kind}

        return {
            "TableName": table_name,
            "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [key("pk", "HASH"), key("sk", "RANGE")],
            "AttributeDefinitions": [
                {"AttributeName": name, "AttributeType": kind}
                for name, kind in (("pk", "S"), ("sk", "S"), ("gsi_pk", "S"), ("gsi_due", "N"),
                                   ("dead_pk", "S"), ("dead_sk", "S"))],
            "GlobalSecondaryIndexes": [
                {"IndexName": codec.DUE_INDEX, "KeySchema": [key("gsi_pk", "HASH"),
                                                             key("gsi_due", "RANGE")],
                 "Projection": {"ProjectionType": "ALL"}},
                {"IndexName": codec.DEAD_INDEX, "KeySchema": [key("dead_pk", "HASH"),
                                                              key("dead_sk", "RANGE")],
                 "Projection": {"ProjectionType": "ALL"}},
            ],
        }

    @classmethod
    def create_table(cls, table_name: str, client: Any = None, *, wait: bool = True,
                     timeout_s: float = 600.0) -> None:
        """Create the table with both indexes and TTL on ``expires_at``; idempotent.

        An existing table is accepted if it has the two indexes (else :class:`StoreError`).
        With ``wait``, returns once the table and its indexes are ``ACTIVE``.
        """
        client = client if client is not None else _default_client()
        with map_dynamodb_errors():
            try:
                client.create_table(**cls.table_spec(table_name))
            except ClientError as exc:
                # ResourceInUse: it exists (or is being created): idempotent by design
                if error_code(exc) != "ResourceInUseException":
                    raise
            if not wait:
                return
            deadline = time.monotonic() + timeout_s
            client.get_waiter("table_exists").wait(
                TableName=table_name, WaiterConfig={"Delay": 2, "MaxAttempts": int(timeout_s // 2) + 1})
            while True:
                table = client.describe_table(TableName=table_name)["Table"]
                indexes = {g["IndexName"]: g.get("IndexStatus", "ACTIVE")
                           for g in table.get("GlobalSecondaryIndexes", [])}
                missing = {codec.DUE_INDEX, codec.DEAD_INDEX} - set(indexes)
                if missing:
                    raise StoreError(f"table {table_name!r} exists without the index(es) "
                                     f"{sorted(missing)}; it was not created by statebound")
                if table["TableStatus"] == "ACTIVE" and all(s == "ACTIVE" for s in indexes.values()):
                    break
                if time.monotonic() > deadline:
                    raise StoreError(f"table {table_name!r} not ACTIVE after {timeout_s} s")
                time.sleep(2)
            ttl = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
            if ttl.get("TimeToLiveStatus") == "DISABLED":
                client.update_time_to_live(TableName=table_name, TimeToLiveSpecification={
                    "Enabled": True, "AttributeName": "expires_at"})

    # ------------------------------------------------------------------ plumbing
    def _call(self, op: str, actions: Sequence[ActionInfo] | None = None, **kwargs: Any) -> Any:
        return call(getattr(self.client, op), actions=actions, attempts=self._retries,
                    base_delay_s=self._retry_base_s, sleep=self._sleep, **kwargs)

    def _pages(self, op: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Yield the items of a paginated Query/Scan; stop reading when the caller stops."""
        while True:
            page = self._call(op, TableName=self.table_name, **kwargs)
            yield from page.get("Items", [])
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last

    @staticmethod
    def _key(pk: str, sk: str) -> dict[str, Any]:
        return {"pk": S(pk), "sk": S(sk)}

    def _timer_key(self, key: TimerKey) -> dict[str, Any]:
        return self._key(key[0], codec.timer_sk(key[1]))

    def shard_of(self, key: TimerKey) -> int:
        """The due-index shard of a timer row (stable across processes)."""
        return codec.shard_of(key, self.shards)

    def _scan_shards(self) -> list[int]:
        owned = self.owned_shards
        if owned is None:
            return list(range(self.shards))
        held = getattr(owned, "held", owned)
        return sorted(s for s in held if 0 <= s < self.shards)

    def _check_size(self, item: dict[str, Any], what: str) -> int:
        size = codec.item_size(item)
        if size > MAX_ITEM_BYTES:
            raise ItemTooLarge(f"{what} would be a {size:,}-byte DynamoDB item; the limit is "
                               f"400 KB (statebound refuses above {MAX_ITEM_BYTES:,} bytes)",
                               size, MAX_ITEM_BYTES)
        return size

    def _hidden(self, key: TimerKey, now_ms: int | None) -> bool:
        """Whether an index hit must be skipped: soft-claimed here, or gone (index lag)."""
        with self._lock:
            claim = self._claims.get(key)
            if claim is not None and (now_ms is None or claim.expires_ms > now_ms):
                return True
            gone = self._gone.get(key)
            return gone is not None and time.monotonic() - gone < GSI_LAG_S

    def _overlay(self, row: TimerRow) -> TimerRow:
        """Show this store's soft claim on a row the table says is pending."""
        with self._lock:
            claim = self._claims.get(row.key)
        if claim is None or row.state != PENDING:
            return row
        return replace(row, state=CLAIMED, claimed_by=claim.node_id,
                       claim_expires_ms=claim.expires_ms)

    def _forget(self, keys: Collection[TimerKey], *, gone: bool) -> None:
        with self._lock:
            now = time.monotonic()
            for key in keys:
                self._claims.pop(key, None)
                if gone:
                    self._gone[key] = now
                    self._gone.move_to_end(key)
                else:
                    self._gone.pop(key, None)
            while self._gone and now - next(iter(self._gone.values())) >= GSI_LAG_S:
                self._gone.popitem(last=False)

    # ------------------------------------------------------------------ positions
    #: Commits ``commit_many`` sends at once (threads sharing the one client). botocore keeps
    #: 10 connections per client by default; raise ``max_pool_connections`` with this.
    batch_workers = 8

    def load_many(self, instance_ids: Sequence[str]) -> dict[str, PositionRecord]:
        """The records of those ids that exist, by id: one consistent ``BatchGetItem`` per
        100 ids, unprocessed keys asked for again with backoff (see ``_batch.py``)."""
        return _batch.load_many(self, instance_ids)

    def commit_many(self, commits: Sequence[Commit]) -> list[StateboundError | None]:
        """Group commit: every commit as :meth:`commit` sends it, ``batch_workers`` at a time.
        Each stays its own request, all or nothing; a failed one gets its error in its slot
        (why not one transaction: ``docs/dynamodb.md``)."""
        return _batch.commit_many(self, commits)

    def load(self, instance_id: str) -> PositionRecord | None:
        """Return the instance's record: one strongly consistent ``GetItem``."""
        codec.check_id(instance_id)
        response = self._call("get_item", TableName=self.table_name,
                              Key=self._key(instance_id, codec.POSITION_SK), ConsistentRead=True)
        item = response.get("Item")
        return None if item is None else codec.record_from_item(item)

    def commit(self, commit: Commit) -> None:
        """Apply the commit atomically (see the module doc for the calls it costs).

        Raises :class:`ConflictError` (a version moved, the instance exists, the fired
        row is gone or done), :class:`ItemTooLarge` (an item over 400 KB, or more than
        100 actions: refused before anything is sent), :class:`StoreUnavailable`.
        """
        if commit.empty:
            return
        for instance_id in commit_instance_ids(commit):
            codec.check_id(instance_id)
        seen: set[str] = set()
        for w in commit.writes:
            if w.instance_id in seen:
                # DynamoDB refuses two actions on one item in a transaction
                raise StoreError(f"commit writes instance {w.instance_id!r} twice")
            seen.add(w.instance_id)
        self._check_claim(commit.complete)
        token = uuid.uuid4().hex
        purged: dict[TimerKey, str] = {}
        for w in commit.writes:
            if w.blob is None:
                purged.update(self._timer_states(w.instance_id))
        deferred: list[TimerKey] = []
        if (len(commit.writes) == 1 and not commit.timers_put and not commit.timers_delete
                and commit.complete is None and not purged and not commit.history):
            self._commit_single(commit.writes[0], token)
        elif not commit.writes and not commit.timers_put and not commit.timers_delete:
            assert commit.complete is not None  # the commit is not empty
            self._complete_single(commit.complete)
        else:
            deferred = self._commit_transaction(commit, purged, token)
        self._after_commit(commit, purged, deferred)

    def _check_claim(self, complete: TimerCompletion | None) -> None:
        # A soft claim is invisible to DynamoDB, so its owner check happens here.
        if complete is None or complete.node_id is None:
            return
        with self._lock:
            claim = self._claims.get(complete.key)
        if claim is not None and claim.node_id != complete.node_id:
            raise ConflictError(f"timer {complete.key} is claimed by {claim.node_id!r}")

    def _position_condition(self, w: PositionWrite) -> dict[str, Any]:
        if w.expected_version is None:
            return {"ConditionExpression": position_absent,
                    "ExpressionAttributeNames": {"#pk": "pk"}}
        return {"ConditionExpression": version_matches,
                "ExpressionAttributeNames": {"#version": "version"},
                "ExpressionAttributeValues": {":expected": N(w.expected_version)}}

    def _position_item(self, w: PositionWrite, token: str) -> dict[str, Any]:
        assert w.blob is not None
        version = 1 if w.expected_version is None else w.expected_version + 1
        item = codec.position_item(w.instance_id, w.chart, version, w.blob, w.status,
                                   tuple(w.timers), w.parent, token, tuple(w.idempotency))
        self._check_size(item, f"position {w.instance_id!r}")
        return item

    @staticmethod
    def _position_info(w: PositionWrite) -> ActionInfo:
        return ActionInfo("create" if w.expected_version is None else "position", w.instance_id)

    def _commit_single(self, w: PositionWrite, token: str) -> None:
        """One position and nothing else: a single conditional PutItem (or DeleteItem)."""
        info = [self._position_info(w)]
        if w.blob is None:
            self._call("delete_item", info, TableName=self.table_name,
                       Key=self._key(w.instance_id, codec.POSITION_SK),
                       ReturnValuesOnConditionCheckFailure="ALL_OLD", **self._position_condition(w))
            return
        item = self._position_item(w, token)
        try:
            self._call("put_item", info, TableName=self.table_name, Item=item,
                       ReturnValuesOnConditionCheckFailure="ALL_OLD", **self._position_condition(w))
        except ConflictError as exc:
            if not _own_write_landed(exc, token):
                raise

    def _complete_single(self, c: TimerCompletion) -> None:
        """A completion and nothing else (an outbox delivery acknowledged): one UpdateItem,
        or one DeleteItem when done rows are not kept; half the write cost of a transaction."""
        info = [ActionInfo("complete", c.key[0], c.key[1])]
        if c.state == DONE and not self.keep_done:
            self._call("delete_item", info, TableName=self.table_name, Key=self._timer_key(c.key),
                       **self._completion_condition(c))
            return
        self._call("update_item", info, **self._completion_update(c)["Update"])

    def _timer_states(self, instance_id: str) -> dict[TimerKey, str]:
        """Every timer row of an instance (any state), for the purge on delete."""
        out: dict[TimerKey, str] = {}
        for item in self._pages(
                "query", ConsistentRead=True,
                KeyConditionExpression="#pk = :pk AND begins_with(#sk, :timers)",
                ProjectionExpression="#pk, #ordinal, #state",
                ExpressionAttributeNames={"#pk": "pk", "#sk": "sk", "#ordinal": "ordinal",
                                          "#state": "state"},
                ExpressionAttributeValues={":pk": S(instance_id), ":timers": S(codec.TIMER_PREFIX)}):
            out[(instance_id, int(item["ordinal"]["N"]))] = item["state"]["S"]
        return out

    def _completion_condition(self, c: TimerCompletion) -> dict[str, Any]:
        names = {"#pk": "pk", "#state": "state"}
        values = {":pending": S(PENDING), ":claimed": S(CLAIMED), ":waiting": S(WAITING)}
        if c.node_id is None:
            expr = f"{row_exists} AND {row_unfinished}"
        else:
            names["#claimed_by"] = "claimed_by"
            values[":node"] = S(c.node_id)
            expr = f"{row_exists} AND {row_pending_or_mine}"
        return {"ConditionExpression": expr, "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values}

    def _completion_update(self, c: TimerCompletion) -> dict[str, Any]:
        """An Update finishing the fired row (done, waiting or dead), guarded by the
        completion condition."""
        cond = self._completion_condition(c)
        names, values = cond["ExpressionAttributeNames"], cond["ExpressionAttributeValues"]
        names.update({"#outcome": "outcome", "#reason": "reason", "#gsi_pk": "gsi_pk",
                      "#gsi_due": "gsi_due", "#claimed_by": "claimed_by",
                      "#claim_expires": "claim_expires_ms"})
        values[":to"] = S(c.state)
        sets = ["#state = :to"]
        # leaving the index is what stops every later sweep from seeing the row
        removes = ["#gsi_pk", "#gsi_due", "#claimed_by", "#claim_expires"]
        for attr, value in (("#outcome", c.outcome), ("#reason", c.reason)):
            if value is not None:
                sets.append(f"{attr} = :{attr[1:]}")
                values[f":{attr[1:]}"] = S(value)
            else:
                removes.append(attr)
        if c.state == DEAD:
            names.update({"#attempts": "attempts", "#last_error": "last_error",
                          "#dead_pk": "dead_pk", "#dead_sk": "dead_sk"})
            values.update({":one": N(1), ":dead_pk": S(codec.DEAD_PARTITION),
                           ":dead_sk": S(codec.dead_sort_key(c.key)),
                           ":last_error": S((c.error or "")[:MAX_ERROR_CHARS])})
            sets += ["#attempts = #attempts + :one", "#last_error = :last_error",
                     "#dead_pk = :dead_pk", "#dead_sk = :dead_sk"]
        if self.done_ttl_s is not None and c.state == DONE:
            names["#expires_at"] = "expires_at"
            values[":expires_at"] = N(int(time.time()) + self.done_ttl_s)
            sets.append("#expires_at = :expires_at")
        return {"Update": {"TableName": self.table_name, "Key": self._timer_key(c.key),
                           "UpdateExpression": f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
                           **cond}}

    def _timer_put_item(self, row: TimerRow) -> dict[str, Any]:
        item = codec.timer_item(row, shards=self.shards, bucket_ms=self.bucket_ms)
        self._check_size(item, f"timer row {row.key}")
        return item

    def _commit_transaction(self, commit: Commit, purged: dict[TimerKey, str],
                            token: str) -> list[TimerKey]:
        """Build and send one TransactWriteItems; returns done rows deferred past it."""
        table = self.table_name
        # (action, info, bytes, deferrable): deferrable actions are deletes of done rows of
        # a deleted instance, inert history that may be removed after the transaction.
        planned: list[tuple[dict[str, Any], ActionInfo, int, bool]] = []
        for w in commit.writes:
            info = self._position_info(w)
            cond = self._position_condition(w)
            if w.blob is None:
                action = {"Delete": {"TableName": table, "Key": self._key(w.instance_id, codec.POSITION_SK),
                                     "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **cond}}
                planned.append((action, info, 100, False))
            else:
                item = self._position_item(w, token)
                action = {"Put": {"TableName": table, "Item": item,
                                  "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **cond}}
                planned.append((action, info, codec.item_size(item), False))

        puts = {row.key: row for row in commit.timers_put}
        deletes = set(commit.timers_delete)
        comp = commit.complete
        keys: list[TimerKey] = list(dict.fromkeys(
            [*puts, *commit.timers_delete, *([comp.key] if comp else []), *purged]))
        for key in keys:
            completing = comp is not None and comp.key == key
            removed = key in deletes or key in purged
            if key in puts:
                row = puts[key]
                if completing:
                    assert comp is not None
                    if comp.state == DEAD:
                        row = replace(row, attempts=row.attempts + 1, last_error=comp.error)
                    row = replace(row, state=comp.state, outcome=comp.outcome, reason=comp.reason,
                                  claimed_by=None, claim_expires_ms=None)
                    cond = self._completion_condition(comp)
                    info = ActionInfo("complete", key[0], key[1])
                else:
                    # Unconditional, as in MemoryStore: a put of an existing key replaces
                    # the row (the Store contract), and ordinals never repeat within a
                    # live instance, so only a re-created id's leftovers can be replaced.
                    cond = {}
                    info = ActionInfo("timer_put", key[0], key[1])
                item = self._timer_put_item(row)
                planned.append(({"Put": {"TableName": table, "Item": item, **cond}}, info,
                                codec.item_size(item), False))
            elif completing:
                assert comp is not None
                info = ActionInfo("complete", key[0], key[1])
                if removed or (comp.state == DONE and not self.keep_done):
                    action = {"Delete": {"TableName": table, "Key": self._timer_key(key),
                                         **self._completion_condition(comp)}}
                else:
                    action = self._completion_update(comp)
                planned.append((action, info, 300, False))
            else:
                action = {"Delete": {"TableName": table, "Key": self._timer_key(key)}}
                deferrable = key not in deletes and purged.get(key) == DONE
                planned.append((action, ActionInfo("delete", key[0], key[1]), 100, deferrable))

        for h in commit.history:   # one more Put per record, in the same transaction
            item = _operator.history_item(self, h)
            planned.append(({"Put": {"TableName": table, "Item": item}}, ActionInfo("other", h.instance_id),
                            codec.item_size(item), False))

        deferred: list[TimerKey] = []
        if len(planned) > MAX_TRANSACTION_ACTIONS:
            keep: list[tuple[dict[str, Any], ActionInfo, int, bool]] = []
            excess = len(planned) - MAX_TRANSACTION_ACTIONS
            for entry in planned:
                if excess and entry[3]:
                    info = entry[1]
                    deferred.append((info.instance_id, info.ordinal))  # type: ignore[arg-type]
                    excess -= 1
                else:
                    keep.append(entry)
            planned = keep
        if len(planned) > MAX_TRANSACTION_ACTIONS:
            raise ItemTooLarge(
                f"commit needs {len(planned)} DynamoDB actions; one transaction holds at most "
                f"{MAX_TRANSACTION_ACTIONS} (cancel timers or split the work)",
                len(planned), MAX_TRANSACTION_ACTIONS)
        total = sum(entry[2] for entry in planned)
        if total > MAX_TRANSACTION_BYTES:
            raise ItemTooLarge(f"commit is about {total:,} bytes; a DynamoDB transaction holds "
                               f"at most 4 MB", total, MAX_TRANSACTION_BYTES)
        try:
            self._call("transact_write_items", [entry[1] for entry in planned],
                       TransactItems=[entry[0] for entry in planned], ClientRequestToken=token)
        except ConflictError as exc:
            if not _own_write_landed(exc, token):
                raise
        return deferred

    def _after_commit(self, commit: Commit, purged: dict[TimerKey, str],
                      deferred: list[TimerKey]) -> None:
        gone = set(commit.timers_delete) | set(purged)
        if commit.complete is not None:
            gone.add(commit.complete.key)
        put_keys = {row.key for row in commit.timers_put}
        self._forget(gone - put_keys, gone=True)
        self._forget(put_keys, gone=False)
        for row in commit.timers_put:
            if row.state in (PENDING, CLAIMED):
                self._lower_cursor(self.shard_of(row.key), row.ready_at_ms // self.bucket_ms)
        if deferred:
            self._delete_quietly(deferred)
        for w in commit.writes:
            if w.blob is None and commit.history_in_use:
                _operator.purge_history(self, w.instance_id)

    def _delete_quietly(self, keys: list[TimerKey]) -> None:
        """Best-effort removal of inert done rows after a committed delete.

        The commit has succeeded, so failing here would make the host retry a commit
        that landed; a leftover done row is harmless (TTL or a later purge removes it,
        and a re-created instance may overwrite it).
        """
        self._batch_delete_quietly([self._timer_key(k) for k in keys], "done timer rows")

    def _batch_delete_quietly(self, item_keys: list[dict[str, Any]], what: str) -> None:
        """Delete items by key with ``BatchWriteItem``, after a commit: failures are logged."""
        for start in range(0, len(item_keys), 25):  # BatchWriteItem takes 25 requests
            requests = [{"DeleteRequest": {"Key": k}} for k in item_keys[start:start + 25]]
            try:
                for _ in range(self._retries):
                    response = self._call("batch_write_item", RequestItems={self.table_name: requests})
                    requests = response.get("UnprocessedItems", {}).get(self.table_name, [])
                    if not requests:
                        break
            except StoreError as exc:
                log.warning("could not purge %d %s: %s", len(requests), what, exc)

    # ------------------------------------------------------------------ sweep cursors
    def _cursor_key(self, shard: int) -> dict[str, Any]:
        return self._key(f"sweep#{shard}", _CURSOR_SK)

    def _read_cursors(self, shards: Sequence[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for start in range(0, len(shards), 100):  # BatchGetItem takes 100 keys
            keys = [self._cursor_key(s) for s in shards[start:start + 100]]
            for _ in range(self._retries):
                response = self._call("batch_get_item", RequestItems={
                    self.table_name: {"Keys": keys, "ConsistentRead": True}})
                for item in response.get("Responses", {}).get(self.table_name, []):
                    out[int(item["pk"]["S"].split("#", 1)[1])] = int(item["bucket"]["N"])
                keys = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
                if not keys:
                    break
        return out

    def _learn_buckets(self, shards: Collection[int], now_ms: int | None) -> dict[int, list[int]]:
        """One scan of the due index: the non-empty buckets of each of ``shards``, sorted.

        Used to bootstrap a shard without a cursor (a new table) and to catch up a shard
        far behind. With ``now_ms``, the buckets below ``now - settle_ms`` are remembered,
        so sweeps skip the empty ones without reading them. Costs reads in proportion to
        the pending rows (the projection trims the response, not the read cost).
        """
        wanted = set(shards)
        found: dict[int, set[int]] = {s: set() for s in wanted}
        for item in self._pages("scan", IndexName=codec.DUE_INDEX, ProjectionExpression="#g",
                                ExpressionAttributeNames={"#g": "gsi_pk"}):
            bucket_s, shard_s = item["gsi_pk"]["S"].split("#")
            if int(shard_s) in wanted:
                found[int(shard_s)].add(int(bucket_s))
        out = {s: sorted(b) for s, b in found.items()}
        if now_ms is not None:
            horizon = self._floor_bucket(now_ms)
            with self._lock:
                for s, buckets in out.items():
                    self._known[s] = ([b for b in buckets if b < horizon], horizon)
        return out

    def _floor_bucket(self, now_ms: int) -> int:
        """The oldest bucket that may still receive rows: the one ``settle_ms`` ago."""
        return max(0, (now_ms - self.settle_ms) // self.bucket_ms)

    def _bucket_seq(self, shard: int, cursor: int, last: int, cap: int) -> list[int]:
        """The buckets of ``shard`` to read, ascending, from ``cursor`` up to ``last``.

        Below a scan's horizon only the buckets the scan saw non-empty are listed.
        """
        out: list[int] = []
        bucket = cursor
        with self._lock:
            known = self._known.get(shard)
            if known is not None and cursor >= known[1]:
                del self._known[shard]  # swept past the scan's horizon: no longer needed
                known = None
        if known is not None:
            buckets, horizon = known
            for b in buckets[bisect.bisect_left(buckets, cursor):]:
                if b > last or len(out) >= cap:
                    return out
                out.append(b)
            bucket = horizon
        while bucket <= last and len(out) < cap:
            out.append(bucket)
            bucket += 1
        return out

    def _knows_below(self, shard: int, cursor: int) -> bool:
        with self._lock:
            known = self._known.get(shard)
        return known is not None and cursor < known[1]

    def _create_cursor(self, shard: int, bucket: int) -> int:
        try:
            self._call("put_item", TableName=self.table_name,
                       Item={**self._cursor_key(shard), "bucket": N(bucket)},
                       ConditionExpression=cursor_absent, ExpressionAttributeNames={"#pk": "pk"})
            return bucket
        except ConflictError:
            existing = self._read_cursors([shard]).get(shard, bucket)
            if bucket < existing:
                # our scan saw a pending row below that cursor: never leave it stranded
                self._write_lower_cursor(shard, bucket)
                return bucket
            return existing

    def _cursors(self, shards: Sequence[int], now_ms: int | None) -> dict[int, int]:
        """The cursor of each shard, reading or bootstrapping the ones not known yet."""
        with self._lock:
            refresh = (now_ms is not None and self._cursor_read_now is not None
                       and now_ms - self._cursor_read_now >= self.cursor_refresh_ms)
            want = list(shards) if refresh else [s for s in shards if s not in self._cursor]
            gen = self._cursor_gen
        if want:
            durable = self._read_cursors(want)
            absent = [s for s in want if s not in durable]
            if absent:
                learnt = self._learn_buckets(absent, now_ms)
                floor = None if now_ms is None else self._floor_bucket(now_ms)
                for s in absent:
                    bucket = learnt[s][0] if learnt.get(s) else None
                    if floor is not None:
                        bucket = floor if bucket is None else min(bucket, floor)
                    if bucket is not None:  # else: nothing pending, and no "now" to anchor on
                        durable[s] = self._create_cursor(s, bucket)
            with self._lock:
                for s, bucket in durable.items():
                    local = self._cursor.get(s)
                    # an in-process lowering that raced this read must survive it
                    self._cursor[s] = bucket if local is None or gen == self._cursor_gen else min(local, bucket)
                if now_ms is not None and (refresh or self._cursor_read_now is None):
                    self._cursor_read_now = now_ms
        with self._lock:
            return {s: self._cursor[s] for s in shards if s in self._cursor}

    def _write_lower_cursor(self, shard: int, bucket: int) -> None:
        try:
            self._call("update_item", TableName=self.table_name, Key=self._cursor_key(shard),
                       UpdateExpression="SET #bucket = :new",
                       ConditionExpression=f"{cursor_absent} OR {cursor_above}",
                       ExpressionAttributeNames={"#pk": "pk", "#bucket": "bucket"},
                       ExpressionAttributeValues={":new": N(bucket)})
        except ConflictError:
            pass  # already at or below it
        except StoreError as exc:
            # called after a commit landed: report, do not fail the commit
            log.warning("could not lower the sweep cursor of shard %d to %d: %s", shard, bucket, exc)

    def _lower_cursor(self, shard: int, bucket: int) -> None:
        """A row was written below a cursor this store knows: move the cursor back to it."""
        with self._lock:
            current = self._cursor.get(shard)
            if current is None or bucket >= current:
                return
            self._cursor[shard] = bucket
            self._cursor_gen += 1
            # the scan's list of non-empty buckets no longer covers this one
            self._known.pop(shard, None)
        self._write_lower_cursor(shard, bucket)

    def _advance_cursor(self, shard: int, old: int, new: int) -> None:
        with self._lock:
            if self._cursor.get(shard) != old:
                return  # lowered (or re-read) while we were scanning
        try:
            self._call("update_item", TableName=self.table_name, Key=self._cursor_key(shard),
                       UpdateExpression="SET #bucket = :new", ConditionExpression=cursor_unchanged,
                       ExpressionAttributeNames={"#bucket": "bucket"},
                       ExpressionAttributeValues={":new": N(new), ":old": N(old)})
        except ConflictError:
            # another sweeper moved it (or a writer lowered it): re-read next time
            with self._lock:
                if self._cursor.get(shard) == old:
                    del self._cursor[shard]
            return
        with self._lock:
            if self._cursor.get(shard) == old:
                self._cursor[shard] = new

    def reset_sweep_cursors(self) -> None:
        """Forget every shard's sweep cursor; the next sweep bootstraps with an index scan.

        For operators, after clocks were so far off that rows were written into buckets
        already swept past. Costs one index scan on the next ``claim_due``.
        """
        for s in range(self.shards):
            self._call("delete_item", TableName=self.table_name, Key=self._cursor_key(s))
        with self._lock:
            self._cursor.clear()
            self._known.clear()
            self._cursor_gen += 1
            self._cursor_read_now = None

    # ------------------------------------------------------------------ timers
    def _query_bucket(self, bucket: int, shard: int, want: int, now_ms: int | None
                      ) -> tuple[list[TimerRow], bool]:
        """Up to ``want`` visible rows of one index partition, earliest first.

        With ``now_ms``, only rows ready by then. Returns the rows and whether the
        partition held anything at all (hidden rows included), which the cursor needs.
        """
        names = {"#gsi_pk": "gsi_pk"}
        values = {":p": S(codec.due_partition(bucket, shard))}
        expr = "#gsi_pk = :p"
        if now_ms is not None:
            names["#gsi_due"] = "gsi_due"
            values[":now"] = N(now_ms)
            expr += " AND #gsi_due <= :now"
        rows: list[TimerRow] = []
        saw_any = False
        for item in self._pages("query", IndexName=codec.DUE_INDEX, KeyConditionExpression=expr,
                                ExpressionAttributeNames=names, ExpressionAttributeValues=values,
                                Limit=want + 8):  # a little slack for hidden rows
            saw_any = True
            row = codec.row_from_item(item)
            if row.state not in (PENDING, CLAIMED) or self._hidden(row.key, now_ms):
                continue
            rows.append(row)
            if len(rows) >= want:
                break
        return rows, saw_any

    def claim_due(self, now_ms: int, limit: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Return up to ``limit`` rows ready by ``now_ms``, earliest first, soft-claimed.

        Reads the due index bucket by bucket from each shard's cursor (restricted to
        :attr:`owned_shards`) and writes no claim to DynamoDB: the commit that completes
        a row is what guarantees it fires once (see the module doc). The index is
        eventually consistent, so a row may show up just after another process fired
        it; its commit then fails with ``ConflictError``.
        """
        if limit <= 0:
            return []
        shards = self._scan_shards()
        with self._lock:
            self._last_now = now_ms
        if not shards:
            return []
        cursors = self._cursors(shards, now_ms)
        if not cursors:
            return []
        now_bucket = now_ms // self.bucket_ms
        lagging = [sh for sh, c in cursors.items() if now_bucket - c > self.catch_up_buckets
                   and not self._knows_below(sh, c)]
        if lagging:
            self._learn_buckets(lagging, now_ms)
        seqs = {sh: self._bucket_seq(sh, c, now_bucket, self.max_scan_buckets)
                for sh, c in cursors.items()}
        by_bucket: dict[int, list[int]] = {}
        for sh, seq in seqs.items():
            for bucket in seq:
                by_bucket.setdefault(bucket, []).append(sh)
        chosen: list[TimerRow] = []
        nonempty: set[tuple[int, int]] = set()
        scanned_to: int | None = None
        for bucket in sorted(by_bucket):
            want = limit - len(chosen)
            found: list[TimerRow] = []
            for sh in by_bucket[bucket]:
                rows, saw_any = self._query_bucket(bucket, sh, want, now_ms)
                if saw_any:
                    nonempty.add((sh, bucket))
                found.extend(rows)
            # buckets partition time, so the earliest `want` of this bucket come next
            found.sort(key=lambda r: (r.ready_at_ms, r.instance_id, r.ordinal))
            chosen.extend(found[:want])
            scanned_to = bucket
            if len(chosen) >= limit:
                break
        for sh, seq in seqs.items():
            old = cursors[sh]
            # the cursor moves to the first bucket not proven empty: read and found empty
            # after it settled, or skipped because a scan saw it empty (see _bucket_seq)
            new = seq[-1] + 1 if seq else old
            for bucket in seq:
                if (scanned_to is None or bucket > scanned_to or (sh, bucket) in nonempty
                        or (bucket + 1) * self.bucket_ms + self.settle_ms > now_ms):
                    new = bucket
                    break
            if new > old:
                self._advance_cursor(sh, old, new)
        expires = now_ms + lease_ms
        out = []
        with self._lock:
            for row in chosen:
                if self._hidden(row.key, now_ms):
                    continue  # another thread of this store claimed it while we read
                self._claims[row.key] = _Claim(node_id, expires)
                self._claims.move_to_end(row.key)
                out.append(replace(row, state=CLAIMED, claimed_by=node_id, claim_expires_ms=expires))
            # soft claims are only an optimisation: bound them, oldest out first
            while len(self._claims) > 100_000:
                self._claims.popitem(last=False)
        return out

    def release(self, key: TimerKey, node_id: str, *, error: str, next_attempt_at_ms: int,
                dead: bool) -> None:
        """Give a row back after a failed delivery: attempts + 1, error, backoff or dead.

        Re-reads the row and writes it back on the condition that its state and attempts
        are unchanged, so two sweepers that both failed the same row count one attempt,
        and a row completed meanwhile is left alone. A no-op if the row is gone or done.
        """
        with self._lock:
            claim = self._claims.get(key)
        if claim is not None and claim.node_id != node_id:
            return
        response = self._call("get_item", TableName=self.table_name, Key=self._timer_key(key),
                              ConsistentRead=True)
        item = response.get("Item")
        if item is None:
            self._forget([key], gone=True)
            return
        row = codec.row_from_item(item)
        if row.state == DONE or (row.state == CLAIMED and row.claimed_by not in (None, node_id)):
            self._forget([key], gone=row.state == DONE)
            return
        new = replace(row, state=DEAD if dead else PENDING, attempts=row.attempts + 1,
                      last_error=error[:MAX_ERROR_CHARS], next_attempt_at_ms=next_attempt_at_ms,
                      claimed_by=None, claim_expires_ms=None)
        try:
            self._call("put_item", TableName=self.table_name, Item=self._timer_put_item(new),
                       ConditionExpression=row_unchanged,
                       ExpressionAttributeNames={"#state": "state", "#attempts": "attempts"},
                       ExpressionAttributeValues={":seen_state": S(row.state),
                                                  ":seen_attempts": N(row.attempts)})
        except ConflictError:
            pass  # someone else released or completed it first
        self._forget([key], gone=False)
        if not dead:
            self._lower_cursor(self.shard_of(key), new.ready_at_ms // self.bucket_ms)

    def next_due(self) -> int | None:
        """Best-effort earliest ready time among this store's shards, or ``None``.

        Probes the due index bucket by bucket from the oldest cursor to
        ``next_due_horizon_ms`` past the last sweep; if that finds nothing, scans the
        index (at most ``next_due_scan_items`` items). If the scan is cut short, returns
        the end of the probed window: nothing is due before it, so a loop that sleeps
        until then wakes in time. Rows soft-claimed here count at their claim expiry.
        """
        shards = self._scan_shards()
        with self._lock:
            claimed = [c.expires_ms for c in self._claims.values()]
            last_now = self._last_now
        best = min(claimed) if claimed else None
        if not shards:
            return best
        cursors = self._cursors(shards, None)
        if not cursors:
            return best
        start = min(cursors.values())
        base = max(start, last_now // self.bucket_ms) if last_now is not None else start
        end = base + max(1, self.next_due_horizon_ms // self.bucket_ms)
        by_bucket: dict[int, list[int]] = {}
        for s, c in cursors.items():
            for bucket in self._bucket_seq(s, c, end, end - start + 1):
                by_bucket.setdefault(bucket, []).append(s)
        found: int | None = None
        for bucket in sorted(by_bucket):
            for s in by_bucket[bucket]:
                rows, _ = self._query_bucket(bucket, s, 1, None)
                if rows and (found is None or rows[0].ready_at_ms < found):
                    found = rows[0].ready_at_ms
            if found is not None:
                break
        if found is None:
            found = self._scan_earliest(set(shards), (end + 1) * self.bucket_ms)
        if found is None:
            return best
        return found if best is None else min(best, found)

    def _scan_earliest(self, shards: set[int], bound: int) -> int | None:
        earliest: int | None = None
        read = 0
        for item in self._pages("scan", IndexName=codec.DUE_INDEX,
                                ProjectionExpression="#pk, #ordinal, #gsi_pk, #gsi_due",
                                ExpressionAttributeNames={"#pk": "pk", "#ordinal": "ordinal",
                                                          "#gsi_pk": "gsi_pk", "#gsi_due": "gsi_due"},
                                Limit=min(self.next_due_scan_items, 1_000)):
            read += 1
            if read > self.next_due_scan_items:
                return bound if earliest is None else min(earliest, bound)
            shard = int(item["gsi_pk"]["S"].split("#")[1])
            key = (item["pk"]["S"], int(item["ordinal"]["N"]))
            if shard not in shards or self._hidden(key, None):
                continue
            due = int(item["gsi_due"]["N"])
            earliest = due if earliest is None else min(earliest, due)
        return earliest

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The instance's rows that are not done (pending, claimed or dead), by ordinal."""
        codec.check_id(instance_id)
        rows = [codec.row_from_item(item) for item in self._pages(
            "query", ConsistentRead=True,
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :timers)",
            FilterExpression="#state <> :done",
            ExpressionAttributeNames={"#pk": "pk", "#sk": "sk", "#state": "state"},
            ExpressionAttributeValues={":pk": S(instance_id), ":timers": S(codec.TIMER_PREFIX),
                                       ":done": S(DONE)})]
        return sorted((self._overlay(r) for r in rows), key=lambda r: r.ordinal)

    def dead_timers(self, limit: int = 100) -> Sequence[TimerRow]:
        """Rows parked as dead, by key, from the sparse ``dead-index`` (eventually consistent)."""
        if limit <= 0:
            return []
        out: list[TimerRow] = []
        for item in self._pages("query", IndexName=codec.DEAD_INDEX,
                                KeyConditionExpression="#dead_pk = :dead",
                                ExpressionAttributeNames={"#dead_pk": "dead_pk"},
                                ExpressionAttributeValues={":dead": S(codec.DEAD_PARTITION)},
                                Limit=limit):
            row = codec.row_from_item(item)
            if row.state == DEAD:
                out.append(row)
                if len(out) >= limit:
                    break
        return out

    def retry_timer(self, key: TimerKey, now_ms: int) -> bool:
        """Revive a dead row (pending, attempts reset, due ``now_ms``): one UpdateItem."""
        codec.check_id(key[0])
        shard = self.shard_of(key)
        try:
            self._call(
                "update_item", TableName=self.table_name, Key=self._timer_key(key),
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
                    ":partition": S(codec.due_partition(now_ms // self.bucket_ms, shard))})
        except ConflictError:
            return False
        self._forget([key], gone=False)
        self._lower_cursor(shard, now_ms // self.bucket_ms)
        return True

    def get_timer(self, key: TimerKey) -> TimerRow | None:
        """One row by key, in any state: one strongly consistent GetItem."""
        codec.check_id(key[0])
        response = self._call("get_item", TableName=self.table_name, Key=self._timer_key(key),
                              ConsistentRead=True)
        item = response.get("Item")
        return None if item is None else self._overlay(codec.row_from_item(item))
