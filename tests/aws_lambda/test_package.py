"""examples/lambda/package.py: the deployment package has statebound from this checkout
(installed by path, so no index can substitute a higher version), no second botocore, and
a fully pinned set of third-party wheels."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .harness import LAMBDA_DIR


@pytest.fixture(scope="module")
def package():
    spec = importlib.util.spec_from_file_location("lambda_package", LAMBDA_DIR / "package.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requirements_pin_a_closed_set_without_the_runtimes_packages(package):
    pins = {canonicalize_name(line.split("==")[0]): line.split("==")[1]
            for line in package.pinned_requirements(LAMBDA_DIR / "requirements.txt")}
    assert not set(pins) & {canonicalize_name(n) for n in (*package.RUNTIME_PROVIDED, "statebound")}
    lambda_python = {"python_version": package.PYTHON, "python_full_version": package.PYTHON + ".0",
                     "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64",
                     "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}

    def needs(dist: str) -> set[str]:
        out = set()
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(lambda_python):
                out.add(canonicalize_name(req.name))
        return out

    # statebound's own run-time dependencies (no extras: boto3 comes from the runtime)...
    assert needs("statebound") <= set(pins)
    # ...and what the handlers import, with everything each pinned package needs in turn
    assert "aws-lambda-powertools" in pins
    for dist in pins:
        assert needs(dist) <= set(pins), dist


@pytest.mark.parametrize("line", ["statebound[aws]", "msgpack>=1.0", "boto3==1.40.0", "statebound==0.1.0",
                                  "msgpack", "botocore==1.40.0"])
def test_a_loose_or_forbidden_requirement_is_refused(package, tmp_path, line):
    path = tmp_path / "requirements.txt"
    path.write_text(f"# comment\n{line}\n")
    with pytest.raises(package.PackagingError):
        package.pinned_requirements(path)


def test_the_package_holds_the_local_build_and_no_botocore(package, tmp_path):
    """The whole script, offline apart from the wheel build: the third-party pins are
    replaced by an empty file (their installation is pip's own --no-deps --target)."""
    empty = tmp_path / "none.txt"
    empty.write_text("")
    out = tmp_path / "build"
    assert package.main(["--out", str(out), "--requirements", str(empty), "--zip", str(tmp_path / "fn.zip"),
                         "--compile-with", "none"]) == 0
    found = package.verify(out)
    assert found["source"].startswith("statebound-") and found["source"].endswith(".whl")
    assert found["statebound"] == metadata.version("statebound")
    assert {p.name for p in out.iterdir()} >= {*package.HANDLER_FILES, "charts", "statebound"}
    assert sorted(p.relative_to(out).as_posix() for p in (out / "charts").rglob("*.scxml")) == [
        "charts/order/v1.scxml", "charts/order/v2.scxml", "charts/order/v3.scxml"]
    assert not any((out / name).exists() for name in package.RUNTIME_PROVIDED)
    assert not (out / "bin").exists() and not list(out.rglob("*.pyc"))
    assert (out / "statebound" / "jsonio.py").read_text() == (
        Path(__file__).resolve().parents[2] / "src" / "statebound" / "jsonio.py").read_text()


def _fake_install(out: Path, *, direct_url: str | None) -> None:
    info = out / "statebound-9.9.9.dist-info"
    info.mkdir(parents=True)
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": direct_url, "archive_info": {}}))
    for name in ("app.py", "chart_revisions.py", "handler.py", "sqs_events.py", "sweeper.py", "telemetry.py", "wake.py"):
        (out / name).write_text("")


def test_verify_refuses_a_second_botocore(package, tmp_path):
    _fake_install(tmp_path, direct_url="file:///tmp/statebound-9.9.9-py3-none-any.whl")
    package.verify(tmp_path)
    (tmp_path / "botocore").mkdir()
    with pytest.raises(package.PackagingError, match="botocore"):
        package.verify(tmp_path)


def test_verify_refuses_statebound_from_an_index(package, tmp_path):
    _fake_install(tmp_path, direct_url=None)   # pip writes direct_url.json only for a path or URL install
    with pytest.raises(package.PackagingError, match="index"):
        package.verify(tmp_path)


def test_verify_refuses_a_wheel_other_than_the_local_build(package, tmp_path):
    _fake_install(tmp_path, direct_url="file:///elsewhere/statebound-9.9.9-py3-none-any.whl")
    with pytest.raises(package.PackagingError, match="not from the local build"):
        package.verify(tmp_path, Path("/tmp/build/statebound-0.1.0-py3-none-any.whl"))


HERE_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
#: counts the modules compiled from source under a directory while importing the host and the DynamoDB store
COLD_IMPORT = """
import sys
root = sys.argv[1]
compiled = []
sys.addaudithook(lambda ev, args: ev == "compile" and isinstance(args[1], str) and args[1].startswith(root)
                 and compiled.append(args[1]))
sys.path.insert(0, root)
import statebound
from statebound import Host
import statebound.dynamodb
assert statebound.__file__.startswith(root), statebound.__file__
print(len(compiled))
"""


def _cold_compiles(build: Path) -> int:
    # -I: no user site or PYTHON* variables; -B: no .pyc written, as on Lambda's read-only code directory
    site = [p for p in sys.path if p.endswith("site-packages")]
    code = f"import sys; sys.path[:0] = {site!r}\n" + COLD_IMPORT
    done = subprocess.run([sys.executable, "-I", "-B", "-c", code, str(build)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_the_package_carries_bytecode_of_the_runtimes_python_so_a_cold_start_compiles_nothing(package, tmp_path):
    empty = tmp_path / "none.txt"
    empty.write_text("")
    plain, built = tmp_path / "plain", tmp_path / "build"
    common = ["--requirements", str(empty), "--python-version", HERE_VERSION]
    assert package.main(["--out", str(plain), *common, "--compile-with", "none"]) == 0
    assert package.main(["--out", str(built), *common, "--compile-with", sys.executable,
                         "--zip", str(tmp_path / "fn.zip")]) == 0
    tag = sys.implementation.cache_tag
    modules = sorted(p for p in (built / "statebound").rglob("*.py"))
    assert len(modules) > 50
    for src in modules:                                     # every module, as an unchecked-hash .pyc
        pyc = src.parent / "__pycache__" / f"{src.stem}.{tag}.pyc"
        head = pyc.read_bytes()[:8]
        assert head[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(head[4:8], "little") == 0b01, src
    assert _cold_compiles(plain) > 50                       # without: every module compiled on each cold start
    assert _cold_compiles(built) == 0                       # with: none
    with zipfile.ZipFile(tmp_path / "fn.zip") as z:         # and the zip Lambda receives carries them
        names = z.namelist()
    assert f"statebound/__pycache__/__init__.{tag}.pyc" in names
    assert not [n for n in names if n.endswith(".pyc") and f".{tag}." not in n]


def test_bytecode_from_a_python_of_another_version_is_refused(package, tmp_path):
    other = "3.99"
    with pytest.raises(package.PackagingError, match=r"needs Python 3\.99"):
        package.compile_bytecode(tmp_path, sys.executable, other)
