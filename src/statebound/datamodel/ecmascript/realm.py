"""The QuickJS bridge: one locked-down realm per thread, wiped and reused by every drive.

Starting a QuickJS runtime and evaluating the prelude costs about 1.5 ms, thirty times a
python drive, so a realm is made once per thread and then lent to one drive at a time
(``docs/adr/0024-one-frozen-quickjs-realm-per-thread.md``):

* **Frozen.** The prelude freezes every shared object (:mod:`.prelude`): no drive can change
  a built-in another drive will see.
* **Wiped.** Before each drive, ``reset`` deletes the globals the last drive added, puts
  back the standard globals it overwrote and clears the prelude's per-drive state. A realm
  that cannot be wiped (a global made non-configurable, a non-extensible global object) is
  replaced, never reused.
* **Budgeted per drive.** The time and stack limits are set for each drive, and the memory
  limit is the realm's own size plus :data:`SLACK_BYTES` plus the drive's cap. The wipe
  runs under the realm's size plus :data:`SLACK_BYTES` alone, so a realm still holding more
  (garbage QuickJS has not collected yet, say) fails it and is replaced: one session's
  leftovers never make another's drive run out of memory.
* **Replaced after a breach.** A call that ends in an exception no JS code could catch (the
  time limit, memory running out inside the dispatcher) retires its realm; the next drive
  gets a fresh one. (Running out of memory inside chart code is an ordinary error: what the
  drive allocated is freed by the wipe, or the tight wipe fails and the realm is replaced.)
* **Lent to one context.** A realm belongs to the context using it until that context is
  gone (a weak reference); a second context open at the same time gets a realm of its own.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import quickjs

from ...exceptions import EvaluationError
from .prelude import PRELUDE

__all__ = ["Realm", "acquire", "SLACK_BYTES", "CACHE_BYTES", "POOL_SIZE", "realms_made"]

#: What a realm may carry into a drive on top of its own size: garbage of earlier drives
#: (QuickJS collects cycles only now and then), compiled expressions, registered symbols and
#: promise jobs that never run. Past it, the realm is replaced.
SLACK_BYTES = 1024 * 1024
#: What compiled expressions and scripts may add to a realm before it is replaced (and its
#: cache with it): a process that loads charts without end must not grow without end.
CACHE_BYTES = 32 * 1024 * 1024
#: Realms a thread keeps: one per context open at the same time (nested drives are rare).
POOL_SIZE = 4
#: Time and memory the prelude may take to set a realm up (about 2 ms and 0.5 MiB).
_SETUP_TIME_S = 10.0
_SETUP_MEMORY = 64 * 1024 * 1024

_local = threading.local()
_made = [0]
# Realms are made by every thread: the count and the serial are taken together, or two
# threads' realms could share a serial and one run the other's compiled keys.
_made_lock = threading.Lock()


def realms_made() -> int:
    """How many realms this process has set up (tests count them: reuse is the point)."""
    return _made[0]


class Realm:
    """One QuickJS runtime with the prelude evaluated and its intrinsics frozen."""

    __slots__ = ("__weakref__", "call", "fresh", "js", "keys", "owner", "reseed", "retired", "scripts", "serial",
                 "size")

    def __init__(self) -> None:
        js = quickjs.Context()
        js.set_time_limit(_SETUP_TIME_S)
        js.set_memory_limit(_SETUP_MEMORY)
        try:
            self.call = js.eval(PRELUDE)
        except Exception as exc:
            raise EvaluationError(f"the ECMAScript sandbox could not start: {str(exc).splitlines()[0]}") from None
        with _made_lock:
            _made[0] += 1
            #: this realm's number in the process (caches keyed by it never mistake another realm for it)
            self.serial = _made[0]
        self.js = js
        #: bytes the realm takes when nothing runs in it: as set up, plus an estimate of what
        #: its compiled expressions and scripts hold (see :meth:`cached`)
        self.size = self.fresh = js.memory()["malloc_size"]
        #: (kind, source) -> key of the compiled expression in the realm
        self.keys: dict[tuple[str, str], int] = {}
        #: source -> key of a ``<script>`` the realm holds
        self.scripts: dict[str, int] = {}
        self.owner: Any = None
        #: why the realm must not be lent again (a drive breached a limit in it)
        self.retired: str | None = None
        #: Math.random was drawn from since it was seeded: the next drive brings a new seed
        self.reseed = True

    def wipe(self, time_s: float, stack_bytes: int) -> bool:
        """Make the realm ready for a new drive; ``False`` when it must be replaced instead.

        ``reset`` frees what the last drive left before it allocates anything, under a limit
        of the realm's size plus :data:`SLACK_BYTES`: if that fails, the realm holds more
        than it should (garbage QuickJS has not collected yet, or values of a drive that
        ended before listing them), and a fresh realm is cheaper than finding out which.
        """
        if self.retired is not None or self.size - self.fresh > CACHE_BYTES:
            return False
        js = self.js
        js.set_time_limit(time_s)
        js.set_max_stack_size(stack_bytes)
        js.set_memory_limit(self.size + SLACK_BYTES)
        try:
            r = self.call("reset")
        except Exception:  # out of memory under the tight limit, or interrupted
            return False
        self.reseed = r == "r"
        return r in ("", "r")

    def lend(self, owner: Any, heap_bytes: int) -> None:
        """Give the realm to ``owner`` (a context) with a heap of ``heap_bytes`` for its drive."""
        self.owner = weakref.ref(owner)
        self.heap(heap_bytes)

    def heap(self, heap_bytes: int) -> None:
        """Let the drive's heap hold ``heap_bytes`` (on top of the realm and its slack)."""
        self.js.set_memory_limit(self.size + SLACK_BYTES + heap_bytes)

    def seed(self) -> str | None:
        """A new seed for Math.random when the last drive drew from it (``begin`` takes it)."""
        if not self.reseed:
            return None
        self.reseed = False
        return os.urandom(16).hex()

    def cached(self, nbytes: int) -> None:
        """Count ``nbytes`` the realm now keeps for good (a compiled expression, a script).

        Measured: a compiled expression takes about 500 bytes plus 16 per character of
        source; estimating beats measuring, which walks the whole heap.
        """
        self.size += nbytes


def acquire(owner: Any, *, heap_bytes: int, time_s: float, stack_bytes: int) -> Realm:
    """A wiped realm of this thread for ``owner``'s drive (a new one when none is free)."""
    pool: list[Realm] | None = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = []
    slot = None
    for i, r in enumerate(pool):
        o = r.owner
        if o is None or o() is None:
            slot = i
            break
    realm = pool[slot] if slot is not None else None
    if realm is None or not realm.wipe(time_s, stack_bytes):
        realm = Realm()
        realm.js.set_time_limit(time_s)
        realm.js.set_max_stack_size(stack_bytes)
        if slot is not None:
            pool[slot] = realm
        elif len(pool) < POOL_SIZE:
            pool.append(realm)
    realm.lend(owner, heap_bytes)
    return realm
