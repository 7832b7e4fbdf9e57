"""Inputs whose cost grew with the square of their size: each runs in a subprocess with a
timeout, so a regression fails here instead of holding CI for minutes (the sizes take a
fraction of a second now, and took from a minute to several before)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from statebound.chart.xml import parse_xml

TIMEOUT_S = 30


def _run(code: str) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {TIMEOUT_S} s: the cost is quadratic again")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_text_of_many_lines_or_entities_is_read_in_linear_time():
    # one expat callback per line or entity, each appended by copying all the text before it:
    # 1.5 MB of newlines took about a minute to load, and event data that looks like XML was
    # parsed the same way on every delivery, before any budget
    out = _run("""
        import statebound as sb
        NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
        n = 3_000_000
        for body in ("x" + "\\n" * n, "&amp;" * (n // 2)):
            c = sb.Chart.from_scxml(f'<scxml {NS} datamodel="null"><state id="a"/>{body}</scxml>', name="q",
                                    trust="untrusted")
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.parametrize("doc", [
    "<a>one<b>two</b>three &amp; four\nfive<c/>six</a>",
    "<a>\n\n<b>&lt;x&gt;\n</b>\n<c>t</c>tail&#10;more</a>",
    "<a><![CDATA[raw <b> & text]]>after<b/></a>",
])
def test_text_and_tails_are_what_a_reference_parser_reads(doc):
    ours, ref = parse_xml(doc), ET.fromstring(doc)

    def walk(el, r):
        assert el.text == (r.text or "")
        assert [c.tag for c in el.children] == [c.tag for c in r]
        assert el.tails == [c.tail or "" for c in r]
        for c, rc in zip(el.children, r, strict=True):
            walk(c, rc)
    walk(ours, ref)


def test_a_src_of_very_many_components_is_refused_before_it_is_resolved(tmp_path):
    # os.path.realpath re-joins the rest of a path once per component: <data src="a/a/.../x">
    # took 136 s of CPU to refuse for a 1.5 MB chart, and <invoke srcexpr> 21 s in one send
    out = _run(f"""
        import statebound as sb
        from statebound.exceptions import ChartPolicyError
        NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
        src = "a/" * 800_000 + "x"
        try:
            sb.Chart.from_scxml(f'<scxml {{NS}} datamodel="null"><datamodel><data id="d" src="{{src}}"/></datamodel>'
                                '<state id="s"/></scxml>', name="q", base_path={str(tmp_path)!r})
        except ChartPolicyError as exc:
            print("refused:", "path components" in str(exc))
    """)
    assert out.strip() == "refused: True"


def test_a_transition_to_thousands_of_regions_loads_in_linear_time():
    # its targets were checked pair by pair: 8,000 regions of a <parallel> took 13 s to load,
    # and a chart building such a child for <invoke><content expr> ran past the call's budget
    out = _run("""
        import statebound as sb
        NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
        n = 20_000
        regions = "".join(f'<state id="r{i}"/>' for i in range(n))
        targets = " ".join(f"r{i}" for i in range(n))
        sb.Chart.from_scxml(f'<scxml {NS} datamodel="null" initial="a"><state id="a">'
                            f'<transition event="go" target="{targets}"/></state>'
                            f'<parallel id="p">{regions}</parallel></scxml>', name="q", trust="untrusted")
        print("ok")
    """)
    assert out.strip() == "ok"
