"""Charts: entry points, state kinds, identity, safe parsing and validation.

What this module proves:

* ``Chart.from_scxml`` / ``Chart.from_file`` build a chart (names, versions, ``src``
  resolution beside the file), and ``chart.state(id).kind`` is one of atomic, compound,
  parallel, final, history.
* ``chart.identity`` is ``sha256:<hex>``; reformatting (whitespace, comments, quoting,
  attribute order, an XML declaration) keeps it, and every semantic change moves it.
* Parsing is safe: DTDs, internal and external entities (billion laughs, XXE) are refused
  as ``ChartSyntaxError`` carrying line and column; oversized documents are refused
  before parsing; nothing is fetched.
* Validation reports *every* problem in one ``ChartValidationError`` with a message and a
  line per problem, for each rule in the issue (duplicate ids, unknown targets, bad
  initial, history defaults, misplaced elements, send/cancel/delay rules, ``sb:timeout``).
* Datamodel selection: ``ecmascript`` and unknown datamodels are clear ``ChartError``\\ s,
  and ``null`` works with ``In()`` conditions.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import statebound as sb
from statebound.chart.xml import MAX_DOCUMENT_BYTES

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
SBNS = 'xmlns:sb="urn:statebound"'


def doc(body: str, attrs: str = "") -> str:
    return f'<scxml {NS} {SBNS} {attrs}>{body}</scxml>'


def chart(body: str, attrs: str = "", **kw) -> sb.Chart:
    return sb.Chart.from_scxml(doc(body, attrs), **kw)


def problems(body: str, attrs: str = "") -> list[sb.Problem]:
    with pytest.raises(sb.ChartValidationError) as ei:
        chart(body, attrs)
    return list(ei.value.problems)


def one_problem(body: str, pattern: str, attrs: str = "") -> sb.Problem:
    ps = problems(body, attrs)
    assert len(ps) == 1, [str(p) for p in ps]
    assert re.search(pattern, ps[0].message), ps[0].message
    return ps[0]


# --------------------------------------------------------------------------- entry points

ORDER = """<?xml version="1.0"?>
<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="order" initial="Pending">
  <state id="Pending">
    <transition event="Go" target="Work"/>
  </state>
  <state id="Work" initial="A">
    <history id="H" type="deep"><transition target="A"/></history>
    <state id="A"/>
    <parallel id="P">
      <state id="P1"/>
      <state id="P2"/>
    </parallel>
  </state>
  <final id="Done"/>
</scxml>
"""


def test_from_scxml_builds_a_chart_with_state_kinds():
    c = sb.Chart.from_scxml(ORDER)
    assert isinstance(c, sb.Chart)
    kinds = {sid: c.state(sid).kind for sid in c.state_ids}
    assert kinds == {"Pending": "atomic", "Work": "compound", "H": "history", "A": "atomic",
                     "P": "parallel", "P1": "atomic", "P2": "atomic", "Done": "final"}
    assert set(kinds.values()) == {"atomic", "compound", "parallel", "final", "history"}
    assert c.name == "order"
    assert c.version is None


def test_state_of_unknown_id_raises_keyerror():
    c = sb.Chart.from_scxml(ORDER)
    with pytest.raises(KeyError):
        c.state("Nope")


def test_name_and_version_arguments():
    c = sb.Chart.from_scxml(ORDER, name="renamed", version="3")
    assert (c.name, c.version) == ("renamed", "3")
    unnamed = chart('<state id="a"/>')
    assert unnamed.name == "chart"


def test_name_and_version_arguments_do_not_change_identity():
    assert sb.Chart.from_scxml(ORDER, name="x", version="1").identity == \
        sb.Chart.from_scxml(ORDER, name="y", version="2").identity


def test_from_scxml_accepts_bytes():
    assert sb.Chart.from_scxml(ORDER.encode()).identity == sb.Chart.from_scxml(ORDER).identity


def test_from_file_names_by_stem_and_resolves_src_beside_it(tmp_path: Path):
    sub = tmp_path / "charts"
    sub.mkdir()
    (sub / "child.scxml").write_text(doc('<final id="cdone"/>'))
    (sub / "init.json").write_text('{"limit": 5}')
    (sub / "parent.scxml").write_text(doc(
        '<datamodel><data id="cfg" src="init.json"/></datamodel>'
        '<state id="s"><invoke id="kid" src="child.scxml"/></state>'))
    c = sb.Chart.from_file(sub / "parent.scxml")
    assert c.name == "parent"
    assert c.state("s").kind == "atomic"
    inv = c.state("s").invokes[0]
    assert isinstance(inv.chart, sb.Chart)
    assert inv.chart.state("cdone").kind == "final"
    pos, effects = sb.Interpreter(c).start()
    assert pos.datamodel["cfg"] == {"limit": 5}
    invokes = [e for e in effects if isinstance(e, sb.effects.Invoke)]
    assert len(invokes) == 1 and invokes[0].chart is inv.chart
    # a str path works as well, and an explicit name wins over the stem
    assert sb.Chart.from_file(str(sub / "parent.scxml"), name="p2").name == "p2"


def test_from_file_identity_covers_loaded_src(tmp_path: Path):
    (tmp_path / "init.json").write_text('{"limit": 5}')
    text = doc('<datamodel><data id="cfg" src="init.json"/></datamodel><state id="s"/>')
    (tmp_path / "c.scxml").write_text(text)
    before = sb.Chart.from_file(tmp_path / "c.scxml").identity
    (tmp_path / "init.json").write_text('{"limit": 6}')
    assert sb.Chart.from_file(tmp_path / "c.scxml").identity != before


def test_from_scxml_base_path(tmp_path: Path):
    (tmp_path / "v.json").write_text("[1, 2, 3]")
    c = chart('<datamodel><data id="v" src="v.json"/></datamodel><state id="s"/>', base_path=str(tmp_path))
    pos, _ = sb.Interpreter(c).start()
    assert pos.datamodel["v"] == [1, 2, 3]


def test_from_file_missing_is_a_chart_error(tmp_path: Path):
    with pytest.raises(sb.ChartError, match="cannot read"):
        sb.Chart.from_file(tmp_path / "missing.scxml")


def test_from_file_name_attribute_wins_over_stem(tmp_path: Path):
    (tmp_path / "file.scxml").write_text(doc('<state id="a"/>', 'name="declared"'))
    assert sb.Chart.from_file(tmp_path / "file.scxml").name == "declared"


def test_timeouts_for_lists_declared_timeouts():
    c = chart('<state id="Live"><sb:timeout event="idle" after="5s"/>'
              '<sb:timeout name="hard" event="stop" at="2026-01-01T00:00:00Z"/></state><state id="Other"/>')
    t = c.timeouts_for("Live")
    assert [(x.name, x.event, x.kind) for x in t] == [("idle", "idle", "after"), ("hard", "stop", "at")]
    assert t[0].duration_ms == 5000
    assert t[1].at_ms == 1767225600000
    assert c.timeouts_for("Other") == ()


# --------------------------------------------------------------------------- identity

BASE = f"""<scxml {NS} name="m" initial="a">
  <datamodel><data id="n" expr="1"/></datamodel>
  <state id="a">
    <onentry><log label="hi" expr="n + 1"/></onentry>
    <transition event="go" cond="n &gt; 0" target="b"/>
  </state>
  <state id="b"><transition event="back" target="a"/></state>
</scxml>"""

REFORMATTED = f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- a comment at the top -->
<scxml name='m'    initial='a' {NS}>
      <datamodel>
          <data expr="1" id="n"/>
      </datamodel>
  <!-- between states -->
      <state id="a"><onentry>
            <log expr="n + 1" label="hi"/>   <!-- trailing -->
         </onentry>
         <transition   target="b" cond="n > 0"
                       event="go"></transition>
      </state>

      <state id="b">
          <transition event="back" target="a" />
      </state>
</scxml>
"""


def test_identity_format():
    ident = sb.Chart.from_scxml(BASE).identity
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", ident)


def test_identity_is_stable_across_parses():
    assert sb.Chart.from_scxml(BASE).identity == sb.Chart.from_scxml(BASE).identity


def test_identity_unchanged_by_whitespace_and_comments():
    assert sb.Chart.from_scxml(REFORMATTED).identity == sb.Chart.from_scxml(BASE).identity


def test_identity_unchanged_by_script_reindentation():
    a = doc('<state id="s"><onentry><script>\n    x = 1\n    y = 2\n</script></onentry></state>')
    b = doc('<state id="s"><onentry><script>\n            x = 1\n            y = 2\n        </script>'
            '</onentry></state>')
    assert sb.Chart.from_scxml(a).identity == sb.Chart.from_scxml(b).identity


@pytest.mark.parametrize("old,new", [
    ('target="b"/>\n  </state>', 'target="a"/>\n  </state>'),                 # a transition target
    ('event="go"', 'event="went"'),                                          # an event attribute
    ('cond="n &gt; 0"', 'cond="n &gt; 1"'),                                  # a condition
    ('expr="n + 1"', 'expr="n + 2"'),                                        # an expression
    ('label="hi"', 'label="ho"'),                                            # another attribute
    ('<data id="n" expr="1"/>', '<data id="n" expr="2"/>'),                   # data expression
    ('<state id="b">', '<state id="c"/><state id="b">'),                      # an added state
    ('initial="a"', 'initial="b"'),                                          # initial
    ('<transition event="go"', '<transition type="internal" event="go"'),    # an added attribute
    ('<onentry><log label="hi" expr="n + 1"/></onentry>', ''),               # removed content
    ('<state id="b"><transition event="back" target="a"/></state>',
     '<final id="b"/>'),                                                     # a state kind
])
def test_identity_changed_by_semantic_change(old, new):
    assert old in BASE
    changed = BASE.replace(old, new, 1)
    assert sb.Chart.from_scxml(changed).identity != sb.Chart.from_scxml(BASE).identity


def test_identity_changed_by_text_content():
    a = doc('<state id="s"><onentry><script>x = 1</script></onentry></state>')
    b = doc('<state id="s"><onentry><script>x = 2</script></onentry></state>')
    assert sb.Chart.from_scxml(a).identity != sb.Chart.from_scxml(b).identity


# --------------------------------------------------------------------------- safe parsing

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0">
  <state id="a"><onentry><log expr="'&lol9;'"/></onentry></state>
</scxml>"""


def test_billion_laughs_is_refused_quickly():
    import time
    t0 = time.perf_counter()
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(BILLION_LAUGHS)
    assert time.perf_counter() - t0 < 1.0
    assert ei.value.line == 2 and ei.value.column is not None
    assert "DTD" in str(ei.value)


def test_external_entity_is_refused_and_never_read(tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    xxe = (f'<?xml version="1.0"?>\n<!DOCTYPE s [ <!ENTITY x SYSTEM "file://{secret}"> ]>\n'
           f'<scxml {NS}><state id="a"><onentry><log expr="\'&x;\'"/></onentry></state></scxml>')
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(xxe)
    assert "TOP-SECRET" not in str(ei.value)
    assert ei.value.line == 2


def test_external_dtd_over_network_is_refused():
    text = (f'<?xml version="1.0"?>\n<!DOCTYPE scxml SYSTEM "http://198.51.100.1/evil.dtd">\n'
            f'<scxml {NS}><state id="a"/></scxml>')
    with pytest.raises(sb.ChartSyntaxError, match="DTD"):
        sb.Chart.from_scxml(text)


def test_undefined_entity_reference_is_a_syntax_error():
    with pytest.raises(sb.ChartSyntaxError, match="entity") as ei:
        sb.Chart.from_scxml(f'<scxml {NS}>\n<state id="a">&nope;</state></scxml>')
    assert ei.value.line == 2


def test_predefined_and_character_entities_still_work():
    c = chart('<datamodel><data id="s" expr="\'&lt;&amp;&#65;\'"/></datamodel><state id="a"/>')
    pos, _ = sb.Interpreter(c).start()
    assert pos.datamodel["s"] == "<&A"


def test_syntax_error_has_line_and_column():
    text = f'<scxml {NS}>\n  <state id="a"/>\n  <state id="b" id="c"/>\n</scxml>'
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(text)
    assert (ei.value.line, ei.value.column) == (3, 17)  # the second id attribute
    assert "line 3" in str(ei.value)


def test_junk_after_root_reports_its_column():
    head = f'<scxml {NS}><state id="a"/></scxml>'
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(head + "junk")
    assert (ei.value.line, ei.value.column) == (1, len(head) + 1)


@pytest.mark.parametrize("text", [
    "", "   ", "not xml at all", "<scxml", f"<scxml {NS}><state id='a'>", "\x00\x01",
    b"\xff\xfe\x00<", "<a></b>",
])
def test_malformed_input_is_a_syntax_error(text):
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(text)
    assert ei.value.line is not None


def test_lone_surrogate_in_str_is_a_syntax_error_with_location():
    # regression: used to escape as UnicodeEncodeError
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(f'<scxml {NS}>\n<state id="a\udcc8"/></scxml>')
    assert (ei.value.line, ei.value.column) == (2, 13)


@pytest.mark.parametrize("encoding", ["UTF-.", "rot13", "hex", "idna", "utf-32", "shift_jis", "punycode",
                                      "undefined"])
def test_unusable_declared_encoding_is_a_syntax_error(encoding):
    # regression: bytes declaring these used to escape as LookupError/ValueError/UnicodeError
    text = f'<?xml version="1.0" encoding="{encoding}"?><scxml {NS}><state id="a"/></scxml>'
    with pytest.raises(sb.ChartSyntaxError) as ei:
        sb.Chart.from_scxml(text.encode("ascii"))
    assert ei.value.line == 1


def test_str_input_ignores_a_declared_encoding():
    # a str is already decoded: its encoding= must not make the parser re-decode it
    text = (f'<?xml version="1.0" encoding="ISO-8859-1"?><scxml {NS}>'
            '<datamodel><data id="s" expr="\'\u00e9\u20ac\'"/></datamodel><state id="a"/></scxml>')
    pos, _ = sb.Interpreter(sb.Chart.from_scxml(text)).start()
    assert pos.datamodel["s"] == "\u00e9\u20ac"
    latin1 = text.replace("\u20ac", "").encode("latin-1")  # bytes do follow their declaration
    pos, _ = sb.Interpreter(sb.Chart.from_scxml(latin1)).start()
    assert pos.datamodel["s"] == "\u00e9"


def test_oversized_document_is_refused_before_parsing():
    filler = "<!--" + "x" * (MAX_DOCUMENT_BYTES + 10) + "-->"
    with pytest.raises(sb.ChartSyntaxError, match="limit"):
        sb.Chart.from_scxml(f'<scxml {NS}><state id="a"/>{filler}</scxml>')


def test_deep_nesting_is_refused():
    depth = 500
    body = "".join(f'<state id="s{i}">' for i in range(depth)) + "</state>" * depth
    with pytest.raises(sb.ChartSyntaxError, match="deeper"):
        chart(body)


def test_root_must_be_scxml():
    with pytest.raises(sb.ChartValidationError, match="root element"):
        sb.Chart.from_scxml('<state id="a"/>')
    with pytest.raises(sb.ChartValidationError, match="namespace"):
        sb.Chart.from_scxml('<scxml version="1.0"><state id="a"/></scxml>')


def test_chart_errors_are_statebound_errors():
    assert issubclass(sb.ChartSyntaxError, sb.ChartError)
    assert issubclass(sb.ChartValidationError, sb.ChartError)
    assert issubclass(sb.ChartError, sb.StateboundError)


# --------------------------------------------------------------------------- validation

def test_three_problems_are_listed_together_with_lines():
    text = f"""<scxml {NS}>
  <state id="a">
    <transition event="x" target="nowhere"/>
  </state>
  <state id="a"/>
  <state id="c"><onentry><cancel/></onentry></state>
</scxml>"""
    with pytest.raises(sb.ChartValidationError) as ei:
        sb.Chart.from_scxml(text)
    ps = ei.value.problems
    assert len(ps) == 3, [str(p) for p in ps]
    by_line = {p.line: p.message for p in ps}
    assert set(by_line) == {3, 5, 6}
    assert "nowhere" in by_line[3]
    assert "duplicate" in by_line[5]
    assert "cancel" in by_line[6]
    assert all(p.column is not None for p in ps)
    assert "3 problem(s)" in str(ei.value)


def test_many_independent_problems_are_all_reported():
    body = "".join(f'<state id="s{i}"><transition target="missing{i}"/></state>' for i in range(7))
    ps = problems(body)
    assert len(ps) == 7
    assert [re.search(r"missing(\d)", p.message).group(1) for p in ps] == [str(i) for i in range(7)]


def test_duplicate_ids():
    p = one_problem('<state id="a"/><parallel id="p"><state id="a"/></parallel>', "duplicate state id 'a'")
    assert p.element == "state"


def test_duplicate_data_ids():
    one_problem('<datamodel><data id="x"/></datamodel><state id="a"><datamodel><data id="x"/></datamodel>'
                '</state>', "duplicate <data id='x'>")


def test_unknown_transition_target():
    one_problem('<state id="a"><transition event="e" target="a ghost"/></state>', "unknown state 'ghost'")


def test_unknown_initial_attribute_target():
    one_problem('<state id="a"/>', "unknown state 'zz'", attrs='initial="zz"')


def test_initial_must_be_a_descendant():
    one_problem('<state id="p" initial="y"><state id="x"/></state><state id="y"/>', "not a descendant")


def test_initial_element_target_must_be_a_descendant():
    one_problem('<state id="p"><initial><transition target="y"/></initial><state id="x"/></state>'
                '<state id="y"/>', "not a descendant")


def test_both_initial_attribute_and_element():
    one_problem('<state id="p" initial="x"><initial><transition target="x"/></initial><state id="x"/></state>',
                "both initial= and <initial>")


def test_initial_on_atomic_state():
    one_problem('<state id="a" initial="b"/><state id="b"/>', "only allowed on compound")


def test_initial_element_in_atomic_state():
    one_problem('<state id="a"><initial><transition target="a"/></initial></state>',
                "only allowed in compound")


def test_initial_transition_may_not_have_event():
    one_problem('<state id="p"><initial><transition event="e" target="x"/></initial><state id="x"/></state>',
                "may not have an event")


def test_history_without_default():
    one_problem('<state id="p"><history id="h"/><state id="x"/></state>', "needs exactly one default")


def test_history_default_outside_parent():
    one_problem('<state id="p"><history id="h"><transition target="y"/></history><state id="x"/></state>'
                '<state id="y"/>', "not a child of 'p'")


def test_shallow_history_targeting_grandchild():
    one_problem('<state id="p"><history id="h" type="shallow"><transition target="g"/></history>'
                '<state id="x"><state id="g"/></state></state>', "not a child of 'p'")


def test_deep_history_may_target_grandchild():
    c = chart('<state id="p"><history id="h" type="deep"><transition target="g"/></history>'
              '<state id="x"><state id="g"/></state></state>')
    assert c.state("h").history_type == "deep"


def test_deep_history_default_outside_parent():
    one_problem('<state id="p"><history id="h" type="deep"><transition target="y"/></history>'
                '<state id="x"/></state><state id="y"/>', "not a descendant of 'p'")


def test_bad_history_type():
    one_problem('<state id="p"><history id="h" type="sideways"><transition target="x"/></history>'
                '<state id="x"/></state>', "shallow' or 'deep")


def test_history_at_top_level_is_one_problem():
    one_problem('<history id="h"><transition target="a"/></history><state id="a"/>',
                "<history> is not allowed inside <scxml>")


def test_transition_at_top_level():
    one_problem('<transition target="a"/><state id="a"/>', "<transition> is not allowed inside <scxml>")


def test_state_inside_final_is_one_problem():
    one_problem('<final id="f"><state id="s"/></final>', "<state> is not allowed inside <final>")


def test_onentry_in_history():
    one_problem('<state id="p"><history id="h"><onentry/><transition target="x"/></history>'
                '<state id="x"/></state>', "<onentry> is not allowed inside <history>")


def test_elseif_outside_if():
    one_problem('<state id="a"><onentry><elseif cond="True"/></onentry></state>', "only allowed inside <if>")


def test_else_outside_if():
    one_problem('<state id="a"><onexit><else/></onexit></state>', "only allowed inside <if>")


def test_elseif_after_else():
    one_problem('<state id="a"><onentry><if cond="True"><else/><elseif cond="False"/></if></onentry></state>',
                "after <else>")


def test_executable_content_directly_in_state():
    one_problem('<state id="a"><raise event="x"/></state>', "<raise> is not allowed inside <state>")


def test_executable_content_at_top_level():
    one_problem('<state id="a"/><log expr="1"/>', "<log> is not allowed inside <scxml>")


def test_state_inside_onentry_is_not_executable():
    one_problem('<state id="a"><onentry><state id="b"/></onentry></state>', "not executable content")


def test_data_outside_datamodel():
    one_problem('<state id="a"><data id="x"/></state>', "<data> is not allowed inside <state>")


def test_non_data_inside_datamodel():
    one_problem('<datamodel><log expr="1"/></datamodel><state id="a"/>', "not allowed inside <datamodel>")


def test_unknown_scxml_element():
    one_problem('<state id="a"><frobnicate/></state>', "<frobnicate> is not allowed")


def test_foreign_namespace_elements_are_ignored():
    c = chart('<state id="a" xmlns:x="urn:other"><x:widget/><onentry><x:thing/></onentry></state>')
    assert c.state("a").kind == "atomic"


def test_send_with_event_and_eventexpr():
    one_problem('<state id="a"><onentry><send event="e" eventexpr="\'e\'"/></onentry></state>',
                "only one of event, eventexpr")


@pytest.mark.parametrize("pair", [("target", "targetexpr"), ("type", "typeexpr"), ("id", "idlocation"),
                                  ("delay", "delayexpr")])
def test_send_exclusive_attribute_pairs(pair):
    a, b = pair
    one_problem(f'<datamodel><data id="v"/></datamodel><state id="a"><onentry>'
                f'<send event="e" {a}="{"1s" if a == "delay" else "x"}" {b}="v"/></onentry></state>',
                f"only one of {a}, {b}")


def test_cancel_needs_sendid_or_sendidexpr():
    one_problem('<state id="a"><onentry><cancel/></onentry></state>', "needs one of sendid, sendidexpr")


def test_cancel_with_both():
    one_problem('<state id="a"><onentry><cancel sendid="x" sendidexpr="\'x\'"/></onentry></state>',
                "only one of sendid, sendidexpr")


@pytest.mark.parametrize("delay", ["soon", "5", "-1s", "5 parsecs", "1.5.2s", ""])
def test_bad_delays(delay):
    one_problem(f'<state id="a"><onentry><send event="e" delay="{delay}"/></onentry></state>', "delay")


@pytest.mark.parametrize("delay,ms", [("5s", 5000), ("100ms", 100), ("1.5s", 1500), ("2m", 120_000),
                                      ("1h", 3_600_000), ("1d", 86_400_000), (".5s", 500)])
def test_good_delays(delay, ms):
    assert sb.chart.parse_duration(delay) == ms
    chart(f'<state id="a"><onentry><send event="e" delay="{delay}"/></onentry></state>')


def test_delay_to_internal_target():
    one_problem('<state id="a"><onentry><send event="e" target="#_internal" delay="1s"/></onentry></state>',
                "#_internal may not have a delay")


def test_send_with_content_and_params():
    one_problem('<state id="a"><onentry><send event="e"><param name="p" expr="1"/><content>x</content>'
                '</send></onentry></state>', "<content> together with")


def test_raise_needs_event():
    one_problem('<state id="a"><onentry><raise/></onentry></state>', "<raise> needs an event")


def test_assign_needs_location():
    one_problem('<state id="a"><onentry><assign expr="1"/></onentry></state>', "needs a location")


def test_if_needs_cond():
    one_problem('<state id="a"><onentry><if><log expr="1"/></if></onentry></state>', "<if> needs a cond")


def test_foreach_needs_array_and_item():
    ps = problems('<state id="a"><onentry><foreach><log expr="1"/></foreach></onentry></state>')
    assert sorted(p.message for p in ps) == ["<foreach> needs array", "<foreach> needs item"]


def test_bad_transition_type_and_event_descriptor():
    ps = problems('<state id="a"><transition type="sideways" event="a..b" target="a"/></state>')
    assert len(ps) == 2
    assert any("bad event descriptor" in p.message for p in ps)
    assert any("type must be" in p.message for p in ps)


def test_bad_binding_and_version():
    ps = problems('<state id="a"/>', attrs='binding="lazy"')
    assert len(ps) == 1 and "binding" in ps[0].message
    with pytest.raises(sb.ChartValidationError, match="version must be"):
        sb.Chart.from_scxml('<scxml xmlns="http://www.w3.org/2005/07/scxml" version="2.0"><state id="a"/>'
                            '</scxml>')


def test_empty_scxml():
    one_problem("", "no states")


def test_invalid_inline_invoked_chart_is_a_problem():
    one_problem('<state id="a"><invoke><content><scxml xmlns="http://www.w3.org/2005/07/scxml" '
                'version="1.0"><state id="c"><transition target="nope"/></state></scxml></content>'
                '</invoke></state>', "invoked chart is invalid")


def test_problems_are_in_document_order_with_lines():
    text = "\n".join([f"<scxml {NS}>", '<state id="a">', '<onentry><raise/></onentry>',
                      '<transition target="q"/>', "</state>", '<final id="f"><onentry><else/></onentry></final>',
                      "</scxml>"])
    with pytest.raises(sb.ChartValidationError) as ei:
        sb.Chart.from_scxml(text)
    assert [p.line for p in ei.value.problems] == [3, 4, 6]


# --------------------------------------------------------------------------- sb:timeout validation

def test_timeout_duplicate_name_on_one_state():
    one_problem('<state id="a"><sb:timeout event="t" after="1s"/><sb:timeout event="t" after="2s"/></state>',
                "duplicate timeout name 't'")


def test_timeout_explicit_duplicate_name():
    one_problem('<state id="a"><sb:timeout name="n" event="t1" after="1s"/>'
                '<sb:timeout name="n" event="t2" after="2s"/></state>', "duplicate timeout name 'n'")


def test_timeout_same_name_on_different_states_is_fine():
    c = chart('<state id="a"><sb:timeout event="t" after="1s"/></state>'
              '<state id="b"><sb:timeout event="t" after="2s"/></state>')
    assert c.timeouts_for("a")[0].name == c.timeouts_for("b")[0].name == "t"


@pytest.mark.parametrize("attrs", ['after="1s" at="2026-01-01T00:00:00Z"', 'after="1s" afterexpr="x"',
                                   'at="2026-01-01T00:00:00Z" atexpr="x"', 'afterexpr="1" atexpr="2"'])
def test_timeout_two_deadline_kinds(attrs):
    one_problem(f'<state id="a"><sb:timeout event="t" {attrs}/></state>', "exactly one of after")


def test_timeout_no_deadline_is_one_problem():
    one_problem('<state id="a"><sb:timeout event="t"/></state>', "exactly one of after")


@pytest.mark.parametrize("after", ["soon", "10", "1y", ""])
def test_timeout_unparseable_duration(after):
    one_problem(f'<state id="a"><sb:timeout event="t" after="{after}"/></state>', "not a duration")


def test_timeout_unparseable_instant():
    one_problem('<state id="a"><sb:timeout event="t" at="next tuesday"/></state>', "ISO-8601")


def test_timeout_needs_event():
    one_problem('<state id="a"><sb:timeout after="1s"/></state>', "needs an event")


def test_timeout_not_allowed_in_final():
    one_problem('<state id="a"/><final id="f"><sb:timeout event="t" after="1s"/></final>',
                "not allowed inside <final>")


def test_unknown_statebound_element():
    one_problem('<state id="a"><sb:deadline event="t" after="1s"/></state>', "<sb:deadline> is not allowed")


def test_timeout_in_other_namespace_is_ignored():
    c = chart('<state id="a" xmlns:o="urn:other"><o:timeout event="t" after="1s"/></state>')
    assert c.timeouts_for("a") == ()


# --------------------------------------------------------------------------- datamodels

def test_ecmascript_without_the_extra_is_a_clear_chart_error(monkeypatch):
    import statebound.chart.compiler as compiler
    monkeypatch.setattr(compiler, "_ecmascript_available", lambda: False)
    with pytest.raises(sb.ChartError, match=r"statebound\[ecmascript\]") as ei:
        chart('<state id="a"/>', attrs='datamodel="ecmascript"')
    assert not isinstance(ei.value, sb.ChartSyntaxError)


def test_ecmascript_with_the_extra_compiles():
    pytest.importorskip("quickjs")
    c = chart('<state id="a"/>', attrs='datamodel="ecmascript"')
    assert c.datamodel == "ecmascript"


def test_unknown_datamodel_is_a_chart_error():
    with pytest.raises(sb.ChartError, match="unknown datamodel 'lua'"):
        chart('<state id="a"/>', attrs='datamodel="lua"')


def test_default_datamodel_is_python():
    assert chart('<state id="a"/>').datamodel == "python"


def test_null_datamodel_with_in_conditions():
    c = chart("""
      <parallel id="p">
        <state id="r1" initial="x">
          <state id="x"><transition event="flip" target="y"/></state>
          <state id="y"/>
        </state>
        <state id="r2" initial="idle">
          <state id="idle">
            <transition event="check" cond="In('y')" target="yes"/>
            <transition event="check" target="no"/>
          </state>
          <state id="yes"/><state id="no"/>
        </state>
      </parallel>""", attrs='datamodel="null"')
    assert c.datamodel == "null"
    it = sb.Interpreter(c)
    pos, _ = it.start()
    early, _ = it.drive(pos, "check")
    assert "no" in early.configuration and "yes" not in early.configuration
    flipped, _ = it.drive(pos, "flip")
    late, _ = it.drive(flipped, "check")
    assert {"y", "yes"} <= late.configuration


def test_null_datamodel_expression_is_error_execution():
    c = chart('<state id="a"><onentry><log expr="1 + 1"/></onentry>'
              '<transition event="error.execution" target="b"/></state><state id="b"/>', attrs='datamodel="null"')
    pos, effects = sb.Interpreter(c).start()
    assert pos.configuration == {"b"}
    assert [e.label for e in effects if isinstance(e, sb.effects.Log)] == ["error.execution"]  # not the <log>


# --------------------------------------------------------------------------- trust keyword

def test_trust_is_trusted_by_default_and_part_of_the_identity():
    text = doc('<state id="s"/>', 'datamodel="null"')
    trusted = sb.Chart.from_scxml(text)
    untrusted = sb.Chart.from_scxml(text, trust="untrusted")
    assert trusted.trust == "trusted" and untrusted.trust == "untrusted"
    assert trusted.identity == sb.Chart.from_scxml(text, trust="trusted").identity
    assert untrusted.identity != trusted.identity  # a blob written untrusted never loads trusted


@pytest.mark.parametrize("bad", ["Untrusted", "", None, True, "none"])
def test_an_unknown_trust_level_is_refused(bad):
    with pytest.raises(ValueError, match="trust must be"):
        sb.Chart.from_scxml(doc('<state id="s"/>'), trust=bad)


def test_an_untrusted_chart_may_not_use_the_python_datamodel_even_by_default():
    for attrs in ("", 'datamodel="python"'):
        with pytest.raises(sb.ChartPolicyError, match="untrusted chart may use only") as info:
            sb.Chart.from_scxml(doc('<state id="s"/>', attrs), trust="untrusted")
        assert isinstance(info.value, sb.ChartValidationError)


@pytest.mark.parametrize("body, why", [
    ('<state id="a" initial="a1 a2"><state id="a1"/><state id="a2"/></state>', "meet in 'a'"),
    ('<state id="x"><transition event="e" target="x y"/></state><state id="y"/>', "meet in '<scxml>'"),
    ('<state id="x" initial="x0"><state id="x0"/><state id="x1"/>'
     '<transition event="e" target="x x1"/></state>', "'x1' is inside 'x'"),
    ('<parallel id="p"><state id="r1"><state id="a"/><state id="b"/></state><state id="r2"/>'
     '<transition event="e" target="a b"/></parallel>', "meet in 'r1'"),
])
def test_targets_that_cannot_be_active_together_are_refused(body, why):
    """SCXML 3.11: the states a transition (or initial=) enters must make a legal
    configuration. These loaded, drove into a configuration with two active children of
    one compound state, and then the stored position could not be loaded by any process."""
    with pytest.raises(sb.ChartValidationError, match="cannot be active together") as err:
        sb.Chart.from_scxml(f'<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0">{body}</scxml>')
    assert why in str(err.value) and err.value.problems[0].line == 1


def test_targets_in_different_regions_of_a_parallel_state_still_load():
    chart = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="p">'
        '<parallel id="p"><state id="r1"><state id="a"/><state id="b"/></state>'
        '<state id="r2"><state id="c"/><state id="d"/></state>'
        '<transition event="e" target="b d"/></parallel></scxml>')
    interp = sb.Interpreter(chart)
    pos, _ = interp.start("s")
    pos, _ = interp.drive(pos, "e")
    assert pos.configuration == {"p", "r1", "b", "r2", "d"}
    assert sb.Position.from_bytes(pos.to_bytes(), chart).configuration == pos.configuration


MINIMAL = f'<scxml {NS}><state id="a"/></scxml>'


@pytest.mark.parametrize("kw", [{"name": 5}, {"version": 5}, {"name": "a\ud800"}, {"version": b"v1"}])
def test_a_name_or_version_no_blob_can_carry_is_refused_at_load(kw):
    """They loaded, and the first to_bytes raised AttributeError or UnicodeEncodeError."""
    with pytest.raises(sb.InvalidArgument, match=r"name|version"):
        sb.Chart.from_scxml(MINIMAL, **kw)


@pytest.mark.parametrize("text", [None, 5, 3.5])
def test_a_document_that_is_not_text_is_invalid_argument(text):
    """None was a bare TypeError; 5 became bytes(5), five NUL bytes, "malformed XML"."""
    with pytest.raises(sb.InvalidArgument, match="str or bytes"):
        sb.Chart.from_scxml(text)


def test_state_ids_starting_with_sb_are_reserved():
    """The compiler names anonymous states _sb_<tag><index>: an author's _sb_state3 and an
    anonymous state at index 3 were two states with one id, whose export could not be
    imported again."""
    with pytest.raises(sb.ChartValidationError, match="reserved"):
        sb.Chart.from_scxml('<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0">'
                            '<state id="_sb_state3"/><state><state/></state></scxml>')


@pytest.mark.parametrize("datamodel", ["python", "ecmascript"])
def test_a_data_id_starting_with_two_underscores_is_refused_at_load(datamodel):
    # no position holds such a variable: an ecmascript session that declared one committed
    # and then could never be loaded again
    with pytest.raises(sb.ChartValidationError, match="reserved"):
        sb.Chart.from_scxml(f'<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="{datamodel}">'
                            '<datamodel><data id="__d" expr="1"/></datamodel><state id="a"/></scxml>')


def test_instants_are_exact_to_the_millisecond_never_early():
    """``int(dt.timestamp() * 1000)`` rounded through a float: about one millisecond instant
    in fifteen after 2034 came out 1 ms early, so an ``<sb:timeout at=...>`` fired before
    the instant it named. A sub-millisecond remainder rounds up, for the same reason."""
    import random
    from datetime import UTC, datetime, timedelta

    from statebound.chart.compiler import parse_instant
    from statebound.cli.timers import parse_time

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    rng = random.Random(7)
    lo, hi = 2_000_000_000_000, 2_200_000_000_000     # 2033 to 2039
    for ms in [2169251686799, *(rng.randrange(lo, hi) for _ in range(2_000))]:
        text = (epoch + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
        assert parse_instant(text) == ms, text
        assert parse_instant(text.replace("+00:00", "Z")) == ms, text
        assert parse_time(text, "--due-before") == ms, text
    assert parse_instant("2026-01-01T00:00:00.000001Z") == 1767225600001
    assert parse_instant("2026-01-01T01:00:00+01:00") == parse_instant("2026-01-01T00:00:00") == 1767225600000


def _pairwise_conflict(nodes, targets):
    """The conflict rule as SCXML states it, pair by pair (the compiler's first version)."""
    distinct = sorted(set(targets))
    for i, a in enumerate(distinct):
        for b in distinct[i + 1:]:
            na, nb = nodes[a], nodes[b]
            if a in nb.ancestors or b in na.ancestors:
                return "inside"
            shared = next(x for x in na.ancestors if x in nb.ancestors)
            if nodes[shared].kind != "parallel":
                return "meet"
    return None


def test_the_target_conflict_check_agrees_with_the_pairwise_rule_on_random_trees():
    """The compiler walks up once per target (a transition to 8,000 regions took 13 s to load
    pair by pair); on random trees and target sets it must judge exactly as the pairs do."""
    import random
    from types import SimpleNamespace

    from statebound.chart.compiler import _target_conflict
    rng = random.Random(11)
    for _ in range(3_000):
        nodes = [SimpleNamespace(id="", kind="scxml", ancestors=())]
        for i in range(1, rng.randrange(2, 14)):
            parent = rng.randrange(i)
            nodes.append(SimpleNamespace(id=f"s{i}", kind=rng.choice(["state", "parallel", "state"]),
                                         ancestors=(parent, *nodes[parent].ancestors)))
        targets = tuple(rng.randrange(1, len(nodes)) for _ in range(rng.randrange(1, 6)))
        got = _target_conflict(nodes, targets)
        want = _pairwise_conflict(nodes, targets)
        assert (got is None) == (want is None), (targets, [(n.id, n.kind, n.ancestors) for n in nodes], got)
        if got is not None and want == "inside":
            assert "is inside" in got
