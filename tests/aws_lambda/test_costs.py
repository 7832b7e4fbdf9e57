"""The README's cost table is what examples/lambda/costs.py measures (run as a script, in
its own process: it sets up its own moto table and environment)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .harness import LAMBDA_DIR

README = (LAMBDA_DIR / "README.md").read_text()
DYNAMODB_DOC = (LAMBDA_DIR.parents[1] / "docs" / "dynamodb.md").read_text()
RRU_USD = 0.125 / 1e6
LAMBDA_USD = 0.20 / 1e6


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
        # the wake-up rides on SQS: no DynamoDB request of its own
        "wake-ups: event arming a timer, and its wake-up": "GetItem, TransactWriteItems",
    }
    block = _readme_block()
    for row in rows:
        assert row in block, f"README.md's cost table is stale; run: python examples/lambda/costs.py --update-readme\n{row}"


@pytest.mark.slow
def test_readme_cost_table_is_measured_in_full():
    assert _measure() == _readme_block(), "run: python examples/lambda/costs.py --update-readme"


_FALLBACK = re.compile(
    r"every (?P<minutes>\d+) minutes \(`FALLBACK_MINUTES`\), (?P<runs>[\d,]+) runs a month, each "
    r"(?P<requests>\d+) requests \((?P<ops>[^)]*)\) and (?P<rru>[\d.]+) RRU over (?P<shards>\d+) shards: "
    r"\*\*\$(?P<usd>[\d.]+) a month\*\* in DynamoDB, \$(?P<invocations_usd>[\d.]+) in invocations")


def _fallback(table: str) -> dict[str, str]:
    found = _FALLBACK.search(table)
    assert found, f"no idle fallback line in:\n{table}"
    return found.groupdict()


def test_the_idle_fallback_is_priced_from_its_counted_requests():
    """With wake-ups the idle cost is the fallback's. It is counted, not quoted: a quarter of
    the shards read every ten minutes instead of five makes a quarter of the requests, half
    the runs, and the dollars follow from those counts."""
    template = _fallback(_measure("--idle-seconds", "0", "--fires", "0"))
    small = _fallback(_measure("--idle-seconds", "0", "--fires", "0", "--shards", "4", "--fallback-minutes", "10"))
    assert (template["shards"], template["minutes"], small["shards"], small["minutes"]) == ("16", "5", "4", "10")
    per_shard = int(template["requests"]) / 16
    assert per_shard >= 1 and int(small["requests"]) == per_shard * 4   # every shard read, no Scan
    assert "Scan" not in template["ops"] and float(small["rru"]) * 4 == float(template["rru"])
    for line in (template, small):
        runs = 730 * 60 / int(line["minutes"])
        assert int(line["runs"].replace(",", "")) == runs
        assert float(line["usd"]) == pytest.approx(float(line["rru"]) * runs * RRU_USD, abs=0.0005)
        assert float(line["invocations_usd"]) == pytest.approx(runs * LAMBDA_USD, abs=0.00005)
    # the README and docs/dynamodb.md quote the template's figures as measured
    assert f"each {template['requests']} requests ({template['ops']}) and {template['rru']} RRU" in _readme_block()
    assert f"{template['requests']} requests ({template['ops']}) and {template['rru']} RRU" in DYNAMODB_DOC
    assert f"**${template['usd']} a month** of DynamoDB" in DYNAMODB_DOC


def test_a_fire_by_wake_up_reads_by_key_and_never_queries():
    """A few timers through the wake function: each fire is the row's and the position's
    GetItem and one transaction, and a wake-up sent by the fallback adds no request."""
    table = _measure("--idle-seconds", "0", "--fires", "5")
    rows = {r.split("|")[1].strip(): r.split("|")[2].strip() for r in table.splitlines() if r.startswith("| ")}
    assert rows["wake-ups: timer fire (`WakeFunction`, arms nothing)"] == "2.00 GetItem, TransactWriteItems"
    assert rows["wake-ups: timer fire that arms the next timer"] == "2.00 GetItem, TransactWriteItems"
    assert rows["wake-ups: a timer due beyond 15 minutes gets its wake-up from the fallback"].startswith("none")
    assert "Query" in rows["polling: timer fire (arms nothing)"]
    block = _readme_block()
    for name in ("wake-ups: timer fire (`WakeFunction`, arms nothing)", "wake-ups: timer fire that arms the next timer"):
        assert f"| {name} | {rows[name]} |" in block
