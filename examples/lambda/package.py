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


def write_zip(out: Path, target: Path) -> int:
    """Zip the build as Lambda would receive it; returns the zip's size in bytes."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(out.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
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
        if args.zip:
            found["zip_bytes"] = write_zip(args.out, args.zip)
    except (PackagingError, subprocess.CalledProcessError) as exc:
        print(f"package.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out), **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
