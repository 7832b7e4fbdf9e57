"""``Host(find_revision=...)``: a long-running host meets a blob of a revision registered
after it started (a migration from another process)."""

from __future__ import annotations

import pytest

import statebound as sb

V1 = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="o" initial="a">
  <state id="a">{extra}<transition event="go" target="b"/></state><final id="b"/></scxml>"""
OLD = sb.Chart.from_scxml(V1.format(extra=""))
NEW = sb.Chart.from_scxml(V1.format(extra='<transition event="refund" target="b"/>'))


def _moved(store):
    mover = sb.Host([OLD, NEW], store=store)
    mover.start(OLD, "i")
    mover.migrate("i", NEW)


def test_a_revision_found_on_demand_drives_the_moved_instance(store):
    _moved(store)
    asked = []

    def find(name, identity):
        asked.append((name, identity))
        return NEW if identity == NEW.identity else None
    host = sb.Host([OLD], store=store, find_revision=find)
    assert host.send("i", "refund").configuration == {"b"}
    assert asked == [("o", NEW.identity)]
    assert host.chart("o") is OLD                     # new instances start on what it was given
    host.start("o", "j")
    assert host.store.load("j").blob != b"" and host.get("j").chart is OLD


@pytest.mark.parametrize("find", [None, lambda name, identity: None, lambda name, identity: OLD,
                                  lambda name, identity: "not a chart"])
def test_without_the_revision_the_load_still_fails_loudly(store, find):
    _moved(store)
    host = sb.Host([OLD], store=store, find_revision=find)
    with pytest.raises(sb.ChartIdentityMismatch):
        host.send("i", "refund")
    assert host.chart("o") is OLD


def test_revisions_lists_every_revision_and_charts_the_latest():
    old_timeout = sb.Chart.from_scxml(V1.format(extra='<sb:timeout xmlns:sb="urn:statebound" event="Old" after="1h"/>'))
    host = sb.Host([old_timeout, OLD, NEW])
    assert host.revisions("o") == [old_timeout, OLD, NEW]
    assert host.charts["o"] is NEW and host.revisions("none") == []
    host.register(OLD)                                   # registered again: the latest again, listed once
    assert host.charts["o"] is OLD and host.revisions("o") == [old_timeout, OLD, NEW]
