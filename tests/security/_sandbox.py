"""Run one hostile chart in this process, under an audit hook, and print what happened as JSON.

Started by ``conftest.py`` in a child process with ``RLIMIT_AS`` set and a timeout, so a
regression (an escape, a hang, a memory blow-up) fails the test instead of the test run.

The audit hook is installed only after every module the run needs has been imported and a
benign chart has run on each datamodel, so whatever it sees afterwards is the hostile
chart's doing. It records, and blocks by raising:

* ``open`` of any path outside the chart's base directory, and any open for writing;
* process, socket, ctypes and file-system-changing events (``os.system``, ``subprocess.Popen``,
  ``os.exec``, ``socket.connect``, ``ctypes.dlopen``, ``os.remove``...);
* an import of ``os``, ``subprocess``, ``ctypes``, ``socket`` and their kin, fresh or cached.

Usage: ``python _sandbox.py SPEC.json``; the result is the last line of stdout.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
import traceback

LIMIT_AS = 3 * 1024 ** 3

_BLOCKED_PREFIXES = (
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "os.putenv", "os.unsetenv", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
    "os.chmod", "os.chown", "os.truncate", "os.utime", "os.listdir", "os.scandir", "os.chdir", "os.startfile",
    "subprocess.", "socket.", "ctypes.", "shutil.", "pty.", "webbrowser.", "urllib.", "http.", "sqlite3.",
    "code.__new__", "function.__new__", "object.__getattr__", "object.__setattr__", "object.__delattr__",
    "sys._current_frames", "sys.setprofile", "builtins.input", "cpython.run_", "marshal.", "pickle.",
    "mmap.", "resource.setrlimit", "gc.get_referrers", "gc.get_objects",
)
_BLOCKED_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "_posixsubprocess", "ctypes", "_ctypes", "socket", "_socket", "pty",
    "shutil", "multiprocessing", "importlib", "io", "_io", "pathlib", "signal", "resource", "gc", "inspect",
})


class Blocked(Exception):
    """Raised by the hook so the operation never happens."""


def main(spec_path: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))
    with open(spec_path) as f:
        spec = json.load(f)
    base = os.path.realpath(spec["base"])

    import statebound as sb
    from statebound.datamodel import ecmascript
    warm_up(sb)
    if spec.get("ecma_limits"):
        ecmascript.set_default_limits(ecmascript.Limits(**spec["ecma_limits"]))

    violations: list[str] = []
    installed = [False]

    def hook(event: str, args: tuple) -> None:
        if not installed[0]:
            return
        bad = None
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
            where = os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else None
            if writes or where is None or not (where == base or where.startswith(base + os.sep)):
                bad = f"open {path!r} mode={mode!r} flags={flags!r}"
        elif event == "import" and args and str(args[0]).split(".")[0] in _BLOCKED_MODULES:
            bad = f"import {args[0]}"
        elif event == "object.__getattr__" and len(args) > 1 and args[1] in ("f_code", "tb_frame"):
            pass  # logging and traceback read their callers' frames (chart code cannot: dunder-free names)
        elif event.startswith(_BLOCKED_PREFIXES):
            bad = f"{event} {str(args)[:200]}"
        if bad is not None:
            violations.append(bad)
            raise Blocked(bad)

    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if installed[0] and level == 0 and name.split(".")[0] in _BLOCKED_MODULES:
            violations.append(f"import {name} (cached)")
            raise Blocked(f"import {name}")
        return real_import(name, globals, locals, fromlist, level)

    sys.addaudithook(hook)
    builtins.__import__ = guarded_import
    out: dict = {"phase": "load", "error": None, "logs": []}
    installed[0] = True
    try:
        run(sb, spec, base, out)
    except BaseException as exc:  # everything is reported to the parent
        installed[0] = False  # formatting the traceback reads frames itself
        out["error"] = {"type": type(exc).__name__, "message": str(exc)[:20000], "length": len(str(exc)),
                        "statebound": isinstance(exc, sb.StateboundError),
                        "traceback": traceback.format_exc()[-3000:]}
    finally:
        installed[0] = False
        builtins.__import__ = real_import
    out["violations"] = violations
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = usage.ru_utime + usage.ru_stime
    sys.stdout.write("\n" + json.dumps(out, default=repr) + "\n")


def warm_up(sb) -> None:
    """Import lazily-loaded modules and run each datamodel once, before the hook is armed."""
    for dm, expr in (("python", "1 + 1"), ("ecmascript", "1 + 1"), ("null", None)):
        data = f'<datamodel><data id="x" expr="{expr}"/></datamodel>' if expr else ""
        text = (f'<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="{dm}">{data}'
                '<state id="a"><transition event="go" target="b"/></state><final id="b"/></scxml>')
        chart = sb.Chart.from_scxml(text, name=f"warm-{dm}")
        host = sb.Host([chart], clock=sb.ManualClock(now_ms=0), on_log=lambda *a: None)
        host.start(chart, "warm")
        host.send("warm", "go")
        pos = host.get("warm")
        sb.Position.from_bytes(pos.to_bytes(), chart)
    try:
        sb.Chart.from_scxml("<nope/>")
    except sb.ChartError:
        pass


def _at_depth(frames: int, call):
    return call() if frames <= 0 else _at_depth(frames - 1, call)


def run(sb, spec: dict, base: str, out: dict) -> None:
    kw = {} if spec.get("trust") is None else {"trust": spec["trust"]}
    if spec.get("allow_dirs"):
        kw["allow_dirs"] = spec["allow_dirs"]
    path = os.path.join(base, spec.get("chart", "main.scxml"))
    if spec.get("load", "file") == "file":
        chart = sb.Chart.from_file(path, **kw)
    else:
        with open(path, encoding="utf-8") as f:  # inside the base directory: allowed
            text = f.read()
        chart = sb.Chart.from_scxml(text, name="main", base_path=base, **kw)
    logs = out["logs"]
    host_kw = spec.get("host") or {}
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host([chart], clock=clock, on_log=lambda iid, label, value: logs.append([iid, label, value]),
                   **host_kw)
    out["phase"] = "start"
    host.start(chart, "main", data=spec.get("data"))
    stacks = spec.get("stacks") or []
    for i, (name, data) in enumerate(spec.get("events", [])):
        out["phase"] = f"send {name}"
        if host.get("main").status != "running":
            break
        # a caller deep in its own stack (a web framework, a handler chain): what an earlier,
        # shallower call stored must still load there
        _at_depth(stacks[i] if i < len(stacks) else 0, lambda n=name, d=data: host.send("main", n, d))
    for _ in range(spec.get("fire", 0)):
        due = host.next_due()
        if due is None:
            break
        out["phase"] = "fire"
        clock.set(max(due, clock.now_ms()))
        host.fire_due(limit=100)
    out["phase"] = "done"
    pos = host.get("main")
    out["status"] = pos.status
    out["configuration"] = sorted(pos.configuration)
    out["datamodel"] = dict(pos.datamodel)
    out["metrics"] = dict(host.metrics)
    out["blob"] = len(pos.to_bytes())


if __name__ == "__main__":
    main(sys.argv[1])
