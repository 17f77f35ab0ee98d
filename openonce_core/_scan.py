"""Audit the effect tools a Python project declares, without importing a line of it.

``openonce providers --scan src`` reads source with ``ast`` only: importing user code
could run side effects (the very thing this library guards) and needs its dependencies
installed in CI. Static reading is also what makes the result a proof rather than a
sample: a literal ``tool="github.create_pr"`` and a literal receipt dict can be checked
against the provider contract on every path; anything computed at runtime is reported
as not provable instead of being guessed.

Recognised declarations: ``@<anything>.effect``/``@<anything>.effect(...)``,
``@effect_tool(...)`` and ``@effect_function_tool(...)``, and the same as calls on a
function defined at the top of the module: ``<anything>.effect(fn, ...)``,
``effect_tool(oo, fn, ...)``, ``effect_function_tool(oo, fn, ...)`` and
``<anything>.declare(fn, EffectOptions(...))`` (the options written in the call, or a
module-level name bound once to ``EffectOptions(...)``; any other options expression is
reported as dynamic). ``tool=`` is a string literal or a simple module-level string
constant (no ``tool=``: the function's name, as at runtime).
"""

from __future__ import annotations

import ast
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._providers import Capability

_ADAPTER_DECORATORS = frozenset({"effect_tool", "effect_function_tool"})
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "venv", "site-packages"})
# Methods that read a dict without changing it; any other use of a receipt variable
# might mutate it (``r.update``, ``r[k] = v``, ``log(r)``), so the static proof stops.
_READ_ONLY_METHODS = frozenset({"get", "keys", "values", "items", "copy"})


@dataclass(frozen=True)
class ReturnPath:
    """One ``return`` of a handler and what it provably returns.

    ``kind``: ``dict`` (a literal), ``dict_call`` (``dict(k=v)``), ``local_dict`` (an
    unmutated local assigned once to either), ``none`` or ``dynamic``. ``fields`` maps each
    receipt key to the bare name its value reads (``{"head": "head"}``), or None when the
    value is any other expression.
    """

    line: int
    kind: str
    fields: Mapping[str, str | None] = field(default_factory=dict)
    reason: str = ""

    @property
    def proven(self) -> bool:
        return self.kind in ("dict", "dict_call", "local_dict")


@dataclass(frozen=True)
class ScannedTool:
    """One decorated handler: where it is, which tool it declares, what it accepts/returns."""

    file: str
    line: int
    function: str
    decorator: str
    tool: str | None  # None: the tool expression is dynamic, so unauditable
    tool_source: str  # "literal", "constant NAME", "function name" or "dynamic"
    tool_expression: str
    parameters: tuple[str, ...]
    accepts_var_keyword: bool
    idempotency_fields: tuple[str, ...] | None
    idempotency_fields_dynamic: bool
    explicit_key: bool
    returns: tuple[ReturnPath, ...]
    may_end_without_return: bool
    rebound_parameters: frozenset[str]

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "decorator": self.decorator,
            "tool": self.tool,
            "tool_source": self.tool_source,
            "tool_expression": self.tool_expression,
            "parameters": list(self.parameters),
            "idempotency_fields": (
                list(self.idempotency_fields) if self.idempotency_fields is not None else None
            ),
            "idempotency_fields_dynamic": self.idempotency_fields_dynamic,
            "explicit_key": self.explicit_key,
            "returns": [
                {"line": r.line, "kind": r.kind, "fields": dict(r.fields), "reason": r.reason}
                for r in self.returns
            ],
            "may_end_without_return": self.may_end_without_return,
        }


@dataclass(frozen=True)
class ScanResult:
    root: str
    files_scanned: int
    tools: tuple[ScannedTool, ...]
    errors: tuple[str, ...]  # files that could not be parsed: nothing in them is audited

    @property
    def unauditable(self) -> list[ScannedTool]:
        return [t for t in self.tools if t.tool is None]

    @property
    def tool_names(self) -> list[str]:
        return list(dict.fromkeys(t.tool for t in self.tools if t.tool is not None))

    def to_json(self) -> dict[str, object]:
        return {
            "root": self.root,
            "files_scanned": self.files_scanned,
            "tools": [t.to_json() for t in self.tools],
            "unauditable": [t.location for t in self.unauditable],
            "errors": list(self.errors),
        }


# -- walking the tree ---------------------------------------------------------------------


def _python_files(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def scan_tree(path: str | os.PathLike[str]) -> ScanResult:
    """Every effect tool declared under ``path`` (a directory or one file)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"scan: {os.fspath(path)} does not exist")
    tools: list[ScannedTool] = []
    errors: list[str] = []
    count = 0
    for file in _python_files(root):
        count += 1
        rel = file.name if root.is_file() else file.relative_to(root).as_posix()
        try:
            module = ast.parse(file.read_bytes(), filename=rel)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            errors.append(f"{rel}:{line or 1}: cannot parse: {exc}")
            continue
        tools.extend(scan_module(module, rel))
    return ScanResult(os.fspath(path), count, tuple(tools), tuple(errors))


def scan_module(module: ast.Module, filename: str) -> list[ScannedTool]:
    """The effect tools declared in one parsed module."""
    constants = _module_string_constants(module)
    functions = {
        node.name: node
        for node in module.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    shared = _module_options(module)
    found: list[ScannedTool] = []
    for node in ast.walk(module):
        if isinstance(node, ast.Call):
            declared = _effect_call(node, functions, shared)
            if declared is not None:
                label, func, options, opaque = declared
                found.append(_scan_handler(func, label, options, constants, filename, opaque))
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            match = _effect_decorator(decorator)
            if match is not None:
                label, call = match
                found.append(_scan_handler(node, label, call, constants, filename))
    return sorted(found, key=lambda t: t.line)


type _Function = ast.FunctionDef | ast.AsyncFunctionDef


def _effect_call(
    node: ast.Call, functions: Mapping[str, _Function], shared: Mapping[str, ast.Call]
) -> tuple[str, _Function, ast.Call, ast.expr | None] | None:
    """(label, handler, options call, opaque options) when ``node`` declares a module
    function an effect by calling the decorator on it; None otherwise. ``opaque`` is an
    options expression that cannot be read statically (the tool is then dynamic)."""
    target = node.func
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
    handler_at = 1 if name in _ADAPTER_DECORATORS else 0
    if name not in ("effect", "declare") and handler_at == 0:
        return None
    if name in ("effect", "declare") and not isinstance(target, ast.Attribute):
        return None  # a bare effect(...) is no OpenOnce method
    handler = node.args[handler_at] if len(node.args) > handler_at else None
    func = functions.get(handler.id) if isinstance(handler, ast.Name) else None
    if func is None:
        return None
    label = ast.unparse(target)
    if name != "declare":
        return label, func, node, None
    options = node.args[1] if len(node.args) > 1 else _keyword(node, "options")
    if isinstance(options, ast.Call) and _is_options_class(options.func):
        return label, func, options, None
    if isinstance(options, ast.Name) and options.id in shared:
        return label, func, shared[options.id], None
    return label, func, node, options if options is not None else node


def _is_options_class(expr: ast.expr) -> bool:
    last = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", None)
    return last == "EffectOptions"


def _module_options(module: ast.Module) -> dict[str, ast.Call]:
    """Names bound exactly once, at the top of the module, to ``EffectOptions(...)``:
    options several tools share (``oo.declare(fn, SHARED)``)."""
    values: dict[str, ast.Call] = {}
    for stmt in module.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Call)
            and _is_options_class(stmt.value.func)
        ):
            values[stmt.targets[0].id] = stmt.value
    bindings = Counter(_module_bindings(module))
    return {name: value for name, value in values.items() if bindings[name] == 1}


def _module_string_constants(module: ast.Module) -> dict[str, str]:
    """Names bound exactly once, at the top of the module, to a string literal.

    A name bound anywhere else too (an ``if``, an import, a ``global`` in a function)
    could hold another tool at runtime, so it is not a constant.
    """
    values: dict[str, str] = {}
    for stmt in module.body:
        target: ast.expr | None = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
        elif isinstance(stmt, ast.AnnAssign):
            target = stmt.target
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            values[target.id] = value.value
    bindings = Counter(_module_bindings(module))
    return {name: value for name, value in values.items() if bindings[name] == 1}


def _module_bindings(module: ast.Module) -> Iterator[str]:
    """Every binding of a module-scope name: assignments, imports, defs, ``global``."""
    stack: list[ast.AST] = list(module.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
            # A function body binds module names only through ``global``.
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.Global))
            continue
        if isinstance(node, ast.Global):
            yield from node.names
        elif isinstance(node, ast.Import | ast.ImportFrom):
            yield from ((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            yield node.id
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name
        stack.extend(ast.iter_child_nodes(node))


def _effect_decorator(decorator: ast.expr) -> tuple[str, ast.Call | None] | None:
    """(label, call) when ``decorator`` declares an effect tool, else None."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call is not None else decorator
    if isinstance(target, ast.Attribute) and target.attr == "effect":
        return ast.unparse(target), call
    last = (
        target.id
        if isinstance(target, ast.Name)
        else target.attr
        if isinstance(target, ast.Attribute)
        else None
    )
    if last in _ADAPTER_DECORATORS:
        return ast.unparse(target), call
    return None


def _keyword(call: ast.Call | None, name: str) -> ast.expr | None:
    if call is None:
        return None
    value = next((k.value for k in call.keywords if k.arg == name), None)
    if isinstance(value, ast.Constant) and value.value is None:
        return None  # tool=None behaves as if it were not passed
    return value


# -- one handler --------------------------------------------------------------------------


def _scan_handler(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
    label: str,
    call: ast.Call | None,
    constants: Mapping[str, str],
    filename: str,
    opaque: ast.expr | None = None,
) -> ScannedTool:
    if opaque is None:
        tool, source, expression = _tool_of(func, call, constants)
        fields, fields_dynamic = _idempotency_fields(_keyword(call, "idempotency_fields"))
    else:  # options computed at runtime: nothing about them can be proven
        tool, source, expression = None, "dynamic", ast.unparse(opaque)
        fields, fields_dynamic = None, True
    params = _parameters(func.args)
    return ScannedTool(
        file=filename,
        line=func.lineno,
        function=func.name,
        decorator=label,
        tool=tool,
        tool_source=source,
        tool_expression=expression,
        parameters=params,
        accepts_var_keyword=func.args.kwarg is not None,
        idempotency_fields=fields,
        idempotency_fields_dynamic=fields_dynamic,
        explicit_key=_keyword(call, "idempotency_key") is not None,
        returns=tuple(_return_paths(func)),
        may_end_without_return=not _always_exits(func.body),
        rebound_parameters=frozenset(_rebound(func, set(params))),
    )


def _tool_of(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
    call: ast.Call | None,
    constants: Mapping[str, str],
) -> tuple[str | None, str, str]:
    """(tool, how it was found, source text); tool None when it cannot be known statically."""
    expr = _keyword(call, "tool")
    if expr is None:
        return func.name, "function name", func.name
    text = ast.unparse(expr)
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value, "literal", text
    if isinstance(expr, ast.Name) and expr.id in constants:
        return constants[expr.id], f"constant {expr.id}", text
    return None, "dynamic", text


def _idempotency_fields(expr: ast.expr | None) -> tuple[tuple[str, ...] | None, bool]:
    """(fields, dynamic). An empty list means "all arguments", as at runtime."""
    if expr is None:
        return None, False
    if isinstance(expr, ast.List | ast.Tuple):
        names = [e.value for e in expr.elts if isinstance(e, ast.Constant)]
        if len(names) == len(expr.elts) and all(isinstance(n, str) for n in names):
            return (tuple(str(n) for n in names) or None), False
    return None, True


def _parameters(args: ast.arguments) -> tuple[str, ...]:
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return tuple(a.arg for a in named)


def _own_nodes(func: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """Nodes of ``func``'s own scope: nested functions, lambdas and classes are skipped."""
    nested = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
    stack: list[ast.AST] = [stmt for stmt in func.body if not isinstance(stmt, nested)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, nested))


def _rebound(func: ast.FunctionDef | ast.AsyncFunctionDef, params: set[str]) -> Iterator[str]:
    """Parameters the body binds again: after that, the name no longer holds the call's arg."""
    for node in ast.walk(func):
        names: Iterable[str] = ()
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names = node.names
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name] if node is not func else []
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names = [node.name]
        yield from (name for name in names if name in params)


def _always_exits(body: list[ast.stmt]) -> bool:
    """True when every path through ``body`` ends in ``return`` or ``raise``.

    A handler that can fall off its end returns None on that path: no receipt.
    """
    for stmt in body:
        if isinstance(stmt, ast.Return | ast.Raise):
            return True
        if isinstance(stmt, ast.If) and _always_exits(stmt.body) and _always_exits(stmt.orelse):
            return True
        if isinstance(stmt, ast.With | ast.AsyncWith) and _always_exits(stmt.body):
            return True
        if isinstance(stmt, ast.Try | ast.TryStar):
            if _always_exits(stmt.finalbody):
                return True
            main = _always_exits(stmt.body) or _always_exits(stmt.orelse)
            if main and all(_always_exits(h.body) for h in stmt.handlers):
                return True
    return False


# -- what a return returns ----------------------------------------------------------------


def _return_paths(func: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ReturnPath]:
    returns = sorted(
        (n for n in _own_nodes(func) if isinstance(n, ast.Return)), key=lambda n: n.lineno
    )
    for node in returns:
        yield _classify_return(func, node)


def _classify_return(func: ast.FunctionDef | ast.AsyncFunctionDef, node: ast.Return) -> ReturnPath:
    value = node.value
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return ReturnPath(node.lineno, "none", reason="returns None, not a receipt")
    shape = _dict_shape(value)
    if shape is not None:
        kind = "dict" if isinstance(value, ast.Dict) else "dict_call"
        return ReturnPath(node.lineno, kind, shape)
    if isinstance(value, ast.Name):
        return _classify_local(func, node.lineno, value.id)
    return ReturnPath(
        node.lineno,
        "dynamic",
        reason=f"returns {ast.unparse(value)!r}; wrap it in an explicit receipt dict",
    )


def _dict_shape(value: ast.expr) -> dict[str, str | None] | None:
    """Keys -> bare name read by each value, for a literal dict or ``dict(k=v)``; else None.

    ``**spread`` and computed keys could add or override any key, so they prove nothing.
    """
    pairs: list[tuple[str | None, ast.expr]] = []
    if isinstance(value, ast.Dict):
        for key, item in zip(value.keys, value.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return None
            pairs.append((key.value, item))
    elif (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and not value.args
    ):
        pairs = [(k.arg, k.value) for k in value.keywords]
    else:
        return None
    if any(key is None for key, _ in pairs):
        return None
    return {key: (item.id if isinstance(item, ast.Name) else None) for key, item in pairs if key}


def _classify_local(
    func: ast.FunctionDef | ast.AsyncFunctionDef, line: int, name: str
) -> ReturnPath:
    """A returned local is proven only if assigned once to a dict and never touched after."""
    stores: list[ast.Name] = []
    parents: dict[ast.AST, ast.AST] = {}
    # Walk nested scopes too: a closure can mutate the dict it captured.
    for parent in ast.walk(func):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
        if isinstance(parent, ast.Global | ast.Nonlocal) and name in parent.names:
            return _unproven(line, name, "is declared global/nonlocal")
    for node in ast.walk(func):
        if not (isinstance(node, ast.Name) and node.id == name):
            continue
        if isinstance(node.ctx, ast.Store):
            stores.append(node)
        elif isinstance(node.ctx, ast.Del):
            return _unproven(line, name, "is deleted")
        elif not _read_only_use(node, parents):
            return _unproven(line, name, f"is used on line {node.lineno} (possible mutation)")
    if name in _parameters(func.args):
        return _unproven(line, name, "is a handler argument, not a receipt dict")
    if len(stores) != 1:
        return _unproven(line, name, f"is assigned {len(stores)} times")
    assign = parents.get(stores[0])
    value = assign.value if isinstance(assign, ast.Assign | ast.AnnAssign) else None
    targets = assign.targets if isinstance(assign, ast.Assign) else [stores[0]]
    shape = _dict_shape(value) if value is not None and len(targets) == 1 else None
    if shape is None:
        return _unproven(line, name, "is not assigned a literal dict or dict(...)")
    return ReturnPath(line, "local_dict", shape)


def _read_only_use(node: ast.Name, parents: Mapping[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if isinstance(parent, ast.Return):
        return True
    if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Load):
        return parent.value is node
    if isinstance(parent, ast.Attribute) and parent.attr in _READ_ONLY_METHODS:
        call = parents.get(parent)
        return isinstance(call, ast.Call) and call.func is parent
    return False


def _unproven(line: int, name: str, why: str) -> ReturnPath:
    return ReturnPath(line, "dynamic", reason=f"receipt variable {name!r} {why}")


# -- the contract checks the gates run ----------------------------------------------------


def handler_contract_problems(tool: ScannedTool, capabilities: Iterable[Capability]) -> list[str]:
    """Why the handler's signature and key do not provably meet the provider contract.

    Natural-key contracts (github_pr) need their key fields both as named parameters and
    in ``idempotency_fields``, so the dedup key is the provider's key. ``**kwargs`` does
    not count: it proves nothing about which names arrive.
    """
    problems: list[str] = []
    for cap in capabilities:
        problems.extend(
            f"{cap.name}: handler signature lacks required arg {arg!r}"
            for arg in dict.fromkeys([*cap.required_args, *cap.required_idempotency_fields])
            if arg not in tool.parameters
        )
        required = cap.required_idempotency_fields
        if not required:
            continue
        wanted = ", ".join(required)
        if tool.explicit_key:
            problems.append(
                f"{cap.name}: idempotency_key= is opaque; use idempotency_fields including {wanted}"
            )
        elif tool.idempotency_fields_dynamic:
            problems.append(
                f"{cap.name}: idempotency_fields is not a literal list; cannot prove it"
                f" includes {wanted}"
            )
        elif tool.idempotency_fields is None:
            problems.append(f"{cap.name}: declare idempotency_fields including {wanted}")
        else:
            missing = [f for f in required if f not in tool.idempotency_fields]
            if missing:
                problems.append(f"{cap.name}: idempotency_fields must include {', '.join(missing)}")
    return problems


def receipt_contract_problems(tool: ScannedTool, capabilities: Iterable[Capability]) -> list[str]:
    """Why some return path of the handler does not provably return a valid receipt."""
    caps = list(capabilities)
    required = list(dict.fromkeys(f for cap in caps for f in cap.required_receipt_fields))
    sources = {k: v for cap in caps for k, v in cap.required_receipt_source_fields.items()}
    if not required and not sources:
        return []  # nothing to prove
    names = ", ".join(c.name for c in caps)
    problems: list[str] = []
    if not tool.returns:
        problems.append(f"{names}: the handler never returns a receipt")
    elif tool.may_end_without_return:
        problems.append(f"{names}: the handler can end without returning (returns None)")
    for path in tool.returns:
        prefix = f"{names}: line {path.line}"
        if not path.proven:
            problems.append(f"{prefix}: {path.reason}")
            continue
        missing = [f for f in required if f not in path.fields]
        if missing:
            problems.append(f"{prefix}: receipt lacks required field(s) {', '.join(missing)}")
        for receipt_field, arg in sources.items():
            if receipt_field not in path.fields:
                continue
            if path.fields[receipt_field] != arg or arg not in tool.parameters:
                problems.append(
                    f"{prefix}: receipt {receipt_field!r} must be the handler arg {arg!r}"
                    f" itself (write {receipt_field!r}: {arg})"
                )
            elif arg in tool.rebound_parameters:
                problems.append(
                    f"{prefix}: handler arg {arg!r} is reassigned, so receipt"
                    f" {receipt_field!r} may not be the call's {arg}"
                )
    return problems
