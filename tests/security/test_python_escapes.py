"""The python datamodel's allow-list: the escapes found against it stay closed.

The python datamodel is for trusted charts only (``docs/security.md``); untrusted charts
cannot use it at all. Its allow-list is still a line of defence against mistakes and
against a chart author reaching past the API, so each known way around it is a test: the
expression must fail with ``error.execution`` and the audit hook must see nothing.
"""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

import pytest

from statebound.datamodel.python import _check_safe, _safe_getattr, _safe_hasattr

from .helpers import CATCH_PY, scxml

#: Issue 10's exploit: a str subclass whose startswith() lies walked getattr to os.popen.
STR_SUBCLASS = ("(lambda S: [getattr(getattr(getattr(c, S('__init__')), S('__globals__'))['sys'].modules['os'], "
                "'popen')('id').read() for c in getattr(getattr(int, S('__base__')), S('__subclasses__'))() "
                "if 'wrap_close' in str(c)][0])(type('S',(str,),{'startswith':lambda s,x: False}))")

ESCAPES = {
    "str subclass through getattr": STR_SUBCLASS,
    "format spec nested in a field": "'{0:{1.__class__.__init__.__globals__}}'.format('x', 1)",
    "format spec nested twice": "'{0:{1:{2.__class__}}}'.format('x', 1, 2)",
    "class built with type()": "type('X', (), {})",
    "class built with the type of a class": "str(type(type(0))('X', (str,), {'startswith': lambda s, x: False}))",
    "getattr with a non-str name": "getattr(1, 1)",
    "hasattr then getattr on a dunder": "[hasattr(1, '__class__'), getattr(1, '__class__')]",
    "frame of a generator": "getattr((x for x in []), 'gi_frame')",
    "format_map": "'{0.__class__}'.format_map({'0': 1})",
}

SCRIPT_ESCAPES = {
    "match reads attributes by name": "match 1:\n    case int(__class__=c):\n        x = c",
    "match binds a dunder name": "match 1:\n    case __builtins__:\n        pass",
    "bare except": "try:\n    x = 1\nexcept:\n    pass",
    "finally": "try:\n    x = 1\nfinally:\n    x = 2",
    "computed handler": "try:\n    x = 1\nexcept (lambda: ValueError)():\n    pass",
    "class statement": "class X:\n    pass",
    "with": "with x:\n    pass",
    "import": "import os",
    "lambda with a dunder argument": "f = lambda __globals__: 1",
    "def with a dunder name": "def __init__():\n    pass",
}


def test_every_known_expression_escape_is_error_execution(hostile):
    # each <assign> in a block of its own, so every one of them runs and fails on its own
    blocks = "".join(f"<onentry><assign location=\"x\" expr={quoteattr(e)}/></onentry>" for e in ESCAPES.values())
    chart = scxml(f'<datamodel><data id="x" expr="None"/></datamodel><state id="a">{blocks}{CATCH_PY}</state>',
                  datamodel=None)
    out = hostile({"main.scxml": chart}, trust=None)
    out.assert_contained()
    assert out.error is None, out.error
    assert len(out.messages) == len(ESCAPES), out.messages
    assert out.raw["datamodel"]["x"] is None
    assert not any("uid=" in m for m in out.messages)


@pytest.mark.parametrize("name", list(SCRIPT_ESCAPES))
def test_script_constructs_that_could_escape_or_outlive_the_budget_are_refused(name):
    import ast
    assert _check_safe(ast.parse(SCRIPT_ESCAPES[name])) is not None, name


def test_scripts_may_still_catch_builtin_exceptions_by_name(hostile):
    script = ("try:\n    x = int('no')\nexcept (ValueError, TypeError) as e:\n    x = 'caught ' + str(isinstance(e, ValueError))\n"
              "ValueError = 1\ntry:\n    y = int('no')\nexcept ValueError:\n    x = x + ' and shadowing did not matter'\n")
    chart = scxml(f'<datamodel><data id="x" expr="None"/></datamodel><state id="a"><onentry>'
                  f'<script>{script}</script></onentry>{CATCH_PY}</state>', datamodel=None)
    out = hostile({"main.scxml": chart}, trust=None)
    out.assert_contained()
    assert out.messages == [] and out.raw["datamodel"]["x"] == "caught True and shadowing did not matter"


def test_getattr_refuses_str_subclasses_whatever_they_claim():
    class Liar(str):
        def startswith(self, *_a):  # type: ignore[override]
            return False

        def __eq__(self, other):
            return False

        __hash__ = str.__hash__

    for name in (Liar("__class__"), Liar("format"), Liar("upper")):
        with pytest.raises(AttributeError, match="must be a str"):
            _safe_getattr("x", name)
        assert _safe_hasattr("x", name) is False
    assert _safe_getattr("ab", "upper")() == "AB"
