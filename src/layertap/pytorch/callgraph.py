"""Which modules run at most once per forward: the static half of ``stop_early``.

To stop a forward as soon as a tap is complete, layertap must know that the
tapped module will not run again later (BasicBlock calls its ``relu`` twice).
This reads the source of each caller's method with :mod:`ast` and decides,
conservatively, whether a child is called at most once per call of its
caller. Anything unclear (no source, a loop, two references) counts as "may
run again", which only makes the stop later, never wrong.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Callable

from torch import nn

_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def completing_ancestor(model: nn.Module, path: str, method: str = "forward") -> str:
    """Deepest module on ``path`` known to run at most once per run of ``method``.

    Once that module returns, no call of the module at ``path`` can follow
    (assuming the module is only called from within its own ancestors).

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
    parts = path.split(".")
    mods = [model]
    for p in parts:
        mods.append(getattr(mods[-1], p))
    best = ""
    caller_idx = 0
    for i in range(1, len(mods)):
        mod = mods[i]
        if isinstance(mod, _CONTAINERS):
            continue  # a container never runs; its elements are called by an ancestor
        caller = mods[caller_idx]
        meth = method if caller_idx == 0 else "forward"
        via_container = i - caller_idx > 1
        attr = parts[caller_idx]  # the caller's direct child on the path
        if not _called_once(caller, meth, attr, via_container):
            break
        best = ".".join(parts[:i])
        caller_idx = i
    return best


def _called_once(caller: nn.Module, method: str, attr: str, via_container: bool) -> bool:
    if type(caller).forward is nn.Sequential.forward and method == "forward" and not via_container:
        return True
    fn = getattr(type(caller), method, None)
    if fn is None:
        return False
    refs = _references(fn, attr)
    if refs is None or len(refs) != 1:
        return False
    in_loop, is_loop_iter = refs[0]
    if via_container:
        return is_loop_iter and not in_loop
    return not in_loop


@functools.lru_cache(maxsize=512)
def _references(fn: Callable, attr: str, depth: int = 0) -> tuple[tuple[bool, bool], ...] | None:
    """Each ``self.<attr>`` use in ``fn`` (and the self-methods it calls).

    Returns ``(inside_loop, is_iter_of_for)`` per use, or ``None`` when the
    source cannot be read.
    """
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    func = tree.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or not func.args.args:
        return None
    self_name = func.args.args[0].arg
    owner = _owner_class(fn)
    found: list[tuple[bool, bool]] = []
    ok = True

    def visit(node: ast.AST, in_loop: bool, loop_iter: bool) -> None:
        nonlocal ok
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name:
            if node.attr == attr:
                found.append((in_loop, loop_iter))
            elif owner is not None and depth < 3 and callable(getattr(owner, node.attr, None)) and inspect.isfunction(getattr(owner, node.attr)):
                sub = _references(getattr(owner, node.attr), attr, depth + 1)
                if sub is None:
                    ok = False
                else:
                    found.extend((il or in_loop, it) for il, it in sub)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            visit(node.iter, in_loop, _is_self_attr_iter(node.iter, self_name))
            for child in node.body + node.orelse + [node.target]:
                visit(child, True, False)
            return
        looping = in_loop or isinstance(node, _LOOPS)
        for child in ast.iter_child_nodes(node):
            visit(child, looping, False)

    for stmt in func.body:
        visit(stmt, False, False)
    return tuple(found) if ok else None


def _is_self_attr_iter(node: ast.AST, self_name: str) -> bool:
    """``self.x``, ``self.x[a:b]``, ``enumerate(self.x)`` or ``zip(self.x, ...)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("enumerate", "zip", "reversed"):
        return any(_is_self_attr_iter(a, self_name) for a in node.args)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        node = node.value
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name


def _owner_class(fn: Callable) -> type | None:
    qual = getattr(fn, "__qualname__", "")
    module = inspect.getmodule(fn)
    obj = module
    for part in qual.split(".")[:-1]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None
