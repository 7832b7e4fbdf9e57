"""Strict JSON at statebound's edges: no ``NaN`` or ``Infinity`` in, none out.

Python's :mod:`json` reads and writes ``NaN``, ``Infinity`` and ``-Infinity``, and reads
``1e999`` as infinity. RFC 8259 has none of them and most other parsers (browsers,
``jq``, Go, Java) refuse a document that contains one, so a value accepted here would come
back out as text no client can read. The CLI (``--data``, ``--json``) and the Lambda
example's HTTP API read and write JSON through these two functions instead.

Writing, a float that is not finite becomes ``null``, as JavaScript's ``JSON.stringify``
does: a datamodel may hold one (``float('nan')`` in a python expression), and refusing to
show such an instance at all would be worse than showing the value as missing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .exceptions import InvalidJSON

__all__ = ["loads", "dumps", "MAX_DEPTH", "nests_deeper"]

#: How deeply arrays and objects may nest in a document :func:`loads` accepts. The stdlib
#: parser goes to about 1,000 levels, but code after it (writing the answer, fingerprinting an
#: idempotency key) recurses once or twice per level and failed from about 495, after the
#: instance was written. 256 is also what an ecmascript datamodel value may nest.
MAX_DEPTH = 256


def _refuse_constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidJSON(f"the number {text[:40]} is too large for a float")
    return value


def loads(text: str | bytes) -> Any:
    """Parse strict JSON.

    :raises InvalidJSON: malformed text, ``NaN``/``Infinity``, a float that overflows, or
        nesting deeper than :data:`MAX_DEPTH`.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InvalidJSON:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, absurd nesting
        raise InvalidJSON(f"not valid JSON: {exc}") from None
    if nests_deeper(value, MAX_DEPTH):
        raise InvalidJSON(f"arrays and objects nest more than {MAX_DEPTH} levels deep")
    return value



_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether containers (dicts, lists, tuples, sets) nest more than ``limit`` deep in
    ``value``, read level by level, so that it never runs out of stack itself on what it is
    there to refuse. (The datamodels' value checks use it too.)"""
    level = [value]
    depth = 0
    while level:
        depth += 1
        below = []
        for v in level:
            t = type(v)
            if t not in _CONTAINERS:
                continue
            if depth > limit:
                return True
            for x in (v.values() if t is dict else v):
                if type(x) in _CONTAINERS:
                    below.append(x)
        level = below
    return False


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that always writes strict JSON (non-finite floats become ``null``).

    Keyword arguments go to :func:`json.dumps` (``indent``, ``sort_keys``, ``default``...).
    """
    return json.dumps(_finite(value), allow_nan=False, **kwargs)
