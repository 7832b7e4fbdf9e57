"""Group commit on DynamoDB: ``BatchGetItem`` for the loads, a bounded pool for the writes.

``DynamoStore.load_many`` reads the position items of up to 100 instances per
``BatchGetItem`` request (strongly consistent), and asks again, with backoff, for the keys
DynamoDB returns as ``UnprocessedKeys`` (throttling, the 16 MB response limit).

``DynamoStore.commit_many`` does **not** put several instances into one
``TransactWriteItems``: a failed condition cancels the whole transaction, so one stale
instance would fail every other one in the group, and a transaction holds at most 100
actions and 4 MB, which one instance's commit can already approach. Each commit stays
the request it is on its own (one conditional ``PutItem``, or one transaction), and a
thread pool of ``DynamoStore.batch_workers`` sends them at once: a group of N costs the
wall time of about N / workers requests instead of N. One boto3 client is shared by the
threads (clients are thread-safe; sessions and resources are not). See ``docs/dynamodb.md``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..exceptions import StateboundError, StoreUnavailable
from ..host.store import Commit, PositionRecord
from . import _codec as codec
from ._codec import S

if TYPE_CHECKING:
    from .store import DynamoStore

__all__ = ["load_many", "commit_many", "MAX_BATCH_GET_KEYS"]

#: Most keys one ``BatchGetItem`` takes.
MAX_BATCH_GET_KEYS = 100


def load_many(store: DynamoStore, instance_ids: Sequence[str]) -> dict[str, PositionRecord]:
    """The records of those ids that exist: one ``BatchGetItem`` per 100 ids (more only for
    unprocessed keys)."""
    ids = list(dict.fromkeys(codec.check_id(iid) for iid in instance_ids))   # a duplicate key is refused
    out: dict[str, PositionRecord] = {}
    for i in range(0, len(ids), MAX_BATCH_GET_KEYS):
        keys = [{"pk": S(iid), "sk": S(codec.POSITION_SK)} for iid in ids[i:i + MAX_BATCH_GET_KEYS]]
        for item in _batch_get(store, keys):
            rec = codec.record_from_item(item)
            out[rec.instance_id] = rec
    return out


def _batch_get(store: DynamoStore, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    request: dict[str, Any] = {store.table_name: {"Keys": keys, "ConsistentRead": True}}
    for attempt in range(store._retries + 1):
        response = store._call("batch_get_item", RequestItems=request)
        items.extend(response.get("Responses", {}).get(store.table_name, []))
        request = response.get("UnprocessedKeys") or {}
        if not request:
            return items
        if attempt < store._retries:
            # DynamoDB's advice for unprocessed keys: back off before asking again
            store._sleep(store._retry_base_s * (2 ** attempt) * (0.5 + random.random() / 2))
    left = len(request.get(store.table_name, {}).get("Keys", []))
    raise StoreUnavailable(f"DynamoDB left {left} key(s) unprocessed after {store._retries + 1} BatchGetItem calls")


def commit_many(store: DynamoStore, commits: Sequence[Commit]) -> list[StateboundError | None]:
    """Each commit as :meth:`DynamoStore.commit` sends it, ``batch_workers`` at a time; a
    failed one reports its error in its slot."""
    def one(commit: Commit) -> StateboundError | None:
        try:
            store.commit(commit)
        except StateboundError as exc:
            return exc
        return None

    todo = [i for i, c in enumerate(commits) if not c.empty]
    out: list[StateboundError | None] = [None] * len(commits)
    workers = min(max(1, store.batch_workers), len(todo))
    if workers <= 1:
        for i in todo:
            out[i] = one(commits[i])
        return out
    with ThreadPoolExecutor(workers, thread_name_prefix="statebound-commit") as pool:
        for i, err in zip(todo, pool.map(one, [commits[i] for i in todo]), strict=True):
            out[i] = err
    return out
