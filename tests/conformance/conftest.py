"""Shared fixtures of the W3C conformance harness, and its end-of-run summary.

``test_w3c.py`` records each test's real outcome (reached ``pass`` or not) through
the ``w3c_record`` fixture, independently of xfail marks, and
``pytest_terminal_summary`` prints the conformance counts in every run,
including ``pytest -q``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass
class Outcome:
    """What one W3C test did."""

    conformance: str          # "mandatory" | "optional"
    profile: str | None       # "ecmascript" | "basichttp" | None
    passed: bool
    detail: str = ""
    datamodel: str = "python"  # which harness recorded it: test_w3c.py or test_w3c_ecma.py


_RESULTS = pytest.StashKey[dict[str, Outcome]]()


def _results(config: pytest.Config) -> dict[str, Outcome]:
    return config.stash.setdefault(_RESULTS, {})


@pytest.fixture
def w3c_record(request: pytest.FixtureRequest):
    """``w3c_record(test_name, conformance=, profile=, passed=, detail=)`` keeps an outcome for the summary."""
    results = _results(request.config)

    def record(name: str, **fields) -> None:
        outcome = Outcome(**fields)
        results[name if outcome.datamodel == "python" else f"{outcome.datamodel}:{name}"] = outcome

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    results = config.stash.get(_RESULTS, None)
    if not results:
        return
    tr = terminalreporter

    def line(label: str, items: list[Outcome]) -> None:
        if items:
            tr.write_line(f"{label}: {sum(o.passed for o in items)}/{len(items)} passed")

    for datamodel in ("python", "ecmascript"):
        mine = {n.split(":", 1)[-1]: o for n, o in results.items() if o.datamodel == datamodel}
        if not mine:
            continue
        tr.section(f"W3C SCXML conformance ({datamodel} datamodel)")
        values = list(mine.values())
        line("mandatory", [o for o in values if o.conformance == "mandatory"])
        optional = [o for o in values if o.conformance == "optional"]
        line("optional", optional)
        line("  optional, ECMAScript profile" + (" (python analogues)" if datamodel == "python" else ""),
             [o for o in optional if o.profile == "ecmascript"])
        line("  optional, Basic HTTP I/O processor", [o for o in optional if o.profile == "basichttp"])
        line("  optional, other", [o for o in optional if o.profile is None])
        failed = sorted((n for n, o in mine.items() if not o.passed),
                        key=lambda n: int("".join(filter(str.isdigit, n)) or 0))
        if failed:
            tr.write_line("not passing: " + " ".join(failed))
