"""Child process for the idempotency races (tests/test_idempotency.py, tests/dynamo/).

``python _idem_child.py sqlite DB GOFILE SEED N KEYS``
``python _idem_child.py dynamodb ENDPOINT:TABLE GOFILE SEED N KEYS``

Sends ``N`` ``add`` events to instance ``c``, the i-th with idempotency key
``k<(SEED + 7 i) % KEYS>`` and that key as data, retrying a call that gives up on version
conflicts (as a client retries a request that timed out). Waits at a start barrier
(``GOFILE``), then prints one JSON line: how many calls applied and how many were repeats.
"""

from __future__ import annotations

import json
import sys
import time

import statebound as sb
from statebound.exceptions import ConflictError

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _conc_child import wait_for

BAG = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
       name="bag" initial="s">
  <datamodel><data id="keys" expr="[]"/></datamodel>
  <state id="s">
    <transition event="add"><assign location="keys" expr="keys + [_event.data['k']]"/></transition>
  </state>
</scxml>"""


def chart() -> sb.Chart:
    return sb.Chart.from_scxml(BAG)


def open_store(kind: str, where: str):
    if kind == "sqlite":
        return sb.SQLiteStore(where)
    import boto3

    from statebound.dynamodb import DynamoStore
    endpoint, table = where.rsplit(":", 1)
    client = boto3.session.Session().client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
        aws_secret_access_key="testing", aws_session_token="testing")
    return DynamoStore(table, client, shards=4)


def main(argv: list[str]) -> int:
    kind, where, go, seed, n, keys = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    store = open_store(kind, where)
    host = sb.Host([chart()], store=store, clock=sb.SystemClock())
    wait_for(go)
    t0 = time.perf_counter()
    retries = 0
    for i in range(n):
        key = f"k{(seed + 7 * i) % keys}"
        while True:
            try:
                host.send("c", "add", {"k": key}, idempotency_key=key)
                break
            except ConflictError:
                retries += 1
    duplicates = host.metrics.get("duplicates", 0)
    print(json.dumps({"sent": n, "applied": n - duplicates, "duplicates": duplicates, "retries": retries,
                      "conflicts": host.metrics["conflicts"], "seconds": time.perf_counter() - t0}), flush=True)
    if hasattr(store, "close"):
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
