"""Shard leases: sweeper nodes split the due-index shards between them with conditional writes.

Leases are an efficiency device, not the safety net: two sweepers firing the same row
still cannot both commit it (the completion condition in :class:`DynamoStore.commit`
refuses the second). What leases buy is that, normally, each shard is read and fired by
one node, so sweepers do not waste drives on rows another node is already firing.

Items, in the statebound table::

    pk = "lease#<shard>"   sk = "L"              owner, expires_ms
    pk = "lease#members"   sk = "N#<node id>"    node, expires_ms   (membership heartbeat)

An instance may be called ``lease#members`` too (ids are anyone's strings), so its position
and timer items can share that partition; the membership query therefore pins the sort
key to ``N#`` (see the key-space rules in ``_codec.py``).

A node takes a shard with a conditional ``PutItem`` that succeeds only if the lease is
free, expired, or already its own. Shards are divided by rendezvous on the sorted list
of live members: with ``n`` live nodes, the node at index ``i`` prefers the shards
``s`` with ``s % n == i``. A node hands back (conditional delete) any shard it holds
that another live member now prefers, and only takes shards it prefers, so the split
converges to disjoint, even sets within a renew period or two after membership changes,
and never has two holders of one lease at once.

Time is the injected clock's; nodes' clocks must agree to well within ``lease_ms``.
A node should stop sweeping a shard when :attr:`ShardLeases.held` no longer lists it:
``held`` empties itself once the last successful renewal has expired.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import ConflictError
from ..host.clock import Clock, SystemClock
from ._codec import N, S
from ._errors import call

__all__ = ["ShardLeases"]

MEMBERS_PK = "lease#members"
MEMBER_PREFIX = "N#"
LEASE_SK = "L"

# Named clauses of the lease conditions.
lease_free = "attribute_not_exists(#pk)"
lease_expired = "#expires < :now"
lease_mine = "#owner = :me"


class ShardLeases:
    """The shard leases one sweeper node holds.

    Typical loop: ``acquire()`` every ``lease_ms / 3``, sweep with
    ``DynamoStore(..., owned_shards=leases)``, ``release()`` on shutdown.

    :param client: a boto3 DynamoDB client.
    :param table_name: the statebound table (leases live beside the positions).
    :param node_id: this node's unique id.
    :param shards: the table's shard count (as given to :class:`DynamoStore`).
    :param lease_ms: how long a lease lasts without renewal.
    :param clock: the clock (``SystemClock`` by default).
    :param retries: attempts per call when DynamoDB throttles.
    """

    def __init__(self, client: Any, table_name: str, node_id: str, shards: int, lease_ms: int,
                 clock: Clock | None = None, *, retries: int = 4) -> None:
        if shards < 1 or lease_ms < 1:
            raise ValueError("shards and lease_ms must be positive")
        self.client = client
        self.table_name = table_name
        self.node_id = node_id
        self.shards = shards
        self.lease_ms = lease_ms
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._retries = retries
        self._held: set[int] = set()
        self._valid_until = 0

    # ------------------------------------------------------------------ reading
    @property
    def held(self) -> frozenset[int]:
        """The shards this node may sweep now; empty once its leases have lapsed."""
        if self.clock.now_ms() >= self._valid_until:
            return frozenset()
        return frozenset(self._held)

    def _call(self, op: str, **kwargs: Any) -> Any:
        return call(getattr(self.client, op), attempts=self._retries, TableName=self.table_name,
                    **kwargs)

    def live_members(self) -> list[str]:
        """The node ids with an unexpired heartbeat, sorted (one consistent Query)."""
        now = self.clock.now_ms()
        members: list[str] = []
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": "#pk = :members AND begins_with(#sk, :member)",
            "ConsistentRead": True,
            "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
            "ExpressionAttributeValues": {":members": S(MEMBERS_PK), ":member": S(MEMBER_PREFIX)}}
        while True:
            page = self._call("query", **kwargs)
            for item in page.get("Items", []):
                if int(item["expires_ms"]["N"]) > now:
                    members.append(item["node"]["S"])
            if not page.get("LastEvaluatedKey"):
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return sorted(set(members))

    def preferred(self, members: list[str]) -> set[int]:
        """The shards this node should hold when ``members`` are the live nodes."""
        members = sorted(set(members) | {self.node_id})
        n, i = len(members), members.index(self.node_id)
        return {s for s in range(self.shards) if s % n == i}

    # ------------------------------------------------------------------ writing
    def _heartbeat(self, expires: int) -> None:
        self._call("put_item", Item={"pk": S(MEMBERS_PK), "sk": S(MEMBER_PREFIX + self.node_id),
                                     "node": S(self.node_id), "expires_ms": N(expires)})

    def _lease_key(self, shard: int) -> dict[str, Any]:
        return {"pk": S(f"lease#{shard}"), "sk": S(LEASE_SK)}

    def _take(self, shard: int, now: int, expires: int) -> bool:
        try:
            self._call("put_item", Item={**self._lease_key(shard), "owner": S(self.node_id),
                                         "expires_ms": N(expires)},
                       ConditionExpression=f"{lease_free} OR {lease_expired} OR {lease_mine}",
                       ExpressionAttributeNames={"#pk": "pk", "#expires": "expires_ms",
                                                 "#owner": "owner"},
                       ExpressionAttributeValues={":now": N(now), ":me": S(self.node_id)})
            return True
        except ConflictError:
            return False

    def _extend(self, shard: int, expires: int) -> bool:
        try:
            self._call("update_item", Key=self._lease_key(shard),
                       UpdateExpression="SET #expires = :expires", ConditionExpression=lease_mine,
                       ExpressionAttributeNames={"#expires": "expires_ms", "#owner": "owner"},
                       ExpressionAttributeValues={":expires": N(expires), ":me": S(self.node_id)})
            return True
        except ConflictError:
            return False  # taken over after it lapsed

    def _give_back(self, shard: int) -> None:
        try:
            self._call("delete_item", Key=self._lease_key(shard), ConditionExpression=lease_mine,
                       ExpressionAttributeNames={"#owner": "owner"},
                       ExpressionAttributeValues={":me": S(self.node_id)})
        except ConflictError:
            pass  # not ours any more: nothing to give back

    def _reconcile(self, take: bool) -> set[int]:
        now = self.clock.now_ms()
        expires = now + self.lease_ms
        self._heartbeat(expires)
        preferred = self.preferred(self.live_members())
        held: set[int] = set()
        for shard in sorted(self._held):
            if shard not in preferred:
                # another live node prefers it: hand it over rather than keep it
                self._give_back(shard)
            elif self._extend(shard, expires):
                held.add(shard)
        if take:
            for shard in sorted(preferred - held):
                if self._take(shard, now, expires):
                    held.add(shard)
        self._held = held
        self._valid_until = expires
        return set(held)

    def acquire(self) -> set[int]:
        """Heartbeat, renew what is held, hand back what others prefer, take free
        preferred shards. Returns the shards held now."""
        return self._reconcile(take=True)

    def renew(self) -> set[int]:
        """Heartbeat and extend the held leases (handing back any another node now
        prefers), without taking new ones. Returns the shards still held."""
        return self._reconcile(take=False)

    def release(self) -> None:
        """Give back every lease and leave the membership (on shutdown)."""
        for shard in sorted(self._held):
            self._give_back(shard)
        self._held = set()
        self._valid_until = 0
        try:
            self._call("delete_item", Key={"pk": S(MEMBERS_PK), "sk": S(MEMBER_PREFIX + self.node_id)},
                       ConditionExpression="#node = :me", ExpressionAttributeNames={"#node": "node"},
                       ExpressionAttributeValues={":me": S(self.node_id)})
        except ConflictError:
            pass
