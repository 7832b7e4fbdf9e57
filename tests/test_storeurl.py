"""``sb.open_store(url)``: one string for every backend, typed errors for bad URLs, and no
backend imported before its URL asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import statebound as sb
from statebound.storeurl import StoreURL, parse_store_url


@pytest.mark.parametrize("url, parsed", [
    ("orders.db", StoreURL("sqlite", "orders.db")),
    ("/var/x?y.db", StoreURL("sqlite", "/var/x?y.db")),             # a plain path is taken as is
    ("sqlite:///orders.db", StoreURL("sqlite", "orders.db")),
    ("sqlite:////var/lib/o.db", StoreURL("sqlite", "/var/lib/o.db")),
    ("sqlite:///o%20b.db?timeout_s=2.5&keep_done=false", StoreURL("sqlite", "o b.db",
                                                                  {"timeout_s": 2.5, "keep_done": False})),
    ("SQLITE:///:memory:", StoreURL("sqlite", ":memory:")),
    ("memory://", StoreURL("memory", "")),
    ("dynamodb://Orders.prod-1?region=eu-west-1&endpoint_url=http://127.0.0.1:5000&shards=4",
     StoreURL("dynamodb", "Orders.prod-1", {"region": "eu-west-1", "endpoint_url": "http://127.0.0.1:5000",
                                            "shards": 4})),
    ("dynamodb://tbl/", StoreURL("dynamodb", "tbl")),
])
def test_parse(url, parsed):
    assert parse_store_url(url) == parsed


@pytest.mark.parametrize("url, words", [
    ("", "non-empty"),
    ("postgres://db/x", "unknown scheme 'postgres'"),
    ("sqlite://host/x.db", "no host"),
    ("sqlite:///", "no database path"),
    ("sqlite:///x.db?shards=2", "unknown option 'shards'"),
    ("sqlite:///x.db?timeout_s=soon", "not a float"),
    ("sqlite:///x.db?timeout_s=-1", "must be positive"),
    ("sqlite:///x.db#frag", "fragment"),
    ("dynamodb://", "is not a DynamoDB table name"),
    ("dynamodb://a b c", "is not a DynamoDB table name"),
    ("dynamodb://tbl/extra", "nothing after it"),
    ("dynamodb://tbl?region=a&region=b", "given twice"),
    ("dynamodb://tbl?keep_done=perhaps", "not true or false"),
    ("dynamodb://tbl?shards=many", "not an int"),
    ("dynamodb://tbl?region=", "is empty"),
    ("memory://somewhere", "takes no location"),
    # a NUL, a lone surrogate or percent-escapes that are not UTF-8 never reach a backend
    ("sqlite:///a%00b.db", "NUL"),
    ("a\x00b.db", "NUL"),
    ("\ud800.db", "lone surrogate"),
    ("sqlite:///a\ud800.db", "lone surrogate"),
    ("sqlite:///%E9.db", "not UTF-8"),
    ("sqlite:///x.db?timeout_s=%ff", "not UTF-8"),
    ("dynamodb://tbl?region=eu%ff", "not UTF-8"),
    ("dynamodb://tbl?region=eu%00", "NUL"),
    ("dynamodb://[tbl", "IPv6"),
    # a busy timeout SQLite cannot hold: nan passes a sign check, and past 2**31-1 ms it wraps
    ("sqlite:///x.db?timeout_s=nan", "finite"),
    ("sqlite:///x.db?timeout_s=inf", "finite"),
    ("sqlite:///x.db?timeout_s=1e400", "finite"),
    ("sqlite:///x.db?timeout_s=2147483.5", "at most 2147483"),
    ("sqlite:///x.db?timeout_s=1e300", "at most"),
])
def test_bad_urls_are_typed_errors(url, words):
    with pytest.raises(sb.InvalidStoreURL) as err:
        sb.open_store(url)
    assert words in str(err.value)
    assert isinstance(err.value, sb.StoreError) and isinstance(err.value, ValueError)


def test_the_url_limit_is_the_stores():
    from statebound.host.sqlite import MAX_TIMEOUT_S
    from statebound.storeurl import _MAX_TIMEOUT_S
    assert _MAX_TIMEOUT_S == MAX_TIMEOUT_S


def test_refused_urls_create_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///%E9.db", "sqlite:///%ff.db", "sqlite:///x.db?timeout_s=nan", "sqlite:///a%00b.db"):
        with pytest.raises(sb.InvalidStoreURL):
            sb.open_store(url)
    assert list(tmp_path.iterdir()) == []


def test_longest_timeout_and_non_utf8_plain_paths_still_open(tmp_path):
    store = sb.open_store(f"sqlite:///{tmp_path / 'a.db'}?timeout_s=2147483")
    assert store.timeout_s == 2147483
    store.close()
    # a file name that is not UTF-8 arrives from sys.argv as surrogate escapes: it is a path
    store = sb.open_store(str(tmp_path / "caf\udce9.db"))
    store.close()
    assert (bytes(tmp_path) + b"/caf\xe9.db") in [bytes(p) for p in tmp_path.iterdir()]


def test_opens_each_backend(tmp_path):
    store = sb.open_store(f"sqlite:///{tmp_path / 'a.db'}?keep_done=false")
    assert isinstance(store, sb.SQLiteStore) and store.path == str(tmp_path / "a.db") and not store._keep_done
    store.close()
    assert isinstance(sb.open_store("memory://"), sb.MemoryStore)
    # overrides win over URL options
    store = sb.open_store(str(tmp_path / "b.db"), timeout_s=1.0)
    assert store.timeout_s == 1.0
    store.close()


def test_dynamodb_url_opens_a_dynamostore_with_its_options(monkeypatch):
    pytest.importorskip("boto3")
    from statebound.dynamodb import DynamoStore
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = sb.open_store("dynamodb://orders?region=eu-west-1&endpoint_url=http://127.0.0.1:5999"
                          "&shards=4&fallback_ms=1000&keep_done=no&done_ttl_s=60")
    assert isinstance(store, DynamoStore)
    assert (store.table_name, store.shards, store.fallback_ms, store.keep_done, store.done_ttl_s) == (
        "orders", 4, 1000, False, 60)
    with pytest.warns(DeprecationWarning, match="bucket_ms"):   # a 0.1 URL still opens
        sb.open_store("dynamodb://orders?region=eu-west-1&endpoint_url=http://127.0.0.1:5999&bucket_ms=1000")
    assert store.client.meta.region_name == "eu-west-1"
    assert store.client.meta.endpoint_url == "http://127.0.0.1:5999"
    # the store's own timeouts, not botocore's 60 s + 60 s retried: every CLI command opened
    # its store this way and hung on an endpoint that never answered
    from statebound.dynamodb._table import DYNAMODB_CALL
    config = store.client.meta.config
    assert (config.connect_timeout, config.read_timeout, config.retries) == (
        DYNAMODB_CALL.connect_timeout, DYNAMODB_CALL.read_timeout, DYNAMODB_CALL.retries)
    assert config.read_timeout <= 5 and config.retries["total_max_attempts"] <= 2
    with pytest.raises(sb.InvalidStoreURL, match="endpoint"):
        sb.open_store("dynamodb://orders?region=eu-west-1&endpoint_url=not a url")


def test_dynamodb_url_without_any_region_says_how_to_give_one(monkeypatch, tmp_path):
    pytest.importorskip("boto3")
    import os
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(sb.InvalidStoreURL, match=r"region="):
        sb.open_store("dynamodb://orders")


def test_import_and_sqlite_urls_never_import_boto3():
    code = ("import sys, statebound as sb\n"
            "assert 'boto3' not in sys.modules and 'sqlite3' not in sys.modules\n"
            "sb.open_store('sqlite:///:memory:'); sb.open_store('memory://')\n"
            "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules\n"
            "print('clean')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"
