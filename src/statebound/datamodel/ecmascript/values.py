"""The JSON value mapping of the ecmascript datamodel: how values cross between Python and JS.

Values cross as JSON text. ``NaN``, ``Infinity`` and strings that start with the marker
``"\\u0000sb:"`` travel as marked strings (the JS side's reviver and replacer undo them),
integers past 2**53 become floats as in JS, and XML content becomes a small tree the
prelude's DOM is built from. Nothing here touches QuickJS.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ...chart.xml import parse_xml

__all__ = ["JSValue", "DataJSValue", "Unstorable", "unstorable", "loads", "dumps", "xml_tree", "plain", "MARK"]

#: Prefix of the strings that stand for NaN and the infinities, which JSON cannot carry; a
#: string that itself starts with it is escaped the same way.
MARK = "\x00sb:"
_LONG_INT = re.compile(r"\d{16}")
_SAFE_INT = 2 ** 53
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSValue:
    """A JS value with no stored form (a function, a symbol, a Map...), as an expression returned it.

    It can be assigned (by the ``<assign>`` that evaluated it) but not sent, stored or logged as data.
    """

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.text = text

    def __repr__(self) -> str:
        return f"<JS {self.kind}{': ' + self.text if self.text else ''}>"

    __str__ = __repr__


class DataJSValue(str):
    """The same, for a ``<data expr>``: the interpreter checks it is storable before declaring it."""

    kind = "value"


def _int_or_float(s: str) -> Any:
    v = int(s)
    return v if -_SAFE_INT <= v <= _SAFE_INT else float(v)


def loads(text: str, special: bool) -> Any:
    """The Python value of JSON text from JS (``special``: it holds marked NaN/Infinity/strings)."""
    v = json.loads(text, parse_int=_int_or_float) if _LONG_INT.search(text) else json.loads(text)
    return _decode_specials(v) if special else v


def _decode_specials(v: Any) -> Any:
    if type(v) is str:
        if v.startswith(MARK):
            r = v[len(MARK):]
            if r == "NaN":
                return math.nan
            if r == "Infinity":
                return math.inf
            if r == "-Infinity":
                return -math.inf
            if r.startswith("s"):
                return r[1:]
        return v
    if type(v) is list:
        return [_decode_specials(x) for x in v]
    if type(v) is dict:
        return {k: _decode_specials(x) for k, x in v.items()}
    return v


def _encode_specials(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return MARK + ("NaN" if v != v else "Infinity" if v > 0 else "-Infinity")
    if isinstance(v, str):
        return MARK + "s" + v if v.startswith(MARK) else v
    if isinstance(v, (list, tuple)):
        return [_encode_specials(x) for x in v]
    if isinstance(v, dict):
        return {k: _encode_specials(x) for k, x in v.items()}
    return v


def _json_default(obj: Any) -> Any:
    from ..base import EventView
    if isinstance(obj, EventView):
        return obj.as_dict()
    raise TypeError(f"a {type(obj).__name__} is not a JSON value")


def dumps(value: Any) -> tuple[str, bool]:
    """JSON text for a Python value, and whether it needs the JS reviver. Raises TypeError/ValueError.

    Characters past ASCII are written as they are, not as ``\\uXXXX``: the text is what the
    stored variables are loaded from, in the drive's heap, and escaped it took up to six times
    the room of the JSON the commit measured (a variable that committed then never loaded
    again). JSON.parse reads U+2028/U+2029 in strings, and ``json`` escapes control characters
    either way. A lone surrogate cannot cross into QuickJS unescaped (the binding passes UTF-8):
    text holding one is escaped throughout.
    """
    try:
        text = json.dumps(value, allow_nan=False, default=_json_default, ensure_ascii=False)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
        special = True
    else:
        special = "\\u0000sb:" in text
    if special:
        value = _encode_specials(value)
        text = json.dumps(value, default=_json_default, ensure_ascii=False)
    if not text.isascii() and _SURROGATE.search(text):
        text = json.dumps(value, default=_json_default)
    return text, special


def xml_tree(value: Any) -> list[Any] | None:
    """``[tag, ns, [[attr, value]...], children...]`` when ``value`` is an XML element's text."""
    if type(value) is not str:
        return None
    s = value.strip()
    if len(s) < 3 or s[0] != "<" or s[-1] != ">" or s.startswith(("<!", "<?xml-stylesheet")):
        return None
    try:
        el = parse_xml(s)
    except Exception:
        return None
    return _tree(el)


def _tree(el: Any) -> list[Any]:
    attrs = [[k.split("}", 1)[1] if k.startswith("{") else k, v] for k, v in el.attrib.items()]
    t: list[Any] = [el.tag, el.ns, attrs]
    if el.text:
        t.append(el.text)
    for i, c in enumerate(el.children):
        t.append(_tree(c))
        tail = el.tails[i] if i < len(el.tails) else ""
        if tail:
            t.append(tail)
    return t


class Unstorable:
    """Stands for a variable whose value has no stored form, in what :meth:`variables` returns.

    Packing it fails (that is the point): the interpreter then puts the variable back as it
    was before the drive and raises ``error.execution``. Each reason is its own subclass,
    named after the reason, because the packer's message names the type.
    """

    __slots__ = ()


_UNSTORABLE: dict[str, type] = {}


def unstorable(reason: str) -> Unstorable:
    """A placeholder whose type is named after ``reason``."""
    cls = _UNSTORABLE.get(reason)
    if cls is None:
        if len(_UNSTORABLE) > 256:
            _UNSTORABLE.clear()
        cls = _UNSTORABLE[reason] = type(reason, (Unstorable,), {"__slots__": ()})
    return cls()


def plain(v: Any) -> Any:
    """A JSON-able stand-in for event data that is not plain (bytes, sets...)."""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        # a set iterates in hash order, which PYTHONHASHSEED changes from one process to the
        # next: the same event must give the same array, and so the same position, everywhere
        return sorted((plain(x) for x in v), key=_order)
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _order(x: Any) -> tuple[str, str]:
    """A sort key for :func:`plain`'s values under which any two compare (``sorted`` never meets
    ``1 < "a"``); equal keys mean equal JSON, so the order of ties cannot show."""
    return type(x).__name__, json.dumps(x, sort_keys=True, ensure_ascii=False)
