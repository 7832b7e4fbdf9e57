"""The python datamodel: compilation, sandbox, system variables, serializability, data.

What this module proves:

* Every expression of a chart is compiled once: ``datamodel_for(chart)`` returns the same
  prepared object each time, interpreters share it, and driving never re-parses.
* Builtins are an allow-list: ``open``, ``__import__``, ``eval``, ``exec``, ``print``
  (and friends) are unavailable and using them raises ``error.execution`` inside the chart,
  observed through a transition on ``error.execution``; dunder attribute escapes
  (``().__class__.__bases__``), including the string form through ``getattr``, do too.
* ``_event`` exposes name/type/sendid/origin/origintype/invokeid/data, and
  ``_event.data.key`` equals ``_event.data['key']``; ``_sessionid``, ``_name``,
  ``_ioprocessors`` and ``In('s')`` are visible.
* Assigning ``_sessionid``/``_event``/``_name``/``_ioprocessors`` raises ``error.execution``,
  through ``<assign>`` and through ``<script>``, and changes nothing.
* Assigning a value msgpack cannot store (a set, a lambda, an iterator object) raises
  ``error.execution`` and leaves the variable unchanged.
* Event data is data: strings that look like code arrive as plain strings.
"""

from __future__ import annotations

import ast

import pytest

import statebound as sb
from statebound.datamodel import datamodel_for
from statebound.datamodel.python import SAFE_BUILTINS, PythonDatamodel

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'


def chart(body: str, attrs: str = "") -> sb.Chart:
    return sb.Chart.from_scxml(f"<scxml {NS} {attrs}>{body}</scxml>")


def run(body: str, *events, attrs: str = "", session_id: str = "s-1", data=None):
    c = chart(body, attrs)
    it = sb.Interpreter(c)
    pos, effects = it.start(session_id=session_id, data=data)
    out = list(effects)
    for ev in events:
        pos, effects = it.drive(pos, ev)
        out.extend(effects)
    return pos, out


def xml_attr(s: str) -> str:
    return s.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


# A chart that runs one assignment on entry and records any error.execution message.
GUARD = """<datamodel><data id="x" expr="'untouched'"/><data id="err" expr="None"/></datamodel>
<state id="a">
  <onentry>{content}</onentry>
  <transition event="error.execution" target="failed">
    <assign location="err" expr="_event.data['message']"/>
  </transition>
</state>
<state id="failed"/>"""


def guarded(content: str, **kw):
    return run(GUARD.format(content=content), **kw)


def assert_failed(pos, *fragments: str) -> None:
    assert pos.configuration == {"failed"}, dict(pos.datamodel)
    assert pos.datamodel["x"] == "untouched"
    for f in fragments:
        assert f in pos.datamodel["err"], pos.datamodel["err"]


# --------------------------------------------------------------------------- compiled once

def test_datamodel_for_is_cached_per_chart():
    c = chart('<datamodel><data id="n" expr="1 + 1"/></datamodel><state id="a"/>')
    dm = datamodel_for(c)
    assert isinstance(dm, PythonDatamodel)
    assert datamodel_for(c) is dm
    # every expression has its compiled form, in chart order
    assert len(dm.code) == len(c.expressions) >= 1
    # a different chart (even with the same text) gets its own
    c2 = chart('<datamodel><data id="n" expr="1 + 1"/></datamodel><state id="a"/>')
    assert datamodel_for(c2) is not dm


def test_interpreters_share_the_prepared_datamodel():
    c = chart('<state id="a"/>')
    assert sb.Interpreter(c)._dm is sb.Interpreter(c)._dm is datamodel_for(c)


def test_null_datamodel_is_cached_too():
    c = chart('<state id="a"/>', attrs='datamodel="null"')
    assert datamodel_for(c) is datamodel_for(c)
    assert datamodel_for(c).name == "null"


def test_expressions_are_not_reparsed_while_driving(monkeypatch):
    c = chart("""<datamodel><data id="n" expr="0"/></datamodel>
      <state id="a"><transition event="tick" cond="n &lt; 1000" target="a">
        <assign location="n" expr="n + 1"/><log expr="'n=%d' % n"/></transition></state>""")
    it = sb.Interpreter(c)
    pos, _ = it.start()
    calls = []
    real_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: calls.append(a) or real_parse(*a, **k))
    for _ in range(20):
        pos, effects = it.drive(pos, "tick")
    assert pos.datamodel["n"] == 20
    assert effects[-1].value == "n=20"
    assert calls == []
    sb.Interpreter(c).start()  # a second interpreter on the same chart compiles nothing either
    assert calls == []


def test_syntax_error_in_expression_is_error_execution_not_chart_error():
    pos, _ = guarded('<assign location="x" expr="1 +"/>')
    assert_failed(pos, "syntax error")


# --------------------------------------------------------------------------- builtins allow-list

@pytest.mark.parametrize("expr", [
    "open('/etc/passwd').read()", "__import__('os').system('true')", "eval('1')", "exec('y = 1')",
    "print('hi')", "compile('1', 'f', 'eval')", "globals()", "locals()", "vars()", "input()",
    "breakpoint()", "memoryview(b'x')", "object()", "__builtins__",
])
def test_forbidden_builtins_raise_error_execution(expr):
    pos, _ = guarded(f'<assign location="x" expr="{xml_attr(expr)}"/>')
    assert_failed(pos)


def test_forbidden_builtins_are_not_in_the_allow_list():
    for name in ("open", "__import__", "eval", "exec", "print", "compile", "globals", "locals", "vars",
                 "input", "breakpoint", "setattr", "delattr", "dir", "help", "exit", "quit"):
        assert name not in SAFE_BUILTINS


def test_allowed_builtins_work():
    pos, _ = guarded('<assign location="x" expr="[len([1, 2]), sorted([3, 1]), max(4, 5), str(6), '
                     'sum(range(4)), abs(-1), round(2.5), isinstance(1, int)]"/>')
    assert pos.configuration == {"a"}
    assert pos.datamodel["x"] == [2, [1, 3], 5, "6", 6, 1, 2, True]


def test_forbidden_builtin_in_script_is_error_execution():
    pos, _ = guarded("<script>x = open('/etc/passwd').read()</script>")
    assert_failed(pos, "open")


def test_import_statement_in_script_is_error_execution():
    pos, _ = guarded("<script>import os\nx = os.getcwd()</script>")
    assert_failed(pos, "import")


def test_error_in_cond_is_error_execution_and_false():
    pos, _ = run("""<state id="a">
      <transition cond="open('/x')" target="wrong"/>
      <transition event="error.execution" target="failed"/></state>
      <state id="wrong"/><state id="failed"/>""")
    assert pos.configuration == {"failed"}


# --------------------------------------------------------------------------- dunder escapes

@pytest.mark.parametrize("expr", [
    "().__class__.__bases__",
    "().__class__.__base__.__subclasses__()",
    "[c for c in ().__class__.__mro__]",
    "In.__globals__",
    "_event.__class__",
    "(lambda: 1).__code__",
    "len.__self__",
    "(x for x in []).gi_frame",
    "'{0.__class__}'.format_map({})",
    "type(()).mro()",
    "getattr((), '__class__')",
    "getattr(getattr((), '__class__'), '__base__')",
    "getattr(In, '__globals__')",
    "getattr(len, '__self__', None)",
    "getattr((x for x in []), 'gi_frame')",
    "[getattr(k, '__name__') for k in [int]]",
])
def test_dunder_escapes_raise_error_execution(expr):
    pos, _ = guarded(f'<assign location="x" expr="{xml_attr(expr)}"/>')
    assert_failed(pos)


def test_getattr_string_escape_cannot_reach_os():
    # the classic escape, written entirely with string attribute names (fixed: getattr is guarded)
    script = """
subs = getattr(getattr(getattr((), '__class__'), '__base__'), '__subclasses__')()
w = [k for k in subs if getattr(k, '__name__') == '_wrap_close']
x = 'system' in getattr(getattr(w[0], '__init__'), '__globals__')
del subs, w
"""
    pos, _ = guarded(f"<script>{xml_attr(script)}</script>")
    assert_failed(pos, "not allowed")


def test_hasattr_refuses_private_names_but_works_otherwise():
    pos, _ = guarded('<assign location="x" expr="[hasattr((), \'__class__\'), hasattr(\'s\', \'upper\'), '
                     'getattr(\'ab\', \'upper\')()]"/>')
    assert pos.configuration == {"a"}
    assert pos.datamodel["x"] == [False, True, "AB"]


def test_dunder_name_in_script_is_error_execution():
    pos, _ = guarded("<script>x = __builtins__</script>")
    assert_failed(pos)


def test_script_failing_halfway_is_error_execution():
    pos, _ = guarded("<script>x = 'half'\ny = 1 / 0</script>")
    assert pos.configuration == {"failed"}
    assert "ZeroDivisionError" in pos.datamodel["err"]
    assert "y" not in pos.datamodel


# --------------------------------------------------------------------------- system variables

EVENT_FIELDS = """<datamodel><data id="ev" expr="None"/><data id="same" expr="None"/></datamodel>
<state id="a"><transition event="go">
  <assign location="ev" expr="{'name': _event.name, 'type': _event.type, 'sendid': _event.sendid,
      'origin': _event.origin, 'origintype': _event.origintype, 'invokeid': _event.invokeid,
      'data': _event.data}"/>
  <assign location="same" expr="[_event.data.key == _event.data['key'], _event.data.nested.k,
      _event.data['nested']['k']]"/>
</transition></state>"""


def test_event_fields_are_visible():
    ev = sb.Event("go", data={"key": "v", "nested": {"k": 2}}, sendid="sid-7", origin="#_scxml_other",
                  origintype="http://www.w3.org/TR/scxml/#SCXMLEventProcessor", invokeid="inv-3")
    pos, _ = run(EVENT_FIELDS, ev)
    assert pos.datamodel["ev"] == {
        "name": "go", "type": "external", "sendid": "sid-7", "origin": "#_scxml_other",
        "origintype": "http://www.w3.org/TR/scxml/#SCXMLEventProcessor", "invokeid": "inv-3",
        "data": {"key": "v", "nested": {"k": 2}}}
    assert pos.datamodel["same"] == [True, 2, 2]


def test_event_data_missing_key_attribute_is_error_execution():
    pos, _ = run("""<datamodel><data id="x" expr="0"/></datamodel><state id="a">
      <transition event="go"><assign location="x" expr="_event.data.missing"/></transition>
      <transition event="error.execution" target="failed"/></state><state id="failed"/>""",
                 sb.Event("go", data={"key": 1}))
    assert pos.configuration == {"failed"}


def test_internal_event_type_and_raise():
    pos, _ = run("""<datamodel><data id="t" expr="None"/></datamodel><state id="a">
      <onentry><raise event="inner"/></onentry>
      <transition event="inner" target="b"><assign location="t" expr="[_event.name, _event.type]"/>
      </transition></state><state id="b"/>""")
    assert pos.datamodel["t"] == ["inner", "internal"]


def test_session_name_ioprocessors_and_in():
    pos, _ = run("""<datamodel><data id="v" expr="None"/></datamodel>
      <parallel id="p"><state id="a"><onentry>
        <assign location="v" expr="[_sessionid, _name, _ioprocessors['scxml']['location'],
            In('a'), In('b'), In('p'), In('nope')]"/>
      </onentry></state><state id="b"/></parallel>""", attrs='name="machine"', session_id="order-9")
    sid, name, loc, in_a, in_b, in_p, in_nope = pos.datamodel["v"]
    assert (sid, name, loc) == ("order-9", "machine", "#_scxml_order-9")
    assert in_a is True and in_p is True and in_nope is False
    # b is entered after a's onentry ran (document order), so In('b') was still false then
    assert in_b is False


def test_ioprocessors_lists_the_scxml_processor():
    pos, _ = guarded('<assign location="x" expr="sorted(_ioprocessors)"/>')
    assert "http://www.w3.org/TR/scxml/#SCXMLEventProcessor" in pos.datamodel["x"]


def test_system_variables_are_not_stored_in_the_position():
    pos, _ = run('<datamodel><data id="n" expr="1"/></datamodel><state id="a"/>')
    assert set(pos.datamodel) == {"n"}


@pytest.mark.parametrize("name", ["_x", "In"])
def test_a_system_name_a_script_binds_without_reading_it_is_not_stored(name):
    # a match capture binds a global without naming it in the code, so the context never
    # bound it: the commit must still leave it out, and the blob must load again
    pos, _ = run(f"""<datamodel><data id="n" expr="1"/></datamodel>
      <state id="a"><onentry><script>match None:\n    case {name}:\n        n = 2</script></onentry>
      </state>""")
    assert dict(pos.datamodel) == {"n": 2}
    assert sb.Position.from_bytes(pos.to_bytes(), pos.chart).datamodel == {"n": 2}


@pytest.mark.parametrize("name", ["_sessionid", "_name"])
def test_a_script_rebinding_sessionid_or_name_unread_is_still_rolled_back(name):
    # the two are bound only for charts that read them, and still checked for every script
    pos, _ = run(f"""<datamodel><data id="n" expr="1"/></datamodel>
      <state id="a"><onentry><script>match None:\n    case {name}:\n        n = 2</script></onentry>
      <transition event="error.execution" target="failed"/></state><state id="failed"/>""")
    assert pos.configuration == {"failed"}
    assert dict(pos.datamodel) == {"n": 1}


@pytest.mark.parametrize("name", ["_sessionid", "_event", "_name", "_ioprocessors"])
def test_assign_to_system_variable_is_error_execution(name):
    pos, _ = run(f"""<datamodel><data id="after" expr="0"/><data id="seen" expr="None"/></datamodel>
      <state id="a"><onentry><assign location="{name}" expr="'hacked'"/><assign location="after" expr="1"/>
      </onentry><transition event="error.execution" target="failed">
        <assign location="seen" expr="[_sessionid, _name]"/></transition></state>
      <state id="failed"/>""", attrs='name="m"', session_id="sess")
    assert pos.configuration == {"failed"}
    assert pos.datamodel["after"] == 0  # the rest of the block did not run
    assert pos.datamodel["seen"] == ["sess", "m"]


@pytest.mark.parametrize("name", ["_sessionid", "_event", "_name", "_ioprocessors"])
def test_script_assigning_system_variable_is_error_execution(name):
    pos, _ = run(f"""<datamodel><data id="after" expr="0"/><data id="seen" expr="None"/></datamodel>
      <state id="a"><onentry><script>after = 5\n{name} = 'hacked'</script></onentry>
      <transition event="error.execution" target="failed">
        <assign location="seen" expr="[_sessionid, _name, after]"/></transition></state>
      <state id="failed"/>""", attrs='name="m"', session_id="sess")
    assert pos.configuration == {"failed"}
    # the whole script was rolled back, the system variables kept their values
    assert pos.datamodel["seen"] == ["sess", "m", 0]
    assert pos.datamodel["after"] == 0


def test_assign_to_in_is_error_execution():
    pos, _ = guarded('<assign location="In" expr="1"/>')
    assert_failed(pos, "system variable")


def test_assign_to_undeclared_variable_is_error_execution():
    pos, _ = guarded('<assign location="nope" expr="1"/>')
    assert_failed(pos, "not declared")
    assert "nope" not in pos.datamodel


def test_assign_to_non_location_is_error_execution():
    pos, _ = guarded('<assign location="x + 1" expr="1"/>')
    assert_failed(pos, "not an assignable location")


def test_assign_to_nested_location():
    pos, _ = run("""<datamodel><data id="d" expr="{'a': {'b': 1}, 'l': [0, 0]}"/></datamodel>
      <state id="s"><onentry><assign location="d['a']['b']" expr="2"/><assign location="d['l'][1]" expr="3"/>
      </onentry></state>""")
    assert pos.datamodel["d"] == {"a": {"b": 2}, "l": [0, 3]}


# --------------------------------------------------------------------------- serializability

@pytest.mark.parametrize("expr", ["{1, 2}", "lambda: 1", "iter([1])", "range(3)", "frozenset()",
                                  "[1, {2}]", "{'k': lambda: 0}", "type(1)", "len"])
def test_assigning_unstorable_value_is_error_execution_and_leaves_variable(expr):
    pos, _ = guarded(f'<assign location="x" expr="{xml_attr(expr)}"/>')
    assert_failed(pos, "cannot be stored")


@pytest.mark.parametrize("expr", ["{1, 2}", "lambda: 1", "iter([1])"])
def test_script_storing_unstorable_value_is_error_execution_and_leaves_variable(expr):
    pos, _ = guarded(f"<script>x = {xml_attr(expr)}</script>")
    assert_failed(pos, "cannot be stored")


def test_script_binding_unstorable_value_then_failing_is_rolled_back():
    # regression: the value stayed bound and start() raised SerializationError at commit
    pos, _ = guarded("<script>x = {1}\ny = 1 / 0</script>")
    assert_failed(pos, "ZeroDivisionError")


def test_script_binding_system_variable_then_failing_is_rolled_back():
    pos, _ = run("""<datamodel><data id="seen" expr="None"/></datamodel><state id="a">
      <onentry><script>_sessionid = 'forged'\ny = 1 / 0</script></onentry>
      <transition event="error.execution" target="failed"><assign location="seen" expr="_sessionid"/>
      </transition></state><state id="failed"/>""", session_id="real")
    assert pos.configuration == {"failed"}
    assert pos.datamodel["seen"] == "real"


def test_script_creating_unstorable_new_variable_is_rolled_back():
    pos, _ = guarded("<script>x = 'changed'\nfresh = {1}</script>")
    assert_failed(pos)
    assert "fresh" not in pos.datamodel


def test_unstorable_nested_assignment_leaves_container_unchanged():
    pos, _ = run("""<datamodel><data id="d" expr="{'k': 1}"/></datamodel><state id="a">
      <onentry><assign location="d['k']" expr="{1}"/></onentry>
      <transition event="error.execution" target="failed"/></state><state id="failed"/>""")
    assert pos.configuration == {"failed"}
    assert pos.datamodel["d"] == {"k": 1}


def test_storable_values_round_trip():
    value = {"s": "x", "i": -3, "f": 1.5, "b": True, "n": None, "l": [1, [2]], "by": b"\x00\xff",
             "d": {"nested": {"deep": [True]}}}
    pos, _ = guarded(f'<assign location="x" expr="{xml_attr(repr(value))}"/>')
    assert pos.configuration == {"a"}
    assert pos.datamodel["x"] == value


def test_unstorable_start_data_is_refused_before_the_start():
    # Start data comes from the caller, not the chart: it is refused up front, typed,
    # whether or not a <data> declares the key.
    for data in ({"x": {1, 2}}, {"new_key": {1, 2}}):
        with pytest.raises(sb.SerializationError):
            run("""<datamodel><data id="x" expr="0"/></datamodel><state id="a"/>""", data=data)


def test_datamodel_view_is_read_only():
    pos, _ = guarded('<assign location="x" expr="[1]"/>')
    with pytest.raises(TypeError):
        pos.datamodel["x"] = 2  # type: ignore[index]
    pos.datamodel["x"].append(2)  # a fresh decode each time: mutating it changes nothing
    assert pos.datamodel["x"] == [1]


# --------------------------------------------------------------------------- event data is data

CODE = "__import__('os').system('touch /tmp/statebound-pwned')"


def test_external_event_data_is_never_evaluated():
    pos, _ = run("""<datamodel><data id="got" expr="None"/></datamodel><state id="a">
      <transition event="go"><assign location="got" expr="_event.data"/></transition></state>""",
                 sb.Event("go", data=CODE))
    assert pos.datamodel["got"] == CODE
    pos, _ = run("""<datamodel><data id="got" expr="None"/></datamodel><state id="a">
      <transition event="go"><assign location="got" expr="_event.data.code"/></transition></state>""",
                 sb.Event("go", data={"code": "1 + 1"}))
    assert pos.datamodel["got"] == "1 + 1"


def test_send_content_that_looks_like_code_arrives_as_a_string():
    pos, _ = run(f"""<datamodel><data id="got" expr="None"/></datamodel><state id="a">
      <onentry><send event="msg" target="#_internal"><content>{xml_attr(CODE)}</content></send></onentry>
      <transition event="msg" target="b"><assign location="got" expr="_event.data"/></transition></state>
      <state id="b"/>""")
    assert pos.configuration == {"b"}
    assert pos.datamodel["got"] == CODE


def test_send_effect_data_is_the_plain_string():
    _, effects = run(f"""<state id="a"><onentry><send event="msg" target="#_scxml_other">
      <content>{xml_attr(CODE)}</content></send></onentry></state>""")
    sends = [e for e in effects if isinstance(e, sb.effects.Send)]
    assert len(sends) == 1 and sends[0].data == CODE


def test_assign_inline_content_is_data_not_code():
    pos, _ = run(f"""<datamodel><data id="got" expr="None"/></datamodel><state id="a">
      <onentry><assign location="got">{xml_attr(CODE)}</assign></onentry></state>""")
    assert pos.datamodel["got"] == CODE


def test_start_data_is_never_evaluated():
    pos, _ = run('<datamodel><data id="x" expr="0"/></datamodel><state id="a"/>', data={"x": CODE, "y": "1+1"})
    assert pos.datamodel["x"] == CODE
    assert pos.datamodel["y"] == "1+1"


@pytest.mark.parametrize("expr", [
    "'{0.__class__}'.format(1)",
    "'{0[0]}'.format([1])",
    "t.format(1)",                               # a computed template could hold anything
    "getattr('{0.__class__}', 'format')(1)",
])
def test_str_format_cannot_reach_into_objects(expr):
    pos, _ = run(f"""<datamodel><data id="x" expr="0"/><data id="t" expr="'{{0.__class__}}'"/></datamodel>
      <state id="a"><onentry><assign location="x" expr="{expr}"/></onentry>
      <transition event="error.execution" target="failed"/></state><state id="failed"/>""")
    assert pos.configuration == {"failed"} and pos.datamodel["x"] == 0


def test_plain_format_fields_still_work():
    pos, _ = run("""<datamodel><data id="x" expr="0"/></datamodel>
      <state id="a"><onentry><assign location="x" expr="'{}-{b}'.format(1, b=2)"/></onentry></state>""")
    assert pos.datamodel["x"] == "1-2"


def test_only_named_system_variables_are_bound_and_each_named_one_is_visible():
    c = chart("""<datamodel><data id="v" expr="None"/></datamodel><state id="a"><onentry>
      <script>def f():\n    return _event.name\nv = f()</script></onentry></state>""")
    dm = datamodel_for(c)
    assert dm.uses == {"_event"}  # named inside a nested function body: still found
    pos, _ = sb.Interpreter(c).start()
    assert pos.datamodel["v"] is None  # _event is bound (to None) before the first event
    bare = datamodel_for(chart('<datamodel><data id="v" expr="1"/></datamodel><state id="a"/>'))
    assert bare.uses == frozenset()
    ctx = bare.open({}, "s", "n", {"x": 1}, lambda _s: True)
    assert "_event" not in ctx.ns and "_ioprocessors" not in ctx.ns and "In" not in ctx.ns


# --------------------------------------------------------------------------- drives are pure
PURE = """<datamodel><data id="n" expr="0"/></datamodel><state id="a"><transition event="go">
  <script>_event.data['items'].append(len(_event.data['items'])); _event.data['meta']['seen'] = True
n = len(_event.data['items'])</script>
  <send event="later" delay="1s"><param name="d" expr="_event.data"/></send></transition></state>"""


def test_chart_code_cannot_change_the_callers_event_data():
    c = chart(PURE)
    it = sb.Interpreter(c)
    pos, _ = it.start("s")
    data = {"items": [], "meta": {"tags": ("x", [1])}}
    ev = sb.Event("go", data=data)
    runs = [it.drive(pos, ev) for _ in range(3)]
    # the same position and event give the same position and effects, every time
    assert [p.datamodel["n"] for p, _ in runs] == [1, 1, 1]
    assert len({p.to_bytes() for p, _ in runs}) == 1
    assert data == {"items": [], "meta": {"tags": ("x", [1])}}  # the caller's data, nested lists included
    sent = next(e for e in runs[-1][1] if isinstance(e, sb.effects.SendDelayed))
    assert sent.data == {"d": {"items": [0], "meta": {"tags": ("x", [1]), "seen": True}}}
    data["items"].append("later")
    data["meta"]["tags"][1].append(2)  # the effect is the chart's copy, not an alias of the caller's
    assert sent.data == {"d": {"items": [0], "meta": {"tags": ("x", [1]), "seen": True}}}


def test_event_data_is_copied_whole_shared_parts_and_cycles_included():
    shared = [1]
    loop: list = []
    loop.append(loop)
    pos, _ = run("""<datamodel><data id="r" expr="None"/></datamodel><state id="a"><transition event="go">
      <script>d = _event.data; d['a'].append(2)
r = [d['a'] is d['b'], d['loop'][0] is d['loop'], d['s'] == {1, 2}, d['ba'] == b'x', len(d['b'])]
del d</script></transition></state>""",
                 sb.Event("go", data={"a": shared, "b": shared, "loop": loop, "s": {1, 2}, "ba": bytearray(b"x")}))
    assert pos.datamodel["r"] == [True, True, True, True, 2]
    assert shared == [1] and loop[0] is loop


def test_flat_event_data_still_reads_as_attributes():
    pos, _ = run("""<datamodel><data id="r" expr="None"/></datamodel><state id="a"><transition event="go">
      <assign location="r" expr="[_event.data.k, _event.data.n.m, _event.data['n']['m']]"/></transition></state>""",
                 sb.Event("go", data={"k": 1, "n": {"m": [2]}}))
    assert pos.datamodel["r"] == [1, [2], [2]]


def test_event_data_of_any_depth_is_copied_but_tuples_too_deep_are_error_execution_where_read():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    body = """<datamodel><data id="r" expr="0"/><data id="err" expr="None"/></datamodel><state id="a">
      <transition event="go"><assign location="r" expr="_event.name"/>
      <script>d = _event.data
for i in range(4999):
    d = d[0]
d.append(1)
r = len(d)
del d</script></transition>
      <transition event="error.execution"><assign location="err" expr="_event.data['message']"/></transition>
      </state>"""
    pos, _ = run(body, sb.Event("go", data=deep))
    assert pos.datamodel["r"] == 2 and pos.datamodel["err"] is None  # lists and dicts: no recursion
    inner = deep
    for _ in range(4999):
        inner = inner[0]
    assert inner == [[]]  # the caller's innermost list is as it was
    tup: tuple = ()
    for _ in range(5000):
        tup = (tup,)
    pos, _ = run(body, sb.Event("go", data=tup))
    assert pos.datamodel["r"] == "go" and "nests too deeply" in pos.datamodel["err"]


def test_chart_code_cannot_change_the_callers_start_data():
    """Start data was handed to the chart as a shallow dict(data): a <script> appending to a
    list the caller passed changed the caller's list, and a second start with the same data
    started from something else."""
    c = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" initial="s">'
        '<datamodel><data id="items" expr="[]"/></datamodel><state id="s"><onentry>'
        '<script>items.append(1)\nitems[1]["a"].append(2)</script></onentry></state></scxml>')
    mine = {"items": [0, {"a": [1]}, [3, [4]]]}
    it = sb.Interpreter(c)
    first, _ = it.start("x", data=mine)
    second, _ = it.start("x", data=mine)
    assert mine == {"items": [0, {"a": [1]}, [3, [4]]]}
    assert first.datamodel["items"] == second.datamodel["items"] == [0, {"a": [1, 2]}, [3, [4]], 1]
