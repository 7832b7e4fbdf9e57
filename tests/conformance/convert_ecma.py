"""Convert the W3C SCXML conformance suite (``.txml``) to the *ecmascript* datamodel.

The sibling ``convert.py`` explains the suite's ``conf:`` vocabulary and carries the
tree rewriting, the writer and the manifest reader; this module reuses all of that and
swaps in ECMAScript meanings for the constructs whose text differs from Python.  It is
written from the meaning of each construct, like ``convert.py``, not derived from the
W3C's ``confEcma.xsl``.

Usage::

    python tests/conformance/convert_ecma.py OUTDIR [SUITE_DIR]

ECMAScript datamodel assumed (what ``statebound.datamodel.ecmascript`` implements)
-------------------------------------------------------------------------------
* ``<data id="Var1">`` declares the global ``Var1``; a declared variable without a value
  is ``undefined`` (and ``null`` once stored), so "bound" means "neither undefined nor
  null".
* Reading an undeclared name throws a ``ReferenceError``; an expression that does not
  parse throws a ``SyntaxError`` when evaluated; both become ``error.execution``.
* ``_event`` fields that have no value are ``undefined``; ``_event.data`` built from
  namelist/``<param>`` is an object keyed by name.
* ``_ioprocessors`` is an object of objects keyed by processor type URI.

Conversion table: only what differs from ``convert.py`` (``N`` a digit string)
-----------------------------------------------------------------------------
::

    conf:datamodel="..."           datamodel="ecmascript"
    conf:quoteExpr="s"             expr="'s'"              a JS string literal
    conf:varNonexistentStruct="N"  expr="VarN.noSuchField.noSuchField"   a TypeError
    conf:scxmlEventIOLocation=""   expr="_ioprocessors['http://www.w3.org/TR/scxml/#SCXMLEventProcessor'].location"
    conf:basicHTTPAccessURITarget="" targetexpr="_ioprocessors['...#BasicHTTPEventProcessor'].location"
    conf:illegalExpr=""            expr=ILLEGAL_EXPR       "1 +* 2" does not parse
    conf:scriptBadSrc=""           src="file:no-such-script.js"
    conf:eventDataFieldValue="k"   expr="_event.data['k']"
    conf:true / conf:false         true / false
    conf:nonBoolean=""             ILLEGAL_EXPR: every JS value converts to a boolean, so a
                                   condition that cannot be evaluated as one must fail to parse
    conf:idQuoteVal="N=s"          VarN == 's'
    conf:VarEqVarStruct="N M"      JSON.stringify(VarN) == JSON.stringify(VarM)   (== compares identity)
    conf:varPrefix="N M"           VarM.indexOf(VarN) == 0
    conf:isBound="N"               VarN !== undefined && VarN !== null
    conf:unboundVar="N"            VarN === undefined || VarN === null
    conf:noValue="N"               VarN === undefined || VarN === null || VarN === ''
    conf:systemVarIsBound="_x"     typeof _x !== 'undefined' && _x !== null
    conf:emptyEventData=""         _event.data === undefined || _event.data === null || _event.data === ''
    conf:eventFieldHasNoValue="f"  _event.f === undefined || _event.f === null || _event.f === ''
    conf:eventFieldsAreBound=""    'name' in _event && 'type' in _event && ... (all seven fields)
    conf:eventNamedParamHasValue="k v"  String(_event.data['k']) == 'v'
    conf:eventIdParamHasValue="N v"     String(_event.data['VarN']) == 'v'
    conf:methodIsPost=""           String(_event.raw).indexOf('POST') >= 0
    conf:messageBodyEquals="s"     String(_event.raw).indexOf('s') >= 0
    <conf:extendArray id="N"/>     <assign location="VarN" expr="[].concat(VarN, [4])"/>

Everything else (names, numbers, ``==``/``<`` comparisons, ``In('s')``, ``_event.name``,
``VarN + 1``, ``<script>Var1 = 1</script>``, the send/invoke attributes) reads the same in
both languages and is taken from ``convert.py`` unchanged.

The ECMAScript-profile tests (C.2) are written in ECMAScript already and run as they
are, with their ``datamodel="ecmascript"``: no analogue is applied.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from collections.abc import Callable

_HERE = Path(__file__).resolve().parent


def _load_base():
    """A private instance of convert.py whose tables this module replaces."""
    name = "statebound_w3c_convert_ecma_base"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HERE / "convert.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


base = _load_base()
var = base.var
ConversionError = base.ConversionError
SCXML_IOP = base.SCXML_IOP
BASICHTTP_IOP = base.BASICHTTP_IOP
EVENT_FIELDS = base.EVENT_FIELDS
load_manifest = base.load_manifest
default_suite_dir = base.default_suite_dir
ECMA_PROFILE_FILES = base.ECMA_PROFILE_FILES

#: Does not parse as ECMAScript (``+`` then ``*``).
ILLEGAL_EXPR = "1 +* 2"


def js_str(s: str) -> str:
    """An ECMAScript single-quoted string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r") + "'"


def _cond(fn: Callable[[str], str]):
    return lambda v: {"cond": fn(v)}


def _expr(fn: Callable[[str], str]):
    return lambda v: {"expr": fn(v)}


def _const(**attrs: str):
    return lambda v: dict(attrs)


def _unset(x: str) -> str:
    return f"({x} === undefined || {x} === null)"


def _id_quote_val(v: str) -> str:
    n, val = base._split_eq(v)
    return f"{var(n)} == {js_str(val)}"


def _var_eq_struct(v: str) -> str:
    a, b = base._split2(v)
    return f"JSON.stringify({var(a)}) == JSON.stringify({var(b)})"


def _var_prefix(v: str) -> str:
    prefix, whole = base._split2(v)
    return f"{var(whole)}.indexOf({var(prefix)}) == 0"


def _named_param(v: str) -> str:
    key, val = base._split2(v)
    return f"String(_event.data[{js_str(key)}]) == {js_str(val)}"


def _id_param(v: str) -> str:
    n, val = base._split2(v)
    return f"String(_event.data[{js_str(var(n))}]) == {js_str(val)}"


_ECMA_ATTRIBUTES = {
    "datamodel": _const(datamodel="ecmascript"),
    "quoteExpr": _expr(js_str),
    "varNonexistentStruct": _expr(lambda v: f"{var(v)}.noSuchField.noSuchField"),
    "scxmlEventIOLocation": _const(expr=f"_ioprocessors[{js_str(SCXML_IOP)}].location"),
    "basicHTTPAccessURITarget": _const(targetexpr=f"_ioprocessors[{js_str(BASICHTTP_IOP)}].location"),
    "illegalExpr": _const(expr=ILLEGAL_EXPR),
    "scriptBadSrc": _const(src="file:no-such-script.js"),
    "eventDataFieldValue": _expr(lambda v: f"_event.data[{js_str(v.strip())}]"),
    "eventDataParamValue": _expr(lambda v: f"_event.data[{js_str(v.strip())}]"),
    "eventDataNamelistValue": _expr(lambda v: f"_event.data[{js_str(var(v))}]"),
    "eventvarVal": _cond(lambda v: (lambda n, val: f"_event.data[{js_str(var(n))}] == {val}")(*base._split_eq(v))),
    "true": _const(cond="true"),
    "false": _const(cond="false"),
    "nonBoolean": _const(cond=ILLEGAL_EXPR),
    "inState": _cond(lambda v: f"In({js_str(v.strip())})"),
    "idQuoteVal": _cond(_id_quote_val),
    "VarEqVarStruct": _cond(_var_eq_struct),
    "varPrefix": _cond(_var_prefix),
    "isBound": _cond(lambda v: f"!{_unset(var(v))}"),
    "unboundVar": _cond(lambda v: _unset(var(v))),
    "noValue": _cond(lambda v: f"({_unset(var(v))} || {var(v)} === '')"),
    "systemVarIsBound": _cond(lambda v: f"(typeof {v.strip()} !== 'undefined' && {v.strip()} !== null)"),
    "nameVarVal": _cond(lambda v: f"_name == {js_str(v.strip())}"),
    "originTypeEq": _cond(lambda v: f"_event.origintype == {js_str(v.strip())}"),
    "eventNameVal": _cond(lambda v: f"_event.name == {js_str(v.strip())}"),
    "emptyEventData": _const(cond=f"({_unset('_event.data')} || _event.data === '')"),
    "eventFieldHasNoValue": _cond(lambda v: f"({_unset('_event.' + v.strip())} || _event.{v.strip()} === '')"),
    "eventFieldsAreBound": _const(cond=" && ".join(f"({js_str(f)} in _event)" for f in EVENT_FIELDS)),
    "eventNamedParamHasValue": _cond(_named_param),
    "eventIdParamHasValue": _cond(_id_param),
    "methodIsPost": _const(cond="String(_event.raw).indexOf('POST') >= 0"),
    "messageBodyEquals": _cond(lambda v: f"String(_event.raw).indexOf({js_str(v)}) >= 0"),
}


def _extend(el) -> list:
    v = var(base._need(el, "id"))
    return [base._el("assign", location=v, expr=f"[].concat({v}, [4])")]


_ECMA_ELEMENTS = {
    "extendArray": _extend,
}

ATTRIBUTES = {**base.ATTRIBUTES, **_ECMA_ATTRIBUTES}
ELEMENTS = {**base.ELEMENTS, **_ECMA_ELEMENTS}
# the private convert.py instance converts with the ECMAScript tables
base.ATTRIBUTES = ATTRIBUTES
base.ELEMENTS = ELEMENTS


def convert_text(text: str | bytes, stem: str = "") -> str:
    """Convert one ``.txml`` document to ecmascript-datamodel SCXML text."""
    root = base.parse(text)
    prolog = base._prolog_comments(text)
    base._convert_element(root)
    dm = root.get("datamodel")
    if dm is None:  # test301 names none; the suite means "the datamodel under test"
        root.set("datamodel", "ecmascript")
    elif dm not in ("ecmascript", "xpath", "null"):  # null: test436 tests that datamodel; xpath: never run
        raise ConversionError(f"{stem}: datamodel is {dm!r}, expected ecmascript")
    result = base.to_xml(root, prolog)
    if base.CONF_NS in result:
        raise ConversionError(f"{stem}: conf namespace left in output")
    return result


base.convert_text = convert_text  # convert_file / convert_suite of the instance use it
convert_file = base.convert_file
convert_suite = base.convert_suite


def main(argv: list[str]) -> int:
    """``python convert_ecma.py OUTDIR [SUITE_DIR]``: convert the whole suite into OUTDIR."""
    return base.main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
