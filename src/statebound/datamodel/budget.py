"""The CPU and memory budget of one drive, or of one host call and every drive it makes.

The interpreter is pure and never reads a clock; a budget does, and lives here, one layer
below, where the datamodels that spend it are (``docs/adr/0017-drive-budget-lives-in-the-datamodel-layer.md``).
The interpreter only calls :meth:`Budget.tick` as it works, and the datamodels check it
around every evaluation; whichever finds it spent raises :class:`BudgetSpent`, which no chart
code can catch. The interpreter then abandons the drive: the position comes back unchanged
with a :class:`~statebound.effects.BudgetExhausted` effect (``Interpreter.start`` raises
:class:`~statebound.exceptions.BudgetExceeded` instead, having no earlier position).

CPU is this thread's CPU time (``time.thread_time``), so a busy neighbour thread does not
eat a drive's budget and sleeping does not spend it. A budget belongs to one thread.
"""

from __future__ import annotations

import time

from ..exceptions import InvalidArgument

__all__ = ["Budget", "BudgetSpent", "DEFAULT_CPU_MS", "DEFAULT_MEMORY_BYTES", "ITEM_BYTES"]

#: CPU one drive (one host call, with a host) may use when nothing else is said.
DEFAULT_CPU_MS = 5_000
#: Bytes of values one drive may bring out of its datamodel, and the ECMAScript heap cap.
DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
#: What one queued event or effect is reckoned to cost, to bound how many a drive makes.
ITEM_BYTES = 1024
#: Ticks between two reads of the clock (a read costs about 0.2 microseconds).
_EVERY = 16

_clock = time.thread_time


class BudgetSpent(BaseException):
    """Internal: the budget ran out; the drive is abandoned.

    A ``BaseException``, so chart code that catches ``Exception`` cannot swallow it (the
    python datamodel lets a chart catch built-in ``Exception`` classes by name only).

    :ivar reason: ``"cpu"`` or ``"memory"``.
    """

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Budget:
    """CPU time and memory for one drive, or for one host call shared by all its drives.

    :param cpu_ms: CPU milliseconds in all; ``None`` for no limit.
    :param memory_bytes: bytes of values the drives may bring out of their datamodel
        (strings, JSON of objects), also the cap of each ECMAScript heap; one event or effect
        counts as :data:`ITEM_BYTES`. ``None`` for no limit.
    """

    __slots__ = ("_countdown", "_held", "_limit", "_t0", "cpu_ms", "max_items", "memory_bytes", "reason",
                 "used_bytes")

    def __init__(self, cpu_ms: int | None = DEFAULT_CPU_MS, memory_bytes: int | None = DEFAULT_MEMORY_BYTES) -> None:
        if cpu_ms is not None and (type(cpu_ms) is not int or cpu_ms < 1):
            raise InvalidArgument(f"cpu_ms must be a positive int or None, not {cpu_ms!r}")
        if memory_bytes is not None and (type(memory_bytes) is not int or memory_bytes < 1024 * 1024):
            raise InvalidArgument(f"memory_bytes must be at least 1 MiB (or None), not {memory_bytes!r}")
        self.cpu_ms = cpu_ms
        self.memory_bytes = memory_bytes
        self.max_items = None if memory_bytes is None else memory_bytes // ITEM_BYTES
        self.used_bytes = 0
        self.reason: str | None = None
        self._limit = None if cpu_ms is None else cpu_ms / 1000
        self._t0: float | None = None
        self._countdown = _EVERY
        self._held: dict[str, int] | None = None

    @classmethod
    def unchecked(cls, cpu_ms: int | None, memory_bytes: int | None) -> Budget:
        """A budget from limits already checked, for one drive: no checks, and the clock starts
        at the first check (a drive short enough never to check never reads the clock)."""
        b = cls.__new__(cls)
        b.cpu_ms = cpu_ms
        b.memory_bytes = memory_bytes
        b.max_items = None if memory_bytes is None else memory_bytes // ITEM_BYTES
        b.used_bytes = 0
        b.reason = None
        b._limit = None if cpu_ms is None else cpu_ms / 1000
        b._t0 = None
        b._countdown = _EVERY
        b._held = None
        return b

    def start(self) -> Budget:
        """Start the clock (the first check starts it too); returns the budget."""
        if self._t0 is None:
            self._t0 = _clock()
        return self

    @property
    def used_s(self) -> float:
        """CPU seconds used since the start."""
        return 0.0 if self._t0 is None else _clock() - self._t0

    def remaining_s(self) -> float | None:
        """CPU seconds left (``None``: no limit). Raises :class:`BudgetSpent` if none are."""
        if self.reason is not None:
            self._raise()
        if self._limit is None:
            return None
        now = _clock()  # one read: this runs before every call into JS
        if self._t0 is None:
            self._t0 = now
        left = self._limit - (now - self._t0)
        if left <= 0:
            self.reason = "cpu"
            self._raise()
        return left

    @property
    def spent(self) -> bool:
        """Whether the budget has run out (reads the clock; never raises)."""
        if self.reason is None and self._limit is not None and self._t0 is not None \
                and _clock() - self._t0 >= self._limit:
            self.reason = "cpu"
        return self.reason is not None

    def check(self) -> None:
        """Raise :class:`BudgetSpent` if the budget has run out (reads the clock)."""
        if self._t0 is None:
            self._t0 = _clock()
        elif self.spent:
            self._raise()

    def tick(self) -> None:
        """A unit of work was done: :meth:`check` once every few ticks."""
        self._countdown -= 1
        if self._countdown <= 0:
            self._countdown = _EVERY
            self.check()

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` brought out of a datamodel; raise :class:`BudgetSpent` past the cap."""
        self.used_bytes += nbytes
        if self.memory_bytes is not None and self.used_bytes > self.memory_bytes:
            self.reason = self.reason or "memory"
            self._raise()

    def hold(self, key: str, nbytes: int) -> None:
        """Count a session's stored datamodel (``nbytes``): a host call keeps every session it
        touched until it commits, so what counts is the most each one held, added up."""
        held = self._held if self._held is not None else {}
        self._held = held
        grown = nbytes - held.get(key, 0)
        if grown > 0:
            held[key] = nbytes
            self.charge(grown)

    def memory_mark(self) -> tuple[int, dict[str, int] | None]:
        """What the budget has counted of memory so far, for :meth:`rewind_memory`."""
        return self.used_bytes, None if self._held is None else dict(self._held)

    def rewind_memory(self, mark: tuple[int, dict[str, int] | None] | None) -> None:
        """Forget the memory counted since ``mark`` (``None``: since the start), for work
        that is thrown away and done again: counted twice, a value the drive brings out
        once would cost it twice. The CPU spent stays spent."""
        self.used_bytes, self._held = mark if mark is not None else (0, None)

    def check_items(self, count: int) -> None:
        """Raise :class:`BudgetSpent` when a drive holds more than ``max_items`` events and effects."""
        if self.max_items is not None and count > self.max_items:
            self.reason = self.reason or "memory"
            self._raise()

    def _raise(self) -> None:
        if self.reason == "cpu":
            raise BudgetSpent("cpu", f"the drive used its CPU budget ({self.cpu_ms} ms)")
        raise BudgetSpent("memory", f"the drive used its memory budget ({self.memory_bytes} bytes of values, "
                                    f"or {self.max_items} events and effects)")

    def __repr__(self) -> str:
        return (f"Budget(cpu_ms={self.cpu_ms}, memory_bytes={self.memory_bytes}, used_s={self.used_s:.3f}, "
                f"used_bytes={self.used_bytes}, reason={self.reason!r})")
