"""Checks of the W3C-to-python converter itself (no interpreter needed)."""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest


def _load_converter():
    """Import the sibling convert.py under a private name, whatever pytest's import mode."""
    name = "statebound_w3c_convert"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("convert.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


convert = _load_converter()

SUITE_DIR = convert.default_suite_dir()
HAVE_SUITE = (SUITE_DIR / "manifest.xml").is_file()
needs_suite = pytest.mark.skipif(
    not HAVE_SUITE, reason="W3C suite not found: set STATEBOUND_W3C_DIR or place it at ../shared/conformance/w3c")

S = f"{{{convert.SCXML_NS}}}"


def _conv(body: str, root_attrs: str = 'conf:datamodel=""', stem: str = "") -> ET.Element:
    """Convert a small inline document and parse the result."""
    doc = (f'<scxml xmlns="{convert.SCXML_NS}" xmlns:conf="{convert.CONF_NS}" {root_attrs} '
           f'version="1.0">{body}</scxml>')
    return ET.fromstring(convert.convert_text(doc, stem))


# --------------------------------------------------------------------------- unit conversions


def test_targets_and_outcome_states():
    root = _conv('<state id="s0"><transition conf:targetpass=""/><transition conf:targetfail=""/></state>'
                 '<conf:pass/><conf:fail/>')
    assert root.get("datamodel") == "python"
    assert [t.get("target") for t in root.iter(S + "transition")] == ["pass", "fail"]
    finals = {f.get("id"): f for f in root.iter(S + "final")}
    assert set(finals) == {"pass", "fail"}
    assert finals["pass"].find(f"{S}onentry/{S}log").get("expr") == "'pass'"


@pytest.mark.parametrize("attr, expected", [
    ('conf:idVal="1=1"', "Var1 == 1"),
    ('conf:idQuoteVal="1=foo"', "Var1 == 'foo'"),
    ('conf:idSystemVarVal="1=_sessionid"', "Var1 == _sessionid"),
    ('conf:VarEqVar="1 2"', "Var1 == Var2"),
    ('conf:compareIDVal="1&lt;2"', "Var1 < Var2"),
    ('conf:varPrefix="2 1"', "Var1.startswith(Var2)"),
    ('conf:isBound="4"', "Var4 is not None"),
    ('conf:unboundVar="2"', "Var2 is None"),
    ('conf:inState="s1"', "In('s1')"),
    ('conf:true=""', "True"),
    ('conf:false=""', "False"),
    ('conf:eventdataVal="\'foo\'"', "_event.data == 'foo'"),
    ('conf:eventvarVal="1=1"', "_event.data['Var1'] == 1"),
    ('conf:nameVarVal="machineName"', "_name == 'machineName'"),
    ('conf:eventFieldHasNoValue="sendid"', "_event.sendid in (None, '')"),
])
def test_conditions(attr, expected):
    root = _conv(f'<state id="s0"><transition {attr} conf:targetpass=""/></state><conf:pass/>')
    assert root.find(f"{S}state/{S}transition").get("cond") == expected


def test_names_and_values():
    root = _conv('<datamodel><data conf:id="1" conf:expr="0"/><data conf:id="2" conf:quoteExpr="it\'s"/>'
                 '<data conf:id="3"><conf:array123/></data></datamodel>'
                 '<state id="s0"><onentry><assign conf:location="1" conf:varExpr="2"/><conf:incrementID id="1"/>'
                 '<send event="e" conf:delay=".5" conf:namelist="1"/>'
                 '<foreach conf:item="4" conf:index="5" conf:arrayVar="3"/></onentry></state>')
    data = root.findall(f"{S}datamodel/{S}data")
    assert [d.attrib for d in data[:2]] == [{"id": "Var1", "expr": "0"}, {"id": "Var2", "expr": '"it\'s"'}]
    assert data[2].text == "[1, 2, 3]"
    onentry = root.find(f"{S}state/{S}onentry")
    assign, incr, send, foreach = list(onentry)
    assert assign.attrib == {"location": "Var1", "expr": "Var2"}
    assert incr.attrib == {"location": "Var1", "expr": "Var1 + 1"}
    assert send.attrib == {"event": "e", "delay": ".5s", "namelist": "Var1"}
    assert foreach.attrib == {"item": "Var4", "index": "Var5", "array": "Var3"}


def test_illegal_expression_does_not_compile():
    with pytest.raises(SyntaxError):
        compile(convert.ILLEGAL_EXPR, "<w3c>", "eval")
    assert not convert.ILLEGAL_NAME.isidentifier()


def test_unknown_conf_construct_is_an_error():
    with pytest.raises(convert.ConversionError):
        _conv('<state id="s0" conf:noSuchThing="1"/>')
    with pytest.raises(convert.ConversionError):
        _conv('<state id="s0"><onentry><conf:noSuchElement/></onentry></state>')


def test_doctype_is_refused():
    with pytest.raises(convert.ConversionError):
        convert.convert_text('<!DOCTYPE scxml [<!ENTITY e "x">]><scxml xmlns="http://www.w3.org/2005/07/scxml"/>')


def test_unqualified_content_keeps_empty_namespace():
    root = _conv('<datamodel><data id="v"><books xmlns=""><book title="t"/></books></data></datamodel>')
    assert root.find(f"{S}datamodel/{S}data/books/book").get("title") == "t"


# --------------------------------------------------------------------------- the whole suite


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("w3c-convert")
    return out, convert.convert_suite(SUITE_DIR, out)


@needs_suite
def test_every_construct_of_the_suite_has_a_meaning():
    used = set()
    for path in (SUITE_DIR / "txml").glob("*.txml"):
        used |= set(re.findall(r"conf:([A-Za-z0-9]+)", path.read_text(encoding="utf-8")))
    known = set(convert.ATTRIBUTES) | set(convert.ELEMENTS)
    assert used - known == set()
    assert len(used) == 89


@needs_suite
def test_every_file_converts_to_wellformed_conf_free_scxml(converted):
    _out, done = converted
    sources = {p.name for p in (SUITE_DIR / "txml").iterdir() if p.is_file()}
    assert set(done) == sources
    for src, path in done.items():
        if path.suffix != ".scxml":
            assert path.read_bytes() == (SUITE_DIR / "txml" / src).read_bytes()
            continue
        text = path.read_text(encoding="utf-8")
        assert convert.CONF_NS not in text and "conf:" not in re.sub(r"<!--.*?-->", "", text, flags=re.S), src
        root = ET.fromstring(text)
        assert root.tag == S + "scxml", src
        for el in root.iter():
            assert not any(k.startswith("{") for k in el.attrib), (src, el.tag)


@needs_suite
def test_references_resolve_in_the_output_directory(converted):
    out, _ = converted
    for path in out.glob("*.scxml"):
        for el in ET.parse(path).getroot().iter():
            src = el.get("src")
            if src and src.startswith("file:") and "no-such" not in src:
                assert (out / src[len("file:"):]).is_file(), (path.name, src)


@needs_suite
def test_every_start_file_exists():
    for t in convert.load_manifest(SUITE_DIR):
        for f in t.files:
            assert (SUITE_DIR / "txml" / f).is_file(), (t.name, f)


@needs_suite
def test_manifest_classification():
    tests = convert.load_manifest(SUITE_DIR)
    assert len(tests) == 231
    counts = Counter((t.conformance, t.manual) for t in tests)
    assert counts == {("mandatory", False): 159, ("mandatory", True): 8,
                      ("optional", False): 63, ("optional", True): 1}
    optional_auto = [t for t in tests if t.conformance == "optional" and t.automatic]
    assert Counter(t.profile for t in optional_auto) == {"xpath": 30, "ecmascript": 20, "basichttp": 12, None: 1}
    assert len([t for t in optional_auto if t.applicable]) == 33
    # mandatory tests belong to no optional profile
    assert {t.profile for t in tests if t.conformance == "mandatory"} == {None}
    # the XPath classification (from specid) agrees with the documents themselves
    for t in tests:
        texts = [(SUITE_DIR / "txml" / f).read_text(encoding="utf-8", errors="replace") for f in t.files]
        assert (t.profile == "xpath") == any('datamodel="xpath"' in s for s in texts), t.name
    # and the converter's static ECMAScript list is the manifest's
    assert {t.name for t in tests if t.profile == "ecmascript"} == convert.ECMA_PROFILE_FILES


@needs_suite
@pytest.mark.parametrize("stem, tag, attr, expected", [
    ("test144", "transition", "target", "pass"),
    ("test153", "if", "cond", "Var1 < Var2"),
    ("test190", "assign", "expr", "Var1 + Var2"),
    ("test201", "send", "targetexpr",
     "_ioprocessors['http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor']['location']"),
    ("test240", "transition", "cond", "Var1 == 1"),
    ("test294", "content", "expr", "'foo'"),
    ("test302", "script", None, "Var1 = 1"),
    ("test336", "send", "targetexpr", "_event.origin"),
    ("test446", "transition", "cond", "isinstance(var1, list)"),
    ("test500", "data", "expr", "_ioprocessors['http://www.w3.org/TR/scxml/#SCXMLEventProcessor']['location']"),
])
def test_specific_conversions(converted, stem, tag, attr, expected):
    out, _ = converted
    root = ET.parse(out / f"{stem}.scxml").getroot()
    values = [(el.text if attr is None else el.get(attr)) for el in root.iter(S + tag)]
    assert expected in values, values


@needs_suite
def test_ecmascript_profile_runs_on_python(converted):
    out, _ = converted
    for stem in convert.ECMA_PROFILE_FILES:
        assert ET.parse(out / f"{stem}.scxml").getroot().get("datamodel") == "python", stem
