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
import traceback
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
run_chart = w3c.run_chart
_deadline = w3c._deadline
DEADLINE_S = w3c.DEADLINE_S

MANIFEST = convert_ecma.load_manifest(SUITE_DIR)

#: Tests expected not to pass under the ecmascript datamodel, with the reason (strict).
XFAIL: dict[str, str] = {}


@pytest.fixture(scope="session")
def converted_ecma_dir(tmp_path_factory) -> Path:
    """The whole suite converted once to the ecmascript datamodel."""
    out = tmp_path_factory.mktemp("w3c-ecmascript")
    convert_ecma.convert_suite(SUITE_DIR, out)
    return out


def _param(test):
    marks = []
    if test.manual:
        marks.append(pytest.mark.skip(reason="manual test: a person must judge its log output"))
    elif test.profile == "xpath":
        marks.append(pytest.mark.skip(reason="XPath datamodel profile (C.3): not applicable to ecmascript"))
    elif test.name in XFAIL:
        marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[test.name]))
    return pytest.param(test, id=test.name, marks=marks)


@pytest.mark.parametrize("w3c_test", [_param(t) for t in MANIFEST])
def test_w3c_ecma(w3c_test, converted_ecma_dir, w3c_record):
    details = []
    passed = True
    try:
        with _deadline(DEADLINE_S):
            for start in w3c_test.files:
                ok, detail = run_chart(converted_ecma_dir / (Path(start).stem + ".scxml"))
                passed = passed and ok
                details.append(f"{start}: {detail}")
    except Exception:
        passed = False
        details.append(traceback.format_exc())
    w3c_record(w3c_test.name, conformance=w3c_test.conformance, profile=w3c_test.profile, passed=passed,
               detail="\n".join(details), datamodel="ecmascript")
    assert passed, (f"{w3c_test.name} ({w3c_test.conformance}, {w3c_test.specnum} {w3c_test.specid}) "
                    "did not reach pass:\n" + "\n".join(details))
