"""The three named-timeout stories of ``docs/timeouts.md``, end to end.

Run it with ``python examples/timeouts/stories.py``. Each story uses its own SQLite
file in a temporary directory and a :class:`statebound.ManualClock`, so an hour passes
in no time at all. ``host.fire_due()`` is what a sweeper does on each pass.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import statebound as sb

HERE = Path(__file__).resolve().parent
EPOCH = 1_767_225_600_000          # 2026-01-01T00:00:00Z in epoch ms
HOUR = 3_600_000


def new_host(chart: sb.Chart, db: Path, now_ms: int) -> tuple[sb.Host, sb.ManualClock]:
    clock = sb.ManualClock(now_ms=now_ms)
    return sb.Host(charts=[chart], store=sb.SQLiteStore(db), clock=clock), clock


def timers(host: sb.Host, instance_id: str) -> list[tuple[int, str | None, int]]:
    """``(ordinal, name, due_at_ms)`` of each pending row."""
    return [(r.ordinal, r.name, r.due_at_ms) for r in host.pending_timers(instance_id)]


def order_story(workdir: Path) -> None:
    """Story 1: PaymentTimeout fires and cancels the order; Complete first leaves no row."""
    chart = sb.Chart.from_file(HERE / "order.scxml")
    host, clock = new_host(chart, workdir / "order.db", EPOCH)

    host.start(chart, "order-1")
    host.send("order-1", "StartPayment")
    print("order-1 timers:", timers(host, "order-1"))        # [(1, 'PaymentTimeout', EPOCH + 1h)]
    clock.advance(HOUR)
    print("fired:", [r.outcome for r in host.fire_due()])    # ['fired']
    pos = host.get("order-1")
    print("order-1:", sorted(pos.configuration), pos.status)  # ['Cancelled'] done
    assert pos.configuration == {"Cancelled"} and host.pending_timers("order-1") == []

    host.start(chart, "order-2")
    host.send("order-2", "StartPayment")
    host.send("order-2", "Complete")                         # exiting Started cancels the row
    print("order-2:", sorted(host.get("order-2").configuration), timers(host, "order-2"))
    assert host.get("order-2").configuration == {"Done"} and host.pending_timers("order-2") == []


def campaign_story(workdir: Path) -> None:
    """Story 2: DailyCheck re-arms itself every 3 s; EndCycle at 9 s is never moved."""
    chart = sb.Chart.from_file(HERE / "campaign.scxml")
    print("timeouts on Live:", [(t.name, t.kind, t.duration_ms) for t in chart.timeouts_for("Live")])
    host, clock = new_host(chart, workdir / "campaign.db", 0)
    host.start(chart, "c-1")
    host.send("c-1", "GoLive")
    end_cycle = [t for t in timers(host, "c-1") if t[1] == "EndCycle"]
    for now in (3_000, 6_000):
        clock.set(now)
        results = host.fire_due()
        print(f"t={now}ms fired {[r.key for r in results]} -> {timers(host, 'c-1')}")
        assert [t for t in timers(host, "c-1") if t[1] == "EndCycle"] == end_cycle
    # At 9 s both EndCycle (armed at 0 s) and the DailyCheck armed at 6 s are due. Rows fire
    # in (due, ordinal) order, so EndCycle goes first; leaving Live deletes the DailyCheck
    # row, and the sweeper's claim on it comes back as "skipped".
    clock.set(9_000)
    results = host.fire_due()
    print("t=9000ms", [(r.key, r.outcome) for r in results])
    pos = host.get("c-1")
    print("c-1:", sorted(pos.configuration), "checks =", pos.datamodel["checks"], timers(host, "c-1"))
    assert pos.configuration == {"Ended"} and host.pending_timers("c-1") == []


def deadline_story(workdir: Path) -> None:
    """Story 3: Edit moves Watch only when the instant changes; Beat never moves."""
    chart = sb.Chart.from_file(HERE / "deadline.scxml")
    host, clock = new_host(chart, workdir / "deadline.db", EPOCH)
    near, far = EPOCH + 5_000, EPOCH + 100_000
    host.start(chart, "stay-due", data={"due_ms": far})

    def row(name: str) -> tuple[int, int]:
        r = next(r for r in host.pending_timers("stay-due") if r.name == name)
        return r.ordinal, r.due_at_ms

    beat_before = row("Beat")
    host.send("stay-due", "Edit", {"due": near})
    moved = row("Watch")
    host.send("stay-due", "Edit", {"due": near})
    same = row("Watch")
    beat_after = row("Beat")
    print("Watch moved to", moved, "then", same, "| Beat", beat_before, "->", beat_after)
    assert moved[1] == near and same == moved and beat_after == beat_before

    clock.set(near)
    host.fire_due()
    print("stay-due:", sorted(host.get("stay-due").configuration), timers(host, "stay-due"))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="statebound-timeouts-") as tmp:
        for story in (order_story, campaign_story, deadline_story):
            print(f"--- {story.__doc__.splitlines()[0]}")
            story(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
