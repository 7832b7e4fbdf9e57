"""Shard leases: sweeper nodes split the due-index shards between them on one board item.

Leases are an efficiency device, not the safety net: two sweepers firing the same row
still cannot both commit it (the completion condition in :class:`DynamoStore.commit`
refuses the second). What leases buy is that, normally, each shard is read and fired by
one node, so sweepers do not waste reads and drives on rows another node is firing.

One item holds everything, in the statebound table::

    pk = "lease#board"   sk = "B"    hb    = {node id: heartbeat expiry (ms)}
                                     owner = {shard: node id}
                                     shards = the table's shard count

A renewal is one ``UpdateItem`` that writes this node's heartbeat and returns the whole
board (``ReturnValues=ALL_NEW``), so an idle node spends **one request per renewal**,
whatever the number of shards, and sees every other node's heartbeat and shards in it.
An instance may be called ``lease#board`` (ids are anyone's strings); its items have other
sort keys and the board is only ever read by its full key.

The shards are divided by rendezvous on the sorted live members (unexpired heartbeats):
with ``n`` members, the node at index ``i`` prefers the shards ``s`` with ``s % n == i``.
At each renewal a node, in one conditional ``UpdateItem`` on what it saw:

* **takes** every shard it prefers, whoever holds it: free, held by a node whose heartbeat
  has expired (crashed: taken as soon as its lease runs out, see :meth:`next_renewal_ms`),
  or held by a live node that no longer prefers it (a newcomer takes its share at once,
  instead of waiting for the holder's next renewal);
* **gives back** the shards it holds that another live member now prefers;
* forgets heartbeats long expired (Lambda request ids come and go).

The board never names two owners for a shard. A node's :attr:`held`, though, is its view
as of its last renewal: after a newcomer takes a share, the previous holder keeps sweeping
it until its own next renewal (at most ``renew_ms``). Both sweeping a shard for a moment
costs duplicate reads, never a double fire.

Time is the injected clock's; nodes' clocks must agree to well within ``lease_ms``.
:attr:`ShardLeases.held` empties itself once the last successful renewal has expired.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import ConflictError, InvalidArgument, StoreError
from ..host.clock import Clock, SystemClock
from ._codec import N, S
from ._errors import call

__all__ = ["ShardLeases", "BOARD_PK", "BOARD_SK"]

#: The key of the one item every sweeper heartbeats into (the lease board).
BOARD_PK = "lease#board"
BOARD_SK = "B"
#: Heartbeats expired longer than this many lease periods are dropped from the board.
FORGET_AFTER_LEASES = 2
#: How soon (ms) to try again after a renewal lost a race on the board.
RETRY_MS = 1_000

# Named clauses of the board conditions.
board_exists = "attribute_exists(#hb)"
board_absent = "attribute_not_exists(#pk)"
board_empty = "size(#hb) = :zero"


class ShardLeases:
    """The shard leases one sweeper node holds.

    Typical use: ``DynamoStore(..., owned_shards=leases)``; the store calls
    :meth:`maybe_acquire` at every sweep, which renews on schedule. Call :meth:`release`
    on shutdown so the others take over at once.

    :param client: a boto3 DynamoDB client.
    :param table_name: the statebound table (the board lives beside the positions).
    :param node_id: this node's unique id.
    :param shards: the table's shard count (as given to :class:`DynamoStore`); the board
        records it and refuses a node with another count.
    :param lease_ms: how long a lease lasts without renewal.
    :param clock: the clock (``SystemClock`` by default).
    :param retries: attempts per call when DynamoDB throttles.
    :param renew_ms: how often :meth:`maybe_acquire` renews; ``lease_ms // 3`` by default.
    """

    def __init__(self, client: Any, table_name: str, node_id: str, shards: int, lease_ms: int,
                 clock: Clock | None = None, *, retries: int = 4, renew_ms: int | None = None) -> None:
        if shards < 1 or lease_ms < 1:
            raise InvalidArgument("shards and lease_ms must be positive")
        self.client = client
        self.table_name = table_name
        self.node_id = node_id
        self.shards = shards
        self.lease_ms = lease_ms
        self.renew_ms = renew_ms if renew_ms is not None else max(1, lease_ms // 3)
        if not 0 < self.renew_ms < lease_ms:
            raise InvalidArgument("renew_ms must be positive and shorter than lease_ms")
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._retries = retries
        self._held: set[int] = set()
        self._valid_until = 0
        self._next_renewal: int | None = None

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

    @staticmethod
    def _key() -> dict[str, Any]:
        return {"pk": S(BOARD_PK), "sk": S(BOARD_SK)}

    def _read(self) -> dict[str, Any]:
        return self._call("get_item", Key=self._key(), ConsistentRead=True).get("Item") or {}

    @staticmethod
    def _heartbeats(board: dict[str, Any]) -> dict[str, int]:
        return {node: int(v["N"]) for node, v in board.get("hb", {}).get("M", {}).items()}

    @staticmethod
    def _owners(board: dict[str, Any]) -> dict[int, str]:
        return {int(s): v["S"] for s, v in board.get("owner", {}).get("M", {}).items()}

    def live_members(self) -> list[str]:
        """The node ids with an unexpired heartbeat, sorted (one consistent ``GetItem``)."""
        now = self.clock.now_ms()
        return sorted(n for n, expires in self._heartbeats(self._read()).items() if expires > now)

    def preferred(self, members: list[str]) -> set[int]:
        """The shards this node should hold when ``members`` are the live nodes."""
        members = sorted(set(members) | {self.node_id})
        n, i = len(members), members.index(self.node_id)
        return {s for s in range(self.shards) if s % n == i}

    def next_renewal_ms(self) -> int:
        """When :meth:`maybe_acquire` next renews: ``renew_ms`` after the last renewal, or
        sooner, when another member's heartbeat expires (its shards are taken then) or
        after a lost race on the board. Before the first acquire: now."""
        return self._next_renewal if self._next_renewal is not None else self.clock.now_ms()

    # ------------------------------------------------------------------ writing
    def _heartbeat(self, expires: int) -> dict[str, Any]:
        """Write this node's heartbeat; return the board as it now is."""
        for _ in range(2):
            try:
                return self._call("update_item", Key=self._key(), UpdateExpression="SET #hb.#me = :expires",
                                  ConditionExpression=board_exists,
                                  ExpressionAttributeNames={"#hb": "hb", "#me": self.node_id},
                                  ExpressionAttributeValues={":expires": N(expires)},
                                  ReturnValues="ALL_NEW")["Attributes"]
            except ConflictError:
                pass  # no board yet: create it
            board = {**self._key(), "hb": {"M": {self.node_id: N(expires)}}, "owner": {"M": {}},
                     "shards": N(self.shards)}
            try:
                self._call("put_item", Item=board, ConditionExpression=board_absent,
                           ExpressionAttributeNames={"#pk": "pk"})
                return board
            except ConflictError:
                pass  # another node created it first: heartbeat into theirs
        raise StoreError("could not write a heartbeat on the lease board")  # pragma: no cover

    def _change(self, owners: dict[int, str], take: set[int], give: set[int], forget: set[str],
                ) -> dict[str, Any] | None:
        """One conditional ``UpdateItem`` moving ``take`` to this node, removing ``give``
        and the ``forget`` heartbeats, on the condition that those shards are as seen.
        Returns the new board, or ``None`` if it changed meanwhile."""
        names: dict[str, str] = {"#hb": "hb"}
        values: dict[str, Any] = {}
        # an update would create a missing item: the board must exist
        sets, removes, conds = [], [], [board_exists]
        for i, shard in enumerate(sorted(take | give)):
            names["#owner"], names[f"#s{i}"] = "owner", str(shard)
            values[":me"] = S(self.node_id)
            if shard in take:
                sets.append(f"#owner.#s{i} = :me")
                if shard in owners:
                    values[f":o{i}"] = S(owners[shard])
                    conds.append(f"#owner.#s{i} = :o{i}")
                else:
                    conds.append(f"attribute_not_exists(#owner.#s{i})")
            else:
                removes.append(f"#owner.#s{i}")
                conds.append(f"#owner.#s{i} = :me")
        for i, node in enumerate(sorted(forget)):
            names[f"#n{i}"] = node
            removes.append(f"#hb.#n{i}")
        expr = " ".join(part for part in (f"SET {', '.join(sets)}" if sets else "",
                                          f"REMOVE {', '.join(removes)}" if removes else "") if part)
        kwargs: dict[str, Any] = {"ExpressionAttributeNames": names, "ConditionExpression": " AND ".join(conds)}
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            return self._call("update_item", Key=self._key(), UpdateExpression=expr, ReturnValues="ALL_NEW",
                              **kwargs)["Attributes"]
        except ConflictError:
            return None

    def _reconcile(self, take: bool) -> set[int]:
        now = self.clock.now_ms()
        expires = now + self.lease_ms
        board = self._heartbeat(expires)
        recorded = int(board.get("shards", {}).get("N", self.shards))
        if recorded != self.shards:
            raise StoreError(f"the lease board of {self.table_name!r} is for {recorded} shards, "
                             f"this node was given {self.shards}: every writer and sweeper must agree")
        lost_race = False
        for attempt in range(2):
            beats = self._heartbeats(board)
            live = sorted(n for n, e in beats.items() if e > now)
            owners = self._owners(board)
            preferred = self.preferred(live)
            mine = {s for s, node in owners.items() if node == self.node_id}
            wanted = (preferred - mine) if take else set()
            give = mine - preferred
            forget = {n for n, e in beats.items()
                      if n != self.node_id and e < now - FORGET_AFTER_LEASES * self.lease_ms
                      and n not in owners.values()}
            if not (wanted or give or forget):
                break
            changed = self._change(owners, wanted, give, forget)
            if changed is not None:
                owners = self._owners(changed)
                break
            # the board moved under us (another node renewed or took): look again, once
            board = self._read()
            owners = self._owners(board)
            lost_race = attempt == 1
        self._held = {s for s, node in owners.items() if node == self.node_id}
        self._valid_until = expires
        renew = now + self.renew_ms
        if lost_race:
            renew = min(renew, now + RETRY_MS)
        # a crashed member's shards are taken the moment its heartbeat runs out
        others = [e for n, e in beats.items() if n != self.node_id and now < e]
        if others:
            renew = min(renew, min(others) + 1)
        self._next_renewal = renew
        return set(self._held)

    def acquire(self) -> set[int]:
        """Heartbeat, take the shards this node prefers, hand back the ones others prefer.
        Returns the shards held now."""
        return self._reconcile(take=True)

    def renew(self) -> set[int]:
        """Heartbeat and hand back what another node now prefers, without taking shards.
        Returns the shards still held."""
        return self._reconcile(take=False)

    def maybe_acquire(self) -> frozenset[int]:
        """:meth:`acquire` if :meth:`next_renewal_ms` has come (or never acquired); then
        :attr:`held`. A sweeper calls this at every sweep; it costs a request only when due."""
        if self.clock.now_ms() >= self.next_renewal_ms():
            self.acquire()
        return self.held

    def release(self) -> None:
        """Give back every lease and leave the board (on shutdown): one ``UpdateItem``, and
        a ``DeleteItem`` of the board if this was its last member."""
        held = set(self._held)
        self._held = set()
        self._valid_until = 0
        self._next_renewal = None
        board = self._change({}, set(), held, {self.node_id})
        if board is None:
            # someone took one of them meanwhile (or there is no board): one by one
            for shard in sorted(held):
                self._change({}, set(), {shard}, set())
            board = self._change({}, set(), set(), {self.node_id})
        if board is not None and not board.get("hb", {}).get("M"):
            # the last member left: leave no board behind (unless someone just joined)
            try:
                self._call("delete_item", Key=self._key(), ConditionExpression=board_empty,
                           ExpressionAttributeNames={"#hb": "hb"}, ExpressionAttributeValues={":zero": N(0)})
            except ConflictError:
                pass
