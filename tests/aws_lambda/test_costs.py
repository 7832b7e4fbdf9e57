"""The README's cost table is what examples/lambda/costs.py measures (run as a script, in
its own process: it sets up its own moto table and environment)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .harness import LAMBDA_DIR

README = (LAMBDA_DIR / "README.md").read_text()


def _measure(*args: str) -> str:
    done = subprocess.run([sys.executable, "costs.py", *args], cwd=LAMBDA_DIR, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _readme_block() -> str:
    return README.split("<!-- costs:begin -->\n", 1)[1].split("\n<!-- costs:end -->", 1)[0]


def test_readme_event_rows_are_measured():
    """The per-event rows (the handlers' request contract) are re-measured on every run."""
    table = _measure("--idle-seconds", "0", "--fires", "0")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "$" in line]
    requests = {r.split("|")[1].strip(): r.split("|")[2].strip() for r in rows}
    assert requests == {
        "start an instance": "GetItem, PutItem",
        "event, no timer change": "GetItem, PutItem",                   # keyed: the key costs nothing
        "event arming a timer": "GetItem, TransactWriteItems",
        # the outbox row rides in the transaction; the UpdateItem acknowledges the delivery
        "event completing an order: cancels its timer, sends the confirmation (outbox)":
            "GetItem, TransactWriteItems, UpdateItem",
        "repeated event (same `Idempotency-Key`)": "GetItem",
        "event over SQS (`SqsEventsFunction`)": "GetItem, PutItem",
        "SQS delivering an applied event again": "GetItem",
    }
    block = _readme_block()
    for row in rows:
        assert row in block, f"README.md's cost table is stale; run: python examples/lambda/costs.py --update-readme\n{row}"


@pytest.mark.slow
def test_readme_cost_table_is_measured_in_full():
    assert _measure() == _readme_block(), "run: python examples/lambda/costs.py --update-readme"
