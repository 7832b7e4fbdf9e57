"""The ``ecmascript`` datamodel (W3C SCXML §B.2), run in a QuickJS sandbox.

Install it with the extra: ``pip install 'statebound[ecmascript]'`` (the ``quickjs-ng``
binding of the maintained QuickJS fork). A chart opts in with ``datamodel="ecmascript"``.

What a chart sees
-----------------
* Every ``<data>`` is a global variable; ``expr``/``cond``/``*expr`` are ECMAScript
  expressions, ``location`` an assignment target and ``<script>`` a program run in the
  global scope (sloppy mode, ``var`` and function declarations become globals).
* ``_event`` (``name type sendid origin origintype invokeid data``; blank fields are
  ``undefined``), ``_sessionid``, ``_name``, ``_ioprocessors`` and ``In(stateId)``.
  They are read-only: assigning to one raises ``error.execution``.
* Inline content that is JSON arrives as the JSON value; XML content becomes a small
  read-only DOM (``getElementsByTagName``, ``getAttribute``, ``childNodes``,
  ``textContent`` ...), stored as its XML text.
* The built-ins are frozen, because every session of a thread shares them: changing one
  (``Array.prototype.push = f``, ``Math.max = f``) fails, silently in sloppy code as
  JavaScript does for frozen objects, with a ``TypeError`` for a prototype's own methods.
  Giving your own objects such a property still works (``Foo.prototype.toString = f``
  makes an own property). Standard globals can be overwritten (``var JSON = 1``) but not
  deleted or redefined; promise jobs never run.

Sandbox
-------
Each thread keeps one QuickJS realm, set up once, with every built-in frozen; before each
drive it is wiped of what the last drive left (:mod:`.realm`,
``docs/adr/0024-one-frozen-quickjs-realm-per-thread.md``). A drive gets a memory cap, a
CPU-time cap per evaluation and a stack cap (:class:`Limits`, :func:`set_limits`), and spends the drive's
:class:`~statebound.datamodel.budget.Budget`: the time limit of each call into JS is what is
left of it when that is less than the cap. The runtime has no
module loader, no ``std``/``os`` modules and no Python callbacks: an expression can
reach nothing but the variables of its own session. An infinite loop is interrupted
when the time cap expires and an allocation over the memory cap fails; both become
``error.execution`` events, and the realm they happened in is replaced. Exceptions are always described by native code (the error
constructors are frozen), so a hostile ``toString`` cannot hang the host.

Persistence
-----------
Between drives the variables are stored as JSON-compatible values: objects are stored as
``JSON.stringify`` would store them (their own enumerable properties; ``undefined`` is
``null``), ``NaN`` and ``±Infinity`` are kept. Values that cannot be stored are refused:
functions, symbols, BigInts, ``Map``, ``Set``, typed arrays, ``RegExp``, ``Error``,
promises, cycles. ``<assign>`` and ``<data>`` refuse them at once (``error.execution``);
a value smuggled in by a ``<script>`` (a looping ``toJSON``, getter or Proxy included) is
put back by the commit as it was before the drive, with ``error.execution``.

Functions are code, not data. The functions the chart defines at its top level -- in the
root ``<script>``, or as a root ``<data expr="function ...">`` -- are not stored: on every
load, after the stored variables are installed, the top-level ``<script>`` runs again and
the function ``<data>`` are evaluated again, then the stored variables are installed once
more (so stored data always wins). Any other function reaching a variable is refused.

Modules: :mod:`.context` (the datamodel and a drive's context), :mod:`.realm` (the QuickJS
bridge), :mod:`.prelude` (the JavaScript side), :mod:`.values` (the JSON value mapping),
:mod:`.limits`.
"""

from __future__ import annotations

from typing import Any

from . import limits as _limits
from .context import EcmaScriptContext, EcmaScriptDatamodel
from .limits import Limits, get_limits, set_default_limits, set_limits
from .values import JSValue, Unstorable

__all__ = ["EcmaScriptDatamodel", "EcmaScriptContext", "Limits", "DEFAULT_LIMITS", "set_limits",
           "get_limits", "set_default_limits", "BINDING", "JSValue", "Unstorable"]

#: The PyPI distribution that provides the ``quickjs`` module used here.
BINDING = "quickjs-ng"


def __getattr__(name: str) -> Any:
    # DEFAULT_LIMITS is read where set_default_limits writes it, so it is never stale here
    if name == "DEFAULT_LIMITS":
        return _limits.DEFAULT_LIMITS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
