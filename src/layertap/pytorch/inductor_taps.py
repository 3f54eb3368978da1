"""Module rows read from the buffers an inductor-compiled program writes, with no second compile.

A tap inside the graph (a forward hook, :class:`~.compiled.HookTaps`) makes inductor fuse and lay out the
program differently, so its kernels are new C++ to build: a second compile as long as the first. Here the
module is compiled once, as the candidate asks, and the Python wrapper inductor writes around its kernels
gets one call after the kernel that writes each buffer holding a module's output:
``_layertap_store((('layer1.0.conv1', 0),), buf3)``. The kernels are untouched (the same source, so the same
cached builds a plain compile of the model makes), and the store returns at once unless a run is being
:func:`recording`.

Which buffer holds which module call's value comes from the post-grad graph inductor lowers: each node
carries dynamo's ``nn_module_stack``, keyed by the module's ``id`` and its call (``"1403...@1"``: the second
call), and each buffer names the node whose value it holds (``origin_node``). A module call's value is the
last node inside it that something outside it uses; when no buffer holds that node (inductor fused it into a
kernel that writes only a later value, as a BatchNorm into the ReLU after it), the call is absorbed into the
module call whose buffer the kernel writes. A buffer several kernels write into (a ``cat``) is never read
part-written: it is left out.

Example:
    >>> call_key("140109057300752@1"), call_key("140109057300752"), call_key("L['self'].fc")
    ((140109057300752, 1), (140109057300752, 0), None)
"""

from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import fx

#: the stores of the runs being recorded (innermost last): ``(path, call)`` -> the value
_RECORDING: list[dict[tuple, torch.Tensor]] = []


def store(calls: tuple[tuple, ...], value: torch.Tensor) -> None:
    """Called by a rewritten wrapper after the kernel that wrote ``value``, the value of the module ``calls``
    (``(path, call)``, or ``(path, call, k)``: the k-th value of a call returning several): kept while a run is
    recorded.

    The clone is needed: a later kernel may reuse the buffer's memory in place.

    Example:
        >>> store((("fc", 0),), torch.ones(2))  # no run recorded: nothing kept
        >>> with recording() as got:
        ...     store((("fc", 0), ("head", 0)), torch.ones(2))
        >>> sorted(got), got[("fc", 0)] is got[("head", 0)]
        ([('fc', 0), ('head', 0)], True)
    """
    if _RECORDING:
        kept = value.clone()
        for call in calls:
            _RECORDING[-1][call] = kept


@contextlib.contextmanager
def recording() -> Iterator[dict[tuple, torch.Tensor]]:
    """The values the rewritten wrappers store while the block runs, by ``(module path, call)`` (and
    ``(path, call, k)``)."""
    got: dict[tuple, torch.Tensor] = {}
    _RECORDING.append(got)
    try:
        yield got
    finally:
        _RECORDING.pop()


def available() -> bool:
    """Whether this torch's inductor writes the Python wrapper this module rewrites.

    Example:
        >>> available()
        True
    """
    from torch._inductor.graph import GraphLowering  # noqa: PLC0415 -- inductor loads with a compiled candidate

    return callable(getattr(GraphLowering, "_compile_to_module_lines", None))


def call_key(key: str) -> tuple[int, int] | None:
    """A ``nn_module_stack`` key as ``(id of the module, call)``; ``None`` for a key that is no id."""
    head, _, call = key.partition("@")
    if not head.isdigit() or (call and not call.isdigit()):
        return None
    return int(head), int(call or 0)


@dataclass
class Plan:
    """What the rewritten wrappers of one compiled module hold, over every graph compiled for it: the buffers
    stored (by graph, buffer name -> module call), and the calls whose value a later module call's buffer
    absorbed."""

    stored: set[tuple] = field(default_factory=set)
    absorbed: dict[tuple, tuple] = field(default_factory=dict)
    #: calls whose value is a buffer's read in another shape (a ``Flatten`` of a pooled value)
    reshaped: set[tuple[str, int]] = field(default_factory=set)
    #: calls with a node of their own in some graph (the others compute nothing: an ``Identity``)
    seen: set[tuple[str, int]] = field(default_factory=set)
    graphs: int = 0
    #: graphs whose wrapper could not be rewritten (they store nothing)
    unread: int = 0


def call_nodes(graph: fx.Graph, paths: dict[int, str]) -> dict[fx.Node, tuple[tuple, ...]]:
    """The module calls each node holds the value of, for the modules in ``paths`` (by ``id``): a call's value
    is the last node inside it that a node outside it uses (or the graph returns), keyed ``(path, call)``. A
    block's value is often its last child's: one node, several calls. A call with several such nodes (a
    module returning a tuple) also keys each ``(path, call, k)``, in graph order.

    Example:
        >>> g = fx.Graph()
        >>> x = g.placeholder("x")
        >>> y = g.call_function(torch.relu, (x,))
        >>> y.meta["nn_module_stack"] = {"7": ("L['self'].block", torch.nn.Module), "9": ("L['self'].block.act", torch.nn.ReLU)}
        >>> _ = g.output(y)
        >>> call_nodes(g, {7: "block", 9: "block.act"})
        {relu: (('block', 0), ('block.act', 0))}
    """
    return _call_nodes(_scopes(graph, paths))


def _scopes(graph: fx.Graph, paths: dict[int, str]) -> dict[fx.Node, dict[str, tuple[str, int]]]:
    """Each node's module calls among ``paths``: its ``nn_module_stack`` key -> ``(path, call)``."""
    out: dict[fx.Node, dict[str, tuple[str, int]]] = {}
    for node in graph.nodes:
        out[node] = {}
        for key in (node.meta.get("nn_module_stack") or {}):
            parsed = call_key(str(key))
            if parsed is not None and parsed[0] in paths:
                out[node][str(key)] = (paths[parsed[0]], parsed[1])
    return out


def _call_nodes(scopes: dict[fx.Node, dict[str, tuple[str, int]]]) -> dict[fx.Node, tuple[tuple, ...]]:
    escaping: dict[tuple[str, int], list[fx.Node]] = {}
    for node, calls in scopes.items():
        for key, call in calls.items():
            if any(u.op == "output" or key not in scopes[u] for u in node.users):
                escaping.setdefault(call, []).append(node)
    out: dict[fx.Node, tuple[tuple, ...]] = {}
    for call, nodes in escaping.items():
        out[nodes[-1]] = (*out.get(nodes[-1], ()), call)
        if len(nodes) > 1:
            for k, node in enumerate(nodes):
                out[node] = (*out.get(node, ()), (*call, k))
    return out


def plan_buffers(lowering: Any, paths: dict[int, str], plan: Plan,
                 written: set[str]) -> dict[str, tuple[tuple, ...]]:
    """The buffers of one lowered graph to store, by name -> the module calls whose value each holds, among the
    buffers ``written`` by a kernel line of its wrapper (one a kernel keeps to itself is never written out).
    ``plan`` gains them, the calls read through a reshape of a buffer, and the calls their kernels absorbed:
    each into the first stored buffer from the first one whose kernel computed it on."""
    scopes = _scopes(lowering.graph, paths)
    outputs = _call_nodes(scopes)
    plan.seen.update(call for calls in scopes.values() for call in calls.values())
    held = {node: name for node, name in _held_nodes(lowering).items() if name in written}
    stored: dict[str, tuple[tuple, ...]] = {}
    for node, calls in outputs.items():
        base = node
        while base not in held and _is_reshape(base):
            base = base.args[0]  # type: ignore[assignment]  # a reshape's first argument is a node
        if base in held:
            stored[held[base]] = (*stored.get(held[base], ()), *calls)
            if base is not node:
                plan.reshaped.update(calls)
    for name, calls in stored.items():  # the innermost whole call first: the one absorbed calls are named after
        stored[name] = tuple(sorted(calls, key=lambda c: (len(c) != 2, -c[0].count("."))))
        plan.stored.update(calls)
    holder = None
    for name in reversed(list(lowering.name_to_buffer)):  # each buffer's first stored buffer, from it on
        holder = stored[name][0] if name in stored else holder
        for origin in lowering.name_to_buffer[name].get_origins():
            for inner in outputs.get(origin, ()):
                if inner not in plan.stored and holder is not None:
                    plan.absorbed[inner] = holder  # the earliest buffer computing it wins: the loop runs backwards
    plan.graphs += 1
    return stored


def _held_nodes(lowering: Any) -> dict[fx.Node, str]:
    """The buffer holding each node's whole value: the node inductor realised it for (``origin_node``, which
    it sets only where the node's value is that buffer itself, not a view of it). A buffer with no such node
    holds part of a node's arithmetic (a ``mean``'s sum, divided where it is read) and is never read as a
    value; nor is one several kernels write into (a ``cat``'s): it is never whole after one kernel."""
    from torch._inductor import ir  # noqa: PLC0415 -- inductor loads with a compiled candidate

    buffers = lowering.name_to_buffer
    written_through = {layout.view.get_name() for b in buffers.values()
                       if isinstance(layout := getattr(b, "layout", None), ir.NonOwningLayout)
                       and hasattr(layout.view, "get_name")}
    held: dict[fx.Node, str] = {}
    for name, buf in buffers.items():
        node = getattr(buf, "origin_node", None)
        if node is not None and name not in written_through and not isinstance(buf, ir.ConcatKernel):
            held.setdefault(node, name)
    return held


#: ops whose value is another node's, laid out again in the same order (read as a reshape of its buffer)
_RESHAPES = {"view", "reshape", "_unsafe_view", "squeeze", "unsqueeze", "flatten", "alias"}


def _is_reshape(node: fx.Node) -> bool:
    packet = getattr(node.target, "overloadpacket", None)
    return node.op == "call_function" and getattr(packet, "__name__", "") in _RESHAPES and bool(node.args) and \
        isinstance(node.args[0], fx.Node)


#: wrapper lines that write no buffer: allocations, aliases and reuses, frees, checks, returns, comments
_NOT_A_KERNEL = re.compile(r"^\s*(?:#|del\b|assert_|return\b|buf\d+ = (?:empty\w*\(|torch\.empty\w*\(|"
                           r"alloc_from_pool\(|reinterpret_tensor\(|buf\d+\b))")
_BUF = re.compile(r"\bbuf\d+\b")


def _kernel_lines(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """The lines of a wrapper's ``call`` function that launch a kernel, each with the buffers it names."""
    start = next((i for i, line in enumerate(lines) if re.match(r"\s*def call\(", line)), None)
    if start is None:
        return
    indent = len(lines[start]) - len(lines[start].lstrip())
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            return
        if not _NOT_A_KERNEL.match(line) and not line.rstrip().endswith((":", "(", ",", "\\")):
            yield i, list(dict.fromkeys(_BUF.findall(line)))


def written_buffers(code: str) -> set[str]:
    """The buffers a kernel line of the wrapper ``code`` names (a buffer a kernel keeps to itself is not one).

    Example:
        >>> sorted(written_buffers("def call(args):\\n    buf0 = empty_strided_cpu((2,), (1,))\\n"
        ...                        "    kernel_0(arg0_1, buf0)\\n    buf1 = buf0; del buf0  # reuse\\n"))
        ['buf0']
    """
    return {b for _, names in _kernel_lines(code.split("\n")) for b in names}


def rewrite(code: str, stored: dict[str, tuple[tuple, ...]]) -> str:
    """The wrapper ``code`` with a store after the first kernel line that writes each buffer in ``stored``.

    Stores go on the kernel's own line (``kernel(...); _layertap_store(...)``) so the wrapper's line map
    still points at the same lines, and only into its ``call`` function: kernel sources stay byte for byte.

    Example:
        >>> code = "def call(args):\\n    buf1 = empty_strided_cpu((2,), (1,))\\n    kernel_0(arg0_1, buf1)\\n    return (buf1, )\\n"
        >>> print(rewrite(code, {"buf1": (("fc", 0),)}))  # doctest: +NORMALIZE_WHITESPACE
        def call(args):
            buf1 = empty_strided_cpu((2,), (1,))
            kernel_0(arg0_1, buf1); _layertap_store((('fc', 0),), buf1)
            return (buf1, )
        from layertap.pytorch.inductor_taps import store as _layertap_store
    """
    lines = code.split("\n")
    done: set[str] = set()
    for i, names in _kernel_lines(lines):
        new = [b for b in names if b in stored and b not in done]
        if new:
            done.update(new)
            body, hash_, comment = lines[i].partition("  #")
            calls = "".join(f"; _layertap_store({stored[b]!r}, {b})" for b in new)
            lines[i] = body.rstrip() + calls + (f"  #{comment}" if hash_ else "")
    if not done:
        return code
    return "\n".join(lines) + "\nfrom layertap.pytorch.inductor_taps import store as _layertap_store\n"


@contextlib.contextmanager
def rewriting(paths: dict[int, str], plan: Plan) -> Iterator[None]:
    """Every inductor graph compiled in the block gets the stores of the module calls in ``paths`` (by
    ``id``); caches that would hand back a wrapper without them (or keep one with them for a later plain
    compile) are off for the block."""
    from torch._inductor import config  # noqa: PLC0415 -- inductor loads with a compiled candidate
    from torch._inductor.graph import GraphLowering  # noqa: PLC0415

    original = GraphLowering._compile_to_module_lines

    def compile_lines(self: Any, wrapper_code: Any) -> Any:
        code = rewrite(wrapper_code.value, plan_buffers(self, paths, plan, written_buffers(wrapper_code.value)))
        try:
            compile(code, "<inductor wrapper>", "exec")
        except SyntaxError:  # a wrapper this cannot read: it runs as inductor wrote it, and stores nothing
            plan.unread += 1
        else:
            wrapper_code.value = code
        return original(self, wrapper_code)

    GraphLowering._compile_to_module_lines = compile_lines  # type: ignore[method-assign]
    try:
        with config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
            yield
    finally:
        GraphLowering._compile_to_module_lines = original  # type: ignore[method-assign]


class BufferTaps:
    """``module`` (run by ``method``) compiled once as ``compilation`` compiles, with the stores of the module
    calls ``paths``: :meth:`runner` gives the program to call (``record``: keep the stored values in
    :attr:`last`), :meth:`named` one recorded call's values by name (``output``..., ``PATH#CALL``)."""

    def __init__(self, module: torch.nn.Module, method: Any, compilation: Any, paths: set[str]) -> None:
        from .compiled import HookTaps, explained, own_frames  # noqa: PLC0415 -- one wing, loaded with it

        twin = own_frames(copy.deepcopy(module))
        self.ids = {id(m): p for p, m in twin.named_modules() if p in paths}
        self.plan = Plan()
        self.wrapper = HookTaps(twin, method, set())  # the method as a module's forward, with no hook
        self.compiled, self.collected = explained(compilation, self.wrapper)
        self.last: dict[tuple, torch.Tensor] = {}
        #: the module's shape of each call in :attr:`Plan.reshaped` (its buffer is read in that shape)
        self.shapes: dict[tuple, tuple[int, ...]] = {}
        #: the name of each value of a call returning several, by its store key ``(path, call, k)``
        self.items: dict[tuple, str] = {}

    def runner(self, record: bool) -> Any:
        """The compiled program as a callable (``_orig_mod``: what compile errors name modules by)."""
        taps = self

        class Run:
            _orig_mod = taps.wrapper

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                with rewriting(taps.ids, taps.plan):
                    if not record:
                        return taps.compiled(*args, **kwargs)
                    with recording() as got:
                        out = taps.compiled(*args, **kwargs)
                taps.last = got
                return out

        return Run()

    def named(self, values: Any) -> dict[str, torch.Tensor]:
        """The program's outputs by name, and the last recorded run's stores as ``PATH#CALL`` (``PATH#CALL[i]``:
        the i-th value of a call returning several, as :attr:`items` names it)."""
        out = self.wrapper.named(values)
        for key, v in self.last.items():
            if len(key) != 2:
                if key in self.items:
                    out[self.items[key]] = v
                continue
            shape = self.shapes.get(key)
            out[f"{key[0]}#{key[1]}"] = v.reshape(shape) if shape is not None else v
        return out
