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

__all__ = ["loads", "dumps"]


def _refuse_constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidJSON(f"the number {text[:40]} is too large for a float")
    return value


def loads(text: str | bytes) -> Any:
    """Parse strict JSON.

    :raises InvalidJSON: malformed text, ``NaN``/``Infinity``, or a float that overflows.
    """
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InvalidJSON:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, absurd nesting
        raise InvalidJSON(f"not valid JSON: {exc}") from None


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
