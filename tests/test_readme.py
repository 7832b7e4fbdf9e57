"""The README's Python examples run as written (in a scratch directory), so they cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

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
