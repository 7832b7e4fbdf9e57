"""Fast constructors for the frozen values a drive builds over and over.

A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__``, a
name lookup per field; the slot descriptors' own setters do the same store for a third
of the cost. The values built here are ordinary instances, equal to (and as immutable
as) the ones the dataclass constructor makes; only these functions, on objects they
have just allocated, use the setters.

Fields a constructor here does not take get their dataclass default, so a field added
to :class:`~statebound.Event` or an effect later is filled in, not left unset (and one
added without a default fails at import, not at the first drive).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from ..effects import Log
from ..events import Event

__all__ = ["new_event", "new_log"]

_new = object.__new__


def _setters(cls: type, given: tuple[str, ...]) -> tuple[tuple[Any, ...], tuple[tuple[Any, Any], ...]]:
    """The slot setters of ``given``, and ``(setter, default)`` for every other field."""
    rest = []
    for f in fields(cls):
        if f.name in given:
            continue
        if f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has no default: values.py must set it")
        rest.append((getattr(cls, f.name).__set__, f.default))
    return tuple(getattr(cls, f).__set__ for f in given), tuple(rest)


(_e_name, _e_data, _e_type, _e_sendid, _e_origin, _e_origintype), _E_REST = _setters(
    Event, ("name", "data", "type", "sendid", "origin", "origintype"))


def new_event(name: str, data: Any = None, type: str = "external", sendid: str | None = None,
              origin: str | None = None, origintype: str | None = None) -> Event:
    """``Event(name, data, type, sendid, origin, origintype)``, built the fast way."""
    o = _new(Event)
    _e_name(o, name)
    _e_data(o, data)
    _e_type(o, type)
    _e_sendid(o, sendid)
    _e_origin(o, origin)
    _e_origintype(o, origintype)
    for setter, default in _E_REST:
        setter(o, default)
    return o


(_l_macrostep, _l_microstep, _l_round, _l_label, _l_value), _L_REST = _setters(
    Log, ("macrostep", "microstep", "round", "label", "value"))


def new_log(macrostep: int, microstep: int, round: int, label: str | None, value: Any) -> Log:
    """``Log(label=, value=, macrostep=, microstep=, round=)``, built the fast way."""
    o = _new(Log)
    _l_macrostep(o, macrostep)
    _l_microstep(o, microstep)
    _l_round(o, round)
    _l_label(o, label)
    _l_value(o, value)
    for setter, default in _L_REST:
        setter(o, default)
    return o
