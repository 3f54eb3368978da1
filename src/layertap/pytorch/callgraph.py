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
from typing import Any, Callable, Iterable, Sequence

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


def completing_ancestor(model: nn.Module, path: str, method: str | Callable[..., Any] = "forward") -> str:
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
    if path == "" or not isinstance(method, str):
        # A callable fn(model, ...) reaches the modules through an argument,
        # not ``self``: nothing is known to run once, so only its end completes.
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
            if i + 1 < len(mods) and _calls_each_once(mod):
                # ``for blk in self.blocks`` over an nn.Sequential: the caller may
                # call its elements itself; ask about them, as for a ModuleList.
                continue
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
    uses = _AttrUses(fn, attr, via_container, caller).uses()
    return uses is not None and len(uses) == 1 and uses[0]


class _Uses(ast.NodeVisitor):
    """Walks one function body and returns, from each ``visit``, one flag per
    use it counts: True when that use calls once, False when it may call more
    often (or hands the thing on).

    Shared by :class:`_AttrUses` (uses of ``self.<attr>``) and
    :class:`_NameUses` (uses of a loop variable). Loops, comprehensions,
    lambdas and nested functions make their body "repeating"; of an
    ``if``/``else`` only the worse branch counts, and a branch that is
    statically dead on ``inst`` (``if self.grad_checkpointing`` while that
    flag is False) does not count at all.
    """

    def __init__(self, self_name: str, inst: nn.Module) -> None:
        self.self_name = self_name
        self.inst = inst
        self.in_loop = False

    def visit_all(self, nodes: Iterable[ast.AST]) -> list[bool]:
        return [flag for node in nodes for flag in self.visit(node)]

    def generic_visit(self, node: ast.AST) -> list[bool]:
        if isinstance(node, _REPEATING):
            return self.repeating(list(ast.iter_child_nodes(node)))
        return self.visit_all(ast.iter_child_nodes(node))

    def repeating(self, nodes: Sequence[ast.AST]) -> list[bool]:
        """Visit ``nodes`` as code that may run several times."""
        outer, self.in_loop = self.in_loop, True
        try:
            return self.visit_all(nodes)
        finally:
            self.in_loop = outer

    def visit_If(self, node: ast.If) -> list[bool]:
        return self.branches(node.test, node.body, node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> list[bool]:
        return self.branches(node.test, [node.body], [node.orelse])

    def branches(self, test: ast.expr, body: Sequence[ast.AST], orelse: Sequence[ast.AST]) -> list[bool]:
        flags = self.visit(test)
        truth = _static_truth(test, self.self_name, self.inst)
        a = [] if truth is False else self.visit_all(body)
        b = [] if truth is True else self.visit_all(orelse)
        # Only one branch runs: keep the worse one (more uses, or an unsafe one).
        return flags + max(a, b, key=lambda u: (len(u), not all(u)))


class _AttrUses(_Uses):
    """One flag per possible call of ``self.<attr>`` in ``fn``, following
    self-methods (``self._forward_impl``) up to ``_MAX_DEPTH`` deep.

    With ``via_container`` the question is about each element of the
    container ``self.<attr>``: called by ``for blk in self.<attr>: blk(x)``,
    or by calling a plain ``nn.Sequential`` (which calls each element once).

    :meth:`uses` is ``None`` when the source cannot be read or ``self``
    escapes (``super()``, ``helper(self)``), since then uses may hide where
    we cannot see them.
    """

    def __init__(self, fn: Callable, attr: str, via_container: bool, inst: nn.Module, depth: int = 0) -> None:
        super().__init__("", inst)
        self.fn = fn
        self.attr = attr
        self.via_container = via_container
        self.depth = depth
        self.owner = _owner_class(fn)
        self.escaped = False

    def uses(self) -> tuple[bool, ...] | None:
        func = _parse_function(self.fn)
        if func is None or not func.args.args:
            return None
        self.self_name = func.args.args[0].arg
        found = self.visit_all(func.body)
        return None if self.escaped else tuple(found)

    def visit_Name(self, node: ast.Name) -> list[bool]:
        if node.id == self.self_name:
            self.escaped = True  # ``self`` used other than as ``self.x``: passed to a helper, aliased...
        return []

    def visit_Call(self, node: ast.Call) -> list[bool]:
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            self.escaped = True  # the parent class's method may use the child too
            return []
        named = _getattr_name(node, self.self_name)
        if named is not None:
            # ``getattr(self, "flag", False)`` reads one attribute, like ``self.flag``
            return self.visit(ast.Attribute(value=node.args[0], attr=named, ctx=ast.Load())) + self.visit_all(node.args[2:])
        if _is_attr(node.func, self.self_name, self.attr):
            once = not self.in_loop and (not self.via_container or _calls_each_once(getattr(self.inst, self.attr, None)))
            return [once] + self.visit_all([*node.args, *node.keywords])
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> list[bool]:
        if _is_none_check(node, self.self_name, self.attr):
            return []  # ``self.x is not None`` reads, never calls
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> list[bool]:
        if not (isinstance(node.value, ast.Name) and node.value.id == self.self_name):
            return self.generic_visit(node)
        if node.attr == self.attr:
            return [False]  # read but not called here: it may be called anywhere
        target = getattr(self.owner, node.attr, None) if self.owner is not None else None
        if not (inspect.isfunction(target) and target is not self.fn):
            return []
        sub = _AttrUses(target, self.attr, self.via_container, self.inst, self.depth + 1).uses() if self.depth < _MAX_DEPTH else None
        if sub is None:
            self.escaped = True
            return []
        return [flag and not self.in_loop for flag in sub]

    def visit_For(self, node: ast.For | ast.AsyncFor) -> list[bool]:
        own = _element_name(node, self.self_name, None) if isinstance(self.inst, _ITERABLE) else None
        if own is not None and not self.via_container:
            # ``for name, m in self.items(): x = m(x)`` in a container
            # subclass: each element, the child included, once per loop.
            return [not self.in_loop and self.loop_calls_once(node, own)] + self.repeating([node.target, *node.body, *node.orelse])
        elem = _element_name(node, self.self_name, self.attr) if self.via_container else None
        if elem is not None:
            out = [not self.in_loop and self.loop_calls_once(node, elem)]
            # the iterable's other parts (zip partners) still count
            out += self.visit_all(_iter_parts_except(node.iter, self.self_name, self.attr))
        else:
            out = self.visit(node.iter)
        return out + self.repeating([node.target, *node.body, *node.orelse])

    visit_AsyncFor = visit_For

    def loop_calls_once(self, loop: ast.For | ast.AsyncFor, name: str) -> bool:
        """The loop variable ``name`` is called once per iteration and used for nothing else."""
        uses = _NameUses(name, self.self_name, self.inst).visit_all([*loop.body, *loop.orelse])
        return len(uses) == 1 and uses[0]


class _NameUses(_Uses):
    """One flag per use of the local ``name`` (a loop variable): True for a call outside any inner loop."""

    def __init__(self, name: str, self_name: str, inst: nn.Module) -> None:
        super().__init__(self_name, inst)
        self.name = name

    def visit_Name(self, node: ast.Name) -> list[bool]:
        if node.id == self.name:
            return [False]  # read, stored or deleted: not a call
        return []

    def visit_Call(self, node: ast.Call) -> list[bool]:
        if isinstance(node.func, ast.Name) and node.func.id == self.name:
            return [not self.in_loop] + self.visit_all([*node.args, *node.keywords])
        return self.generic_visit(node)


def _getattr_name(node: ast.Call, self_name: str) -> str | None:
    """``"flag"`` for ``getattr(self, "flag"[, default])``, else None."""
    if not (isinstance(node.func, ast.Name) and node.func.id == "getattr" and 2 <= len(node.args) <= 3 and not node.keywords):
        return None
    obj, name = node.args[0], node.args[1]
    if isinstance(obj, ast.Name) and obj.id == self_name and isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value
    return None


def _calls_each_once(container: object) -> bool:
    """Calling ``container`` calls each element once: a stock ``nn.Sequential`` of distinct modules."""
    return (
        isinstance(container, nn.Sequential)
        and type(container).forward is nn.Sequential.forward
        and len({id(m) for m in container}) == len(container)
    )


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
