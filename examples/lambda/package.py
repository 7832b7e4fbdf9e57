"""Build the functions' deployment package in ``build/`` (the template's ``CodeUri``).

    python examples/lambda/package.py            # then: cd examples/lambda && sam deploy

What goes in, and why this way rather than ``sam build`` over a requirements file:

* **statebound from this checkout, and only from it.** The script builds a wheel of the
  repository and installs that file by path, with ``--no-deps``. A requirement such as
  ``statebound[aws]`` with ``--find-links wheels`` would let pip pick a higher-numbered
  statebound from the package index over the local build; a wheel installed by path cannot
  be swapped. The check at the end reads pip's ``direct_url.json`` to prove it.
* **No second botocore.** The Lambda Python runtime ships boto3 and botocore (about 30 MB
  unzipped). The ``aws`` extra would install another copy that shadows the runtime's, so
  the package leaves them out, and the check refuses a build that has them.
* **Pinned third-party wheels for the Lambda platform.** ``requirements.txt`` pins the
  full closure (msgpack, aws-lambda-powertools and its dependencies), installed with
  ``--no-deps`` and ``--only-binary`` for manylinux/arm64 and the runtime's Python, so the
  build is the same on any machine and nothing unlisted comes in.

* **Bytecode for the runtime's Python.** Lambda's code directory is read-only, so a
  package without ``.pyc`` files makes every cold start compile statebound (and the pure
  Python wheels) from source, and the compiled code is thrown away with the environment.
  The script compiles the whole package with a Python of the runtime's version
  (``python3.13`` on ``PATH``, or ``--compile-with``), as unchecked-hash ``.pyc`` files:
  used without looking at the sources' mtimes, which a zip rounds to two seconds. Measured
  on this build with Python 3.13 (three fresh processes each, no bytecode written):
  importing statebound and its ``Host`` took 207-250 ms from source and 114-121 ms from the
  bytecode, and Powertools' ``Logger`` and ``Metrics`` 82-89 ms against 15-19 ms. With no
  such Python the build goes on without bytecode and says so.

The handler modules and ``charts/`` (every revision) are copied beside the packages.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlparse

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: The modules the four functions import (the operator tool revisions.py is not one).
HANDLER_FILES = ("app.py", "chart_revisions.py", "handler.py", "sqs_events.py", "sweeper.py", "telemetry.py", "wake.py")
#: The runtime's own copies; a second one in the package would shadow them.
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "urllib3", "dateutil")
PLATFORM = "manylinux2014_aarch64"   # Architectures: [arm64] in the template
PYTHON = "3.13"                      # Runtime: python3.13


class PackagingError(Exception):
    """The build is not what the template expects (see the message)."""


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def pinned_requirements(path: Path) -> list[str]:
    """The ``name==version`` lines of a requirements file; anything looser is refused."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip() or any(c in line for c in "<>~!;@[ "):
            raise PackagingError(f"{path.name}: {line!r} is not pinned as name==version")
        if name.strip().lower().replace("_", "-") in RUNTIME_PROVIDED or name.strip().lower() == "statebound":
            raise PackagingError(f"{path.name}: {name.strip()} must not be listed (see package.py)")
        lines.append(line)
    return lines


def build_wheel(into: Path) -> Path:
    """A wheel of this checkout of statebound."""
    _pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(into), str(REPO))
    (wheel,) = into.glob("statebound-*.whl")
    return wheel


def install(out: Path, wheel: Path, requirements: Path, *, platform: str = PLATFORM, python: str = PYTHON) -> None:
    """statebound from ``wheel`` and the pinned requirements, into ``out``."""
    # --no-compile: .pyc files made by this machine's Python would be dead weight on another
    _pip("install", "--quiet", "--no-deps", "--no-compile", "--target", str(out), str(wheel))
    pins = pinned_requirements(requirements)
    if pins:
        _pip("install", "--quiet", "--no-deps", "--no-compile", "--only-binary=:all:", "--platform", platform,
             "--python-version", python, "--implementation", "cp", "--target", str(out), *pins)
    # console scripts carry this machine's interpreter path; the functions never run them
    shutil.rmtree(out / "bin", ignore_errors=True)


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` (``"3.13"``) to compile with: this one, or a working
    ``python3.13`` on ``PATH`` (a version manager's shim may be there and not run)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    return found if found is not None and _version_of(found) == version else None


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def compile_bytecode(out: Path, python: str, version: str) -> int:
    """Compile every module in ``out`` with ``python`` (of ``version``) as unchecked-hash
    ``.pyc`` files; returns how many there are.

    :raises PackagingError: ``python`` does not run or is not of ``version``, or a module
        does not compile.
    """
    found = _version_of(python)
    if found != version:
        raise PackagingError(f"{python} is {'Python ' + found if found else 'not a working Python'}; "
                             f"the runtime's bytecode needs Python {version}")
    # -j0: one worker per core; -q: errors only; a module that fails to compile fails the build
    subprocess.run([python, "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return len(list(out.rglob(f"*.{_cache_tag(version)}.pyc")))


def _cache_tag(version: str) -> str:
    major, minor = version.split(".")
    return f"cpython-{major}{minor}"


def copy_sources(out: Path) -> None:
    """The handler modules and every chart revision."""
    for name in HANDLER_FILES:
        shutil.copy2(HERE / name, out / name)
    shutil.copytree(HERE / "charts", out / "charts")


def verify(out: Path, wheel: Path | None = None) -> dict[str, object]:
    """Check the build; returns what it found (statebound version and source, size).

    :raises PackagingError: a runtime-provided package is inside, or statebound is missing,
        twice, or did not come from ``wheel`` (the local build).
    """
    shadowing = sorted(name for name in RUNTIME_PROVIDED if (out / name).exists())
    if shadowing:
        raise PackagingError(f"the package contains {', '.join(shadowing)}, which the Lambda runtime "
                             "provides; a second copy would shadow it")
    infos = sorted(out.glob("statebound-*.dist-info"))
    if len(infos) != 1:
        raise PackagingError(f"expected one statebound installation, found {len(infos)}")
    direct_url = infos[0] / "direct_url.json"
    if not direct_url.exists():
        raise PackagingError("statebound was installed from a package index, not from the local build")
    source = Path(unquote(urlparse(json.loads(direct_url.read_text())["url"]).path))
    if wheel is not None and source.name != wheel.name:
        raise PackagingError(f"statebound came from {source.name}, not from the local build {wheel.name}")
    for name in HANDLER_FILES:
        if not (out / name).is_file():
            raise PackagingError(f"{name} is missing")
    version = infos[0].name.removeprefix("statebound-").removesuffix(".dist-info")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"statebound": version, "source": source.name, "bytes": size}


def write_zip(out: Path, target: Path, python: str = PYTHON) -> int:
    """Zip the build as Lambda would receive it, with the bytecode of the runtime's Python
    ``python`` and no other; returns the zip's size in bytes."""
    tag = f".{_cache_tag(python)}.pyc"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(out.rglob("*")):
            if p.is_file() and ("__pycache__" not in p.parts or p.name.endswith(tag)):
                z.write(p, p.relative_to(out).as_posix())
    return target.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    p = argparse.ArgumentParser(prog="package.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE / "build", help="the build directory (default: build/)")
    p.add_argument("--requirements", type=Path, default=HERE / "requirements.txt")
    p.add_argument("--platform", default=PLATFORM)
    p.add_argument("--python-version", default=PYTHON)
    p.add_argument("--zip", type=Path, help="also write the zip Lambda would receive here, and report its size")
    p.add_argument("--compile-with", metavar="PYTHON",
                   help="the interpreter (of --python-version) that compiles the bytecode; 'none' for no bytecode "
                        "(default: this one if its version matches, else python<version> on PATH)")
    args = p.parse_args(argv)
    try:
        pinned_requirements(args.requirements)
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        with tempfile.TemporaryDirectory() as tmp:
            wheel = build_wheel(Path(tmp))
            install(args.out, wheel, args.requirements, platform=args.platform, python=args.python_version)
            copy_sources(args.out)
            found = verify(args.out, wheel)
        python = find_python(args.python_version) if args.compile_with is None else (
            None if args.compile_with == "none" else args.compile_with)
        if python is None:
            if args.compile_with is None:
                print(f"package.py: no python{args.python_version} found, so no bytecode: every cold start will "
                      "compile the modules (see --compile-with)", file=sys.stderr)
            found["pyc_files"] = 0
        else:
            found["pyc_files"] = compile_bytecode(args.out, python, args.python_version)
        if args.zip:
            found["zip_bytes"] = write_zip(args.out, args.zip, args.python_version)
    except (PackagingError, subprocess.CalledProcessError) as exc:
        print(f"package.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out), **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
