"""The position blob: ``to_bytes``/``from_bytes``, ``export``/``import_`` and :func:`diff`.

A :class:`~statebound.Position` between two drives persists as a small, version-stamped,
identity-checked blob. Layout of format version 1 (all offsets in bytes)::

    0   4  magic            b"SB\\x00P"
    4   1  format version   1
    5   1  codec            b"m" msgpack | b"c" cbor
    6  32  chart identity   the raw SHA-256 digest behind ``Chart.identity``
    38  v  chart name       uvarint length + UTF-8
    ..  v  chart version    uvarint (0 = none, n + 1 = n bytes) + UTF-8
    ..  *  payload          one codec-encoded positional array (see ``_V1_FIELDS``)

The header up to the payload is codec-independent, so :func:`read_header` can tell which
chart a blob belongs to without decoding anything (and without ``cbor2`` installed).
The compiled chart is never stored: ``from_bytes`` is given it and checks the identity.

What is *not* stored: the per-driver fields (``Position.PER_DRIVER_FIELDS``) come back
``None`` and are re-stamped by the host. There is no pending internal state to refuse:
a position only exists at rest, after a macrostep has emptied the internal queue, so the
payload is complete by construction (the interpreter's ``Machine`` never outlives a drive).

This module registers itself with :mod:`statebound.interpreter.state` on import, which
is how the ``Position`` methods reach it while imports still flow one way.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable, Mapping, Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import msgpack

from .chart.model import Chart, StateNode
from .datamodel.base import check_stored, pack_vars, unpack_vars
from .exceptions import (
    ChartIdentityMismatch,
    CorruptPosition,
    NotAPosition,
    PositionError,
    SerializationError,
    UnsupportedFormatVersion,
)
from .interpreter.state import (CANCELLED, DONE, RUNNING, ArmedTimeout, Invocation, Position, make_position,
                               register_codec)

__all__ = [
    "MAGIC", "FORMAT_VERSION", "READABLE_VERSIONS", "CODECS", "BlobHeader", "MigrationError",
    "CodecUnavailable", "ChartDiff", "to_bytes", "from_bytes", "read_header", "export", "import_",
    "remap", "diff",
]

#: The first four bytes of every position blob. The NUL keeps text (JSON, XML) from matching.
MAGIC = b"SB\x00P"
#: The format version :func:`to_bytes` writes.
FORMAT_VERSION = 1
#: Every format version :func:`from_bytes` reads (older ones are upgraded on read).
READABLE_VERSIONS: frozenset[int] = frozenset({1})
#: Codec name -> the tag byte stored at offset 5.
CODECS: Mapping[str, int] = {"msgpack": ord("m"), "cbor": ord("c")}
_CODEC_NAMES = {v: k for k, v in CODECS.items()}
_HEADER_KEYS = {tag: f"position.header.{tag}" for tag in _CODEC_NAMES}
_MSGPACK_HEADER_KEY = _HEADER_KEYS[ord("m")]

_STATUS_CODE = {RUNNING: 0, DONE: 1, CANCELLED: 2}
_STATUS_NAME = (RUNNING, DONE, CANCELLED)

# Payload v1: a positional array; trailing fields equal to their default are omitted,
# so a fresh top-level session costs only what it uses.
_V1_FIELDS = ("session_id", "status", "states", "data", "macrostep", "send_counter", "ordinal",
              "invoke_counter", "history", "timeouts", "invocations", "initialized", "parent",
              "invokeid")
_V1_MIN = 3  # session_id, status and states are always written
#: The largest counter a blob may hold: a signed 64-bit integer, what every store and codec
#: writes back (a cbor bignum or a msgpack uint64 near its top would load, then fail to encode
#: after the next drive, or to print as a send id).
_MAX_COUNTER = (1 << 63) - 1
_MIN_MS, _MAX_MS = -(1 << 63), (1 << 63) - 1
_EMPTY: tuple[Any, ...] = ()
#: ``Chart._caches`` key of the configurations already found legal (value: ``running``)
_LEGAL_KEY = "position.legal"
_LEGAL_MAX = 4096
_N_FIELDS = len(_V1_FIELDS)
#: what a payload of n fields lacks, by n (trailing defaults are not written)
_PAD = tuple((None,) * (_N_FIELDS - n) for n in range(_N_FIELDS + 1))
_MSGPACK = ord("m")
_NONE_ACTIVE: frozenset[int] = frozenset()
_unpackb = msgpack.unpackb


class MigrationError(PositionError):
    """An exported position cannot be imported onto the given chart.

    :ivar unknown_ids: every state id the export names that the chart lacks (all of them,
        not just the first), in the order met.
    :ivar problems: every other reason, as sentences.
    """

    def __init__(self, chart: Chart, unknown_ids: tuple[str, ...] = (),
                 problems: tuple[str, ...] = ()) -> None:
        self.unknown_ids = tuple(unknown_ids)
        self.problems = tuple(problems)
        parts = []
        if self.unknown_ids:
            parts.append(f"{len(self.unknown_ids)} state id(s) unknown to chart {chart.name!r} "
                         f"version {chart.version!r}: {', '.join(map(repr, self.unknown_ids))} "
                         "(map them with statebound.position.remap or import_(..., mapping=))")
        parts.extend(self.problems)
        super().__init__("cannot import position: " + "; ".join(parts))


class CodecUnavailable(PositionError, SerializationError):
    """The cbor codec was asked for but ``cbor2`` is not installed (``pip install 'statebound[cbor]'``).

    It is both a :class:`~statebound.PositionError` (so ``from_bytes`` keeps its promise of
    raising nothing else) and a :class:`~statebound.SerializationError` (what ``to_bytes``
    raises for anything it cannot write).
    """


@dataclass(frozen=True, slots=True)
class BlobHeader:
    """What the codec-independent header of a blob says (see :func:`read_header`).

    :ivar version: the format version.
    :ivar codec: ``"msgpack"`` or ``"cbor"``.
    :ivar identity: ``"sha256:<hex>"``, comparable with ``Chart.identity``.
    :ivar name: the chart name recorded when the blob was written.
    :ivar chart_version: the chart version label recorded, or ``None``.
    :ivar payload_offset: where the codec-encoded payload starts.
    """

    version: int
    codec: str
    identity: str
    name: str
    chart_version: str | None
    payload_offset: int


# --------------------------------------------------------------------------- header


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_uvarint(blob: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(blob) or shift > 28:  # > 4 bytes of length: no sane chart name is that long
            raise CorruptPosition("truncated or overlong length in the blob header")
        b = blob[i]
        i += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i
        shift += 7


def _digest(chart: Chart) -> bytes:
    ident = chart.identity
    if not ident.startswith("sha256:") or len(ident) != 71:
        raise SerializationError(f"chart identity {ident!r} is not a sha256 identity")
    return bytes.fromhex(ident[7:])


def _header(chart: Chart, tag: int) -> bytes:
    """The header bytes of ``chart`` for codec ``tag``, cached on the chart (hot path)."""
    key = _HEADER_KEYS.get(tag) or f"position.header.{tag}"
    h = chart._caches.get(key)
    if h is None:
        name = chart.name.encode()
        ver = b"\x00" if chart.version is None else _uvarint(len(chart.version.encode()) + 1) + \
            chart.version.encode()
        h = MAGIC + bytes((FORMAT_VERSION, tag)) + _digest(chart) + _uvarint(len(name)) + name + ver
        chart._caches[key] = h
    return h


def _read_header_v1(blob: bytes) -> BlobHeader:
    if len(blob) < 38:
        raise CorruptPosition(f"blob truncated in its header ({len(blob)} bytes)")
    codec = _CODEC_NAMES.get(blob[5])
    if codec is None:
        raise CorruptPosition(f"unknown codec tag 0x{blob[5]:02x} (known: m = msgpack, c = cbor)")
    identity = "sha256:" + blob[6:38].hex()
    n, i = _read_uvarint(blob, 38)
    if i + n > len(blob):
        raise CorruptPosition("blob truncated in the chart name")
    try:
        name = blob[i:i + n].decode()
        i += n
        v, i = _read_uvarint(blob, i)
        chart_version = None
        if v:
            if i + v - 1 > len(blob):
                raise CorruptPosition("blob truncated in the chart version")
            chart_version = blob[i:i + v - 1].decode()
            i += v - 1
    except UnicodeDecodeError:
        raise CorruptPosition("chart name or version in the blob header is not UTF-8") from None
    return BlobHeader(1, codec, identity, name, chart_version, i)


#: version -> reader of that version's header. A new version adds its reader here.
_HEADER_READERS: dict[int, Callable[[bytes], BlobHeader]] = {1: _read_header_v1}

#: version N -> ``_upgrade_vN``, turning payload fields of version N into those of N + 1.
#: Empty while v1 is the only version; when v2 arrives, write ``_upgrade_v1`` (v1 fields
#: in, v2 fields out), register it here, add 2 to READABLE_VERSIONS and bump FORMAT_VERSION.
#: Never delete an upgrader: old blobs stay readable forever.
_UPGRADERS: dict[int, Callable[[list[Any]], list[Any]]] = {}


def _upgrade(version: int, fields: list[Any]) -> list[Any]:
    while version < FORMAT_VERSION:
        fields = _UPGRADERS[version](fields)
        version += 1
    return fields


def _as_bytes(blob: Any) -> bytes:
    if isinstance(blob, bytes):
        return blob
    if isinstance(blob, (bytearray, memoryview)):
        return bytes(blob)
    raise NotAPosition(f"a position blob is bytes, not {type(blob).__name__}")


def read_header(blob: bytes) -> BlobHeader:
    """Read a blob's header without decoding the payload or needing the chart.

    Use it to pick the chart a stored blob belongs to (e.g. while draining positions of
    an old chart revision) or to report on blobs in an operator tool.

    :raises NotAPosition: not bytes, or no magic prefix.
    :raises UnsupportedFormatVersion: a version this code cannot read.
    :raises CorruptPosition: a truncated or malformed header.
    """
    blob = _as_bytes(blob)
    if blob[:4] != MAGIC:
        raise NotAPosition("not a statebound position (bad magic prefix)")
    if len(blob) < 5:
        raise CorruptPosition("blob truncated after the magic prefix")
    version = blob[4]
    if version not in READABLE_VERSIONS:
        raise UnsupportedFormatVersion(version, sorted(READABLE_VERSIONS))
    return _HEADER_READERS[version](blob)


# --------------------------------------------------------------------------- encode


def _cbor() -> Any:
    mod = sys.modules.get("cbor2")
    if mod is not None:
        return mod
    try:
        import cbor2
    except ImportError:
        raise CodecUnavailable("the cbor codec needs cbor2: pip install 'statebound[cbor]'") from None
    return cbor2


def _timeouts(pos: Position) -> list[list[Any]]:
    timeouts = []
    states = pos.chart.states
    for t in pos.timeouts:
        # The interpreter derives timeout send ids from the state id; store only surprises.
        sid = None if t.send_id == f"sb.timeout.{states[t.state].id}.{t.name}" else t.send_id
        tf: list[Any] = [t.state, t.name, t.ordinal, sid, t.at_ms]
        while len(tf) > 3 and tf[-1] is None:
            tf.pop()
        timeouts.append(tf)
    return timeouts


def _fields(pos: Position, data: Any, data_default: Any) -> list[Any]:
    try:
        status = _STATUS_CODE[pos.status]
    except KeyError:
        raise SerializationError(f"position status {pos.status!r} is not one of running/done/cancelled") \
            from None
    # Trailing defaults are left out: most positions trail eight or more, so the last field
    # that is not one is found from the end first and only the fields before it are built.
    if pos.invokeid is not None:
        n = 14
    elif pos.parent is not None:
        n = 13
    elif pos.initialized:
        n = 12
    elif pos.invocations:
        n = 11
    elif pos.timeouts:
        n = 10
    elif pos.history:
        n = 9
    elif pos.invoke_counter != 0:
        n = 8
    elif pos.ordinal != 0:
        n = 7
    elif pos.send_counter != 0:
        n = 6
    elif pos.macrostep != 0:
        n = 5
    else:
        return [pos.session_id, status, pos.states] if data == data_default else \
            [pos.session_id, status, pos.states, data]
    f = [pos.session_id, status, pos.states, data, pos.macrostep, pos.send_counter, pos.ordinal,
         pos.invoke_counter, pos.history, _timeouts(pos) if n > 9 else _EMPTY,
         [(i.invokeid, i.state, i.index, i.autoforward) for i in pos.invocations] if n > 10 else _EMPTY,
         pos.initialized, pos.parent, pos.invokeid]
    if n < 14:
        del f[n:]
    return f


# Packing with a fresh Packer (what msgpack.packb does) costs as much again as the packing;
# one kept per thread, since a Packer holds its buffer between calls.
_local = threading.local()


def _packb(f: list[Any]) -> bytes:
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        return packer.pack(f)
    except BaseException:
        packer.reset()   # a failed pack leaves what it wrote so far in the buffer
        raise


def to_bytes(pos: Position, codec: str = "msgpack") -> bytes:
    """Encode ``pos`` as a blob (see the module docstring for the layout).

    :param codec: ``"msgpack"`` (default, smallest and fastest) or ``"cbor"`` (needs the
        ``cbor`` extra; the datamodel is re-encoded as CBOR values so any CBOR tool reads it).
    :raises SerializationError: an unknown codec, a value that cannot be encoded, or
        :class:`CodecUnavailable` when cbor2 is missing.
    """
    if codec == "msgpack":
        f = _fields(pos, pos.data, b"")
        try:
            body = _packb(f)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(f"position cannot be encoded (msgpack): {exc}") from None
        return _header(pos.chart, _MSGPACK) + body
    if codec == "cbor":
        cbor2 = _cbor()
        try:
            data = unpack_vars(pos.data) if pos.data else None
        except Exception as exc:  # the datamodel bytes came from pack_vars; anything else is a bug
            raise SerializationError(f"position datamodel cannot be decoded: {exc}") from None
        f = _fields(pos, data, None)
        try:
            body = cbor2.dumps(f)
        except (TypeError, ValueError, OverflowError, cbor2.CBOREncodeError) as exc:
            raise SerializationError(f"position cannot be encoded (cbor): {exc}") from None
        return _header(pos.chart, CODECS["cbor"]) + body
    raise SerializationError(f"unknown codec {codec!r} (use 'msgpack' or 'cbor')")


# --------------------------------------------------------------------------- decode


def from_bytes(blob: bytes, chart: Chart) -> Position:
    """Decode a blob written by :func:`to_bytes` against ``chart``.

    Checks, in order: magic, format version, codec, chart identity, then the payload and
    its legality on ``chart`` (configuration, history, invocations, timeouts). The
    configuration check is O(active states).

    :raises NotAPosition: not bytes, or no magic prefix.
    :raises UnsupportedFormatVersion: a version not in :data:`READABLE_VERSIONS`.
    :raises ChartIdentityMismatch: the blob belongs to another chart (or revision).
    :raises CorruptPosition: anything else wrong with the bytes.
    :raises CodecUnavailable: a cbor blob without cbor2 installed.

    Nothing else escapes, whatever the input.
    """
    if type(blob) is bytes:
        # Fastest path: a msgpack blob of this chart starts with the header the chart caches
        # (magic, version, codec, identity, labels: everything the checks below read).
        head = chart._caches.get(_MSGPACK_HEADER_KEY)
        if head is not None and blob.startswith(head):
            return _decode(blob, len(head), _MSGPACK, blob[4], chart)
    blob = _as_bytes(blob)
    if blob[:4] != MAGIC:
        raise NotAPosition("not a statebound position (bad magic prefix)")
    # Fast path: the blob starts with exactly this chart's cached header.
    tag = blob[5] if len(blob) > 5 else -1
    if len(blob) > 4 and blob[4] == FORMAT_VERSION and tag in _CODEC_NAMES:
        head = _header(chart, tag)
        if blob.startswith(head):
            return _decode(blob, len(head), tag, FORMAT_VERSION, chart)
    h = read_header(blob)
    if h.identity != chart.identity:
        raise ChartIdentityMismatch((chart.identity, chart.name, chart.version),
                                    (h.identity, h.name, h.chart_version))
    return _decode(blob, h.payload_offset, CODECS[h.codec], h.version, chart)


def _decode(blob: bytes, offset: int, tag: int, version: int, chart: Chart) -> Position:
    try:
        if tag == _MSGPACK:
            # arrays come back as tuples: the configuration and history are kept as they are
            fields = _unpackb(blob[offset:], raw=False, use_list=False, strict_map_key=True)
            cbor = False
        else:
            cbor2 = _cbor()
            stream = io.BytesIO(blob[offset:])
            fields = cbor2.CBORDecoder(stream).decode()
            if stream.tell() != len(blob) - offset:   # cbor2.loads would ignore what follows
                raise CorruptPosition(f"{len(blob) - offset - stream.tell()} extra byte(s) after the payload")
            cbor = True
        if type(fields) is not tuple and type(fields) is not list:
            raise CorruptPosition("payload is not an array")
        if version != FORMAT_VERSION:
            fields = _upgrade(version, list(fields))
        return _build(chart, fields, cbor)
    except PositionError:
        raise
    except Exception as exc:  # decoder errors of every kind, RecursionError, MemoryError...
        raise CorruptPosition(f"corrupt or truncated payload: {type(exc).__name__}: {exc}") from exc


def _bad(msg: str) -> CorruptPosition:
    return CorruptPosition(msg)


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= _MAX_COUNTER:
        raise _bad(f"{what} must be a non-negative 64-bit integer, not {_short(v)}")
    return v


def _short(v: Any) -> str:
    # repr of a 10**5000 would exceed int-to-str's digit cap (ValueError) and flood the message
    return f"an int of {v.bit_length()} bits" if type(v) is int and v.bit_length() > 64 else repr(v)[:80]


def _opt_str(v: Any, what: str) -> str | None:
    if v is not None and type(v) is not str:
        raise _bad(f"{what} must be a string or nil")
    return v


def _seq(v: Any, what: str) -> list[Any] | tuple[Any, ...]:
    if type(v) is not list and type(v) is not tuple:
        raise _bad(f"{what} must be an array")
    return v


def _check_data(data: bytes, chart: Chart) -> None:
    # Decoding once here means pos.datamodel and the next drive can never fail on it.
    _check_vars(msgpack.unpackb(data, raw=False, strict_map_key=False), chart)


def _check_vars(vars_: Any, chart: Chart) -> None:
    why = check_stored(chart.datamodel, vars_)
    if why is not None:
        raise _bad(f"datamodel does not fit chart {chart.name!r} ({chart.datamodel}): {why}")


def _build(chart: Chart, f: list[Any] | tuple[Any, ...], cbor: bool) -> Position:
    n = len(f)
    if n < _V1_MIN or n > _N_FIELDS:
        raise _bad(f"payload has {n} fields; format 1 has {_V1_MIN} to {_N_FIELDS}")
    if n < _N_FIELDS:
        f = (f if type(f) is tuple else tuple(f)) + _PAD[n]
    (session_id, status, states_in, raw, c0, c1, c2, c3, history_in, timeouts_in, invocations_in,
     initialized_in, parent, invokeid) = f
    if type(session_id) is not str:
        raise _bad("session_id must be a string")
    if type(status) is not int or not 0 <= status < 3:
        raise _bad(f"unknown status code {_short(status)}")
    status_name = _STATUS_NAME[status]

    if cbor:
        if raw is None:
            data = b""
        elif type(raw) is dict and all(type(k) is str for k in raw):
            _check_vars(raw, chart)
            try:
                data = pack_vars(raw)
            except SerializationError as exc:
                raise _bad(f"datamodel holds values a position cannot: {exc}") from None
        else:
            raise _bad("datamodel is not a map of variable names")
    else:
        if raw is None:
            data = b""
        elif type(raw) is bytes:
            data = raw
            if data:
                _check_data(data, chart)
        else:
            raise _bad("datamodel must be msgpack bytes")

    # _int, inline: four per decode, and most counters are small
    if c0 is None:
        c0 = 0
    elif type(c0) is not int or not 0 <= c0 <= _MAX_COUNTER:
        _int(c0, "macrostep")
    if c1 is None:
        c1 = 0
    elif type(c1) is not int or not 0 <= c1 <= _MAX_COUNTER:
        _int(c1, "send_counter")
    if c2 is None:
        c2 = 0
    elif type(c2) is not int or not 0 <= c2 <= _MAX_COUNTER:
        _int(c2, "ordinal")
    if c3 is None:
        c3 = 0
    elif type(c3) is not int or not 0 <= c3 <= _MAX_COUNTER:
        _int(c3, "invoke_counter")
    # the codecs give arrays as lists (cbor) or tuples (msgpack), never both in one payload
    if history_in is None:
        history_in = _EMPTY
    elif type(history_in) is not tuple and type(history_in) is not list:
        raise _bad("history must be an array")
    if timeouts_in is None:
        timeouts_in = _EMPTY
    elif type(timeouts_in) is not tuple and type(timeouts_in) is not list:
        raise _bad("timeouts must be an array")
    if invocations_in is None:
        invocations_in = _EMPTY
    elif type(invocations_in) is not tuple and type(invocations_in) is not list:
        raise _bad("invocations must be an array")
    if initialized_in is None:
        initialized_in = _EMPTY
    elif type(initialized_in) is not tuple and type(initialized_in) is not list:
        raise _bad("initialized must be an array")
    if parent is not None and type(parent) is not str:
        raise _bad("parent must be a string or nil")
    if invokeid is not None and type(invokeid) is not str:
        raise _bad("invokeid must be a string or nil")
    return _assemble(chart, session_id, status_name, states_in, data, (c0, c1, c2, c3), history_in, timeouts_in,
                     invocations_in, initialized_in, parent, invokeid)


def _could_leave(nodes: Any, owner: StateNode, rec: Any, deep: bool) -> bool:
    """Whether ``rec`` (checked to be ``owner``'s children, or atomic descendants when ``deep``)
    is what a history of ``owner`` records on leaving a legal configuration: restoring two
    siblings of a compound state would drive the session into an illegal one."""
    if not rec or len(set(rec)) != len(rec):
        return False
    if not deep:
        return set(rec) == set(owner.children) if owner.kind == "parallel" else len(rec) == 1
    inside = set(rec)
    for r in rec:
        for a in nodes[r].ancestors:
            if a == owner.index:
                break
            inside.add(a)
    for s in (*inside, owner.index):
        node = nodes[s]
        active = sum(1 for c in node.children if c in inside)
        if node.kind == "parallel" and active != len(node.children):
            return False
        if node.kind == "compound" and active != 1:
            return False
    return True


def _check_configuration(nodes: Any, states_in: Any, running: bool) -> tuple[int, ...]:
    """The configuration as a tuple, checked to be one the chart can be in (``_assemble``)."""
    bad = _bad
    n_states = len(nodes)
    active: set[int] = set()
    counts: dict[int, int] = {}
    prev = 0
    for s in _seq(states_in, "configuration"):
        if type(s) is not int or not prev < s < n_states:
            raise bad(f"state index {_short(s)} is out of range or out of document order")
        prev = s
        node = nodes[s]
        if node.kind == "history":
            raise bad(f"history state {node.id!r} cannot be active")
        p = node.parent
        if p and p not in active:
            raise bad(f"state {node.id!r} is active without its parent {nodes[p].id!r}")
        active.add(s)
        counts[p] = counts.get(p, 0) + 1
    states = tuple(states_in)
    if running:
        if counts.get(0, 0) != 1:
            raise bad(f"a running configuration has exactly one top-level state, not {counts.get(0, 0)}")
        for s in states:
            node = nodes[s]
            if node.kind == "compound" and counts.get(s, 0) != 1:
                raise bad(f"compound state {node.id!r} has {counts.get(s, 0)} active children, not 1")
            if node.kind == "parallel" and counts.get(s, 0) != len(node.children):
                raise bad(f"parallel state {node.id!r} has {counts.get(s, 0)} of its "
                          f"{len(node.children)} regions active")
    else:  # a halted session keeps the configuration it halted in, or none
        if counts.get(0, 0) > 1 or any(nodes[s].kind == "compound" and counts.get(s, 0) > 1 for s in states):
            raise bad("a compound state has two active children")
    return states


def _assemble(chart: Chart, session_id: str, status: str, states_in: Any, data: bytes,
              counters: tuple[int, int, int, int] | list[int],
              history_in: Any, timeouts_in: Any, invocations_in: Any, initialized_in: Any,
              parent: str | None, invokeid: str | None) -> Position:
    """Check every index against ``chart`` and build the position (shared by decode and import)."""
    bad = _bad
    nodes = chart.states
    n_states = len(nodes)
    running = status == RUNNING

    # -- configuration: strictly increasing document indices, so a parent is always seen
    # before its children and the whole check is one pass over the active states. A chart
    # has few legal configurations and positions keep meeting the same ones: those already
    # checked are remembered per chart (exact ints only: True and 1.0 hash as 1).
    legal = chart._caches.get(_LEGAL_KEY)
    if legal is None:
        legal = chart._caches.setdefault(_LEGAL_KEY, {})
    seen = None
    if type(states_in) is tuple or type(states_in) is list:
        seen = states_in if type(states_in) is tuple else tuple(states_in)
        for s in seen:
            if type(s) is not int:
                seen = None
                break
    active: AbstractSet[int]
    if seen is not None and legal.get(seen) == running:
        states = seen
        active = set(seen) if timeouts_in or invocations_in else _NONE_ACTIVE   # only those two read it
    else:
        states = _check_configuration(nodes, states_in, running)
        if seen is not None:
            if len(legal) >= _LEGAL_MAX:
                legal.clear()
            legal[seen] = running
        active = set(states)

    # -- history: recorded values must be what that history state can record. The four
    # collections below are empty in most positions: nothing is allocated for them then.
    history: Any = _EMPTY
    if history_in:
        history = _check_history(nodes, history_in)

    # -- armed timeouts: exiting a state cancels its timeouts, so the state is active
    timeouts: Any = _check_timeouts(nodes, timeouts_in, active, counters[2]) if timeouts_in else _EMPTY

    # -- invocations: owned by an active state, pointing at one of its <invoke>s
    invocations: Any = _check_invocations(nodes, invocations_in, active) if invocations_in else _EMPTY

    initialized: Any = _EMPTY
    if initialized_in:
        prev = -1
        for s in _seq(initialized_in, "initialized"):
            if type(s) is not int or not prev < s < n_states:
                raise bad(f"initialized state {_short(s)} is out of range or out of order")
            prev = s
        initialized = tuple(initialized_in)

    return make_position(chart, session_id, status, states, history, data, counters[0], counters[1],
                         counters[2], counters[3], invocations, initialized, parent, invokeid, timeouts)


def _check_history(nodes: Any, history_in: Any) -> tuple[tuple[int, tuple[int, ...]], ...]:
    bad = _bad
    n_states = len(nodes)
    history = []
    prev = 0
    for item in _seq(history_in, "history"):
        if type(item) not in (list, tuple) or len(item) != 2:
            raise bad("a history entry is [history state, [states]]")
        h, rec = item
        if type(h) is not int or not prev < h < n_states or nodes[h].kind != "history":
            raise bad(f"history index {_short(h)} is not a history state (or out of order)")
        prev = h
        hnode = nodes[h]
        owner: StateNode = nodes[hnode.parent]
        deep = hnode.history_type == "deep"
        for r in _seq(rec, "history value"):
            if type(r) is not int or not owner.index < r <= owner.last:
                raise bad(f"history {hnode.id!r} records {_short(r)}, not a descendant of {owner.id!r}")
            rn = nodes[r]
            if (deep and not rn.is_atomic) or (not deep and rn.parent != owner.index) or rn.kind == "history":
                raise bad(f"{hnode.history_type} history {hnode.id!r} cannot record {rn.id!r}")
        if not _could_leave(nodes, owner, rec, deep):
            raise bad(f"{hnode.history_type} history {hnode.id!r} records {[nodes[r].id for r in rec][:20]}, "
                      f"which {owner.id!r} cannot have been in when it was left")
        history.append((h, tuple(rec)))
    return tuple(history)


def _check_timeouts(nodes: Any, timeouts_in: Any, active: AbstractSet[int], ordinal: int) -> tuple[ArmedTimeout, ...]:
    bad = _bad
    timeouts = []
    armed: set[tuple[int, str]] = set()
    for t in _seq(timeouts_in, "timeouts"):
        if type(t) not in (list, tuple) or not 3 <= len(t) <= 5:
            raise bad("a timeout entry is [state, name, ordinal, send_id?, at_ms?]")
        st, name, tord = t[0], t[1], t[2]
        send_id = t[3] if len(t) > 3 else None
        at_ms = t[4] if len(t) > 4 else None
        if type(st) is not int or st not in active:
            raise bad(f"armed timeout on state {_short(st)}, which is not active")
        if type(name) is not str or not any(ts.name == name for ts in nodes[st].timeouts):
            raise bad(f"state {nodes[st].id!r} declares no timeout named {name!r}")
        if type(tord) is not int or not 0 < tord <= ordinal:
            raise bad(f"timeout ordinal {_short(tord)} is not within the session's ordinal {ordinal}")
        if send_id is None:
            send_id = f"sb.timeout.{nodes[st].id}.{name}"
        elif type(send_id) is not str:
            raise bad("timeout send_id must be a string")
        if at_ms is not None and (type(at_ms) is not int or not _MIN_MS <= at_ms <= _MAX_MS):
            raise bad("timeout at_ms must be a 64-bit integer")
        if (st, name) in armed:
            raise bad(f"timeout {name!r} of state {nodes[st].id!r} is armed twice")
        armed.add((st, name))
        timeouts.append(ArmedTimeout(st, name, tord, send_id, at_ms))
    return tuple(timeouts)


def _check_invocations(nodes: Any, invocations_in: Any, active: AbstractSet[int]) -> tuple[Invocation, ...]:
    bad = _bad
    invocations = []
    running_ids: set[str] = set()
    invoked: set[tuple[int, int]] = set()
    for inv in _seq(invocations_in, "invocations"):
        if type(inv) not in (list, tuple) or len(inv) != 4:
            raise bad("an invocation entry is [invokeid, state, index, autoforward]")
        iid, st, k, af = inv
        if type(iid) is not str:
            raise bad("invokeid must be a string")
        if type(st) is not int or st not in active:
            raise bad(f"invocation {_short(iid)} refers to state {_short(st)}, which is not active")
        if type(k) is not int or not 0 <= k < len(nodes[st].invokes):
            raise bad(f"invocation {_short(iid)}: state {nodes[st].id!r} has no invoke #{_short(k)}")
        if type(af) is not bool:
            raise bad("autoforward must be a boolean")
        if iid in running_ids or (st, k) in invoked:
            raise bad(f"invocation {_short(iid)} (state {nodes[st].id!r}, invoke #{k}) is recorded twice")
        running_ids.add(iid)
        invoked.add((st, k))
        invocations.append(Invocation(iid, st, k, af))
    return tuple(invocations)


# --------------------------------------------------------------------------- export / import


def export(pos: Position) -> dict[str, Any]:
    """A plain dict keyed by state *ids* (not indices), for moving to a revised chart.

    The ``<scxml>`` root appears as ``""`` in ``initialized`` (late binding). Per-driver
    fields are not included. Feed the dict (after :func:`remap`, if states were renamed)
    to :meth:`Position.import_ <statebound.Position.import_>`.
    """
    st = pos.chart.states
    return {
        "format": FORMAT_VERSION,
        "chart": {"name": pos.chart.name, "version": pos.chart.version, "identity": pos.chart.identity},
        "session_id": pos.session_id,
        "status": pos.status,
        "configuration": [st[i].id for i in pos.states],
        "history": {st[h].id: [st[i].id for i in rec] for h, rec in pos.history},
        "datamodel": unpack_vars(pos.data),
        "counters": {"macrostep": pos.macrostep, "send_counter": pos.send_counter,
                     "ordinal": pos.ordinal, "invoke_counter": pos.invoke_counter},
        "invocations": [{"invokeid": i.invokeid, "state": st[i.state].id, "index": i.index,
                         "autoforward": i.autoforward} for i in pos.invocations],
        "timeouts": [{"state": st[t.state].id, "name": t.name, "ordinal": t.ordinal,
                      "send_id": t.send_id, "at_ms": t.at_ms} for t in pos.timeouts],
        "parent": pos.parent,
        "invokeid": pos.invokeid,
        "initialized": [st[i].id for i in pos.initialized],
    }


def remap(data: Mapping[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """Return a copy of :func:`export` output with state ids renamed by ``mapping`` ({old: new}).

    Ids not in ``mapping`` are kept. Only state ids change; everything else is copied.
    """
    def m(i: Any) -> Any:
        return mapping.get(i, i) if isinstance(i, str) else i

    out = dict(data)
    out["configuration"] = [m(i) for i in data.get("configuration", ())]
    out["history"] = {m(h): [m(i) for i in rec] for h, rec in dict(data.get("history") or {}).items()}
    out["invocations"] = [{**inv, "state": m(inv.get("state"))} if isinstance(inv, Mapping) else inv
                          for inv in data.get("invocations") or ()]
    out["timeouts"] = [{**t, "state": m(t.get("state"))} if isinstance(t, Mapping) else t
                       for t in data.get("timeouts") or ()]
    out["initialized"] = [m(i) for i in data.get("initialized") or ()]
    return out


def import_(data: Mapping[str, Any], chart: Chart, *, mapping: Mapping[str, str] | None = None) -> Position:
    """Build a position on ``chart`` from :func:`export` output, by state id.

    Every unknown id is collected and reported in one :class:`MigrationError`; then the
    result is checked exactly like a decoded blob (legal configuration, history,
    invocations and timeouts on ``chart``).

    :param mapping: optional ``{old_id: new_id}`` renames, applied first (see :func:`remap`).
    :raises UnsupportedFormatVersion: ``data["format"]`` is not one this code reads.
    :raises MigrationError: unknown ids, a malformed dict, or a result illegal on ``chart``.
    """
    if not isinstance(data, Mapping):
        raise MigrationError(chart, problems=(f"an export is a mapping, not {type(data).__name__}",))
    fmt = data.get("format")
    if fmt not in READABLE_VERSIONS:
        raise UnsupportedFormatVersion(fmt if type(fmt) is int else -1, sorted(READABLE_VERSIONS))
    try:
        if mapping:
            data = remap(data, mapping)
        return _import(data, chart)
    except MigrationError:
        raise
    except CorruptPosition as exc:
        raise MigrationError(chart, problems=(f"not a legal position on chart {chart.name!r}: {exc}",)) \
            from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MigrationError(chart, problems=(f"malformed export: {type(exc).__name__}: {exc}",)) from None


def _import(data: Mapping[str, Any], chart: Chart) -> Position:
    unknown: list[str] = []
    by_id = chart._by_id

    def idx(i: Any, root_ok: bool = False) -> int:
        if root_ok and i == "":
            return 0
        if not isinstance(i, str) or i not in by_id or i == "":
            if i not in unknown:
                unknown.append(i)
            return -1
        return by_id[i]

    states = sorted(idx(i) for i in data["configuration"])
    history = sorted((idx(h), tuple(idx(i) for i in rec)) for h, rec in dict(data.get("history") or {}).items())
    invocations = [(inv["invokeid"], idx(inv["state"]), inv.get("index", 0), bool(inv.get("autoforward")))
                   for inv in data.get("invocations") or ()]
    timeouts = [(idx(t["state"]), t["name"], t["ordinal"], t.get("send_id"), t.get("at_ms"))
                for t in data.get("timeouts") or ()]
    initialized = sorted(idx(i, root_ok=True) for i in data.get("initialized") or ())
    if unknown:
        raise MigrationError(chart, unknown_ids=tuple(unknown))

    status = data["status"]
    if status not in _STATUS_CODE:
        raise MigrationError(chart, problems=(f"unknown status {status!r}",))
    session_id = data["session_id"]
    if type(session_id) is not str:
        raise MigrationError(chart, problems=("session_id must be a string",))
    values = dict(data.get("datamodel") or {})
    why = check_stored(chart.datamodel, values)
    if why is not None:
        raise MigrationError(chart, problems=(f"datamodel: {why}",))
    try:
        packed = pack_vars(values)
    except SerializationError as exc:
        raise MigrationError(chart, problems=(str(exc),)) from None
    c = dict(data.get("counters") or {})
    counters = [_int(c.get(k, 0), k) for k in ("macrostep", "send_counter", "ordinal", "invoke_counter")]
    return _assemble(chart, session_id, status, states, packed, counters, history, timeouts, invocations,
                     initialized, _opt_str(data.get("parent"), "parent"),
                     _opt_str(data.get("invokeid"), "invokeid"))


# --------------------------------------------------------------------------- diff


@dataclass(frozen=True, slots=True)
class ChartDiff:
    """How positions of one chart revision relate to another (see :func:`diff`).

    :ivar kind: ``"identical"``, ``"compatible"``, ``"mapped"`` or ``"breaking"``.
    :ivar reasons: human-readable sentences: what blocks migration for ``"breaking"``,
        otherwise notes on what changed.
    """

    kind: str
    reasons: tuple[str, ...] = ()

    @property
    def migratable(self) -> bool:
        """True unless ``kind == "breaking"``: export/import (with the mapping) will work."""
        return self.kind != "breaking"


def _kind(node: StateNode) -> str:
    # Shallow and deep history record different things, so they count as different kinds.
    return f"history({node.history_type})" if node.kind == "history" else node.kind


def diff(old_chart: Chart, new_chart: Chart, mapping: Mapping[str, str] | None = None) -> ChartDiff:
    """Compare two revisions of a chart by state id, to decide how to migrate positions.

    * ``"identical"``: same identity; blobs load on either chart unchanged.
    * ``"compatible"``: every state of ``old_chart`` exists in ``new_chart`` with the same
      kind and parent, so ``Position.import_(pos.export(), new_chart)`` works as is (but see
      the notes on timeouts and invokes below).
    * ``"mapped"``: compatible once ``mapping`` ({old_id: new_id}) renames are applied.
    * ``"breaking"``: some old states have no counterpart, or changed kind or parent
      (or a parallel state gained a region), so some positions cannot move.

    A state that no longer declares a named ``<sb:timeout>``, or has fewer ``<invoke>`` elements,
    leaves the verdict as it is and adds a note: only a position holding that timeout or
    invocation cannot move, and ``import_`` refuses it alone (``MigrationError``).

    :return: a :class:`ChartDiff` whose ``reasons`` say what differs.
    """
    if old_chart.identity == new_chart.identity:
        return ChartDiff("identical", ())
    mapping = dict(mapping or {})
    blocking: list[str] = []
    notes: list[str] = []
    renamed = False
    old_ids = set(old_chart.state_ids)
    for k in mapping:
        if k not in old_ids:
            blocking.append(f"mapping renames {k!r}, which the old chart does not have")
    targets: dict[str, str] = {}
    for node in old_chart.states[1:]:
        nid = mapping.get(node.id, node.id)
        if not new_chart.has_state(nid):
            if node.id in mapping:
                blocking.append(f"state {node.id!r} is mapped to {nid!r}, which the new chart does not have")
            else:
                blocking.append(f"state {node.id!r} is gone from the new chart (map it to a new id?)")
            continue
        if nid != node.id:
            renamed = True
            notes.append(f"state {node.id!r} becomes {nid!r}")
        if nid in targets:
            blocking.append(f"states {targets[nid]!r} and {node.id!r} both map to {nid!r}")
        targets[nid] = node.id
        new = new_chart.state(nid)
        if _kind(new) != _kind(node):
            blocking.append(f"state {node.id!r} changed kind: {_kind(node)} -> {_kind(new)}")
        old_parent = old_chart.states[node.parent].id if node.parent else ""
        want = mapping.get(old_parent, old_parent) if old_parent else ""
        got = new_chart.states[new.parent].id if new.parent else ""
        if got != want:
            blocking.append(f"state {node.id!r} moved: parent {old_parent or '<scxml>'!r} -> {got or '<scxml>'!r}")
        if node.kind == "parallel" and new.kind == "parallel" and len(new.children) > len(node.children):
            blocking.append(f"parallel state {node.id!r} gained region(s): positions inside it would lack them")
        # A position in the state may hold one of its timeouts or invocations, which import_
        # checks against the new state's declarations by name and by index. Only such
        # positions are stuck (the others move), so this is a note, not a block.
        for t in node.timeouts:
            if not any(n.name == t.name for n in new.timeouts):
                notes.append(f"state {node.id!r} no longer declares <sb:timeout> {t.name!r}: a position "
                             "waiting on it cannot move")
        if len(new.invokes) < len(node.invokes):
            notes.append(f"state {node.id!r} has {len(new.invokes)} <invoke>(s), not {len(node.invokes)}: a "
                         "position with one of the last ones running cannot move")
    for nid in new_chart.state_ids:
        if nid not in targets:
            notes.append(f"state {nid!r} is new")
    old_data = {d.id for s in old_chart.states for d in s.data}
    new_data = {d.id for s in new_chart.states for d in s.data}
    for d in sorted(new_data - old_data):
        notes.append(f"<data id={d!r}> is new: imported positions lack it until you set it in the export")
    for d in sorted(old_data - new_data):
        notes.append(f"<data id={d!r}> is gone: imported positions still carry it")
    if old_chart.datamodel != new_chart.datamodel:
        blocking.append(f"datamodel changed: {old_chart.datamodel} -> {new_chart.datamodel}")
    if blocking:
        return ChartDiff("breaking", tuple(blocking + notes))
    return ChartDiff("mapped" if renamed else "compatible", tuple(notes))


register_codec(sys.modules[__name__])
