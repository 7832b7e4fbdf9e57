"""An untrusted chart, and every chart it reaches, may use only ecmascript or null.

Issue 10's second exploit: an ecmascript chart invoked a python child whose ``<donedata>``
ran a shell command. Each way a chart can reach a child is tried here: inline
``<content>``, ``src``, nested grandchildren, and at run time ``srcexpr`` and
``<content expr>``. Inline and ``src`` children are refused when the parent loads; run-time
children become ``error.execution``. A child reloaded by another host (from the store,
after a restart) is loaded under its parent's policy again, and the trust level is part
of the identity its blob is checked against.
"""

from __future__ import annotations

import json
from xml.sax.saxutils import quoteattr

import pytest

import statebound as sb

from .helpers import CATCH, scxml
from .test_python_escapes import STR_SUBCLASS

PYTHON_CHILD = scxml(f'<final id="f"><donedata><param name="out" expr={quoteattr(STR_SUBCLASS)}/></donedata>'
                     '</final>', datamodel="python")
DEFAULT_CHILD = PYTHON_CHILD.replace(' datamodel="python"', "")


@pytest.mark.parametrize("child", [PYTHON_CHILD, DEFAULT_CHILD], ids=["python", "default datamodel"])
def test_an_inline_python_child_is_refused_at_load(hostile, child):
    chart = scxml(f'<state id="a"><invoke><content>{child}</content></invoke></state>')
    hostile({"main.scxml": chart}).assert_refused_at_load("untrusted chart may use only")


def test_a_python_grandchild_is_refused_at_load(hostile):
    middle = scxml(f'<state id="m"><invoke><content>{PYTHON_CHILD}</content></invoke></state>')
    chart = scxml(f'<state id="a"><invoke><content>{middle}</content></invoke></state>')
    hostile({"main.scxml": chart}).assert_refused_at_load("untrusted chart may use only")


def test_a_python_src_child_is_refused_at_load(hostile):
    chart = scxml('<state id="a"><invoke src="child.scxml"/></state>')
    hostile({"main.scxml": chart, "child.scxml": PYTHON_CHILD}).assert_refused_at_load("untrusted chart may use only")


def test_run_time_python_children_are_error_execution(hostile):
    chart = scxml(f"""<datamodel><data id="doc" expr={quoteattr(json.dumps(PYTHON_CHILD))}/></datamodel>
      <state id="a">{CATCH}
        <invoke srcexpr="'child' + '.scxml'"/>
        <invoke><content expr="doc"/></invoke>
        <transition event="done.invoke" target="escaped"/>
      </state><state id="escaped"/>""")
    out = hostile({"main.scxml": chart, "child.scxml": PYTHON_CHILD})
    out.assert_error_execution("untrusted chart may use only")
    assert len(out.messages) == 2 and out.raw["configuration"] == ["a"]


def test_untrusted_children_on_ecmascript_and_null_run(hostile):
    child = scxml('<datamodel><data id="v" expr="6 * 7"/></datamodel>'
                  '<final id="f"><donedata><param name="v" expr="v"/></donedata></final>')
    null_child = scxml('<final id="f"/>', datamodel="null")
    chart = scxml(f"""<datamodel><data id="got" expr="[]"/></datamodel><state id="a">{CATCH}
        <invoke id="one"><content>{child}</content></invoke>
        <invoke id="two" srcexpr="'null.scxml'"/>
        <transition event="done.invoke.one"><assign location="got" expr="got.concat([_event.data.v])"/></transition>
        <transition event="done.invoke.two"><assign location="got" expr="got.concat(['null'])"/></transition>
      </state>""")
    out = hostile({"main.scxml": chart, "null.scxml": null_child})
    out.assert_contained()
    assert out.messages == [] and sorted(map(str, out.raw["datamodel"]["got"])) == ["42", "null"]


def test_a_trusted_parent_may_still_invoke_python_children(hostile):
    chart = scxml('<state id="a"><invoke><content><scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0">'
                  '<final id="f"><donedata><param name="v" expr="6 * 7"/></donedata></final></scxml></content>'
                  '</invoke><transition event="done.invoke" target="ok"/></state><final id="ok"/>')
    out = hostile({"main.scxml": chart}, trust=None)
    out.assert_contained()
    assert out.error is None and out.raw["configuration"] == ["ok"]


# --------------------------------------------------------------------------- reloaded children

CHILD = scxml('<datamodel><data id="n" expr="1"/></datamodel><state id="c">'
              '<transition event="tick"><assign location="n" expr="n + 1"/></transition>'
              '<transition event="stop" target="f"/></state><final id="f"/>')
PARENT = scxml('<state id="a"><invoke id="kid" srcexpr="\'child.scxml\'"/>'
               '<transition event="done.invoke.kid" target="b"/></state><final id="b"/>')


def _run_parent(tmp_path, store):
    (tmp_path / "child.scxml").write_text(CHILD)
    (tmp_path / "main.scxml").write_text(PARENT)
    parent = sb.Chart.from_file(tmp_path / "main.scxml", trust="untrusted")
    host = sb.Host([parent], store=store, clock=sb.ManualClock(now_ms=0))
    host.start(parent, "p")
    return parent


def test_a_child_reloaded_by_another_host_keeps_the_parents_policy(tmp_path):
    store = sb.MemoryStore()
    _run_parent(tmp_path, store)
    # another process: it knows the parent chart only, and finds the child by its name
    other = sb.Host([sb.Chart.from_file(tmp_path / "main.scxml", trust="untrusted")], store=store)
    kid = other.get("p::kid")
    assert kid.chart.trust == "untrusted" and kid.chart.datamodel == "ecmascript"
    other.send("p::kid", "tick")
    assert other.get("p::kid").datamodel["n"] == 2


def test_a_child_file_turned_python_is_not_reloaded(tmp_path):
    store = sb.MemoryStore()
    _run_parent(tmp_path, store)
    (tmp_path / "child.scxml").write_text(PYTHON_CHILD)
    other = sb.Host([sb.Chart.from_file(tmp_path / "main.scxml", trust="untrusted")], store=store)
    with pytest.raises(sb.UnknownChart):
        other.get("p::kid")


def test_a_child_blob_does_not_load_against_the_same_child_trusted(tmp_path):
    store = sb.MemoryStore()
    _run_parent(tmp_path, store)
    rec = store.load("p::kid")
    trusted = sb.Chart.from_file(tmp_path / "child.scxml", name=rec.chart)
    with pytest.raises(sb.ChartIdentityMismatch):
        sb.Position.from_bytes(rec.blob, trusted)
    untrusted = sb.Chart.from_file(tmp_path / "child.scxml", name=rec.chart, trust="untrusted")
    assert sb.Position.from_bytes(rec.blob, untrusted).datamodel["n"] == 1
