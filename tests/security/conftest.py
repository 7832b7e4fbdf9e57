"""The hostile-chart harness: each chart runs in a child process (``_sandbox.py``).

The child has ``RLIMIT_AS`` of 3 GiB and reports the CPU it used (under 20 s, or the test
fails), and the parent a wall-clock timeout, so an attack that gets through fails its test
(a violation, a foreign exception, a crash, too much CPU, a hang) and never hangs or swamps
the test run. Every run puts a secret file next to (outside) the chart's
base directory; :meth:`Outcome.assert_contained` checks it never surfaced.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .helpers import SECRET

SANDBOX = Path(__file__).with_name("_sandbox.py")
#: CPU seconds a hostile chart may cost its process (issue 10: "no process exceeds 20 s").
CPU_LIMIT_S = 20
#: Wall-clock guard against a hang: generous, because a loaded machine stretches wall time.
TIMEOUT_S = 90


@dataclass
class Outcome:
    """What the child reported."""

    raw: dict[str, Any]
    stdout: str
    stderr: str
    logs: list[Any] = field(default_factory=list)

    @property
    def error(self) -> dict[str, Any] | None:
        return self.raw.get("error")

    @property
    def messages(self) -> list[str]:
        """The ``error.*`` messages the chart logged (charts log them with label ``error``)."""
        return [str(v) for _, label, v in self.logs if label == "error"]

    def assert_contained(self) -> None:
        """No audit violation, no secret anywhere, and any exception is a statebound one."""
        assert self.raw["violations"] == [], self.raw["violations"]
        assert self.raw["cpu_s"] < CPU_LIMIT_S, f"the chart cost {self.raw['cpu_s']:.1f} s of CPU"
        assert SECRET not in self.stdout and SECRET not in self.stderr, "the secret leaked"
        if self.error is not None:
            assert self.error["statebound"], f"a foreign exception escaped:\n{self.error['traceback']}"

    def assert_refused_at_load(self, *fragments: str) -> None:
        self.assert_contained()
        assert self.error is not None and self.raw["phase"] == "load", self.raw
        assert self.error["type"] in ("ChartPolicyError", "ChartValidationError", "ChartSyntaxError",
                                      "ChartError"), self.error
        for f in fragments:
            assert f in self.error["message"], self.error["message"]

    def assert_error_execution(self, *fragments: str) -> None:
        """The run completed and the chart saw ``error.execution`` with these words in it."""
        self.assert_contained()
        assert self.error is None, self.error
        assert self.messages, f"no error was logged: {self.raw}"
        for f in fragments:
            assert any(f in m for m in self.messages), (f, self.messages)


@pytest.fixture
def hostile(tmp_path: Path):
    """``hostile(files, chart="main.scxml", trust="untrusted", events=(), ...) -> Outcome``.

    ``files`` maps names (relative to the base directory) to text; ``None`` as trust
    omits the keyword (the default, trusted). ``stacks[i]``: how many frames deep in its own
    stack the caller sends the ``i``-th event.
    """
    base = tmp_path / "base"
    base.mkdir()
    (tmp_path / "secret.txt").write_text(SECRET)

    def run(files: dict[str, str], *, chart: str = "main.scxml", trust: str | None = "untrusted",
            events: list[tuple[str, Any]] = (), load: str = "file", host: dict[str, Any] | None = None,
            ecma_limits: dict[str, Any] | None = None, fire: int = 0, data: Any = None,
            allow_dirs: list[str] | None = None, prepare: Any = None, stacks: list[int] | None = None) -> Outcome:
        for name, text in files.items():
            p = base / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        if prepare is not None:
            prepare(base)
        spec = {"base": str(base), "chart": chart, "trust": trust, "events": list(events), "load": load,
                "host": host or {}, "ecma_limits": ecma_limits, "fire": fire, "data": data,
                "allow_dirs": allow_dirs, "stacks": stacks}
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(spec))
        try:
            proc = subprocess.run([sys.executable, str(SANDBOX), str(spec_path)], capture_output=True,
                                  text=True, timeout=TIMEOUT_S, cwd=tmp_path)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"the hostile chart ran past {TIMEOUT_S}s:\n{exc.stderr}")
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            pytest.fail(f"the sandbox process died (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        raw = json.loads(lines[-1])
        return Outcome(raw, proc.stdout, proc.stderr, raw.get("logs", []))

    run.base = base  # type: ignore[attr-defined]
    run.secret = tmp_path / "secret.txt"  # type: ignore[attr-defined]
    return run
