"""The load policy of a chart: how far it is trusted, and which files its ``src`` may read.

Two rules, applied to every chart and every chart it reaches:

* **Containment.** ``<data src>``, ``<script src>`` and ``<invoke src|srcexpr>`` name a file
  by a relative path (optionally written ``file:path``, as the W3C tests do). It resolves
  against the chart's base directory and must land, symlinks followed, inside one of the
  chart's *roots*: the base directory tree, plus the directories a trusted caller listed in
  ``allow_dirs``. Absolute paths, ``..`` above the roots, other schemes (``http:``,
  ``file://``) and symlinks that leave the roots are refused. What is read must be a regular
  file no larger than :data:`~statebound.chart.xml.MAX_DOCUMENT_BYTES`; it is opened
  non-blocking and checked with ``fstat`` before a byte is read, so a FIFO or a device can
  neither hang nor flood the load.
* **Trust.** ``trust="untrusted"`` limits the chart, and every chart it reaches (inline
  ``<content>``, ``src``, and at run time ``srcexpr`` and ``<content expr>``), to the
  ``ecmascript`` and ``null`` datamodels. The python datamodel is Python ``eval`` and no
  sandbox (see ``docs/security.md``).

Every refusal is a :class:`~statebound.exceptions.ChartPolicyError`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass

from ..exceptions import ChartError, ChartPolicyError, InvalidArgument, InvalidTrustLevel, Problem
from .xml import MAX_DOCUMENT_BYTES, MAX_ELEMENTS

__all__ = ["TRUSTED", "UNTRUSTED", "TRUST_LEVELS", "UNTRUSTED_DATAMODELS", "MAX_SRC_CHARS", "MAX_SRC_PARTS", "check_trust", "roots_for",
           "resolve_src", "read_src", "read_file", "LoadBudget", "MAX_LOADED_BYTES", "MAX_LOADED_CHARTS"]

#: The two trust levels: a trusted chart may use every datamodel, an untrusted one may not.
TRUSTED = "trusted"
UNTRUSTED = "untrusted"
#: The values of the ``trust=`` keyword.
TRUST_LEVELS = (TRUSTED, UNTRUSTED)
#: The datamodels an untrusted chart (and every chart it reaches) may use.
UNTRUSTED_DATAMODELS = ("ecmascript", "null")
#: ``src`` bytes one load may read in all (every file of every chart it reaches).
MAX_LOADED_BYTES = 4 * MAX_DOCUMENT_BYTES
#: Charts one load may compile in all: the chart, its inline children and its ``src`` children.
MAX_LOADED_CHARTS = 256

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))


def check_trust(trust: object) -> str:
    """Return ``trust`` if it is ``"trusted"`` or ``"untrusted"``; raise :class:`InvalidTrustLevel` otherwise."""
    if type(trust) is not str or trust not in TRUST_LEVELS:
        raise InvalidTrustLevel(f"trust must be 'trusted' or 'untrusted', not {trust!r}")
    return trust


def roots_for(base_path: str | None, allow_dirs: object = ()) -> tuple[str, ...]:
    """The directories ``src`` may read under: the base tree, then each allowed directory.

    Paths are made real (symlinks resolved) once, here, so later checks compare like with like.
    """
    if isinstance(allow_dirs, (str, bytes, os.PathLike)):
        raise InvalidArgument("allow_dirs is a list of directories, not one path")
    roots: list[str] = []
    for d in ([base_path] if base_path is not None else []) + list(allow_dirs or ()):  # type: ignore[call-overload]
        real = os.path.realpath(os.fspath(d))
        if real not in roots:
            roots.append(real)
    return tuple(roots)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


#: The longest ``src`` path resolved (Linux's PATH_MAX is 4,096 bytes), and the most components.
MAX_SRC_CHARS = 4_096
MAX_SRC_PARTS = 256


def resolve_src(src: object, base_path: str | None, roots: tuple[str, ...]) -> str:
    """The real path ``src`` names, checked against the containment rules.

    :raises ChartPolicyError: the path is absolute, has a scheme other than a relative
        ``file:``, climbs out of every root, or the chart has no base directory.
    """
    if type(src) is not str or not src:
        raise _refuse(src, "it is empty or not a string")
    path = src
    m = _SCHEME.match(src)
    if m is not None and len(m.group(1)) > 1:  # one letter would be a drive (C:), refused below
        if m.group(1).lower() != "file":
            raise _refuse(src, f"the {m.group(1)!r} scheme is not allowed (only a relative path or file:path)")
        path = src[m.end():]
        if path.startswith("//"):
            raise _refuse(src, "file:// URLs are not allowed (write file:relative/path)")
    if not path or "\x00" in path:
        raise _refuse(src, "it names no file")
    if len(path) > MAX_SRC_CHARS or path.count("/") + path.count("\\") > MAX_SRC_PARTS:
        # realpath re-joins the rest of a path once per component: 400,000 components took
        # 20 s of CPU in one call, past every budget (no file system has such a path)
        raise _refuse(src, f"it is longer than {MAX_SRC_CHARS} characters or {MAX_SRC_PARTS} path components")
    if os.path.isabs(path) or _SCHEME.match(path) or path.startswith("\\"):
        raise _refuse(src, "absolute paths are not allowed")
    if base_path is None or not roots:
        raise _refuse(src, "the chart has no base directory (give base_path, or load it with from_file)")
    try:
        real = os.path.realpath(os.path.join(base_path, path))
    except (OSError, ValueError) as exc:
        raise _refuse(src, f"it cannot be resolved ({exc})") from None
    if not any(_inside(real, r) for r in roots):
        raise _refuse(src, "it resolves outside the chart's base directory"
                      + (" and the allowed directories" if len(roots) > 1 else ""))
    return real


def read_src(src: object, base_path: str | None, roots: tuple[str, ...],
             budget: LoadBudget | None = None) -> tuple[str, str] | None:
    """``(real path, UTF-8 text)`` of what ``src`` names, or ``None`` when no such file exists.

    :raises ChartPolicyError: for anything :func:`resolve_src` refuses, and for a file that
        is not a regular file, is over the size limit, is not UTF-8, or would take the load
        over :data:`MAX_LOADED_BYTES`.
    """
    real = resolve_src(src, base_path, roots)
    limit = MAX_DOCUMENT_BYTES if budget is None else min(MAX_DOCUMENT_BYTES, budget.bytes_left)
    try:
        data = _read_regular(real, limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refuse(src, f"it cannot be read ({exc.strerror or exc})") from None
    except _Refused as exc:
        why = str(exc)
        if why == "too big" and budget is not None and limit < MAX_DOCUMENT_BYTES:
            why = f"the load has read its {MAX_LOADED_BYTES} bytes of src files"
        elif why == "too big":
            why = f"the limit is {MAX_DOCUMENT_BYTES} bytes"
        raise _refuse(src, why) from None
    if budget is not None:
        budget.bytes_left -= len(data)
    try:
        return real, data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(src, "it is not UTF-8 text") from None


def read_file(path: str) -> bytes:
    """The bytes of a chart file a caller named (no containment: the caller chose it).

    Read the same careful way as a ``src``, so a FIFO or a device given by mistake fails
    at once instead of hanging or filling memory.

    :raises ChartError: it does not exist, cannot be read, is not a regular file or is too big.
    """
    try:
        return _read_regular(path, MAX_DOCUMENT_BYTES)
    except OSError as exc:
        raise ChartError(f"cannot read chart {path!r}: {exc.strerror or exc}") from None
    except _Refused as exc:
        why = f"over the {MAX_DOCUMENT_BYTES} byte limit" if str(exc) == "too big" else str(exc)
        raise ChartError(f"cannot read chart {path!r}: {why}") from None


class _Refused(Exception):
    """Internal: the file is not something a chart may be read from."""


def _read_regular(path: str, limit: int) -> bytes:
    """Read a regular file of at most ``limit`` bytes; ``OSError`` or :class:`_Refused` otherwise."""
    _check_stat(os.stat(path), limit)  # before any open: a device or FIFO is never opened at all
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component became a symlink since it was resolved
            raise _Refused("it changed while it was being read") from None
        raise
    try:
        _check_stat(os.fstat(fd), limit)  # the file that was opened, not the one checked
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise _Refused("too big")
    return b"".join(chunks)


def _check_stat(st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _Refused("it is not a regular file")
    if st.st_size > limit:
        raise _Refused("too big")


def _refuse(src: object, why: str) -> ChartPolicyError:
    return ChartPolicyError([Problem(f"src {src!r} is refused: {why}")])


@dataclass
class LoadBudget:
    """What one load may still read and compile, shared by every chart it reaches.

    Without it, a chart that invokes itself by ``src`` a hundred times, nested eight deep,
    would compile 100**8 charts: the nesting limit bounds depth, this bounds the total.
    """

    bytes_left: int = MAX_LOADED_BYTES
    charts_left: int = MAX_LOADED_CHARTS
    elements_left: int = MAX_ELEMENTS

    def take_chart(self) -> bool:
        """Count one more chart; ``False`` when the load may compile no more."""
        self.charts_left -= 1
        return self.charts_left >= 0
