"""Resource exhaustion: documents, expressions and sessions that would take the process down.

Each chart is a class of attack: exponential or oversized input at load (elements, depth,
deep JSON, deep expressions), runaway evaluation (recursion, regular expressions, strings,
arrays, and native array methods on huge sparse arrays, which QuickJS runs without ever
checking its time limit), and runaway invocation (a chart invoking itself by ``srcexpr``, nested or ten times
at every level). Every one ends in a statebound error or ``error.execution`` within the
sandbox's limits (3 GiB, 20 s), and never in a Python exception.
"""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

import pytest

import statebound as sb

from .helpers import CATCH, CATCH_PY, scxml


def test_too_many_elements_are_refused_at_load(hostile):
    chart = scxml('<state id="a"><onentry>' + "<raise event='e'/>" * 120_000 + "</onentry></state>")
    hostile({"main.scxml": chart}).assert_refused_at_load("more than 100000 elements")


def test_too_many_elements_across_src_documents_are_refused(hostile):
    # each document is under the limit; together they are not
    kid = scxml('<state id="k"><onentry>' + "<raise event='e'/>" * 30_000 + "</onentry></state>")
    chart = scxml('<state id="a">' + "".join(f'<invoke src="kid{i}.scxml"/>' for i in range(5)) + "</state>")
    files = {"main.scxml": chart, **{f"kid{i}.scxml": kid for i in range(5)}}
    hostile(files).assert_refused_at_load("elements")


def test_deep_nesting_is_refused_at_load(hostile):
    chart = scxml("<state id='a'>" + "<if cond='true'>" * 300 + "</if>" * 300 + "</state>")
    hostile({"main.scxml": chart}).assert_refused_at_load("nested deeper than")


def test_inline_children_nested_too_deep_are_refused_at_load(hostile):
    chart = '<final id="f"/>'
    for _ in range(12):
        chart = f'<state id="s"><invoke><content>{scxml(chart)}</content></invoke></state>'
    hostile({"main.scxml": scxml(chart)}).assert_refused_at_load("nested too deeply")


def test_deep_json_data_is_a_string_not_a_crash(hostile):
    deep = "[" * 50_000 + "]" * 50_000
    chart = scxml(f'<datamodel><data id="x">{deep}</data><data id="y" src="deep.json"/></datamodel>'
                  '<state id="a"/>')
    out = hostile({"main.scxml": chart, "deep.json": deep})
    out.assert_contained()
    assert out.error is None and out.raw["datamodel"]["x"] == deep


def test_deeply_nested_expressions_are_error_execution(hostile):
    py = scxml(f'<datamodel><data id="x" expr={quoteattr("-" * 100_000 + "1")}/></datamodel>'
               f'<state id="a">{CATCH_PY}</state>', datamodel=None)
    hostile({"main.scxml": py}, trust=None).assert_error_execution("too deeply nested")
    js = scxml(f'<datamodel><data id="x" expr={quoteattr("(" * 50_000 + "1" + ")" * 50_000)}/></datamodel>'
               f'<state id="a">{CATCH}</state>')
    hostile({"main.scxml": js}).assert_error_execution()


def test_runaway_javascript_is_error_execution(hostile):
    attacks = [
        "(function f() { return f() + 1; })()",                               # recursion
        "/(a+)+$/.test('a'.repeat(40) + 'b')",                                # catastrophic regex
        "'x'.repeat(1 << 29).length",                                         # a 512 MiB string
        "(function () { var a = []; while (true) a.push(new Array(1e5)); })()",  # memory
        "JSON.parse('['.repeat(1e6) + ']'.repeat(1e6))",                      # deep JSON
        "new Array(2 ** 31).join('x')",                                       # natives that never poll
        "Array.prototype.sort.call({length: 2 ** 40})",                       # the interrupt handler
        "[].concat(new Array(2 ** 32 - 1)).length",
        "(function () { var s = 'x'; while (true) s = s + s; })()",
    ]
    blocks = "".join(f"<onentry><assign location='x' expr={quoteattr(a)}/></onentry>" for a in attacks)
    chart = scxml(f'<datamodel><data id="x" expr="0"/></datamodel><state id="a">{blocks}{CATCH}</state>')
    out = hostile({"main.scxml": chart}, ecma_limits={"time_ms": 300})
    out.assert_contained()
    assert out.error is None and len(out.messages) == len(attacks), out.messages
    assert out.raw["datamodel"]["x"] == 0


def test_a_foreach_over_a_huge_array_is_bounded(hostile):
    chart = scxml(f"""<datamodel><data id="n" expr="0"/></datamodel><state id="idle">{CATCH}
      <transition event="go"><foreach array="new Array(3e6).fill(0)" item="i"><raise event="e"/></foreach>
      </transition></state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)])
    out.assert_contained()
    assert out.error is None and (out.raw["metrics"]["budget_exhausted"] == 1 or out.messages), out.raw


def test_a_chart_invoking_itself_at_run_time_is_bounded(hostile):
    once = scxml(f'<state id="a">{CATCH}<invoke srcexpr="\'main.scxml\'"/></state>')
    out = hostile({"main.scxml": once})
    out.assert_error_execution("nest deeper than")
    tenfold = scxml(f'<state id="a">{CATCH}' + '<invoke srcexpr="\'main.scxml\'"/>' * 10 + "</state>")
    out = hostile({"main.scxml": tenfold})
    out.assert_contained()
    assert out.error is None and out.raw["status"] == "running"


# Times no store can hold: a delay string of 400 digits is an infinite float, and Infinity,
# NaN or 1e300 as an instant made int() raise. Each was a bare OverflowError or ValueError
# out of Host.send; a static one loaded and failed in the store on every drive.
SB = 'xmlns:sb="urn:statebound"'


@pytest.mark.parametrize("at", ["Infinity", "NaN", "1e300", "-1e300"])
def test_an_instant_no_store_can_hold_is_error_execution(hostile, at):
    chart = scxml(f"""<state id="a">{CATCH}<transition event="go" target="t"/></state>
      <state id="t">{CATCH}<sb:timeout name="t" atexpr="{at}" event="late"/></state>""", attrs=SB)
    out = hostile({"main.scxml": chart}, events=[("go", None)])
    out.assert_error_execution("<sb:timeout atexpr> gave")
    assert out.raw["configuration"] == ["t"]


def test_a_delay_no_store_can_hold_is_error_execution(hostile):
    chart = scxml(f"""<state id="a">{CATCH}<transition event="go" target="b">
      <send event="later" delayexpr="'1' + '0'.repeat(400) + 'ms'"/></transition></state><state id="b">{CATCH}</state>""")
    out = hostile({"main.scxml": chart}, events=[("go", None)])
    out.assert_error_execution("<send delayexpr> gave")
    assert out.raw["configuration"] == ["b"]


@pytest.mark.parametrize("timer", ['<send event="later" delay="100000000000000000000d"/>',
                                   '<send event="later" delay="1' + "0" * 400 + 'ms"/>',
                                   '<sb:timeout name="t" after="99999999999999999999d" event="late"/>'],
                         ids=["send 1e20 days", "send 400 digits", "timeout 1e20 days"])
def test_a_static_delay_no_store_can_hold_is_refused_at_load(hostile, timer):
    where = "onentry" if timer.startswith("<send") else None
    body = f"<onentry>{timer}</onentry>" if where else timer
    out = hostile({"main.scxml": scxml(f'<state id="a">{body}</state>', attrs=SB)})
    out.assert_refused_at_load("(up to 2**53 ms)")


def test_inline_children_nest_exactly_as_deep_as_documented():
    # security.md: 8 levels of child charts below the root; the check was one off (9 loaded)
    from statebound.chart.compiler import MAX_CHILD_NESTING

    def nested(levels: int) -> str:
        chart = '<final id="f"/>'
        for _ in range(levels):
            chart = f'<state id="s"><invoke><content>{scxml(chart)}</content></invoke></state>'
        return scxml(chart)

    assert MAX_CHILD_NESTING == 8
    sb.Chart.from_scxml(nested(MAX_CHILD_NESTING))
    with pytest.raises(sb.ChartValidationError, match="nested too deeply"):
        sb.Chart.from_scxml(nested(MAX_CHILD_NESTING + 1))
