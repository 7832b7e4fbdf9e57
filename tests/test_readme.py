"""The README's examples run as written (in a scratch directory), so they cannot rot: the
Python blocks, the SQLite command block and the make targets it names. The DynamoDB command
block runs against a moto server in tests/cli/test_cli.py::test_readme_dynamodb_commands_run_as_written_against_moto."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import statebound as sb
from statebound.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_examples_run(tmp_path, monkeypatch, capsys):
    blocks = _python_blocks()
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    # the blocks build on each other (the host example reuses the chart of the first)
    source = "\n".join(blocks).replace('"examples/', f'"{ROOT}/examples/')
    exec(compile(source, "README.md", "exec"), ns)
    out = capsys.readouterr().out
    assert "frozenset({'Started'})" in out and "SendDelayed(" in out
    assert ns["host"].get("order-1").configuration == {"Cancelled"}
    assert ns["shop"].get("order-2").configuration == {"Done"}
    assert out.count("receipt order-2:") == 1 and ns["shop"].metrics["duplicates"] == 1


def test_readme_sqlite_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """The command block on the embedded store, line by line through the CLI's ``main``; the
    blob ``inspect`` reads is the one the block's instance has, saved with ``to_bytes()``."""
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
               if "--store orders.db" in b]
    monkeypatch.chdir(tmp_path)
    for name in ("STATEBOUND_STORE", "STATEBOUND_DB", "STATEBOUND_HISTORY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    outputs = {}
    for line in filter(str.strip, block.splitlines()):
        argv = shlex.split(line, comments=True)
        assert argv[0] == "statebound", line
        if argv[1] == "inspect":
            host = sb.Host([sb.Chart.from_file(ROOT / "examples" / "order" / "order.scxml")], sb.SQLiteStore("orders.db"))
            (tmp_path / "blob.bin").write_bytes(host.get("order-1").to_bytes())
        assert cli(["--json", *argv[1:]]) == 0, (line, capsys.readouterr().err)
        command = next(a for a in argv[1:] if not a.startswith("-") and a != "orders.db")
        outputs[command] = json.loads(capsys.readouterr().out)
    assert outputs["send"]["configuration"] == ["Started"]
    assert [t["event"] for t in outputs["timers"]] == ["PaymentTimeout"]
    assert outputs["sweep"]["fired"] == 0 and outputs["validate"]["valid"] is True
    assert outputs["inspect"]["position"]["configuration"] == ["Started"]


def test_readme_make_targets_exist():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make (\w+)`|^make (\w+)", (ROOT / "README.md").read_text(), re.M))
    named_targets = {a or b for a, b in named}
    assert {"demo", "test", "bench", "soak"} <= named_targets <= targets
