"""Safe chart upgrades on Lambda: start on v1, deploy v2, and v1's timers still fire on v1
while new instances start on v2; revisions.py counts what is left to drain."""

from __future__ import annotations

import importlib
import json
import shutil

import pytest

from .harness import deployment


@pytest.fixture()
def deployments(tmp_path):
    """Two charts/ directories as two deployments would ship them: v1 alone, then v1 + v2."""
    return deployment(tmp_path / "deploy-1", "v1"), deployment(tmp_path / "deploy-2", "v1", "v2")


def test_v1_timers_fire_on_v1_after_v2_is_deployed(lam, deployments):
    first, second = deployments
    lam.rebuild(first)
    status, body = lam.call("POST", "/instances/old", {"chart": "order", "data": {"payment_timeout": "30s"}})
    assert status == 201 and body["revision"] == "v1"
    lam.call("POST", "/instances/old/events", {"event": "StartPayment"})

    lam.rebuild(second)   # deploy v2: a new Lambda version, a cold start over the same table
    status, body = lam.call("POST", "/instances/new", {"chart": "order", "data": {"payment_timeout": "30s"}})
    assert status == 201 and body["revision"] == "v2"
    lam.call("POST", "/instances/new/events", {"event": "StartPayment"})
    assert lam.call("GET", "/instances/old")[1]["revision"] == "v1"   # still on its own revision

    lam.clock.advance(30_000)
    report = lam.sweep(8_000, 2_000)
    assert report["fired"] == 2 and report["failed"] == 0
    old = lam.call("GET", "/instances/old")[1]
    new = lam.call("GET", "/instances/new")[1]
    assert (old["revision"], old["configuration"], old["status"]) == ("v1", ["Cancelled"], "done")  # v1's rule
    assert (new["revision"], new["configuration"]) == ("v2", ["Overdue"])                            # v2's rule
    assert [t["name"] for t in new["timers"]] == ["GraceExpired"]


def test_an_old_instance_still_takes_events_on_its_revision(lam, deployments):
    first, second = deployments
    lam.rebuild(first)
    lam.call("POST", "/instances/o", {"chart": "order"})
    lam.rebuild(second)
    status, body = lam.call("POST", "/instances/o/events", {"event": "StartPayment"})
    assert status == 200 and body["revision"] == "v1" and body["configuration"] == ["Started"]


def test_an_undeployed_revision_is_a_clear_409_not_a_500(lam, deployments, tmp_path):
    first, _ = deployments
    lam.rebuild(first)
    lam.call("POST", "/instances/o", {"chart": "order"})
    v2_only = tmp_path / "v2-only"
    deployment(v2_only, "v2")
    lam.rebuild(v2_only)
    for method, path, body in (("GET", "/instances/o", None), ("POST", "/instances/o/events", {"event": "Cancel"})):
        status, payload = lam.call(method, path, body)
        assert status == 409 and "not deployed" in payload["error"] and payload["type"] == "ChartIdentityMismatch"


def test_revisions_lists_instances_per_revision_and_flags_undeployed_ones(lam, deployments, capsys, monkeypatch):
    first, second = deployments
    lam.rebuild(first)
    for iid in ("a", "b", "c"):
        lam.call("POST", f"/instances/{iid}", {"chart": "order"})
    lam.call("POST", "/instances/c/events", {"event": "Cancel"})   # finished (status done) on v1
    lam.rebuild(second)
    lam.call("POST", "/instances/d", {"chart": "order"})
    lam.call("POST", "/instances/a/events", {"event": "StartPayment"})   # a timer row, which is not an instance
    lam.call("POST", "/instances/e", {"chart": "order"})
    lam.host.delete("e")                    # its tombstone (ADR 0028) is not an instance either
    revisions = importlib.import_module("revisions")
    capsys.readouterr()

    assert revisions.main(["--table", "statebound-example", "--json", "--ids", "--charts", str(second)],
                          client=lam.client) == 0
    rows = {r["revision"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"v1", "v2"}
    assert rows["v1"]["by_status"] == {"running": 2, "done": 1, "cancelled": 0}
    assert sorted(rows["v1"]["ids"]) == ["a", "b", "c"] and rows["v1"]["deployed"] is True
    assert rows["v2"]["by_status"]["running"] == 1 and rows["v2"]["ids"] == ["d"]

    # Deploying without v1 now would strand a and b: the tool says so and exits non-zero.
    v2_only = second.parent / "v2-only"
    shutil.copytree(second, v2_only)
    (v2_only / "order" / "v1.scxml").unlink()
    assert revisions.main(["--table", "statebound-example", "--charts", str(v2_only)], client=lam.client) == 1
    text = capsys.readouterr().out
    v1_line = next(line for line in text.splitlines() if line.startswith("order") and " v1 " in line)
    assert "NOT DEPLOYED" in v1_line and v1_line.split()[2] == "2"


def test_a_timer_stranded_by_a_bad_deployment_is_redriven_after_the_fix(lam, deployments, tmp_path, capsys):
    """The README's redrive story: a revision shipped too early goes dead, comes back."""
    first, second = deployments
    lam.rebuild(first)
    lam.call("POST", "/instances/old", {"chart": "order", "data": {"payment_timeout": "30s"}})
    lam.call("POST", "/instances/old/events", {"event": "StartPayment"})
    v2_only = tmp_path / "v2-only"
    shutil.copytree(second, v2_only)
    (v2_only / "order" / "v1.scxml").unlink()
    lam.rebuild(v2_only).max_attempts = 2          # the mistake: v1 dropped while "old" runs it
    lam.clock.advance(30_000)
    lam.sweep(8_000, 2_000)
    lam.clock.advance(10_000)
    lam.sweep(8_000, 2_000)
    redrive = importlib.import_module("redrive")
    capsys.readouterr()
    assert redrive.main(["--table", "statebound-example", "--json"], client=lam.client, clock=lam.clock) == 0
    (dead,) = json.loads(capsys.readouterr().out)
    assert (dead["instance"], dead["event"], dead["attempts"], dead["revived"]) == ("old", "PaymentTimeout", 2, False)
    assert "version 'v1'" in dead["last_error"]

    lam.rebuild(second)                              # the fix: v1 shipped again
    assert redrive.main(["--table", "statebound-example", "--retry", "old"], client=lam.client, clock=lam.clock) == 0
    assert "1 dead, 1 revived" in capsys.readouterr().out
    assert lam.sweep(8_000, 2_000)["fired"] == 1
    body = lam.call("GET", "/instances/old")[1]
    assert (body["revision"], body["configuration"], body["timers"]) == ("v1", ["Cancelled"], [])
    assert redrive.main(["--table", "statebound-example"], client=lam.client, clock=lam.clock) == 0
    assert "0 dead, 0 revived" in capsys.readouterr().out
