"""Every public name has its docstring: what ``statebound.__all__`` and each public
submodule's ``__all__`` export.

A class or function carries its own ``__doc__`` (not one a dataclass or NamedTuple makes up
from the fields, nor one inherited). A constant cannot carry a docstring, so its assignment
is documented in the source where it is defined: a comment on the lines just above it (a
``#:`` before a group of assignments covers the group) or at the end of its line.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import pkgutil
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import statebound

#: every module of the package, private ones included (a public name may be defined in one);
#: ``__main__`` modules run when imported
MODULES = ["statebound"] + [m.name for m in pkgutil.walk_packages(statebound.__path__, "statebound.")
                            if not m.name.endswith("__main__")]
PUBLIC = [m for m in MODULES if not any(part.startswith("_") for part in m.split(".")[1:])]


def _exports() -> list[tuple[str, str]]:
    return [(module, name) for module in PUBLIC for name in importlib.import_module(module).__dict__.get(
        "__all__", ())]


@cache
def _commented_assignments(module: str) -> frozenset[str]:
    """The module-level names assigned under a comment, or with one at the end of the line."""
    path = importlib.import_module(module).__file__
    assert path is not None
    lines = Path(path).read_text().splitlines()
    names: set[str] = set()
    for node in ast.parse("\n".join(lines)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        assigned = [t.id for t in targets if isinstance(t, ast.Name)]
        if not assigned:
            continue
        documented = "  # " in lines[node.end_lineno - 1]
        i = node.lineno - 2
        # walk up over the group of assignments this one belongs to, to the comment above it
        while not documented and i >= 0 and lines[i].strip():
            documented = lines[i].lstrip().startswith("#")
            i -= 1
        if documented:
            names.update(assigned)
    return frozenset(names)


def _is_documented_constant(module: str, name: str) -> bool:
    value = getattr(importlib.import_module(module), name)
    return any(name in _commented_assignments(m) and getattr(importlib.import_module(m), name, None) is value
               for m in [module, *MODULES])


def test_the_walk_sees_the_facade_and_the_subpackages():
    exports = _exports()
    assert ("statebound", "Host") in exports and ("statebound", "StateboundError") in exports
    assert {m for m, _ in exports} >= {"statebound.host", "statebound.dynamodb", "statebound.position",
                                       "statebound.effects", "statebound.aws", "statebound.chart"}


@pytest.mark.parametrize(("module", "name"), _exports(), ids=lambda x: x)
def test_every_public_name_has_a_docstring(module, name):
    obj = getattr(importlib.import_module(module), name)
    if isinstance(obj, (type, types.FunctionType, types.ModuleType)):
        doc = (obj.__doc__ or "").strip()
        assert doc, f"{module}.{name} has no docstring"
        # dataclasses and NamedTuples write "Name(field, ...)" when the class says nothing
        assert not doc.startswith(f"{obj.__name__}("), f"{module}.{name}: only the generated docstring"
    else:
        assert _is_documented_constant(module, name), f"{module}.{name}: no comment where it is assigned"


def test_a_bare_constant_is_caught(tmp_path, monkeypatch):
    """The comment check itself can fail: a constant with no comment is not documented."""
    (tmp_path / "sb_undocumented.py").write_text(
        '"""A module."""\n__all__ = ["BARE", "NOTED", "TRAILING"]\n\n'
        'BARE = 1\n#: a comment\nNOTED = 2\n\nTRAILING = 3  # a comment\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _commented_assignments("sb_undocumented") == {"NOTED", "TRAILING"}


_PARAM = re.compile(r":param (?:[\w\[\], |.]+ )?(\w+):")


def _unknown_params(obj: Any, doc: str | None, extra: frozenset[str] = frozenset()) -> list[str]:
    """The ``:param name:`` entries of ``doc`` that ``obj``'s signature does not have."""
    named = _PARAM.findall(doc or "")
    if not named:
        return []
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return []
    return [n for n in named if n not in parameters and n not in extra]


def test_every_documented_param_is_a_real_parameter():
    """A ``:param x:`` in a docstring names a parameter the function (or the class's
    constructor, or a dataclass field) really has: a renamed keyword leaves no stale doc."""
    wrong, documented = [], 0
    for module in MODULES:
        for name, obj in vars(importlib.import_module(module)).items():
            if getattr(obj, "__module__", None) != module:
                continue
            targets = [(name, obj, obj.__doc__)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                targets.append((name, obj, obj.__doc__))
                targets += [(f"{name}.{n}", f, f.__doc__) for n, m in vars(obj).items()
                            for f in [getattr(m, "__func__", m)] if inspect.isfunction(f)]
            for where, target, doc in targets:
                documented += bool(_PARAM.search(doc or ""))
                fields = frozenset(getattr(target, "__dataclass_fields__", ()))
                wrong += [f"{module}.{where}: :param {p}:" for p in _unknown_params(target, doc, fields)]
    assert documented > 30 and wrong == []


def test_a_stale_param_is_caught():
    def f(new: int) -> None:
        """:param old: renamed since."""
    assert _unknown_params(f, f.__doc__) == ["old"]
