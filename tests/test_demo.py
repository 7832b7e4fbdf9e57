"""`make demo` stays working: examples/order/demo.py end to end (about 5 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_order_demo_runs_ok():
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "order" / "demo.py")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "demo OK" in p.stdout
    assert "Traceback" not in p.stderr
