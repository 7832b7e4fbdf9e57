"""A fake DynamoDB client for capacity simulations: it keeps items in memory, serves the
subset of the API statebound uses, and **meters** every request the way DynamoDB bills it,
per partition key and per simulated second.

Not moto: it evaluates no condition (a simulation runs one thread, so no write races)
and understands only the expression shapes statebound sends. What it adds is the
accounting moto does not do:

* reads: a strongly consistent ``GetItem`` costs ``ceil(size / 4 KB)`` read units, an
  eventually consistent ``Query`` half a unit per 4 KB of items read, summed per page;
* writes: ``ceil(size / 1 KB)`` units of the larger of the old and new item, twice inside a
  transaction;
* the sparse indexes: a write that adds, changes or removes a row's index entry costs the
  entry's size in units on the index key (``gsi_pk`` or ``dead_pk``), as DynamoDB charges
  index maintenance.

Units are attributed to ``("table", pk)`` or ``(index name, index key)`` and to the second
of the injected clock, so a test can ask for the hottest key's units per second.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter, defaultdict
from typing import Any

from statebound.dynamodb import _codec as codec

_INDEX_KEYS = {codec.DUE_INDEX: ("gsi_pk", "gsi_due"), codec.DEAD_INDEX: ("dead_pk", "dead_sk")}


def _size(item: dict[str, Any] | None) -> int:
    return 0 if not item else codec.item_size(item)


def _sort_value(value: dict[str, Any]) -> Any:
    return int(value["N"]) if "N" in value else value["S"]


class Meter:
    """Units and requests, per key and per second."""

    def __init__(self, clock):
        self.clock = clock
        self.rcu: Counter = Counter()        # (key, second) -> read units
        self.wcu: Counter = Counter()        # (key, second) -> write units
        self.requests: Counter = Counter()   # operation -> count
        self.items_read = 0

    def read(self, key, units):
        self.rcu[(key, self.clock.now_ms() // 1000)] += units

    def write(self, key, units):
        self.wcu[(key, self.clock.now_ms() // 1000)] += units

    def total(self, counter, kind=None):
        """Units over all keys (or those whose key starts with ``kind``)."""
        return sum(v for (key, _), v in counter.items() if kind is None or key[0] == kind)

    def hottest(self, counter, kind=None):
        """The most units one key took in one second: ``(units, key)``."""
        per = [(v, key) for (key, _), v in counter.items() if kind is None or key[0] == kind]
        return max(per, default=(0, None))

    def keys(self, counter, kind):
        """Units per key of one kind, all seconds together."""
        out: Counter = Counter()
        for (key, _), v in counter.items():
            if key[0] == kind:
                out[key[1]] += v
        return out


class FakeDynamoDB:
    """Enough of the DynamoDB client for DynamoStore, Host and Sweeper, metered."""

    def __init__(self, clock):
        self.meter = Meter(clock)
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        # index name -> index key -> sorted [(sort value, pk, sk)]
        self.indexes: dict[str, dict[str, list]] = {name: defaultdict(list) for name in _INDEX_KEYS}
        # a table as DynamoStore.create_table leaves it: with the layout marker, so the
        # first sweep does not look for 0.1 rows (this fake has no Scan)
        self.items[(codec.LAYOUT_PK, codec.LAYOUT_SK)] = {
            "pk": {"S": codec.LAYOUT_PK}, "sk": {"S": codec.LAYOUT_SK}, "layout": {"N": str(codec.LAYOUT)}}

    # ------------------------------------------------------------------ storage
    def _index_entry(self, index, item):
        hk, rk = _INDEX_KEYS[index]
        if item and hk in item and rk in item:
            return item[hk]["S"], (_sort_value(item[rk]), item["pk"]["S"], item["sk"]["S"])
        return None

    def _store(self, key, new, *, transactional=False):
        old = self.items.get(key)
        factor = 2 if transactional else 1
        self.meter.write(("table", key[0]), factor * math.ceil(max(_size(old), _size(new), 1) / 1024))
        for index in _INDEX_KEYS:
            before, after = self._index_entry(index, old), self._index_entry(index, new)
            if before is not None:
                entries = self.indexes[index][before[0]]
                entries.pop(bisect.bisect_left(entries, before[1]))
            if after is not None:
                bisect.insort(self.indexes[index][after[0]], after[1])
            if before is not None and after is not None and before[0] == after[0]:
                if old != new:   # the entry changes in place: one write of its new size
                    self.meter.write((index, after[0]), math.ceil(max(_size(new), 1) / 1024))
                continue
            if before is not None:   # leaves this key (deleted, or moved to another key)
                self.meter.write((index, before[0]), math.ceil(max(_size(old), 1) / 1024))
            if after is not None:    # joins this key
                self.meter.write((index, after[0]), math.ceil(max(_size(new), 1) / 1024))
        if new is None:
            self.items.pop(key, None)
        else:
            self.items[key] = new

    @staticmethod
    def _key(key):
        return key["pk"]["S"], key["sk"]["S"]

    # ------------------------------------------------------------------ expressions
    @staticmethod
    def _name(token, names):
        return names.get(token, token)

    def _update(self, item, expression, names, values):
        item = dict(item)
        for clause, body in re.findall(r"(SET|REMOVE)\s+(.*?)(?=\s+(?:SET|REMOVE)\s|$)", expression.strip()):
            for part in (p.strip() for p in body.split(",")):
                if clause == "SET":
                    attr, value = (s.strip() for s in part.split("="))
                    item[self._name(attr, names)] = values[value]
                else:
                    item.pop(self._name(part, names), None)
        return item

    # ------------------------------------------------------------------ the API
    def get_item(self, TableName, Key, ConsistentRead=False, **_):
        self.meter.requests["GetItem"] += 1
        item = self.items.get(self._key(Key))
        units = math.ceil(max(_size(item), 1) / 4096) * (1 if ConsistentRead else 0.5)
        self.meter.read(("table", Key["pk"]["S"]), units)
        return {"Item": dict(item)} if item else {}

    def put_item(self, TableName, Item, **_):
        self.meter.requests["PutItem"] += 1
        self._store(self._key(Item), dict(Item))
        return {}

    def delete_item(self, TableName, Key, **_):
        self.meter.requests["DeleteItem"] += 1
        self._store(self._key(Key), None)
        return {}

    def update_item(self, TableName, Key, UpdateExpression, ExpressionAttributeNames=None,
                    ExpressionAttributeValues=None, **_):
        self.meter.requests["UpdateItem"] += 1
        key = self._key(Key)
        base = self.items.get(key) or dict(Key)
        self._store(key, self._update(base, UpdateExpression, ExpressionAttributeNames or {},
                                      ExpressionAttributeValues or {}))
        return {}

    def transact_write_items(self, TransactItems, **_):
        self.meter.requests["TransactWriteItems"] += 1
        for action in TransactItems:
            (kind, spec), = action.items()
            if kind == "Put":
                self._store(self._key(spec["Item"]), dict(spec["Item"]), transactional=True)
            elif kind == "Delete":
                self._store(self._key(spec["Key"]), None, transactional=True)
            elif kind == "Update":
                key = self._key(spec["Key"])
                self._store(key, self._update(self.items.get(key) or dict(spec["Key"]), spec["UpdateExpression"],
                                              spec.get("ExpressionAttributeNames", {}),
                                              spec.get("ExpressionAttributeValues", {})), transactional=True)
            else:
                raise NotImplementedError(kind)
        return {}

    def batch_get_item(self, RequestItems, **_):
        self.meter.requests["BatchGetItem"] += 1
        out = {}
        for table, spec in RequestItems.items():
            found = [dict(self.items[self._key(k)]) for k in spec["Keys"] if self._key(k) in self.items]
            out[table] = found
            per_4kb = 1 if spec.get("ConsistentRead") else 0.5
            for k in spec["Keys"]:   # billed per item, as GetItem would be
                item = self.items.get(self._key(k))
                self.meter.read(("table", k["pk"]["S"]), math.ceil(max(_size(item), 1) / 4096) * per_4kb)
        return {"Responses": out, "UnprocessedKeys": {}}

    def query(self, TableName, KeyConditionExpression, ExpressionAttributeValues,
              IndexName=None, Limit=None, ExclusiveStartKey=None, **_):
        self.meter.requests["Query"] += 1
        values = ExpressionAttributeValues
        cond = KeyConditionExpression
        if IndexName is None:
            m = re.fullmatch(r"(#\w+) = (:\w+) AND begins_with\((#\w+), (:\w+)\)", cond)
            assert m, cond
            pk, prefix = values[m.group(2)]["S"], values[m.group(4)]["S"]
            rows = sorted(i for i in self.items if i[0] == pk and i[1].startswith(prefix))
            entries = [(sk, pk, sk) for _, sk in rows]
            meter_key = ("table", pk)
        else:
            m = re.fullmatch(r"(#\w+) = (:\w+)(?: AND (#\w+) BETWEEN (:\w+) AND (:\w+))?", cond)
            assert m, cond
            hash_value = values[m.group(2)]["S"]
            entries = self.indexes[IndexName].get(hash_value, [])
            if m.group(3):
                lo, hi = int(values[m.group(4)]["N"]), int(values[m.group(5)]["N"])
                entries = entries[bisect.bisect_left(entries, (lo,)):bisect.bisect_right(entries, (hi, "\U0010ffff"))]
            meter_key = (IndexName, hash_value)
        start = 0
        if ExclusiveStartKey is not None:
            start = int(ExclusiveStartKey["_pos"]["N"])
        page = entries[start:start + Limit] if Limit else entries[start:]
        items = [dict(self.items[(pk, sk)]) for _, pk, sk in page]
        self.meter.items_read += len(items)
        self.meter.read(meter_key, math.ceil(max(sum(_size(i) for i in items), 1) / 4096) * 0.5)
        out: dict[str, Any] = {"Items": items, "Count": len(items)}
        if Limit and start + Limit < len(entries):
            out["LastEvaluatedKey"] = {"_pos": {"N": str(start + Limit)}}
        return out
