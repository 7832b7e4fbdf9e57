"""DynamoStore: the :class:`~statebound.host.store.Store` protocol on one DynamoDB table.

Layout (see ``_codec.py`` for every attribute): ``pk`` = instance id, ``sk`` = ``"P"``
for the position item and ``"T#<ordinal>"`` for each timer row the instance scheduled.
Pending rows also carry ``gsi_pk = "due#<shard>"`` and ``gsi_due = ready_at_ms``, which
puts them in the sparse ``due-index``; a fired, cancelled or dead row drops those
attributes and leaves it. Dead rows carry ``dead_pk = "dead#<shard>"``/``dead_sk`` instead
and sit in the sparse ``dead-index``, so :meth:`DynamoStore.dead_timers` reads dead rows
only, never the table.

This module holds the positions and commits; the sweep (which shards to read, hints,
soft claims, releases) is ``_sweep.py``, the schema ``_table.py``, the 0.1 upgrade
``_migrate.py``.

Costs per operation (one "call" is one HTTP request; botocore's own retries aside):

==========================  ==========================================================
``load``                    1 ``GetItem`` (strongly consistent)
``commit``, one position,   1 ``PutItem`` with ``#version = :expected``
  no timers
``commit``, anything else   1 ``TransactWriteItems`` (position + timer rows + completion)
``commit`` deleting an      1 ``Query`` of the instance's timer rows, then 1
  instance                    ``TransactWriteItems`` (or 1 ``DeleteItem`` if none)
``claim_due``               1 ``Query`` per shard that is due by its hint, new to this
                            store object, or past ``fallback_ms`` since its last read;
                            **no write** for a timer row: the claim is the commit's
                            completion condition; 1 conditional ``UpdateItem`` per outbox
                            row (its stored claim, ``_sweep.py``). Idle with fresh hints:
                            nothing at all
``claim_rows``              1 conditional ``UpdateItem`` per row (the sweeper calls it for
                            the outbox rows a wake-up names)
``next_due``                nothing, once every owned shard has been read
``load_many``               1 ``BatchGetItem`` per 100 ids (more for unprocessed keys)
``commit_many``             each commit as ``commit``, ``batch_workers`` in parallel
                            (``_batch.py``: why not one transaction)
``release``                 1 ``GetItem`` + 1 conditional ``PutItem``
``retry_timer``             1 conditional ``UpdateItem``
``pending_timers``          1 ``Query`` of the instance partition (paginated)
``dead_timers``             1 ``Query`` per shard of ``dead-index``
``due_timers``,             operator reads and batch jobs: see ``_operator.py``
``history``,
``list_positions``,
``purge_done``
==========================  ==========================================================

**Claims.** ``claim_due`` writes no claim of a timer row to DynamoDB. Exactly-once firing
comes from the commit: the fired row is completed in the same transaction as the position,
on the condition that the row still exists and is not done, so of two sweepers that fire
the same row one commits and the other gets :class:`~statebound.ConflictError` with nothing
written. Within one store object claims are exclusive ("soft claims", ``_sweep.py``), and
shard leases (``leases.py``) keep two processes off the same shards most of the time. An
outbox row calls the outside world before its completion, so its claim is written, by
``claim_due`` and by ``claim_rows`` alike (``_sweep.py``: stored claims).

**Idempotent commits.** A transaction carries a ``ClientRequestToken``, and every
position item records the ``commit_token`` of the commit that wrote it. When a retried
request (botocore retries timeouts on its own) finds its condition failed because its
own first attempt already landed, the token in the returned item says so and the commit
reports success instead of a conflict that would make the host apply the event twice.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import ConflictError, InvalidArgument, ItemTooLarge, StateboundError, StoreError
from ..host.store import (CLAIMED, DEAD, DONE, PENDING, WAITING, Commit, PositionRecord, check_ints, PositionWrite,
                          TimerCompletion, TimerKey, TimerRow, commit_instance_ids, purges)
from . import _batch
from . import _codec as codec
from . import _operator, _table
from ._codec import N, S
from ._errors import ActionInfo, call
from ._migrate import MigrationReport, migrate
from ._sweep import MAX_ERROR_CHARS, Sweep, cut_utf8, error_text

__all__ = ["DynamoStore", "MAX_ITEM_BYTES", "MAX_TRANSACTION_ACTIONS", "MAX_TRANSACTION_BYTES",
           "MAX_INSTANCE_ID_BYTES", "MAX_ERROR_CHARS", "TIMER_HEADROOM_BYTES"]

log = logging.getLogger(__name__)

#: Longest instance id (UTF-8 bytes) the table can key on.
MAX_INSTANCE_ID_BYTES = codec.MAX_INSTANCE_ID_BYTES
#: Largest item we send. DynamoDB's limit is 400 KB (409,600 bytes, names included);
#: we stop short of it so that an estimate a little low still never reaches the service.
MAX_ITEM_BYTES = 400_000
#: What a timer row leaves free of :data:`MAX_ITEM_BYTES` when it is written: room for the
#: record of a failed delivery (attempts, retry time, the dead index's keys, outcome, reason
#: and an error of up to ``MAX_ERROR_CHARS`` bytes), so that recording a failure never makes
#: the row too large to write back.
TIMER_HEADROOM_BYTES = MAX_ERROR_CHARS + 1_024
#: Most actions DynamoDB accepts in one ``TransactWriteItems``.
MAX_TRANSACTION_ACTIONS = 100
#: DynamoDB refuses transactions over 4 MB; moto does not check, so we do.
MAX_TRANSACTION_BYTES = 4_000_000

# --------------------------------------------------------------------------- conditions
# Each clause is named so the expressions read like the rules they enforce.
position_absent = "attribute_not_exists(#pk)"
version_matches = "#version = :expected"
row_exists = "attribute_exists(#pk)"
row_unfinished = "#state IN (:pending, :claimed, :waiting)"
row_pending_or_mine = "(#state IN (:pending, :waiting) OR (#state = :claimed AND #claimed_by = :node))"

#: Constructor arguments of 0.1's bucketed sweep, accepted and ignored.
_RETIRED = ("bucket_ms", "settle_ms", "max_scan_buckets", "catch_up_buckets", "next_due_horizon_ms",
            "next_due_scan_items", "cursor_refresh_ms")


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
        Clients are thread-safe, so one serves a sweeper's whole thread pool.
    :param shards: due-index shards. Fixed for the life of a table: every writer and
        sweeper must use the same number (``docs/dynamodb.md`` shows how to choose it).
    :param owned_shards: restrict ``claim_due``/``next_due`` to these shards: a
        collection of ints, or anything with a ``held`` attribute such as a
        :class:`~statebound.dynamodb.ShardLeases` (read at every call; its
        ``maybe_acquire()`` is called at every ``claim_due``). ``None``: all.
    :param keep_done: keep completed rows (state ``done``) for inspection; if ``False``,
        a completion deletes the row.
    :param done_ttl_s: when set, completed rows get an ``expires_at`` attribute (epoch
        seconds, wall clock) so DynamoDB TTL deletes them after this many seconds.
    :param fallback_ms: the slow fallback sweep: a shard is read at least this often (in
        the ``now_ms`` of ``claim_due``) even when its hint says nothing is due, to find
        rows other processes wrote without a wake-up. Idle cost: one ``Query`` per shard
        per ``fallback_ms``. Rows written through this store object, and rows whose
        writers send wake-ups, never wait for it.
    :param retries: attempts per call when DynamoDB throttles, before ``StoreUnavailable``.
    :param retry_base_s: first backoff delay, doubled on each retry.
    :param sleep: how to wait between retries (tests pass a no-op).

    0.1's sweep settings (``bucket_ms``, ``settle_ms``, ``max_scan_buckets``,
    ``catch_up_buckets``, ``next_due_horizon_ms``, ``next_due_scan_items``,
    ``cursor_refresh_ms``) are accepted with a ``DeprecationWarning`` and ignored.
    """

    def __init__(self, table_name: str, client: Any = None, *, shards: int = 16,
                 owned_shards: Collection[int] | Any | None = None, keep_done: bool = True,
                 done_ttl_s: int | None = None, fallback_ms: int = 60_000, retries: int = 4,
                 retry_base_s: float = 0.05, sleep: Callable[[float], None] = time.sleep,
                 **retired: Any) -> None:
        unknown = set(retired) - set(_RETIRED)
        if unknown:
            raise InvalidArgument(f"DynamoStore got unexpected argument(s) {sorted(unknown)}")
        if retired:
            warnings.warn(f"DynamoStore: {sorted(retired)} belonged to 0.1's bucketed sweep and are "
                          "ignored; see fallback_ms", DeprecationWarning, stacklevel=2)
        if shards < 1 or retries < 1 or fallback_ms < 1:
            raise InvalidArgument("shards, retries and fallback_ms must be positive")
        self.table_name = table_name
        self.client = client if client is not None else _table.default_client()
        self.shards = shards
        #: the longest instance id (UTF-8 bytes) this store keys; the host checks an invoked
        #: child's id (``parent::invokeid``) against it before it starts the child
        self.max_instance_id_bytes = MAX_INSTANCE_ID_BYTES
        #: see the ``owned_shards`` parameter; may be reassigned at any time
        self.owned_shards = owned_shards
        self.keep_done = keep_done
        self.done_ttl_s = done_ttl_s
        self._retries = retries
        self._retry_base_s = retry_base_s
        self._sleep = sleep
        # Local state, shared by the threads of one sweeper; never trusted across processes.
        self._sweep = Sweep(self, fallback_ms)
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
        return _table.table_spec(table_name)

    @classmethod
    def create_table(cls, table_name: str, client: Any = None, *, wait: bool = True,
                     timeout_s: float = 600.0) -> None:
        """Create the table with both indexes and TTL on ``expires_at``; idempotent.

        An existing table is accepted if it has the two indexes (else :class:`StoreError`).
        With ``wait``, returns once the table and its indexes are ``ACTIVE``.
        """
        _table.create_table(table_name, client, wait=wait, timeout_s=timeout_s)

    def migrate(self) -> MigrationReport:
        """Bring a table written by statebound 0.1 to this layout (idempotent; see
        ``_migrate.py``). A sweep does it by itself when it finds 0.1's sweep cursors, or, on a
        table without the layout marker, rows keyed the 0.1 way."""
        report = migrate(self)
        self._sweep.reset()
        return report

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

    @property
    def fallback_ms(self) -> int:
        """See the ``fallback_ms`` parameter (may be reassigned)."""
        return self._sweep.fallback_ms

    @fallback_ms.setter
    def fallback_ms(self, value: int) -> None:
        self._sweep.fallback_ms = value

    def _check_size(self, item: dict[str, Any], what: str) -> int:
        size = codec.item_size(item)
        if size > MAX_ITEM_BYTES:
            raise ItemTooLarge(f"{what} would be a {size:,}-byte DynamoDB item; the limit is "
                               f"400 KB (statebound refuses above {MAX_ITEM_BYTES:,} bytes)",
                               size, MAX_ITEM_BYTES)
        return size

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
        self._sweep.check_claim(commit.complete)
        token = uuid.uuid4().hex
        purged: dict[TimerKey, str] = {}
        for w in commit.writes:
            if purges(w):
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
            values.update({":one": N(1), ":dead_pk": S(codec.dead_partition(self.shard_of(c.key))),
                           ":dead_sk": S(codec.dead_sort_key(c.key)),
                           ":last_error": S(error_text(c.error))})
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
        """A new row's item, refused unless it leaves :data:`TIMER_HEADROOM_BYTES` free."""
        item = codec.timer_item(row, shards=self.shards)
        size = codec.item_size(item)
        if size + TIMER_HEADROOM_BYTES > MAX_ITEM_BYTES:
            raise ItemTooLarge(f"timer row {row.key} would be a {size:,}-byte DynamoDB item; a timer row may "
                               f"be at most {MAX_ITEM_BYTES - TIMER_HEADROOM_BYTES:,} bytes (400 KB, less "
                               f"{TIMER_HEADROOM_BYTES:,} kept for the record of a failed delivery)",
                               size, MAX_ITEM_BYTES - TIMER_HEADROOM_BYTES)
        return item

    def _failed_row_item(self, row: TimerRow) -> dict[str, Any]:
        """The item of a row that records a failure (released or parked as dead).

        A row written by this version always has room for it; one written before the
        headroom existed gets its error shortened to fit, to nothing at worst.
        :raises ItemTooLarge: the row does not fit even without an error.
        """
        item = codec.timer_item(row, shards=self.shards)
        over = codec.item_size(item) - MAX_ITEM_BYTES
        if over > 0 and row.last_error:
            row = replace(row, last_error=cut_utf8(row.last_error, len(row.last_error.encode("utf-8")) - over))
            item = codec.timer_item(row, shards=self.shards)
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
        expect = dict(commit.timers_expect)
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
                        row = replace(row, attempts=row.attempts + 1, last_error=error_text(comp.error))
                    row = replace(row, state=comp.state, outcome=comp.outcome, reason=comp.reason,
                                  claimed_by=None, claim_expires_ms=None)
                    cond = self._completion_condition(comp)
                    info = ActionInfo("complete", key[0], key[1])
                    item = self._failed_row_item(row)
                elif key in expect:
                    # a row the host read and rewrites: only in a state it read it in
                    states = expect[key]
                    cond = {"ConditionExpression": f"#state IN ({', '.join(f':s{i}' for i in range(len(states)))})",
                            "ExpressionAttributeNames": {"#state": "state"},
                            "ExpressionAttributeValues": {f":s{i}": S(v) for i, v in enumerate(states)}}
                    info = ActionInfo("timer_state", key[0], key[1])
                    item = self._timer_put_item(row)
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
        self._sweep.after_commit(commit, purged)
        if deferred:
            self._delete_quietly(deferred)
        for w in commit.writes:
            # Whoever deletes, the history goes: a host without history= may delete what
            # another recorded, and a later instance of the same id would read it as its own
            # (an erasure that kept the data). One Query per delete.
            if purges(w):
                # a tombstone's version ends the deleted instance's records; after it they are
                # those of a new instance started over it meanwhile (ADR 0028)
                _operator.purge_history(self, w.instance_id, None if w.blob is None else w.expected_version)

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

    # ------------------------------------------------------------------ timers
    def claim_due(self, now_ms: int, limit: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Return up to ``limit`` rows ready by ``now_ms``, earliest first, soft-claimed.

        Reads only the shards (of :attr:`owned_shards`) that are due by their hint, new to
        this store object, or past ``fallback_ms`` (``_sweep.py``), one ``Query`` each, and
        writes no claim of a timer row to DynamoDB: the commit that completes a row is what
        guarantees it fires once. The index is eventually consistent, so a row may show up
        just after another process fired it; its commit then fails with ``ConflictError``.
        An outbox row's claim is written (one conditional ``UpdateItem``), since it calls
        out before its commit; one another process holds is left out.
        """
        check_ints(now_ms=now_ms, limit=limit, lease_ms=lease_ms)
        return self._sweep.claim_due(now_ms, limit, node_id, lease_ms)

    def claim_rows(self, keys: Sequence[TimerKey], now_ms: int, node_id: str, lease_ms: int) -> list[TimerRow]:
        """Claim the named rows for ``node_id`` (see
        :meth:`~statebound.host.store.RowClaimStore.claim_rows`): one conditional ``UpdateItem``
        per row, which writes ``state = claimed``, ``claimed_by`` and ``claim_expires_ms`` and
        leaves the row in the due index, so a claim whose holder died is found when it lapses.
        Unlike ``claim_due``'s soft claims, every process sees it."""
        check_ints(now_ms=now_ms, lease_ms=lease_ms)
        for key in keys:
            codec.check_id(key[0])
        return self._sweep.claim_rows(keys, now_ms, node_id, lease_ms)

    def release(self, key: TimerKey, node_id: str, *, error: str, next_attempt_at_ms: int | None,
                dead: bool, attempt: bool = True) -> None:
        """Give a row back after a failed delivery: attempts + 1, error, backoff or dead.

        Re-reads the row and writes it back on the condition that its state and attempts
        are unchanged, so two sweepers that both failed the same row count one attempt,
        and a row completed meanwhile is left alone. A no-op if the row is gone or done.
        """
        self._sweep.release(key, node_id, error=error, next_attempt_at_ms=next_attempt_at_ms, dead=dead,
                            attempt=attempt)

    def next_due(self) -> int | None:
        """Best-effort earliest ready time among this store's shards, or ``None``.

        The lowest shard hint (a lower bound: rows other processes wrote since a shard was
        last read may be missing), or a soft claim's expiry if sooner. Costs nothing once
        every owned shard has been read; a shard never read is peeked at with one ``Query``.
        """
        return self._sweep.next_due()

    def pending_between(self, after_ms: int, until_ms: int, limit: int = 100_000) -> list[TimerRow]:
        """Pending rows of the owned shards with ``after_ms < ready_at_ms <= until_ms``,
        earliest first, without claiming them: one ``Query`` per shard (paginated), reading
        only those rows. The scheduled fallback sweep uses it to ask wake-ups for the rows
        that come within the wake-up horizon before it runs again."""
        return self._sweep.pending_between(after_ms, until_ms, limit)

    def shard_hints(self) -> dict[int, int | None]:
        """What this store object knows of each shard it read: the earliest ready time it
        saw there (``None``: nothing pending). For operators and tests."""
        return self._sweep.hints()

    def reset_sweep_cursors(self) -> None:
        """Forget every shard hint, so the next sweep reads every shard (0.1's name kept:
        there are no cursors any more)."""
        self._sweep.reset()

    def pending_timers(self, instance_id: str) -> list[TimerRow]:
        """The instance's rows that are not done (pending, claimed or dead), by ordinal."""
        codec.check_id(instance_id)
        rows = [codec.listed_row(item) for item in self._pages(
            "query", ConsistentRead=True,
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :timers)",
            FilterExpression="#state <> :done",
            ExpressionAttributeNames={"#pk": "pk", "#sk": "sk", "#state": "state"},
            ExpressionAttributeValues={":pk": S(instance_id), ":timers": S(codec.TIMER_PREFIX),
                                       ":done": S(DONE)})]
        return sorted((self._sweep.overlay(r) for r in rows), key=lambda r: r.ordinal)

    def dead_timers(self, limit: int = 100) -> Sequence[TimerRow]:
        """Rows parked as dead, by key, from the sparse ``dead-index`` (eventually
        consistent): one ``Query`` per shard."""
        check_ints(limit=limit)
        return self._sweep.dead_timers(limit)

    def retry_timer(self, key: TimerKey, now_ms: int) -> bool:
        """Revive a dead row (pending, attempts reset, due ``now_ms``): one UpdateItem."""
        codec.check_id(key[0])
        return self._sweep.retry_timer(key, now_ms)

    def get_timer(self, key: TimerKey) -> TimerRow | None:
        """One row by key, in any state: one strongly consistent GetItem."""
        codec.check_id(key[0])
        response = self._call("get_item", TableName=self.table_name, Key=self._timer_key(key),
                              ConsistentRead=True)
        item = response.get("Item")
        return None if item is None else self._sweep.overlay(codec.listed_row(item))
