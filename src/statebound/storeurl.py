"""Store URLs: one string names a backend, so tools and configuration need not know which.

::

    orders.db                                   a SQLite file (any string without "://")
    sqlite:///orders.db                         the same, relative to the working directory
    sqlite:////var/lib/statebound/orders.db     an absolute path (four slashes, as SQLAlchemy)
    sqlite:///orders.db?timeout_s=5&keep_done=false
    dynamodb://statebound?region=eu-west-1
    dynamodb://statebound?region=eu-west-1&endpoint_url=http://127.0.0.1:5000   moto, DynamoDB Local
    memory://                                   a MemoryStore (nothing survives the process)

:func:`open_store` imports a backend only when its URL names it: ``import statebound`` stays
free of boto3 and sqlite3, and a SQLite URL never imports boto3. Every malformed URL raises
:class:`~statebound.InvalidStoreURL` naming what is wrong, before anything is opened.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .exceptions import InvalidStoreURL

__all__ = ["StoreURL", "parse_store_url", "open_store"]

#: Query options each scheme takes, with the type of each.
_OPTIONS: dict[str, dict[str, type]] = {
    "sqlite": {"timeout_s": float, "keep_done": bool},
    "memory": {"keep_done": bool},
    # bucket_ms and settle_ms belonged to 0.1's bucketed sweep: still accepted, and ignored
    "dynamodb": {"region": str, "endpoint_url": str, "profile": str, "shards": int, "fallback_ms": int,
                 "bucket_ms": int, "settle_ms": int, "keep_done": bool, "done_ttl_s": int},
}
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
#: SQLite takes its busy timeout as a C int of milliseconds: a longer ``timeout_s`` would wrap
#: to a negative one, which SQLite reads as "never wait", the opposite of what was asked. The
#: same whole seconds as ``statebound.host.sqlite.MAX_TIMEOUT_S``, which would import sqlite3.
_MAX_TIMEOUT_S = (2**31 - 1) // 1000


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL.

    :ivar scheme: ``"sqlite"``, ``"dynamodb"`` or ``"memory"``.
    :ivar location: the SQLite path or the DynamoDB table name (``""`` for memory).
    :ivar options: the query options, converted to their types.
    """

    scheme: str
    location: str
    options: dict[str, Any] = field(default_factory=dict)


def _convert(url: str, scheme: str, name: str, raw: str) -> Any:
    kind = _OPTIONS[scheme].get(name)
    if kind is None:
        known = ", ".join(sorted(_OPTIONS[scheme])) or "none"
        raise InvalidStoreURL(f"store URL {url!r}: unknown option {name!r} for {scheme} (known: {known})")
    if kind is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise InvalidStoreURL(f"store URL {url!r}: option {name}={raw!r} is not true or false")
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidStoreURL(f"store URL {url!r}: option {name}={raw!r} is not a{'n' if kind is int else ''} "
                              f"{kind.__name__}") from None
    if kind is float and not math.isfinite(value):   # nan would pass the sign check below
        raise InvalidStoreURL(f"store URL {url!r}: option {name} must be a finite number, not {raw!r}")
    if kind in (int, float) and value <= 0:
        raise InvalidStoreURL(f"store URL {url!r}: option {name} must be positive, not {raw!r}")
    if name == "timeout_s" and value > _MAX_TIMEOUT_S:
        raise InvalidStoreURL(f"store URL {url!r}: option timeout_s must be at most {_MAX_TIMEOUT_S} "
                              f"(SQLite's busy timeout is a 32-bit count of milliseconds), not {raw!r}")
    if kind is str:
        if not value:
            raise InvalidStoreURL(f"store URL {url!r}: option {name} is empty")
        _check_text(url, f"option {name}", value, path=False)
    return value


def _check_text(url: str, what: str, text: str, *, path: bool) -> None:
    """Refuse what no backend can take, as InvalidStoreURL rather than the ValueError or
    UnicodeError the backend would raise later: a NUL, or a character with no byte form.

    A path is held to the filesystem's rule (``os.fsencode``), so a file name that is not
    UTF-8, which reaches Python as surrogate escapes (from ``sys.argv``), still opens.
    """
    if "\x00" in text:
        raise InvalidStoreURL(f"store URL {url!r}: the {what} holds a NUL character")
    try:
        os.fsencode(text) if path else text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidStoreURL(f"store URL {url!r}: the {what} is not valid Unicode "
                              "(it holds a lone surrogate)") from None


def parse_store_url(url: str) -> StoreURL:
    """Parse a store URL (see the module docstring) without opening anything.

    :raises InvalidStoreURL: an unknown scheme or option, a bad value, a missing table.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidStoreURL("a store URL must be a non-empty string")
    if "://" not in url:
        _check_text(url, "path", url, path=True)
        return StoreURL("sqlite", url)      # a plain path; it may hold ':' or '?' legitimately
    try:
        parts = urlsplit(url)
    except ValueError as exc:   # an unbalanced '[' reads as a broken IPv6 host
        raise InvalidStoreURL(f"store URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _OPTIONS:
        raise InvalidStoreURL(f"store URL {url!r}: unknown scheme {parts.scheme!r} "
                              "(use a SQLite path, sqlite:///PATH, dynamodb://TABLE or memory://)")
    if parts.fragment:
        raise InvalidStoreURL(f"store URL {url!r}: a fragment ('#...') means nothing here")
    options: dict[str, Any] = {}
    try:   # strict: a '%ff' decoded with the default 'replace' would become U+FFFD unseen
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False, errors="strict")
    except UnicodeDecodeError:
        raise InvalidStoreURL(f"store URL {url!r}: the options are not UTF-8 once percent-decoded") from None
    for name, raw in query:
        if name in options:
            raise InvalidStoreURL(f"store URL {url!r}: option {name!r} is given twice")
        options[name] = _convert(url, scheme, name, raw)
    if scheme == "sqlite":
        if parts.netloc:
            raise InvalidStoreURL(f"store URL {url!r}: sqlite URLs have no host; write sqlite:///relative.db "
                                  "or sqlite:////absolute/path.db")
        try:   # the slash after '//' separates; what follows is the path
            path = unquote(parts.path[1:], errors="strict")
        except UnicodeDecodeError:
            raise InvalidStoreURL(f"store URL {url!r}: the path is not UTF-8 once percent-decoded "
                                  "(give such a path as a plain path, not a sqlite:/// URL)") from None
        if not path:
            raise InvalidStoreURL(f"store URL {url!r}: no database path after sqlite:///")
        _check_text(url, "path", path, path=True)
        return StoreURL("sqlite", path, options)
    if scheme == "memory":
        if parts.netloc or parts.path not in ("", "/"):
            raise InvalidStoreURL(f"store URL {url!r}: memory:// takes no location")
        return StoreURL("memory", "", options)
    table = unquote(parts.netloc)
    if parts.path not in ("", "/"):
        raise InvalidStoreURL(f"store URL {url!r}: write the table as dynamodb://TABLE, with nothing after it "
                              "but ?options")
    if not _TABLE_NAME.fullmatch(table):
        raise InvalidStoreURL(f"store URL {url!r}: {table!r} is not a DynamoDB table name "
                              "(3-255 letters, digits, '_', '-', '.')")
    return StoreURL("dynamodb", table, options)


def open_store(url: str, **overrides: Any) -> Any:
    """Open the store a URL names: a ``SQLiteStore``, ``DynamoStore`` or ``MemoryStore``.

    ``overrides`` are passed to the store's constructor and win over URL options (for
    example ``client=`` for a DynamoDB client you built yourself)::

        store = sb.open_store("dynamodb://table?region=eu-west-1&endpoint_url=http://127.0.0.1:5000")

    :raises InvalidStoreURL: the URL is malformed, or names the ``dynamodb`` backend
        without boto3 installed (``pip install 'statebound[aws]'``), or no AWS region is
        configured for it.
    """
    parsed = parse_store_url(url)
    options = dict(parsed.options)
    if parsed.scheme == "memory":
        from .host.memory import MemoryStore
        return MemoryStore(**{**options, **overrides})
    if parsed.scheme == "sqlite":
        from .host.sqlite import SQLiteStore
        return SQLiteStore(parsed.location, **{**options, **overrides})
    return _open_dynamodb(url, parsed.location, options, overrides)


def _open_dynamodb(url: str, table: str, options: dict[str, Any], overrides: dict[str, Any]) -> Any:
    try:
        import boto3
        from botocore.exceptions import BotoCoreError

        from .dynamodb import DynamoStore
        from .dynamodb._table import DYNAMODB_CALL
    except ImportError:
        raise InvalidStoreURL(f"store URL {url!r} needs the DynamoDB backend: pip install 'statebound[aws]'") \
            from None
    region = options.pop("region", None)
    endpoint = options.pop("endpoint_url", None)
    profile = options.pop("profile", None)
    if "client" not in overrides:
        try:
            session = boto3.session.Session(profile_name=profile)
            # the store's own timeouts, as DynamoStore's default client has: botocore's 60 s
            # connect and read, retried, held every CLI command on an endpoint that hangs
            client = session.client("dynamodb", region_name=region, endpoint_url=endpoint, config=DYNAMODB_CALL)
            overrides = {**overrides, "client": client}
        except (BotoCoreError, ValueError) as exc:  # no region, an unknown profile, a bad endpoint
            raise InvalidStoreURL(f"store URL {url!r}: {exc} (add ?region=... to the URL, or set AWS_REGION)") \
                from None
    return DynamoStore(table, **{**options, **overrides})
