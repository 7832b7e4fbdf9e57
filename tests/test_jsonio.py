"""Strict JSON in and out (statebound.jsonio), and the CLI reading ``--data`` and writing
``--json`` through it: no NaN or Infinity accepted, none ever printed."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statebound as sb
from statebound import jsonio
from statebound.cli import main


def strict_parse(text: str):
    """A parser as strict as a browser's: the stdlib's, told to refuse the constants."""
    def refuse(name):
        raise AssertionError(f"{name} in output")
    return json.loads(text, parse_constant=refuse)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_dumps_always_writes_strict_json_and_keeps_finite_values(value):
    text = jsonio.dumps(value)
    back = strict_parse(text)

    def same(a, b):
        if isinstance(a, float) and not math.isfinite(a):
            return b is None
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b
    assert same(value, back)
    assert jsonio.loads(text) == back


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "1e400", '{"a": [1, -1e999]}',
                                  "{bad", "", "[" * 50_000])
def test_loads_refuses_what_strict_parsers_refuse(text):
    with pytest.raises(sb.InvalidJSON) as info:
        jsonio.loads(text)
    assert isinstance(info.value, ValueError)  # callers that caught ValueError still do


def test_loads_refuses_nesting_past_max_depth_and_takes_it_up_to_there():
    """The stdlib parser goes to about 1,000 levels, but what runs after it recursed per
    level and failed from about 495 (writing the HTTP answer, fingerprinting a key)."""
    for deep in ("[" * 257 + "]" * 257, '{"a":' * 257 + "1" + "}" * 257,
                 "[" + '{"a":[' * 200 + "]}" * 200 + "]", "[" * 900 + "]" * 900):
        with pytest.raises(sb.InvalidJSON, match="nest more than 256"):
            jsonio.loads(deep)
    assert jsonio.loads("[" * 256 + "]" * 256) is not None
    ok = jsonio.loads('{"a":' * 256 + "1" + "}" * 256)
    assert jsonio.loads(jsonio.dumps(ok)) == ok
    assert jsonio.MAX_DEPTH == 256


def test_loads_accepts_large_finite_numbers():
    assert jsonio.loads('{"x": 1e308, "n": 123456789012345678901234567890}') == {
        "x": 1e308, "n": 123456789012345678901234567890}


@pytest.fixture
def cli_db(tmp_path, monkeypatch):
    monkeypatch.setenv("STATEBOUND_DB", str(tmp_path / "cli.db"))
    monkeypatch.chdir(tmp_path)
    chart = tmp_path / "nan.scxml"
    chart.write_text('<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" '
                     'initial="a"><datamodel><data id="x" expr="float(\'nan\')"/><data id="y" expr="1.5"/>'
                     '</datamodel><state id="a"/></scxml>')
    return chart


@pytest.mark.parametrize("data", ['{"amount": NaN}', '{"amount": Infinity}', '{"amount": 1e999}'])
def test_cli_data_refuses_nan_and_infinity(cli_db, capsys, data):
    code = main(["start", str(cli_db), "i1", "--data", data])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "--data is not valid JSON" in err
    assert main(["show", "i1"]) == 3  # nothing was started


def test_cli_json_output_is_strict_even_with_nan_in_the_datamodel(cli_db, capsys):
    assert main(["--json", "start", str(cli_db), "i1"]) == 0
    out, _ = capsys.readouterr()
    assert "NaN" not in out
    assert strict_parse(out)["datamodel"] == {"x": None, "y": 1.5}
    assert main(["show", "i1", "--json"]) == 0
    assert strict_parse(capsys.readouterr()[0])["datamodel"]["x"] is None
