"""The public facade: ``import statebound`` loads only the error tree; every name loads on use."""

from __future__ import annotations

import json
import subprocess
import sys

import statebound as sb


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_import_loads_the_error_tree_and_nothing_else():
    got = _fresh("import json, sys, statebound\n"
                 "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
                 "('statebound', 'boto3', 'sqlite3', 'quickjs', 'msgpack', 'opentelemetry'))))")
    assert got == ["statebound", "statebound.exceptions"]


def test_every_public_name_resolves_and_is_the_class_it_names():
    assert sb.Chart is __import__("statebound.chart", fromlist=["Chart"]).Chart
    assert sb.Host.__module__ == "statebound.host.host"
    for name in sb.__all__:
        assert getattr(sb, name) is not None, name
    assert set(sb.__all__) <= set(dir(sb))


def test_a_position_loaded_through_the_facade_has_its_blob_codec():
    got = _fresh("import json, statebound as sb\n"
                 "c = sb.Chart.from_scxml('<scxml xmlns=\"http://www.w3.org/2005/07/scxml\" version=\"1.0\" "
                 "datamodel=\"null\"><state id=\"a\"/></scxml>')\n"
                 "pos, _ = sb.Interpreter(c).start('x')\n"
                 "print(json.dumps(sorted(sb.Position.from_bytes(pos.to_bytes(), c).configuration)))")
    assert got == ["a"]


def test_submodules_stay_reachable_as_attributes():
    got = _fresh("import json, statebound as sb\n"
                 "print(json.dumps([sb.host.Store.__name__, sb.effects.Send.__name__, sb.position.__name__]))")
    assert got == ["Store", "Send", "statebound.position"]


def test_an_unknown_name_is_an_attribute_error():
    try:
        sb.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("no AttributeError")
