"""The ``python`` datamodel (the default), for trusted charts only.

Expressions are Python expressions, ``<script>`` bodies are Python statements, and the
variables live in one namespace per drive. Every expression of a chart is compiled once,
when the chart is first prepared.

Safety: builtins are an allow-list (``getattr``/``hasattr`` take real ``str`` names only,
``type`` cannot build classes) and any name or attribute starting with ``__`` (and the
frame/code attributes used to escape sandboxes) is refused at compile time, as are
``str.format`` fields that reach into objects, ``import``, ``class``, ``with``, ``finally``
and ``except`` clauses naming anything but a built-in exception class. That closes the
known escapes, but Python's ``eval`` is **not** a security boundary: a chart loaded with
``trust="untrusted"`` may not use this datamodel at all (``docs/security.md``). Event data
is never evaluated.
"""

from __future__ import annotations

import ast
import builtins
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from ..chart.model import Chart, Expr
from ..exceptions import EvaluationError
from .base import _INT_END, _INT_MIN, _PLAIN, SYSTEM_VARIABLES, EventView, check_serializable
from .budget import Budget

__all__ = ["PythonDatamodel", "SAFE_BUILTINS"]

_ALLOWED = ["abs", "all", "any", "bool", "bytes", "callable", "chr", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "getattr", "hasattr", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "ord", "pow", "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip", "True", "False", "None", "ArithmeticError", "AttributeError", "Exception", "IndexError", "KeyError", "LookupError", "NameError", "TypeError", "ValueError", "ZeroDivisionError"]
_FORBIDDEN_ATTRS = frozenset({
    "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "f_globals", "f_locals",
    "f_builtins", "f_back", "f_code", "tb_frame", "tb_next", "co_code", "func_globals", "mro",
    "format_map",
})
#: The exception classes a ``<script>`` may name in ``except``. Handlers are rewritten to
#: reach them under a dunder alias no chart can rebind (see :func:`_rewrite_handlers`).
_EXCEPTIONS = tuple(n for n in _ALLOWED if n.endswith("Error") or n == "Exception")
_ALIAS = "__sb_exc_"


def _refused(name: object) -> bool:
    # Only a real str is a name: a str subclass could answer startswith() and == as it likes.
    # "format" too: reached through getattr, the template is never checked (see _format_fields).
    return type(name) is not str or name.startswith("_") or name in _FORBIDDEN_ATTRS or name == "format"


def _safe_getattr(obj: Any, name: str, *default: Any) -> Any:
    """``getattr`` that refuses the names the compile-time check refuses (no string escapes)."""
    if _refused(name):
        raise AttributeError(f"attribute {name!r} is not allowed" if type(name) is str
                             else f"an attribute name must be a str, not {type(name).__name__}")
    return getattr(obj, name, *default)


def _safe_hasattr(obj: Any, name: str) -> bool:
    """``hasattr`` that never looks up a refused name."""
    return not _refused(name) and hasattr(obj, name)


def _safe_type(obj: Any, *more: Any) -> type:
    """``type(x)``; the three-argument form would let a chart build classes with hooks of its own.

    So would the type of a class: ``type(int)`` is the real ``type``, three arguments and all.
    """
    if more:
        raise TypeError("type() may not create classes in a chart")
    t = type(obj)
    if issubclass(t, type):
        raise TypeError("type() of a class is not allowed in a chart (it would create classes)")
    return t


#: The builtins expressions may use.
SAFE_BUILTINS: dict[str, Any] = {n: getattr(builtins, n) for n in _ALLOWED}
SAFE_BUILTINS["getattr"] = _safe_getattr
SAFE_BUILTINS["hasattr"] = _safe_hasattr
SAFE_BUILTINS["type"] = _safe_type
SAFE_BUILTINS.update({_ALIAS + n: getattr(builtins, n) for n in _EXCEPTIONS})

# Statements a chart has no use for, each of which would run chart code while an exception
# (the CPU budget's, see budget.py) unwinds: finally blocks, context managers, except*.
_REFUSED_NODES: dict[type, str] = {
    ast.Import: "import", ast.ImportFrom: "import", ast.Global: "global", ast.Nonlocal: "nonlocal",
    ast.With: "with", ast.AsyncWith: "async with", ast.AsyncFor: "async for",
    ast.AsyncFunctionDef: "async def", ast.Await: "await", ast.ClassDef: "class",
}
if hasattr(ast, "TryStar"):
    _REFUSED_NODES[ast.TryStar] = "except*"


def _bound_names(node: ast.AST) -> list[str]:
    """Identifiers a node binds (or deletes) other than through an ``ast.Name``."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.ExceptHandler):
        return [node.name] if node.name else []
    if isinstance(node, (ast.MatchAs, ast.MatchStar)):
        return [node.name] if node.name else []
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    return []


def _check_safe(tree: ast.AST) -> str | None:
    for node in ast.walk(tree):
        refused = _REFUSED_NODES.get(type(node))
        if refused is not None:
            return f"{refused} is not allowed"
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return f"name {node.id!r} is not allowed"
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in _FORBIDDEN_ATTRS):
            return f"attribute {node.attr!r} is not allowed"
        if isinstance(node, ast.MatchClass):  # case C(attr=...) reads attributes by name
            for attr in node.kwd_attrs:
                if attr.startswith("_") or attr in _FORBIDDEN_ATTRS:
                    return f"attribute {attr!r} is not allowed"
        for bound in _bound_names(node):
            if bound.startswith("__"):
                return f"name {bound!r} is not allowed"
        if isinstance(node, ast.Try):
            if node.finalbody:
                return "finally is not allowed"
            for h in node.handlers:
                bad = _handler_problem(h)
                if bad:
                    return bad
        if isinstance(node, ast.Attribute) and node.attr == "format":
            bad = _format_fields(node.value)
            if bad:
                return bad
    return None


def _handler_problem(h: ast.ExceptHandler) -> str | None:
    """A handler may name built-in exception classes only: a bare ``except:`` or a computed
    class could swallow the CPU budget's exception, or replace it with a new one."""
    names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
    for n in names:
        if not (isinstance(n, ast.Name) and n.id in _EXCEPTIONS):
            return ("a bare except is not allowed" if n is None else
                    f"except may name only built-in exception classes ({', '.join(_EXCEPTIONS)})")
    return None


class _RewriteHandlers(ast.NodeTransformer):
    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.AST:
        def alias(n: ast.expr) -> ast.expr:
            assert isinstance(n, ast.Name)
            return ast.copy_location(ast.Name(id=_ALIAS + n.id, ctx=ast.Load()), n)
        t = node.type
        if isinstance(t, ast.Tuple):
            node.type = ast.copy_location(ast.Tuple(elts=[alias(e) for e in t.elts], ctx=ast.Load()), t)
        elif t is not None:
            node.type = alias(t)
        self.generic_visit(node)
        return node


def _rewrite_handlers(tree: ast.Module) -> ast.Module:
    """``except ValueError`` -> ``except __sb_exc_ValueError``: a chart can shadow the plain
    name (``ValueError = 1``), which would turn the handler into a TypeError raised while
    the budget's exception unwinds; the alias lives in the builtins, out of its reach."""
    _RewriteHandlers().visit(tree)
    return ast.fix_missing_locations(tree)


def _format_fields(receiver: ast.AST) -> str | None:
    """``str.format`` resolves ``{0.attr}`` and ``{0[key]}`` itself, past the AST check.

    A constant template may use plain fields only, in its format specs too (``{0:{1}}``
    nests a field in the spec); a template computed at run time could hold anything, so
    ``.format`` on it is refused (f-strings and ``%`` are the alternatives).
    """
    if not (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)):
        return "str.format on a computed template is not allowed (use an f-string)"
    todo = [receiver.value]
    while todo:
        template = todo.pop()
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError:
            return None  # a malformed template fails when it runs, as an ordinary error
        for _, field, spec, _ in parts:
            if field and ("." in field or "[" in field):
                return f"format field {{{field}}} reaches into an object; only plain fields are allowed"
            if spec:
                todo.append(spec)
    return None


#: Nodes that can run chart code again and again: each gets a tick of the budget.
_REPEATING = (ast.While, ast.For, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda,
              ast.FunctionDef)
#: The global every tick calls: the drive's ``Budget.tick`` (see :attr:`PythonContext.budget`).
#: A dunder name, so no chart can name, read or rebind it.
_TICK = "__sb_tick"


def _repeats(tree: ast.AST) -> bool:
    return any(isinstance(n, _REPEATING) for n in ast.walk(tree))


class _Ticks(ast.NodeTransformer):
    """Compiles a tick of the drive's budget into chart code wherever it can repeat.

    Every loop body, every function or lambda call and every step of a comprehension calls
    ``__sb_tick()`` first, so the code spends the budget *wherever it runs*: in the
    evaluation that made it, or later, called by another expression, iterated by
    ``<foreach>``, or called back from a builtin (``map``, ``sorted(key=)``). A function keeps
    its globals, which are the drive's namespace, and so the drive's tick. When the budget
    runs out the tick raises ``BudgetSpent``, which no chart handler can catch (handlers name
    built-in ``Exception`` classes only), and which every later tick raises again.
    What this cannot stop is one long call into C: ``10**10**10``, ``sum(range(10**12))``,
    ``any(iter(int, 1))``, ``'x' * 10**10``. See ``docs/security.md``.
    """

    @staticmethod
    def _tick(at: ast.AST) -> ast.Call:
        return ast.copy_location(ast.Call(func=ast.Name(id=_TICK, ctx=ast.Load()), args=[], keywords=[]), at)

    def _prepend(self, node: Any) -> Any:
        self.generic_visit(node)
        node.body.insert(0, ast.copy_location(ast.Expr(value=self._tick(node)), node))
        return node

    visit_While = visit_For = visit_FunctionDef = _prepend

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.generic_visit(node)  # lambda: body  ->  lambda: __sb_tick() or body  (a tick returns None)
        node.body = ast.copy_location(ast.BoolOp(op=ast.Or(), values=[self._tick(node.body), node.body]), node.body)
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        self.generic_visit(node)  # [x for x in xs if c]  ->  [x for x in xs if not __sb_tick() if c]
        node.ifs.insert(0, ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=self._tick(node.iter)), node.iter))
        return node


def _no_tick() -> None:
    """The tick of a drive with no budget."""


def _instrument(tree: Any) -> tuple[Any, bool]:
    """``tree`` with the budget's ticks compiled in, and whether it can repeat at all."""
    if not _repeats(tree):
        return tree, False
    return ast.fix_missing_locations(_Ticks().visit(tree)), True


class _Failed:
    """Stands in for an expression that did not compile; fails when evaluated."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _root_name(target: ast.AST) -> str | None:
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


class PythonDatamodel:
    """The python datamodel prepared for one chart (all expressions compiled).

    Besides the :class:`~statebound.datamodel.base.Datamodel` protocol it offers the
    interpreter one closure per expression (:meth:`evaluator`, :meth:`condition`,
    :meth:`assigner`), built once here, so executable content calls straight into the
    compiled code. :class:`PythonContext`'s methods are the same closures: there is one
    implementation of every check, whichever way it is reached.
    """

    name = "python"

    def __init__(self, chart: Chart) -> None:
        self.chart = chart
        names: set[str] = set()
        #: ids of the expressions that can repeat (and so tick the budget as they run)
        self._repeating: set[int] = set()
        self.code: list[Any] = [self._compile(e, names) for e in chart.expressions]
        #: the system variables some expression of the chart names. No expression can reach
        #: a global it does not name (no ``globals()``, ``vars()`` or ``__`` attributes), so
        #: the others need not be bound: building ``_event`` and ``_ioprocessors`` for every
        #: drive is most of a small chart's datamodel cost.
        self.uses: frozenset[str] = frozenset(names & SYSTEM_VARIABLES)
        #: the names a context binds besides the variables (what :meth:`PythonContext.variables` drops)
        self.bound: tuple[str, ...] = ("__builtins__", _TICK,
                                       *(n for n in ("_sessionid", "_name", "_ioprocessors", "In", "_event")
                                         if n in self.uses))
        self._eval = [_evaluator(e, c) for e, c in zip(chart.expressions, self.code, strict=True)]
        self._cond = [_condition(e, c) for e, c in zip(chart.expressions, self.code, strict=True)]
        self._assign = [_assigner(e, c) for e, c in zip(chart.expressions, self.code, strict=True)]

    def _compile(self, e: Expr, names: set[str]) -> Any:
        try:
            return self._compile_one(e, names)
        except (RecursionError, MemoryError, ValueError):  # nested past what CPython can compile
            return _Failed(f"{e.kind} {e.src[:200]!r} is too deeply nested to compile")

    def _compile_one(self, e: Expr, names: set[str]) -> Any:
        src = e.src.strip() if e.kind != "script" else e.src
        mode = "exec" if e.kind == "script" else "eval"
        try:
            tree = ast.parse(src, mode=mode)
        except SyntaxError as exc:
            return _Failed(f"syntax error in {e.kind} {e.src[:200]!r}: {exc.msg}")
        bad = _check_safe(tree)
        if bad:
            return _Failed(f"{bad} in {e.kind} {e.src!r}")
        names.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
        tree, repeats = _instrument(tree)  # after the checks: they would refuse the tick's name
        if repeats:
            self._repeating.add(e.id)
        if isinstance(tree, ast.Module):  # a <script>: only statements have except clauses
            tree = _rewrite_handlers(tree)
        where = f"<scxml line {e.line}>"
        if e.kind == "location":
            body = tree.body
            if not isinstance(body, (ast.Name, ast.Attribute, ast.Subscript)):
                return _Failed(f"{e.src!r} is not an assignable location")
            root = _root_name(body)
            load = compile(ast.Expression(body=body), where, "eval")
            if isinstance(body, ast.Name):
                return ("name", body.id, None, load)
            stmt = ast.Module(body=[ast.Assign(targets=[ast.fix_missing_locations(
                _as_store(body))], value=ast.Name(id="_sb_value", ctx=ast.Load()), lineno=1)],  # type: ignore[list-item]
                type_ignores=[])
            ast.fix_missing_locations(stmt)
            return ("path", root, compile(stmt, where, "exec"), load)
        return compile(tree, where, mode)

    def evaluator(self, expr: Expr) -> Callable[[PythonContext], Any]:
        """``f(ctx) -> value``: evaluate ``expr``, raising :class:`EvaluationError` on failure."""
        return self._eval[expr.id]

    def condition(self, expr: Expr) -> Callable[[PythonContext], bool]:
        """``f(ctx) -> bool``: evaluate ``expr`` as a condition."""
        return self._cond[expr.id]

    def assigner(self, location: Expr) -> Callable[[PythonContext, Any], None]:
        """``f(ctx, value)``: assign to ``location`` with every check of :meth:`PythonContext.assign`."""
        return self._assign[location.id]

    def repeats(self, expr: Expr) -> bool:
        """Whether ``expr`` compiled to code that can loop (it then ticks the drive's budget, which
        must exist when it runs: see :attr:`PythonContext.budget`)."""
        return expr.id in self._repeating

    def assignment(self, location: Expr, expr: Expr) -> Callable[[PythonContext], None] | None:
        """``f(ctx)``: evaluate ``expr`` and assign it to ``location``, in one closure.

        Exactly ``assigner(location)(ctx, evaluator(expr)(ctx))``, offered where it is
        shorter (a plain variable name); ``None`` elsewhere.
        """
        return _assignment(location, self.code[location.id], expr, self.code[expr.id])

    def open(self, variables: dict[str, Any], session_id: str, name: str,
             ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
             budget: Budget | None = None) -> PythonContext:
        """Open a drive's context; ``variables`` is taken over (not copied)."""
        return PythonContext(self, variables, session_id, name, ioprocessors, in_state, budget)


def _fails(message: str) -> Callable[..., Any]:
    def failed(*_args: Any) -> Any:
        raise EvaluationError(message)
    return failed


#: An object's address in a repr (``<function f at 0x7f...>``): it differs between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _why(exc: Exception) -> str:
    """An exception as error.execution's text: without addresses, since the text becomes event
    data a chart may store, and the same drive must store the same bytes in every process."""
    return f"{type(exc).__name__}: {_ADDRESS.sub('', str(exc))}"


def _failure(src: str, exc: Exception) -> EvaluationError:
    return EvaluationError(f"{src!r}: {_why(exc)}")


def _evaluator(e: Expr, c: Any) -> Callable[[PythonContext], Any]:
    if type(c) is _Failed:
        return _fails(c.message)
    code = c[3] if type(c) is tuple else c  # a location read as a value (namelist, <param location>)
    src = e.src

    def evaluate(ctx: PythonContext) -> Any:
        try:
            return eval(code, ctx.ns)
        except Exception as exc:
            raise _failure(src, exc) from None
    return evaluate


def _condition(e: Expr, c: Any) -> Callable[[PythonContext], bool]:
    if type(c) is _Failed:
        return _fails(c.message)
    code = c[3] if type(c) is tuple else c
    src = e.src

    def cond(ctx: PythonContext) -> bool:
        try:
            value = eval(code, ctx.ns)
        except Exception as exc:
            raise _failure(src, exc) from None
        return bool(value)
    return cond


def _assignment(loc: Expr, lc: Any, e: Expr, c: Any) -> Callable[[PythonContext], None] | None:
    """``<assign location expr>`` in one closure, for the common case of a plain variable name."""
    if type(c) is _Failed or type(lc) is not tuple or lc[0] != "name" or lc[1] in SYSTEM_VARIABLES \
            or lc[1].startswith("__"):
        return None  # the general composition reports failures in its order
    root = lc[1]
    code = c[3] if type(c) is tuple else c
    src = e.src
    undeclared = f"cannot assign to {loc.src!r}: {root!r} is not declared"
    what = f"the value assigned to {loc.src!r}"

    def assign(ctx: PythonContext) -> None:
        ns = ctx.ns
        try:
            value = eval(code, ns)
        except Exception as exc:
            raise _failure(src, exc) from None
        if root not in ns:
            raise EvaluationError(undeclared)
        t = type(value)  # check_serializable's own first test, inline: most values are scalars
        if (t is not int or not _INT_MIN <= value < _INT_END) and t not in _PLAIN:
            check_serializable(value, what)
        ns[root] = value
    return assign


def _assigner(e: Expr, c: Any) -> Callable[[PythonContext, Any], None]:
    if type(c) is _Failed:
        return _fails(c.message)
    if type(c) is not tuple:  # the compiler only assigns to locations
        return _fails(f"{e.src!r} is not an assignable location")
    kind, root, code, _ = c
    src = e.src
    if root in SYSTEM_VARIABLES:
        return _fails(f"cannot assign to {src!r}: it is a system variable")
    if root is None or root.startswith("__"):
        return _fails(f"cannot assign to {src!r}")
    undeclared = f"cannot assign to {src!r}: {root!r} is not declared"
    what = f"the value assigned to {src!r}"

    if kind == "name":
        def assign_name(ctx: PythonContext, value: Any) -> None:
            ns = ctx.ns
            if root not in ns:
                raise EvaluationError(undeclared)
            t = type(value)  # as in _assignment
            if (t is not int or not _INT_MIN <= value < _INT_END) and t not in _PLAIN:
                check_serializable(value, what)
            ns[root] = value
        return assign_name

    def assign_path(ctx: PythonContext, value: Any) -> None:
        ns = ctx.ns
        if root not in ns:
            raise EvaluationError(undeclared)
        check_serializable(value, what)
        ns["_sb_value"] = value
        try:
            exec(code, ns)
        except Exception as exc:
            raise EvaluationError(f"cannot assign to {src!r}: {_why(exc)}") from None
        finally:
            ns.pop("_sb_value", None)
    return assign_path


def _as_store(node: ast.AST) -> ast.AST:
    node.ctx = ast.Store()  # type: ignore[attr-defined]
    return node


class PythonContext:
    """One drive's namespace. See :class:`statebound.datamodel.base.Context`.

    Only the system variables the chart names are bound (see :attr:`PythonDatamodel.uses`).
    """

    __slots__ = ("_budget", "_dm", "_name", "_sessionid", "ns")

    def __init__(self, dm: PythonDatamodel, variables: dict[str, Any], session_id: str, name: str,
                 ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
                 budget: Budget | None = None) -> None:
        self._dm = dm
        self._budget = budget
        # what a <script> may not rebind, bound in the namespace only when some code reads it
        self._sessionid = session_id
        self._name = name
        uses = dm.uses
        ns = variables
        ns["__builtins__"] = SAFE_BUILTINS
        ns[_TICK] = _no_tick if budget is None else budget.tick
        if uses:
            if "_sessionid" in uses:
                ns["_sessionid"] = session_id
            if "_name" in uses:
                ns["_name"] = name
            if "_ioprocessors" in uses:
                ns["_ioprocessors"] = ioprocessors
            if "In" in uses:
                ns["In"] = in_state
            if "_event" in uses:
                ns["_event"] = None
        self.ns = ns

    @property
    def budget(self) -> Budget | None:
        """The drive's budget, which every loop, call and comprehension of chart code ticks,
        however it is reached (see :class:`_Ticks`). Set it before code that can loop runs."""
        return self._budget

    @budget.setter
    def budget(self, budget: Budget | None) -> None:
        self._budget = budget
        self.ns[_TICK] = _no_tick if budget is None else budget.tick

    def evaluate(self, expr: Expr) -> Any:
        """Evaluate an expression in the namespace."""
        return self._dm._eval[expr.id](self)

    def evaluate_text(self, expr: Expr) -> str:
        """Evaluate an expression and convert it with ``str``."""
        value = self._dm._eval[expr.id](self)
        try:
            return str(value)
        except Exception as exc:   # a chart's object whose __str__ fails is the chart's error
            raise EvaluationError(f"{expr.src!r}: {_why(exc)}") from None

    def cond(self, expr: Expr) -> bool:
        """Evaluate a condition."""
        return self._dm._cond[expr.id](self)

    def valid_location(self, location: Expr) -> bool:
        """Whether ``location`` compiled as an assignable target."""
        return type(self._dm.code[location.id]) is tuple

    def is_declared(self, location: Expr) -> bool:
        """Whether the location's root variable exists."""
        c = self._dm.code[location.id]
        return type(c) is tuple and c[1] in self.ns and c[1] not in SYSTEM_VARIABLES

    def assign(self, location: Expr, value: Any) -> None:
        """Assign, refusing system variables, undeclared names and unstorable values."""
        self._dm._assign[location.id](self, value)

    def declare(self, name: str, value: Any) -> None:
        """Create a variable (``<data>``, foreach item/index)."""
        if name in SYSTEM_VARIABLES or name.startswith("__"):
            raise EvaluationError(f"cannot declare system variable {name!r}")
        self.ns[name] = value

    def execute(self, script: Expr) -> None:
        """Run a ``<script>``, then check it left system variables alone and stored only data."""
        c = self._dm.code[script.id]
        if type(c) is _Failed:
            raise EvaluationError(c.message)
        ns = self.ns
        before = dict(ns)
        try:
            exec(c, ns)
        except Exception as exc:
            # roll back what it bound so far: it may have bound an unstorable value or a
            # system variable, and the checks below never run for a failed script
            ns.clear()
            ns.update(before)
            raise EvaluationError(f"<script> failed: {_why(exc)}") from None
        finally:
            ns["__builtins__"] = SAFE_BUILTINS
        # what the system variables held before the script is what they were bound to: an
        # <assign> cannot change them, and a script that did was rolled back
        problem = None
        if ns.get("_sessionid", self._sessionid) != before.get("_sessionid", self._sessionid) \
                or ns.get("_name", self._name) != before.get("_name", self._name) \
                or ns.get("_ioprocessors") is not before.get("_ioprocessors") \
                or ns.get("In") is not before.get("In") or ns.get("_event") is not before.get("_event"):
            problem = "<script> may not assign system variables"
        else:
            for k, v in ns.items():
                if k in SYSTEM_VARIABLES or k == "__builtins__" or k == _TICK:
                    continue
                if k not in before or before[k] is not v or isinstance(v, (list, dict)):
                    try:
                        check_serializable(v, f"variable {k!r}")
                    except EvaluationError as exc:
                        problem = str(exc)
                        break
        if problem:
            ns.clear()
            ns.update(before)
            raise EvaluationError(problem)

    def set_event(self, event: Any) -> None:
        """Bind ``_event`` (when the chart reads it at all)."""
        if "_event" in self._dm.uses:
            self.ns["_event"] = None if event is None else EventView(event)

    def variables(self) -> dict[str, Any]:
        """The variables, system names removed."""
        out = self.ns.copy()
        for k in self._dm.bound:  # what __init__ bound: a copy and a few pops beat a filtering pass
            out.pop(k, None)
        if not SYSTEM_VARIABLES.isdisjoint(out):  # a system name the chart never reads, bound by a script
            out = {k: v for k, v in out.items() if k not in SYSTEM_VARIABLES}
        return out
