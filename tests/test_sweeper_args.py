"""``Sweeper`` refuses settings it cannot run with, as ``InvalidArgument``, before it sweeps.

``nan`` slips past a plain ``<= 0`` check (every comparison with it is false) and made the
sweeper busy-loop, one write transaction per turn; ``inf`` and huge values overflowed in a
sleep or a lease's expiry. ``statebound sweep`` maps the refusal to its usage exit code.
"""

from __future__ import annotations

import math

import pytest

import statebound as sb
from statebound.cli import main
from statebound.host.sweeper import MAX_BATCH, MAX_SECONDS, MAX_WORKERS

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="idle" initial="a">
  <state id="a"/>
</scxml>"""


@pytest.fixture
def host():
    return sb.Host([sb.Chart.from_scxml(CHART)], store=sb.MemoryStore())


@pytest.mark.parametrize("kw", [
    {"interval_s": math.nan}, {"interval_s": math.inf}, {"interval_s": -math.inf}, {"interval_s": 1e300},
    {"interval_s": MAX_SECONDS + 1}, {"interval_s": 0}, {"interval_s": -1}, {"interval_s": "1"},
    {"interval_s": True},
    {"lease_s": math.nan}, {"lease_s": math.inf}, {"lease_s": 1e300}, {"lease_s": 0}, {"lease_s": None},
    {"jitter": math.nan}, {"jitter": math.inf}, {"jitter": -0.1}, {"jitter": 1.5}, {"jitter": "0.2"},
    {"batch": 0}, {"batch": 1.5}, {"batch": math.nan}, {"batch": MAX_BATCH + 1}, {"batch": 10**30},
    {"batch": True}, {"batch": "10"},
    {"workers": 0}, {"workers": 2.0}, {"workers": math.inf}, {"workers": MAX_WORKERS + 1},
])
def test_unusable_settings_are_refused(host, kw):
    with pytest.raises(sb.InvalidArgument) as err:
        sb.Sweeper(host, **kw)
    name = next(iter(kw))
    assert name in str(err.value)                       # the message says which argument
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)


@pytest.mark.parametrize("kw", [
    {"interval_s": MAX_SECONDS}, {"interval_s": 0.001}, {"interval_s": 2}, {"lease_s": MAX_SECONDS},
    {"jitter": 0}, {"jitter": 1}, {"batch": 1}, {"batch": MAX_BATCH}, {"workers": MAX_WORKERS},
])
def test_settings_at_the_limits_are_taken(host, kw):
    sweeper = sb.Sweeper(host, **kw)
    assert sweeper.run_once().total == 0
    sweeper.close()


@pytest.mark.parametrize("argv", [["--interval", "nan"], ["--interval", "inf"], ["--interval", "-1"],
                                  ["--interval", "1e300"], ["--batch", "0"], ["--batch", str(10**30)]])
def test_sweep_command_refuses_them_with_a_usage_error(argv, tmp_path, capsys):
    code = main(["--db", str(tmp_path / "s.db"), "sweep", "--once", *argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and err.startswith("statebound: error: Sweeper ") and err.count("\n") == 1


@pytest.mark.parametrize("lease_s", [0.0001, 0.0009])
def test_a_lease_shorter_than_a_millisecond_is_refused(lease_s):
    """It became a 0 ms lease, which lapses as it is taken: another sweeper could claim, and
    hand over, the same outbox row at once."""
    host = sb.Host([], store=sb.MemoryStore())
    with pytest.raises(sb.InvalidArgument, match="lease_s"):
        sb.Sweeper(host, lease_s=lease_s)
    assert sb.Sweeper(host, lease_s=0.001).lease_ms == 1


def test_run_until_idle_stops_between_sweeps_when_asked():
    """The CLI's sweep --until-idle had no graceful stop: a signal interrupted a batch."""
    chart = sb.Chart.from_scxml(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="t" '
        'initial="s"><state id="s"><onentry><send event="tick" delay="1ms"/></onentry>'
        '<transition event="tick"/></state></scxml>')
    clock = sb.ManualClock(0)
    host = sb.Host([chart], store=sb.MemoryStore(), clock=clock)
    for i in range(5):
        host.start("t", f"t{i}")
    clock.advance(10)
    asked: list[int] = []

    def stop() -> bool:   # asked before every sweep: true on the third ask
        asked.append(1)
        return len(asked) > 2
    report = sb.Sweeper(host, batch=2).run_until_idle(stop=stop)
    assert report.fired == 4 and len(asked) == 3      # two sweeps of two, then the stop
    assert sb.Sweeper(host, batch=2).run_until_idle().fired == 1


def test_run_until_idle_goes_on_after_a_sweep_that_only_parked_rows():
    """Rows claimed just before their instance was suspended (by another thread or
    process) are parked when the sweep fires them. Not counted, a sweep of only those
    reported a total of 0, and run_until_idle stopped with other rows still due."""
    chart = sb.Chart.from_scxml("""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" name="t"
      datamodel="python" initial="a"><datamodel><data id="d" expr="1"/></datamodel><state id="a"><onentry>
      <foreach array="list(range(3))" item="k"><send event="go" delayexpr="str(d) + 's'"/></foreach>
      </onentry><transition event="go"/></state></scxml>""")
    clock = sb.ManualClock(0)
    host = sb.Host([chart], clock=clock)
    host.start("t", "early", {"d": 1})
    host.start("t", "late", {"d": 2})
    clock.advance(2_000)
    claim_due = host.store.claim_due

    def claim_then_suspend(*args, **kwargs):
        rows = claim_due(*args, **kwargs)
        if rows and rows[0].instance_id == "early":
            host.suspend("early")              # an operator, between this claim and its fires
        return rows
    host.store.claim_due = claim_then_suspend
    report = sb.Sweeper(host, batch=3).run_until_idle()
    assert host.pending_timers("late") == []            # swept to the end
    assert report.parked == 3 and report.fired == 3
    assert [r.state for r in host.pending_timers("early")] == ["suspended"] * 3
