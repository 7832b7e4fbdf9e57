"""The W3C SCXML 1.0 conformance suite under the *ecmascript* datamodel.

The suite is converted by ``convert_ecma.py`` (ECMAScript meanings of the ``conf:``
vocabulary; the ECMAScript-profile tests of Appendix C.2 run as written) and every test
runs through the same public Host loop as ``test_w3c.py``: a fresh ``Host`` over a
``MemoryStore`` with a ``ManualClock``, timers fired in due order until the session halts;
a test passes iff its final configuration contains ``pass``.

Skipped when the ``ecmascript`` extra (quickjs-ng) is not installed or the suite is absent.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("quickjs", reason="the ecmascript extra is not installed: pip install 'statebound[ecmascript]'")


def _load(name: str, filename: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


convert_ecma = _load("statebound_w3c_convert_ecma", "convert_ecma.py")

SUITE_DIR = convert_ecma.default_suite_dir()
if not (SUITE_DIR / "manifest.xml").is_file():
    pytest.skip("W3C suite not found: set STATEBOUND_W3C_DIR or place it at ../shared/conformance/w3c",
                allow_module_level=True)

# The Host loop, the deadline guard and the limits are test_w3c.py's own.
w3c = _load("statebound_w3c_harness", "test_w3c.py")

MANIFEST = convert_ecma.load_manifest(SUITE_DIR)

#: Tests expected not to pass under the ecmascript datamodel, with the reason (strict).
XFAIL: dict[str, str] = {}


@pytest.fixture(scope="session")
def converted_ecma_dir(tmp_path_factory) -> Path:
    """The whole suite converted once to the ecmascript datamodel."""
    out = tmp_path_factory.mktemp("w3c-ecmascript")
    convert_ecma.convert_suite(SUITE_DIR, out)
    return out


@pytest.mark.parametrize("w3c_test", [w3c.param_for(t, XFAIL, "ecmascript") for t in MANIFEST])
def test_w3c_ecma(w3c_test, converted_ecma_dir, w3c_record):
    w3c.check_w3c(w3c_test, converted_ecma_dir, w3c_record, "ecmascript")
