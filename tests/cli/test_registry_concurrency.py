"""The CLI's chart registry (``cli/registry.py``) when several processes open one SQLite file
at once: a new file, a file from before charts had a trust level, and two revisions of one
chart remembered at the same moment. Driver errors come out as ``StoreUnavailable``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

import statebound as sb
from statebound.cli import main, registry
from statebound.cli.registry import SQLiteChartRegistry

CHART = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" name="rev" initial="s" datamodel="python">
  <datamodel><data id="v" expr="{v}"/></datamodel><state id="s"/>
</scxml>'''

OLD_TABLE = ("CREATE TABLE cli_chart_revisions (name TEXT NOT NULL, identity TEXT NOT NULL, path TEXT, "
             "source BLOB NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (name, identity))")


def _revision(v):
    text = CHART.format(v=v)
    return sb.Chart.from_scxml(text), text.encode()


class _Rows(list):
    """Rows already read, as a cursor hands them out."""

    def fetchone(self):
        return self[0] if self else None


class _Hooked:
    """A connection that runs ``hook`` once, right after the first statement starting with
    ``prefix`` has read its rows: what another process could do at that very moment."""

    def __init__(self, con, prefix, hook):
        self.con, self.prefix, self.hook = con, prefix, hook

    def execute(self, sql, *args):
        cur = self.con.execute(sql, *args)
        if self.hook is not None and sql.startswith(self.prefix):
            rows = _Rows(cur)
            hook, self.hook = self.hook, None
            hook()
            return rows
        return cur

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_file_from_before_trust_gets_the_column_once_when_processes_race(tmp_path, monkeypatch):
    """Two processes open an old file; both see the column missing. The second to add it used
    to fail with "duplicate column name: trust"; it now checks again under the write lock."""
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    chart, source = _revision(1)
    con.execute(OLD_TABLE)
    con.execute("INSERT INTO cli_chart_revisions VALUES (?, ?, NULL, ?, 1)", (chart.name, chart.identity, source))
    con.commit()
    con.close()
    real_connect = sqlite3.connect
    other = []

    def racing_connect(*args, **kwargs):
        monkeypatch.setattr(registry.sqlite3, "connect", real_connect)   # the other process connects plainly
        return _Hooked(real_connect(*args, **kwargs), "PRAGMA table_info",
                       lambda: other.append(SQLiteChartRegistry(str(db))))   # it adds the column meanwhile
    monkeypatch.setattr(registry.sqlite3, "connect", racing_connect)
    reg = SQLiteChartRegistry(str(db))
    monkeypatch.undo()
    assert len(other) == 1
    try:
        assert [c.identity for c in reg.load_all()] == [chart.identity]   # an old row: trusted
        columns = [row[1] for row in reg.db.execute("PRAGMA table_info(cli_chart_revisions)")]
        assert columns.count("trust") == 1
    finally:
        reg.close()
        other[0].close()


def test_two_revisions_remembered_at_once_get_distinct_sequence_numbers(tmp_path):
    """``remember`` read max(seq) and then inserted: another process remembering in between
    took the same number, and which revision was the latest depended on the row order."""
    db = str(tmp_path / "r.db")
    first, second = SQLiteChartRegistry(db), SQLiteChartRegistry(db)
    second.db.execute("PRAGMA busy_timeout = 50")   # it must not wait 30 s for the test's lock
    (a, a_src), (b, b_src) = _revision(1), _revision(2)
    outcome = []

    def meanwhile():
        try:
            second.remember(b, "b.scxml", b_src)
            outcome.append("interleaved")
        except sb.StoreUnavailable:   # it waited for the lock `first` holds, then gave up
            outcome.append("waited")
    first.db = _Hooked(first.db, "SELECT coalesce(max(seq)", meanwhile)
    try:
        first.remember(a, "a.scxml", a_src)
        if outcome == ["waited"]:
            second.remember(b, "b.scxml", b_src)
        seqs = dict(second.db.execute("SELECT identity, seq FROM cli_chart_revisions").fetchall())
        assert len(set(seqs.values())) == 2, seqs
        assert [c.identity for c in second.load_all()] == [a.identity, b.identity]   # b, remembered last, is latest
    finally:
        first.close()
        second.close()


def test_registry_errors_are_store_errors(tmp_path, capsys):
    """A lock held past the store's timeout is ``StoreUnavailable`` with the store's message,
    never an ``sqlite3.OperationalError``; the CLI prints it as one clear line."""
    db = tmp_path / "l.db"
    reg = SQLiteChartRegistry(str(db))
    reg.db.execute("PRAGMA busy_timeout = 50")
    path = tmp_path / "rev.scxml"
    path.write_text(CHART.format(v=1))
    chart, source = _revision(1)
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sb.StoreUnavailable, match="locked"):
            reg.remember(chart, str(path), source)
        code = main(["--store", f"sqlite:///{db}?timeout_s=0.05", "start", str(path), "r1"])
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("statebound: error: SQLite database is locked"), err
        assert "OperationalError" not in err and len(err.splitlines()) == 1
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        reg.close()
    with pytest.raises(sb.StoreError):
        SQLiteChartRegistry(str(tmp_path))   # a directory: cannot be opened as a database


_CHILD = """
import os, sys, time
from statebound.cli import main
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
sys.exit(main(["--store", sys.argv[2], "start", sys.argv[3], sys.argv[4]]))
"""


def test_processes_starting_on_a_new_file_at_once_all_succeed(tmp_path):
    """Processes that open a brand-new file together used to fail now and then with
    "duplicate column name: trust"; those remembering two revisions of one chart could take
    one sequence number. A few rounds, each process released at the same moment."""
    charts = []
    for v in (1, 2):
        path = tmp_path / f"rev{v}.scxml"
        path.write_text(CHART.format(v=v))
        charts.append(str(path))
    for round_ in range(4):
        db = tmp_path / f"new{round_}.db"
        go = tmp_path / f"go{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(go), str(db), charts[k % 2], f"i{k}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(6)]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            go.touch()
            results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.communicate()
        assert [rc for rc, _ in results] == [0] * 6, results
        con = sqlite3.connect(db)
        seqs = [seq for (seq,) in con.execute("SELECT seq FROM cli_chart_revisions")]
        assert con.execute("SELECT count(*) FROM positions").fetchone()[0] == 6
        con.close()
        assert len(seqs) == 2 and len(set(seqs)) == 2, seqs
