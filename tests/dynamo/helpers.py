"""Plain helpers shared by the DynamoDB tests (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import boto3

import statebound as sb
from statebound.dynamodb import DynamoStore
from statebound.dynamodb import _codec as codec

REGION = "us-east-1"


def make_store(client, table_name, *, batch_workers=None, **kw):
    """A DynamoStore with test-friendly defaults: 4 shards, no real sleeping on retries.

    Group commits write from one thread on in-process moto, whose writes are not safe
    across threads (``shared/notes/moto.md``), and from the default pool on the serialised
    moto server, unless ``batch_workers`` says otherwise."""
    kw.setdefault("shards", 4)
    kw.setdefault("sleep", lambda seconds: None)
    store = DynamoStore(table_name, client, **kw)
    if batch_workers is None and not str(client.meta.endpoint_url).startswith("http://127.0.0.1"):
        batch_workers = 1
    if batch_workers is not None:
        store.batch_workers = batch_workers
    return store


class CallLog:
    """Records the DynamoDB operation names a client sends, via botocore's event hooks."""

    def __init__(self, client):
        self.names: list[str] = []
        self._client = client
        client.meta.events.register("before-call.dynamodb", self._record)

    def close(self) -> None:
        """Stop recording."""
        self._client.meta.events.unregister("before-call.dynamodb", self._record)

    def _record(self, model, **kwargs):
        self.names.append(model.name)

    def take(self) -> list[str]:
        """The names recorded since the last take."""
        names, self.names = self.names, []
        return names


def server_client(endpoint: str):
    """A new boto3 DynamoDB client (own session) on the moto server."""
    return boto3.session.Session().client(
        "dynamodb", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
        aws_secret_access_key="testing", aws_session_token="testing")


def table_items(client, table_name, index=None):
    """Every item of the table (or of one index), by a plain paginated scan."""
    kwargs = {"TableName": table_name}
    if index:
        kwargs["IndexName"] = index
    items = []
    while True:
        page = client.scan(**kwargs)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def written_items(client, table_name):
    """Every item of the table but the layout marker ``create_table`` puts in a table it
    creates (``_migrate.py``): what the store's own calls wrote."""
    return [i for i in table_items(client, table_name)
            if (i["pk"]["S"], i["sk"]["S"]) != (codec.LAYOUT_PK, codec.LAYOUT_SK)]


def index_keys(client, table_name, index):
    """The ``(pk, sk)`` of every item in an index."""
    return {(i["pk"]["S"], i["sk"]["S"]) for i in table_items(client, table_name, index)}


def tick_chart(delay: str) -> sb.Chart:
    """A chart named ``tick`` that fires one timer ``delay`` after it starts, then is done."""
    return sb.Chart.from_scxml(f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
      datamodel="null" name="tick" initial="waiting">
      <state id="waiting">
        <onentry><send event="go" delay="{delay}"/></onentry>
        <transition event="go" target="fired"/>
      </state>
      <final id="fired"/>
    </scxml>""")
