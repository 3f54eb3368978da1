"""Which modules run at most once per forward: the static half of ``stop_early``.

To stop a forward as soon as a tap is complete, layertap must know that the
tapped module will not run again later (BasicBlock calls its ``relu`` twice).
This reads the source of each caller's method with :mod:`ast` and decides,
conservatively, whether a child is called at most once per call of its
caller. A use counts as "once" only when it has one of two shapes:

* ``self.child(...)``, written once, outside any loop, comprehension, lambda
  or nested function;
* ``for blk in self.blocks: ... blk(...) ...`` (also ``enumerate``, ``zip``,
  ``reversed``, slices, ``.values()``/``.items()``), with the loop variable
  called exactly once in the body and the loop itself not inside a loop.

Anything else (no source, ``super()``, ``self`` passed away, a child stored
in a local, two references, ``while``) counts as "may run again", which only
makes the stop later, never wrong. A module reachable under several paths
(an alias such as ``self.b = self.a``) is judged on all of them.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Callable, TypeGuard

from torch import nn

# Nodes whose body may run several times per run of the enclosing function.
_REPEATING = (
    ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
    ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef,
)
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)
# Modules whose forward may iterate over ``self`` to call their elements.
_ITERABLE = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_MAX_DEPTH = 3  # how deep self-method calls (self._forward_impl) are followed


def completing_ancestor(model: nn.Module, path: str, method: str = "forward") -> str:
    """Deepest module whose return guarantees no further call of ``path``.

    The result runs at most once per run of ``model.<method>``, and every call
    of the module at ``path`` happens inside it. ``""`` (the root) means
    "only when the whole method returns".

    Example:
        >>> import torchvision
        >>> m = torchvision.models.resnet18()
        >>> completing_ancestor(m, "layer2.0.relu")
        'layer2.0'
        >>> completing_ancestor(m, "layer2")
        'layer2'
    """
    if path == "":
        return ""
    target = model.get_submodule(path)
    paths = [p for p, m in model.named_modules(remove_duplicate=False) if m is target] or [path]
    # One ancestor per path the module can be reached by; their common prefix
    # is an ancestor of every call site and still runs at most once.
    ends = [_chain_ancestor(model, p, method) for p in paths]
    return _common_prefix(ends)


def _chain_ancestor(model: nn.Module, path: str, method: str) -> str:
    """Walk root -> ``path`` while each step is called at most once by its caller."""
    parts = path.split(".")
    mods = [model]
    for p in parts:
        mods.append(getattr(mods[-1], p))
    best = ""
    caller_idx = 0
    for i in range(1, len(mods)):
        mod = mods[i]
        if is_plain_container(mod):
            continue  # a container never runs; its elements are called by an ancestor
        caller = mods[caller_idx]
        meth = method if caller_idx == 0 else "forward"
        via_container = i - caller_idx > 1
        attr = parts[caller_idx]  # the caller's direct child on the path
        if not called_once(caller, meth, attr, via_container=via_container):
            break
        best = ".".join(parts[:i])
        caller_idx = i
    return best


def is_plain_container(mod: nn.Module) -> bool:
    """A ModuleList/ModuleDict that is never called itself. A subclass with its
    own ``forward`` (torchvision's ``IntermediateLayerGetter``) is a module
    that runs and calls its elements.

    Example:
        >>> is_plain_container(nn.ModuleList()), is_plain_container(nn.Sequential())
        (True, False)
    """
    return isinstance(mod, _CONTAINERS) and type(mod).forward is nn.Module.forward


def _common_prefix(paths: list[str]) -> str:
    split = [p.split(".") if p else [] for p in paths]
    out: list[str] = []
    for parts in zip(*split):
        if any(q != parts[0] for q in parts):
            break
        out.append(parts[0])
    return ".".join(out)


def called_once(caller: nn.Module, method: str, attr: str, *, via_container: bool = False) -> bool:
    """True when ``caller.<method>`` calls ``caller.<attr>`` (or, via a container,
    each element of it) at most once.

    Example:
        >>> import torchvision
        >>> block = torchvision.models.resnet18().layer1[0]
        >>> called_once(block, "forward", "conv1"), called_once(block, "forward", "relu")
        (True, False)
    """
    if type(caller).forward is nn.Sequential.forward and method == "forward" and not via_container:
        return True
    fn = getattr(type(caller), method, None)
    if fn is None or not callable(fn):
        return False
    uses = _uses(fn, attr, via_container, caller)
    return uses is not None and len(uses) == 1 and uses[0]


def _uses(fn: Callable, attr: str, via_container: bool, inst: nn.Module, depth: int = 0) -> tuple[bool, ...] | None:
    """One flag per possible call of ``self.<attr>`` in ``fn`` (following
    self-methods): True when that use calls the child (or each element) at
    most once. Of an ``if``/``else``, only the worse branch counts, and a
    branch that is statically dead on ``inst`` (``if self.grad_checkpointing``
    when that flag is False) does not count at all.

    ``None`` when the source cannot be read or ``self`` escapes (``super()``,
    ``helper(self)``), since then uses may hide where we cannot see them.
    """
    func = _parse_function(fn)
    if func is None or not func.args.args:
        return None
    self_name = func.args.args[0].arg
    owner = _owner_class(fn)
    ok = True

    def is_self_attr(node: ast.AST) -> TypeGuard[ast.Attribute]:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name

    def visit(node: ast.AST, in_loop: bool, parent: ast.AST | None) -> list[bool]:
        nonlocal ok
        if isinstance(node, ast.Name) and node.id == self_name:
            # ``self`` used other than as ``self.x``: passed to a helper, aliased...
            ok = False
            return []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
            ok = False  # the parent class's method may use the child too
            return []
        if _is_none_check(node, self_name, attr):
            return []  # ``self.x is not None`` reads, never calls
        if isinstance(node, (ast.If, ast.IfExp)):
            return visit_branches(node, in_loop)
        if is_self_attr(node):
            if node.attr == attr:
                is_call = isinstance(parent, ast.Call) and parent.func is node
                return [is_call and not in_loop and not via_container]
            target = getattr(owner, node.attr, None) if owner is not None else None
            if inspect.isfunction(target) and target is not fn:
                sub = _uses(target, attr, via_container, inst, depth + 1) if depth < _MAX_DEPTH else None
                if sub is None:
                    ok = False
                    return []
                return [flag and not in_loop for flag in sub]
            return []
        if isinstance(node, (ast.For, ast.AsyncFor)):
            out: list[bool] = []
            own = _element_name(node, self_name, None) if isinstance(inst, _ITERABLE) else None
            if own is not None and not via_container:
                # ``for name, m in self.items(): x = m(x)`` in a container
                # subclass: each element, the child included, once per loop.
                out.append(not in_loop and _called_once_in(node, own))
                for child in [node.target, *node.body, *node.orelse]:
                    out += visit(child, True, node)
                return out
            elem = _element_name(node, self_name, attr) if via_container else None
            if elem is not None:
                out.append(not in_loop and _called_once_in(node, elem))
                # the iterable's other parts (zip partners) still count
                for child in _iter_parts_except(node.iter, self_name, attr):
                    out += visit(child, in_loop, node)
            else:
                out += visit(node.iter, in_loop, node)
            for child in [node.target, *node.body, *node.orelse]:
                out += visit(child, True, node)
            return out
        looping = in_loop or isinstance(node, _REPEATING)
        out = []
        for child in ast.iter_child_nodes(node):
            out += visit(child, looping, node)
        return out

    def visit_branches(node: ast.If | ast.IfExp, in_loop: bool) -> list[bool]:
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        test = visit(node.test, in_loop, node)
        truth = _static_truth(node.test, self_name, inst)
        a = [] if truth is False else [f for s in body for f in visit(s, in_loop, node)]
        b = [] if truth is True else [f for s in orelse for f in visit(s, in_loop, node)]
        # Only one branch runs: keep the worse one (more uses, or an unsafe one).
        worse = max(a, b, key=lambda u: (len(u), not all(u)))
        return test + worse

    found = [f for stmt in func.body for f in visit(stmt, False, func)]
    return tuple(found) if ok else None


def _is_none_check(node: ast.AST, self_name: str, attr: str) -> bool:
    """``self.<attr> is None`` / ``is not None``."""
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.Is, ast.IsNot))
        and _is_attr(node.left, self_name, attr)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    )


def _static_truth(test: ast.AST, self_name: str, inst: nn.Module) -> bool | None:
    """The value of a branch test built from boolean flags of the module
    (``self.training``, ``self.grad_checkpointing``), or None when unknown."""
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id == self_name:
        try:
            value = inspect.getattr_static(inst, test.attr)
        except AttributeError:
            return None
        return value if isinstance(value, bool) else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _static_truth(test.operand, self_name, inst)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [_static_truth(v, self_name, inst) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else (True if all(v is True for v in values) else None)
        return True if True in values else (False if all(v is False for v in values) else None)
    return None


@functools.lru_cache(maxsize=1024)
def _parse_function(fn: Callable) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    func = tree.body[0] if tree.body else None
    return func if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _element_name(loop: ast.For | ast.AsyncFor, self_name: str, attr: str | None) -> str | None:
    """The loop variable bound to the elements of ``self.<attr>`` (``attr``
    None: of ``self`` itself, a container subclass), if that is clear.

    Handles ``self.x``, ``self.x[a:b]``, ``self.x.values()``, ``self.x.items()``,
    ``self.x.children()``, ``reversed(...)``, ``enumerate(...)`` and ``zip(...)``.

    Example:
        >>> loop = ast.parse("for name, m in self.items(): x = m(x)").body[0]
        >>> _element_name(loop, "self", None), _element_name(loop, "self", "blocks")
        ('m', None)
    """

    def is_source(node: ast.AST) -> bool:
        if attr is None:
            return isinstance(node, ast.Name) and node.id == self_name
        return _is_attr(node, self_name, attr)

    def resolve(it: ast.AST, target: ast.AST) -> str | None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and not it.keywords:
            if it.func.id == "reversed" and len(it.args) == 1:
                return resolve(it.args[0], target)
            if it.func.id == "enumerate" and len(it.args) == 1:
                if isinstance(target, ast.Tuple) and len(target.elts) == 2:
                    return resolve(it.args[0], target.elts[1])
                return None
            if it.func.id == "zip":
                if isinstance(target, ast.Tuple) and len(target.elts) == len(it.args):
                    hits = [resolve(a, t) for a, t in zip(it.args, target.elts)]
                    hits = [h for h in hits if h is not None]
                    return hits[0] if len(hits) == 1 else None
                return None
            return None
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args:
            base = it.func.value
            if is_source(base):
                if it.func.attr in ("values", "children"):
                    return target.id if isinstance(target, ast.Name) else None
                if it.func.attr == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                    return target.elts[1].id if isinstance(target.elts[1], ast.Name) else None
            return None
        if isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Slice):
            it = it.value
        if is_source(it):
            return target.id if isinstance(target, ast.Name) else None
        return None

    return resolve(loop.iter, loop.target)


def _iter_parts_except(it: ast.AST, self_name: str, attr: str) -> list[ast.AST]:
    """Sub-expressions of a loop's iterable other than the ``self.<attr>`` use."""
    out: list[ast.AST] = []

    def walk(node: ast.AST) -> None:
        if _is_attr(node, self_name, attr):
            return
        if isinstance(node, ast.Name) and node.id == self_name:
            return
        if isinstance(node, ast.Attribute) and _is_attr(node.value, self_name, attr):
            return  # self.x.values
        if isinstance(node, (ast.Call, ast.Subscript, ast.Slice)):
            for child in ast.iter_child_nodes(node):
                walk(child)
            return
        out.append(node)

    walk(it)
    return out


def _called_once_in(loop: ast.For | ast.AsyncFor, name: str) -> bool:
    """The loop variable ``name`` is called once per iteration and used for nothing else."""
    uses: list[bool] = []

    def visit(node: ast.AST, repeating: bool, parent: ast.AST | None) -> None:
        if isinstance(node, ast.Name) and node.id == name:
            stored = isinstance(node.ctx, (ast.Store, ast.Del))
            is_call = isinstance(parent, ast.Call) and parent.func is node
            uses.append(is_call and not repeating and not stored)
            return
        looping = repeating or isinstance(node, _REPEATING)
        for child in ast.iter_child_nodes(node):
            visit(child, looping, node)

    for stmt in [*loop.body, *loop.orelse]:
        visit(stmt, False, None)
    return len(uses) == 1 and uses[0]


def _is_attr(node: ast.AST, self_name: str, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == self_name
    )


def _owner_class(fn: Callable) -> type | None:
    qual = getattr(fn, "__qualname__", "")
    module = inspect.getmodule(fn)
    obj = module
    for part in qual.split(".")[:-1]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None
