"""Host.migrate: one stored instance onto a new chart revision, in its own conditional commit."""

from __future__ import annotations

from pathlib import Path

import pytest

import statebound as sb
from statebound.position import MigrationError, read_header

ORDER = Path(__file__).resolve().parents[1] / "examples" / "order" / "order.scxml"
V1 = ORDER.read_text()
V2 = V1.replace('target="Started"', 'target="Paying"').replace('id="Started"', 'id="Paying"')
V3 = V1.replace('<transition event="Complete" target="Done"/>', '<transition event="Complete" target="Done"/>'
                '<transition event="Refund" target="Cancelled"/>')           # compatible: one more transition


@pytest.fixture
def world(tmp_path):
    v1 = sb.Chart.from_scxml(V1, name="order")
    v2 = sb.Chart.from_scxml(V2, name="order")
    clock = sb.ManualClock(now_ms=0)
    store = sb.SQLiteStore(tmp_path / "m.db")
    host = sb.Host([v1], store=store, clock=clock)
    host.start("order", "o1", {"payment_timeout": "1h"})
    host.send("o1", "StartPayment", {"card": "4242"})
    return host, v1, v2, clock


def test_a_mapped_revision_moves_and_its_named_timeout_still_fires(world):
    host, v1, v2, clock = world
    before = host.store.load("o1")
    [row] = host.pending_timers("o1")
    res = host.migrate("o1", v2, mapping={"Started": "Paying"})
    assert (res.outcome, res.reason, res.from_identity, res.moved) == ("moved", "mapped", v1.identity, True)
    rec = host.store.load("o1")
    assert read_header(rec.blob).identity == v2.identity and rec.version == before.version + 1
    assert rec.timers == before.timers and host.pending_timers("o1") == [row]   # rows untouched
    pos = host.get("o1")
    assert pos.configuration == {"Paying"} and pos.datamodel["card"] == "4242"
    assert [(pos.chart.state_ids[t.state - 1], t.name, t.ordinal) for t in pos.timeouts] == [
        ("Paying", "PaymentTimeout", row.ordinal)]
    clock.advance(3_600_000)
    assert [r.outcome for r in host.fire_due()] == ["fired"]                  # not "stale": same generation
    assert host.get("o1").configuration == {"Cancelled"}
    assert host.migrate("o1", v2, mapping={"Started": "Paying"}).outcome == "already"


def test_what_cannot_move_is_reported_and_left_alone(world, tmp_path):
    host, v1, v2, _ = world
    version = host.store.load("o1").version
    res = host.migrate("o1", v2)                                             # no map: Started is gone
    assert res.outcome == "breaking" and "'Started' is gone" in res.reason and not res.moved
    assert host.migrate("o1", v2, mapping={"Started": "Paying"}, dry_run=True).outcome == "would-move"
    assert host.store.load("o1").version == version                          # neither wrote anything
    assert host.migrate("ghost", v2).outcome == "gone"
    stranger = sb.Host([v2], store=host.store)                               # does not know v1
    res = stranger.migrate("o1", v2)
    assert res.outcome == "unknown-revision" and v1.identity in res.reason
    host.store.commit(sb.host.Commit(writes=(sb.host.PositionWrite("junk", "order", None, b"not a blob",
                                                                   "running"),)))
    res = host.migrate("junk", v2)
    assert res.outcome == "failed" and "not a statebound position" in res.reason


def test_a_concurrent_event_is_never_lost(world):
    host, v1, _, _ = world
    v3 = sb.Chart.from_scxml(V3, name="order")
    sender = sb.Host([v1, v3], store=sb.SQLiteStore(host.store.path))     # another connection
    real_commit = host.store.commit
    raced = []

    def commit_after_a_racing_send(commit):
        if not raced:                       # between the migration's load and its commit
            raced.append(sender.send("o1", "Nudge"))
        return real_commit(commit)
    host.store.commit = commit_after_a_racing_send
    res = host.migrate("o1", v3)
    assert res.outcome == "moved" and res.reason == "compatible"
    rec = host.store.load("o1")
    assert read_header(rec.blob).identity == v3.identity
    assert host.get("o1").macrostep == raced[0].macrostep                    # the racing event is in it
    assert host.metrics["conflicts"] == 1


def test_diff_notes_a_removed_timeout_or_invoke_and_only_those_positions_stay():
    """diff() said "compatible" with no word of a state that lost its <sb:timeout> or an
    <invoke>, and then the positions holding one failed to move. It now names them; the
    verdict stays, since the other positions move."""
    ns = 'xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound" version="1.0" datamodel="python"'
    old = sb.Chart.from_scxml(f"""<scxml {ns} name="c" initial="Idle">
      <state id="Idle"><transition event="Go" target="Wait"/></state>
      <state id="Wait"><sb:timeout event="Late" after="1h"/><transition event="Late" target="Idle"/></state>
    </scxml>""")
    new = sb.Chart.from_scxml(f"""<scxml {ns} name="c" initial="Idle">
      <state id="Idle"><transition event="Go" target="Wait"/></state>
      <state id="Wait"><transition event="Back" target="Idle"/></state>
    </scxml>""")
    d = sb.diff(old, new)
    assert d.kind == "compatible"
    assert any("no longer declares <sb:timeout> 'Late'" in r for r in d.reasons)
    interp = sb.Interpreter(old)
    idle, _ = interp.start("i")
    waiting, _ = interp.drive(idle, "Go")
    assert sb.Position.import_(idle.export(), new).configuration == {"Idle"}
    with pytest.raises(MigrationError, match="Late"):
        sb.Position.import_(waiting.export(), new)
