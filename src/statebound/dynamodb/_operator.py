"""DynamoStore's operator reads and batch jobs: what ``statebound`` runs, never the hot path.

Kept apart from ``store.py`` (commits, claims and the sweep) because none of it is on the
path of an event or a fire. Each function is bound as a :class:`DynamoStore` method; the
costs below are per call, "RCU" meaning read capacity units (4 KB each, halved for an
eventually consistent read).

==========================  ==========================================================
``purge_done``              a ``Scan`` of the table (the whole table over a full pass:
                            done rows are in no index), plus 1 conditional
                            ``DeleteItem`` per row deleted. Prefer ``done_ttl_s``, which
                            costs no requests at all.
==========================  ==========================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import ConflictError
from ..host.store import DONE
from . import _codec as codec
from ._codec import N, S

if TYPE_CHECKING:
    from .store import DynamoStore

__all__ = ["purge_done"]

row_done = "#state = :done"


def purge_done(self: DynamoStore, due_before_ms: int, limit: int = 10_000) -> int:
    """Delete up to ``limit`` completed timer rows that were due before ``due_before_ms``.

    Done rows leave both indexes, so finding them takes a ``Scan`` (see the module table
    for its cost). The scan resumes, on the next call to the same store object, where this
    one stopped, so a caller looping until fewer than ``limit`` come back reads the table
    once. Each delete is conditional on the row still being done: an instance deleted and
    re-created under the same id may have reused the key for a pending row meanwhile.
    Returns how many rows were deleted.
    """
    if limit <= 0:
        return 0
    found: list[tuple[str, int]] = []
    kwargs: dict[str, Any] = dict(
        ProjectionExpression="#pk, #ordinal",
        FilterExpression="begins_with(#sk, :timers) AND #state = :done AND #due < :cutoff",
        ExpressionAttributeNames={"#pk": "pk", "#sk": "sk", "#ordinal": "ordinal", "#state": "state",
                                  "#due": "due_at_ms"},
        ExpressionAttributeValues={":timers": S(codec.TIMER_PREFIX), ":done": S(DONE), ":cutoff": N(due_before_ms)})
    resume = self._purge_resume
    if resume is not None:
        kwargs["ExclusiveStartKey"] = resume
    while True:
        page = self._call("scan", TableName=self.table_name, **kwargs)
        for item in page.get("Items", []):
            found.append((item["pk"]["S"], int(item["ordinal"]["N"])))
        resume = page.get("LastEvaluatedKey")
        if len(found) >= limit:
            if len(found) > limit:  # resume just after the last row this call takes
                found = found[:limit]
                resume = self._timer_key(found[-1])
            break
        if not resume:
            break
        kwargs["ExclusiveStartKey"] = resume
    self._purge_resume = resume
    deleted = 0
    for key in found:
        try:
            self._call("delete_item", TableName=self.table_name, Key=self._timer_key(key),
                       ConditionExpression=row_done, ExpressionAttributeNames={"#state": "state"},
                       ExpressionAttributeValues={":done": S(DONE)})
            deleted += 1
        except ConflictError:
            pass  # no longer a done row: not ours to delete
    return deleted
