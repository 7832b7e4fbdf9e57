"""Moving a stored instance onto a new chart revision, in its own conditional commit.

:meth:`Host.migrate <statebound.Host.migrate>` is the one-instance step of a bulk migration
(``statebound migrate --chart NAME --to new.scxml``). It uses the rules of
``docs/persistence.md``: :func:`~statebound.diff` decides whether the old revision can move
at all, then ``export()`` and ``Position.import_()`` carry the position across by state id.

The new blob is committed **conditional on the version loaded**, with the instance's timer
refs and parent unchanged, so a concurrent event is never lost: if it commits first, the
migration reloads and moves the newer position; if the migration commits first, the event's
host reloads and drives the moved position, on the new revision (which it must have
registered). Timer rows are left as they are: they are keyed by ordinal, and named
timeouts keep their ordinals (their generations) in the moved position, so they fire, or
are recognised as stale, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..chart.model import Chart
from ..exceptions import ConflictError, PositionError, StateboundError
from ..interpreter import Position
from ..position import ChartDiff, diff, import_, read_header
from .store import Commit, HistoryRecord, PositionRecord, PositionWrite, live

if TYPE_CHECKING:
    from .host import Host

__all__ = ["MigrationResult", "migrate", "MOVED", "ALREADY", "GONE", "UNKNOWN_REVISION", "BREAKING",
           "FAILED", "CONFLICT", "WOULD_MOVE"]

#: What happened to one instance in a migration (``MigrationResult.outcome``).
MOVED = "moved"
ALREADY = "already"                 # on the target revision already (a resumed run)
GONE = "gone"                       # deleted since it was listed
UNKNOWN_REVISION = "unknown-revision"
BREAKING = "breaking"               # diff() says its revision cannot move
FAILED = "failed"                   # import_ refused this position, or its blob is damaged
CONFLICT = "conflict"               # kept losing to concurrent commits
WOULD_MOVE = "would-move"           # a dry run's "moved"


@dataclass(frozen=True, slots=True)
class MigrationResult:
    """What :meth:`Host.migrate` did with one instance.

    :ivar outcome: one of ``moved``, ``already``, ``gone``, ``unknown-revision``,
        ``breaking``, ``failed``, ``conflict`` or (dry run) ``would-move``.
    :ivar reason: why it did not move, or the kind of diff when it did.
    :ivar from_identity: the revision it was on, when known.
    """

    instance_id: str
    outcome: str
    reason: str | None = None
    from_identity: str | None = None

    @property
    def moved(self) -> bool:
        """True when the instance is (or, in a dry run, would be) on the new revision."""
        return self.outcome in (MOVED, ALREADY, WOULD_MOVE)


def _carried(rec: PositionRecord) -> dict[str, Any]:
    """The record's fields a migration keeps as they are (timer refs, parent, and whatever
    else a backend keeps beside the position), by name, so none is silently reset."""
    fixed = {"instance_id", "chart", "expected_version", "blob", "status"}
    return {f.name: getattr(rec, f.name) for f in fields(PositionWrite)
            if f.name not in fixed and hasattr(rec, f.name)}


def _mapping_for(old: Chart, mapping: Mapping[str, str] | None) -> dict[str, str] | None:
    # One --map serves several old revisions: each gets the renames of ids it has.
    if not mapping:
        return None
    return {k: v for k, v in mapping.items() if old.has_state(k)} or None


def migrate(host: Host, instance_id: str, chart: Chart, *, mapping: Mapping[str, str] | None = None,
            dry_run: bool = False, diffs: dict[str, ChartDiff] | None = None) -> MigrationResult:
    """See :meth:`Host.migrate`. ``diffs`` caches one diff per (old, new) revision pair across
    calls that use the same ``mapping``."""
    diffs = {} if diffs is None else diffs
    for _ in range(host.max_conflict_retries):
        rec = live(host.store.load(instance_id))
        if rec is None:
            return MigrationResult(instance_id, GONE, "deleted since it was listed")
        try:
            identity = read_header(rec.blob).identity
        except PositionError as exc:
            return MigrationResult(instance_id, FAILED, str(exc))
        if identity == chart.identity:
            return MigrationResult(instance_id, ALREADY, None, identity)
        old = host._revisions.get(rec.chart, {}).get(identity)
        if old is None:
            return MigrationResult(instance_id, UNKNOWN_REVISION,
                                   f"its revision {identity} of chart {rec.chart!r} is not registered", identity)
        renames = _mapping_for(old, mapping)
        d = diffs.get(identity + chart.identity)
        if d is None:
            d = diffs[identity + chart.identity] = diff(old, chart, renames)
        if not d.migratable:
            return MigrationResult(instance_id, BREAKING, "; ".join(r for r in d.reasons), identity)
        try:
            moved = import_(Position.from_bytes(rec.blob, old).export(), chart, mapping=renames)
            blob = moved.to_bytes(host.codec)
        except StateboundError as exc:
            return MigrationResult(instance_id, FAILED, str(exc).splitlines()[0], identity)
        if dry_run:
            return MigrationResult(instance_id, WOULD_MOVE, d.kind, identity)
        write = PositionWrite(instance_id, chart.name, rec.version, blob, rec.status, **_carried(rec))
        history: tuple[HistoryRecord, ...] = ()
        if host.history is not None:   # replay needs the move: it re-does it with the same mapping
            now = host.clock.now_ms()
            history = (HistoryRecord(
                instance_id, rec.version + 1, now, "migrate", (), tuple(sorted(moved.configuration)), rec.status,
                {}, chart.name, chart.identity, {"op": "migrate", "instance": instance_id}, None,
                {"from": identity, "mapping": renames},
                None if host.history.ttl_s is None else now + host.history.ttl_s * 1000),)
        try:
            host.store.commit(Commit(writes=(write,), history=history,
                                     history_keep=None if host.history is None else host.history.keep))
        except ConflictError:
            host.metrics.add("conflicts")
            continue        # an event committed first: move the newer position
        host.metrics.add("commits")
        return MigrationResult(instance_id, MOVED, d.kind, identity)
    return MigrationResult(instance_id, CONFLICT, f"lost {host.max_conflict_retries} commits in a row to "
                                                  "concurrent events; run the migration again")
