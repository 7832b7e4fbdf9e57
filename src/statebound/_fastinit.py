"""A faster ``__init__`` for the frozen, slotted dataclasses built on every drive and host call.

A frozen dataclass's generated ``__init__`` stores each field through
``object.__setattr__(self, name, value)``: a method lookup and a name lookup per field. The
slot descriptor's own setter does the same store for about half the cost. Effects, events,
timer rows and commits are built several times per host call, so :func:`fast_init` swaps
in an ``__init__`` with the same signature (names, defaults, keyword-only fields) that stores
through the slot setters. Instances are as immutable as before: the setters are reached only
from ``__init__`` on a fresh object (``interpreter/state.py``'s ``make_position`` does the same
by hand for ``Position``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")

#: "no value given" for a field with a default_factory: the dataclass module's own marker,
#: so the signature reads ``<factory>`` as before
_FACTORY: Any = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", object())


def fast_init(cls: type[T]) -> type[T]:
    """Give frozen, slotted dataclass ``cls`` an equivalent ``__init__`` that sets each slot
    directly. Apply it above ``@dataclass(frozen=True, slots=True)``.

    :raises TypeError: ``cls`` is not such a dataclass, or has a field ``__init__`` does not
        simply store (``init=False``, ``InitVar``) or a ``__post_init__``: those keep the
        generated ``__init__``, and a class that grows one must not silently lose it.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init needs a frozen dataclass with slots, not {cls.__name__}")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {cls.__name__} has a __post_init__")
    env: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f._field_type is not dataclasses._FIELD:  # type: ignore[attr-defined]
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} is not a plain init field")
        env[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            env[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_factory_{f.name}"] = f.default_factory
            param = f"{f.name}=_FACTORY"
            body.append(f"    if {f.name} is _FACTORY:\n        {f.name} = _factory_{f.name}()")
        else:
            param = f.name
        (keyword if f.kw_only else positional).append(param)
        body.append(f"    _set_{f.name}(self, {f.name})")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    exec(f"def __init__({signature}):\n" + ("\n".join(body) or "    pass"), env)  # noqa: S102
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
