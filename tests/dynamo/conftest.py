"""Fixtures for the DynamoDB backend tests. Two moto modes, never real AWS:

* **in-process** (``mock_client``): ``moto.mock_aws`` intercepts botocore inside this
  process. Fast, but it checks a condition and then writes in two steps with no lock, so
  it cannot referee races between threads (see ``shared/notes/moto.md``).
* **server, serialised** (``moto_endpoint``): one moto server per session, in a
  subprocess, served by werkzeug with ``threaded=False`` so it handles one request at a
  time, which makes each conditional write atomic the way DynamoDB's are. Tests that
  race several clients use it, each with a table of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from statebound.dynamodb import DynamoStore  # noqa: E402

from .helpers import REGION, CallLog, make_store, server_client  # noqa: E402

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
    # never read a developer's real profile or config
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def _scrubbed_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(FAKE_CREDENTIALS)
    return env


@pytest.fixture
def aws_env(monkeypatch):
    """Fake credentials and region; any real AWS setting (profile, endpoint) removed."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def _shared_client():
    # Building a botocore client costs ~50 ms; moto's hook is on every client, so one
    # client serves every mock_aws test (each mock_aws start resets moto's state).
    return boto3.session.Session().client(
        "dynamodb", region_name=REGION, aws_access_key_id="testing",
        aws_secret_access_key="testing", aws_session_token="testing")


@pytest.fixture
def mock_client(aws_env, _shared_client):
    """A DynamoDB client on in-process moto (``mock_aws``), with an empty account."""
    with moto.mock_aws():
        yield _shared_client


@pytest.fixture
def table(mock_client):
    """A fresh statebound table on in-process moto."""
    name = "statebound-test"
    DynamoStore.create_table(name, mock_client)
    return name


@pytest.fixture
def dstore(mock_client, table):
    """A DynamoStore on in-process moto."""
    return make_store(mock_client, table)


@pytest.fixture
def calls(mock_client):
    """A :class:`CallLog` on the in-process client (unhooked afterwards: it is shared)."""
    log = CallLog(mock_client)
    yield log
    log.close()


_SERVER = """
import sys
from werkzeug.serving import make_server
from moto.server import DomainDispatcherApplication, create_backend_app
# threaded=False: one request at a time, so every conditional write is atomic
server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app),
                     threaded=False)
print(server.server_port, flush=True)
server.serve_forever()
"""


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """Start a serialised moto server on a free loopback port; yield its URL."""
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log_path, "w") as log:
        # port 0: the OS picks a free port and the child reports it, so no race for it;
        # werkzeug logs every request to stderr, which goes to a file, never a full pipe
        proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE,
                                stderr=log, env=_scrubbed_env(), text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            proc.kill()
            pytest.fail(f"moto server did not start: {log_path.read_text()[-2000:]}")
        endpoint = f"http://127.0.0.1:{line}"
        client = server_client(endpoint)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.list_tables()
                break
            except Exception:  # not answering yet
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def server_table(moto_endpoint):
    """A fresh table of its own on the shared moto server."""
    name = f"sb-{uuid.uuid4().hex[:10]}"
    DynamoStore.create_table(name, server_client(moto_endpoint))
    return name
