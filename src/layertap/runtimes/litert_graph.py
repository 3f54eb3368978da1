"""A LiteRT program's op graph, read from its flatbuffer, and the PyTorch module calls its tensors hold.

``litert-torch`` names every op's output tensor by the modules the op ran in (MLIR location names): one location
is ``Root/Class_attr/Class_attr...;``, a ``/``-separated chain of module levels, each the module's class (its
module and qualified name) and the last part of its attribute path, the root's class alone first. An op the
converter fused from several ops carries the locations of all of them, joined by ``;`` (the first is the op that
produced the value), and a trailing number tells apart tensors of the same locations::

    torchvision.models.resnet.ResNet/torch.nn.modules.container.Sequential_layer1/torchvision.models.resnet.BasicBlock_0/torch.nn.modules.activation.ReLU_relu;;...BatchNorm2d_bn1;;...Conv2d_conv1;1

:func:`parse_locations` reads those names; :func:`module_values` finds, for each module and each of its calls,
the one tensor that holds the call's value, or says that the converter fused the call into another op (a Conv's
output inside the Conv+BatchNorm+ReLU op the ReLU's location leads). A location names the modules that ran, not
containers never called (an ``nn.ModuleList``), so ``layers.0.attn`` is the chain ``0.attn``:
:func:`resolve_location` finds the model's own path by each level's class, :func:`chain_matches` by names alone.

:class:`ProgramGraph` is the op list as Model Explorer's TFLite adapter reads it: op ``i`` of the signature's
subgraph is its node ``"i"``. Reading needs only ``ai-edge-litert``'s flatbuffer schema (imported inside
:meth:`ProgramGraph.read`); the rest is plain Python.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..errors import LayertapError, missing_litert
from ..onnxfile.walk import linked_groups

#: ops that only rearrange values: a module call whose ops are only these has no value of its own in the program
#: (a Conv's NHWC transpose of its input, left when the Conv itself was fused into the op after it)
MOVES = frozenset({"TRANSPOSE"})
#: ops that finish a value: no op after them continues it (an Add the converter fused after a Conv, naming the Conv's
#: module among its locations, adds another module's value; after an elementwise op it may finish the same module's)
FINISHING = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D", "CONV_3D_TRANSPOSE",
                       "FULLY_CONNECTED", "BATCH_MATMUL", "MAX_POOL_2D", "AVERAGE_POOL_2D", "L2_POOL_2D", "MEAN",
                       "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "SOFTMAX", "LOG_SOFTMAX", "GELU",
                       "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "CONCATENATION", "EMBEDDING_LOOKUP"})
#: ops whose outputs are channels-last by definition (TFLite's NHWC / NDHWC kernels)
CHANNELS_LAST_OPS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "MAX_POOL_2D", "AVERAGE_POOL_2D",
                               "L2_POOL_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "SPACE_TO_DEPTH",
                               "DEPTH_TO_SPACE", "CONV_3D", "CONV_3D_TRANSPOSE"})
#: ops that change what the axes mean: a channels-last input does not make a channels-last output
_REARRANGES = frozenset({"TRANSPOSE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "FULLY_CONNECTED", "BATCH_MATMUL",
                         "GATHER", "GATHER_ND"})


def split_segment(segment: str) -> tuple[str, str]:
    """One level of a location: ``(class, attribute)``. litert-torch writes ``module.Class_attr``; a class name
    keeps its leading underscores (``_DenseLayer``), the attribute starts after the class name's first ``_``
    (class names are CamelCase; a class with ``_`` in its name is read right only against the model:
    :func:`resolve_location`). A level with no ``_`` after its class is the root (no attribute).

    Example:
        >>> split_segment("torch.nn.modules.conv.Conv2d_conv1")
        ('torch.nn.modules.conv.Conv2d', 'conv1')
        >>> split_segment("transformers.models.llama.modeling_llama.LlamaAttention_self_attn")
        ('transformers.models.llama.modeling_llama.LlamaAttention', 'self_attn')
        >>> split_segment("torchvision.models.densenet._DenseLayer_denselayer1"), split_segment("__main__.Net")
        (('torchvision.models.densenet._DenseLayer', 'denselayer1'), ('__main__.Net', ''))
    """
    module, dot, tail = segment.rpartition(".")
    lead = len(tail) - len(tail.lstrip("_"))
    cut = tail.find("_", lead)
    if cut < 0:
        return segment, ""
    return module + dot + tail[:cut], tail[cut + 1:]


@dataclass(frozen=True)
class Location:
    """The modules one op ran in, as litert-torch names them: ``segments`` outermost first, the root's class alone
    first, then one ``Class_attr`` per module level.

    Example:
        >>> loc = parse_locations("m.Net/torch.nn.modules.container.Sequential_layer1/m.Block_0/m.Conv_conv1;1")[0]
        >>> loc.chain, loc.attrs, loc.depth
        ('layer1.0.conv1', ('layer1', '0', 'conv1'), 3)
    """

    segments: tuple[str, ...]

    @property
    def attrs(self) -> tuple[str, ...]:
        """The attribute of each level below the root."""
        return tuple(split_segment(s)[1] for s in self.segments[1:])

    @property
    def chain(self) -> str:
        """The levels' attributes joined by dots: the module path where every level is a called child."""
        return ".".join(self.attrs)

    @property
    def depth(self) -> int:
        return len(self.segments) - 1

    def within(self, other: "Location") -> bool:
        """Whether this location is ``other`` or a module inside it."""
        return self.segments[:len(other.segments)] == other.segments


def parse_locations(name: str) -> tuple[Location, ...]:
    """The module locations a tensor name carries, the producing op's first (each once); ``()`` for a name that
    carries none (a signature's ``serving_default_output_0_output``, an input).

    Example:
        >>> name = ("torchvision.models.resnet.ResNet/torch.nn.modules.activation.ReLU_relu;;"
        ...         "torchvision.models.resnet.ResNet/torch.nn.modules.batchnorm.BatchNorm2d_bn1;;"
        ...         "torchvision.models.resnet.ResNet/torch.nn.modules.conv.Conv2d_conv1;1")
        >>> [loc.chain for loc in parse_locations(name)]
        ['relu', 'bn1', 'conv1']
        >>> parse_locations("serving_default_output_0_output")
        ()
    """
    out: list[Location] = []
    for part in name.split(";"):
        if not part or part.isdigit():  # the separators' empty parts and the number that makes names unique
            continue
        segments = tuple(part.split("/"))
        # every level is a class's module-qualified name: a plain tensor name has no dot in some part
        if all("." in s and " " not in s for s in segments):
            loc = Location(segments)
            if loc not in out:
                out.append(loc)
    return tuple(out)


def short_name(name: str) -> str:
    """A tensor name with each module location cut to its chain (``layer1.0.relu``), then ``;`` and the number
    that makes it unique (never a bare module path): what tables show and taps accept for a program's tensor.

    Example:
        >>> short_name("m.Net/torch.nn.modules.activation.ReLU_relu;;m.Net/torch.nn.modules.conv.Conv2d_conv1;1")
        'relu;conv1;1'
        >>> short_name("m.Net/m.Attention_attn;"), short_name("serving_default_output_0_output")
        ('attn;', 'serving_default_output_0_output')
    """
    locs = parse_locations(name)
    if not locs:
        return name
    tail = name.rsplit(";", 1)[-1] if ";" in name else ""
    return ";".join(loc.chain or "(root)" for loc in locs) + ";" + (tail if tail.isdigit() else "")


@dataclass(frozen=True)
class Op:
    """One op of the program: its index (Model Explorer's node id), kind (``CONV_2D``), input and output tensors
    (``-1``: an optional input left out).

    Example:
        >>> Op(0, "CONV_2D", (0, 1, 2), (3,)).outputs
        (3,)
    """

    index: int
    kind: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass
class ProgramGraph:
    """The signature's subgraph of a LiteRT program: ops in execution order, tensors by index (name, shape, type),
    the signature's inputs and outputs by name.

    Example:
        >>> g = ProgramGraph([Op(0, "CONV_2D", (0,), (1,)), Op(1, "ADD", (1, 0), (2,))], ["x", "c", "y"],
        ...                  [(1, 4, 4, 8)] * 3, ["float32"] * 3, {"x": 0}, {"y": 2})
        >>> g.producer, g.consumers, sorted(g.channels_last())
        ({1: 0, 2: 1}, {0: [0, 1], 1: [1]}, [1])
        >>> ProgramGraph.read("missing.tflite")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such LiteRT program: 'missing.tflite'
    """

    ops: list[Op]
    names: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    inputs: dict[str, int]
    outputs: dict[str, int]
    subgraph: int = 0
    signature: str = "serving_default"

    @classmethod
    def read(cls, path: str | os.PathLike, signature: str | None = None) -> "ProgramGraph":
        """The graph of ``signature`` (default: ``serving_default``, else the first) in the program at ``path``,
        read from its flatbuffer without loading the weights' values."""
        if not Path(path).is_file():
            raise LayertapError(f"no such LiteRT program: '{path}'")
        try:
            from ai_edge_litert import schema_py_generated as fb  # LiteRT's extra, only for a program
        except ImportError:
            raise missing_litert() from None
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            model = fb.Model.GetRootAs(buf, 0)
            kinds = {v: k for k, v in vars(fb.BuiltinOperator).items() if isinstance(v, int)}
            types = {v: k.lower() for k, v in vars(fb.TensorType).items() if isinstance(v, int)}
            codes = [model.OperatorCodes(i) for i in range(model.OperatorCodesLength())]
            op_kinds = [kinds.get(max(c.BuiltinCode(), c.DeprecatedBuiltinCode()), "CUSTOM") for c in codes]
            sigs = [model.SignatureDefs(i) for i in range(model.SignatureDefsLength())]
            keys = [(s.SignatureKey() or b"").decode() for s in sigs]
            chosen = sigs[keys.index(signature or "serving_default")] if (signature or "serving_default") in keys \
                else (sigs[0] if sigs else None)
            index = chosen.SubgraphIndex() if chosen is not None else 0
            sg = model.Subgraphs(index)
            tensors = [sg.Tensors(j) for j in range(sg.TensorsLength())]
            ops = [Op(k, op_kinds[o.OpcodeIndex()], tuple(int(i) for i in o.InputsAsNumpy()),
                      tuple(int(i) for i in o.OutputsAsNumpy()))
                   for k, o in ((k, sg.Operators(k)) for k in range(sg.OperatorsLength()))]
            names = [(t.Name() or b"").decode(errors="replace") for t in tensors]
            shapes = [tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else () for t in tensors]
            dtypes = [types.get(t.Type(), "float32") for t in tensors]
            if chosen is not None:
                ins = {chosen.Inputs(j).Name().decode(): chosen.Inputs(j).TensorIndex()
                       for j in range(chosen.InputsLength())}
                outs = {chosen.Outputs(j).Name().decode(): chosen.Outputs(j).TensorIndex()
                        for j in range(chosen.OutputsLength())}
            else:  # no signature: the subgraph's own inputs and outputs, by tensor name
                ins = {names[int(i)]: int(i) for i in sg.InputsAsNumpy()}
                outs = {names[int(i)]: int(i) for i in sg.OutputsAsNumpy()}
            signature_key = keys[sigs.index(chosen)] if chosen is not None else ""
        return cls(ops, names, shapes, dtypes, ins, outs, index, signature_key)

    @cached_property
    def producer(self) -> dict[int, int]:
        """Tensor -> the op that writes it."""
        return {t: op.index for op in self.ops for t in op.outputs}

    @cached_property
    def consumers(self) -> dict[int, list[int]]:
        """Tensor -> the ops that read it."""
        out: dict[int, list[int]] = {}
        for op in self.ops:
            for t in op.inputs:
                if t >= 0:
                    out.setdefault(t, []).append(op.index)
        return out

    @cached_property
    def short_names(self) -> list[str]:
        """Each op output's :func:`short_name` (others, weights among them, keep their names), ``[t`` the tensor's
        index ``]`` added where the short one would repeat another's (``0.attn;[t60]``: an op the converter fused from two
        of the module's own)."""
        written = {t for op in self.ops for t in op.outputs}
        short = [short_name(n) if k in written else n for k, n in enumerate(self.names)]
        seen: dict[str, int] = {}
        for s in short:
            seen[s] = seen.get(s, 0) + 1
        return [s if seen[s] == 1 or s == n else f"{s}[t{k}]" for k, (s, n) in enumerate(zip(short, self.names))]

    def tensor_named(self, name: str) -> int | None:
        """The tensor a name (full or short) names, ``None`` for none."""
        for names in (self.names, self.short_names):
            if name in names:
                return names.index(name)
        return None

    @cached_property
    def locations(self) -> dict[int, tuple[Location, ...]]:
        """Op -> the locations its (first) output's name carries."""
        return {op.index: parse_locations(self.names[op.outputs[0]]) for op in self.ops if op.outputs}

    @cached_property
    def first_seen(self) -> dict[Location, int]:
        """Location -> the first op that names it (as its producer or among the locations it fused)."""
        seen: dict[Location, int] = {}
        for k, locs in self.locations.items():
            for loc in locs:
                seen.setdefault(loc, k)
        return seen

    def channels_last(self) -> set[int]:
        """The op outputs held channels-last (NHWC): the outputs of TFLite's NHWC kernels and of the ops that keep
        the layout of channels-last inputs (elementwise ops, padding, a concatenation of such values)."""
        tagged: set[int] = set()
        graph_inputs = set(self.inputs.values())
        for op in self.ops:
            if not op.outputs:
                continue
            out = op.outputs[0]
            if op.kind in CHANNELS_LAST_OPS:
                tagged.add(out)
                continue
            rank = len(self.shapes[out])
            if op.kind in _REARRANGES or rank < 3:
                continue
            live = [t for t in op.inputs if t >= 0 and (t in self.producer or t in graph_inputs)
                    and len(self.shapes[t]) == rank]
            if live and all(t in tagged for t in live):
                tagged.add(out)
        return tagged


@dataclass(frozen=True)
class ModuleValue:
    """One call of a module as the program holds it: the tensor with its value, or ``None`` where the converter
    fused it into another op (``fused_into``: the module that op's location leads with, ``fused_op`` the op, when a
    location says which). ``ops``: the ops of the call (its Model Explorer nodes).

    Example:
        >>> v = ModuleValue(Location(("m.Net", "m.Conv_conv")), 0, None, Location(("m.Net", "m.ReLU_relu")), (2,), 2)
        >>> v.location.chain, v.fused_into.chain
        ('conv', 'relu')
    """

    location: Location
    call: int
    tensor: int | None
    fused_into: Location | None = None
    ops: tuple[int, ...] = field(default=(), compare=False)
    #: the op it was fused into (its index), where ``fused_into`` is known
    fused_op: int | None = None


def module_values(graph: ProgramGraph) -> list[ModuleValue]:
    """Every module call the program's tensor names locate (the root aside), in the order their first ops run.

    A module's ops are those whose producing location is the module or inside it; its calls are the groups of
    those ops connected by data flow (a module called twice in a row cannot be told apart this way: one group).
    A call's value is the one tensor its group hands to ops outside it, unless an op outside the module reads it
    while naming the module among the locations it fused (the module's last op went into that op: a Conv's
    padded input read by the Conv+BatchNorm+ReLU op), unless the op that made it finishes values (:data:`FINISHING`:
    names can list modules whose constants the converter shared), or the group only rearranges values
    (:data:`MOVES`). A module no op produces
    (only fused into others' ops) has one call, fused into the first op that names it.

    Example:
        >>> conv, relu = "m.Net/m.Conv_conv;1", "m.Net/m.ReLU_relu;;m.Net/m.Conv_conv;1"
        >>> g = ProgramGraph([Op(0, "TRANSPOSE", (0,), (1,)), Op(1, "CONV_2D", (1,), (2,))], ["x", conv, relu],
        ...                  [(1, 3, 4, 4), (1, 4, 4, 3), (1, 4, 4, 8)], ["float32"] * 3, {"x": 0}, {"y": 2})
        >>> [(v.location.chain, v.tensor, v.fused_into and v.fused_into.chain) for v in module_values(g)]
        [('conv', None, 'relu'), ('relu', 2, None)]
    """
    members: dict[Location, list[int]] = {}
    fused: dict[Location, int] = {}  # a location -> the first op naming it as fused
    for k, locs in graph.locations.items():
        if not locs:
            continue
        lead = locs[0]
        for depth in range(1, lead.depth + 1):
            members.setdefault(Location(lead.segments[:depth + 1]), []).append(k)
        for loc in locs[1:]:
            if loc.depth and loc not in fused:
                fused[loc] = k
    values: list[ModuleValue] = []
    for loc, ops in members.items():
        for call, group in enumerate(_groups(graph, loc, ops)):
            values.append(_call_value(graph, loc, call, group, fused))
    for loc, k in fused.items():
        if loc not in members:
            values.append(ModuleValue(loc, 0, None, graph.locations[k][0], (k,), k))
    return sorted(values, key=lambda v: (min(v.ops), v.location.depth))


def _groups(graph: ProgramGraph, loc: Location, ops: Sequence[int]) -> list[list[int]]:
    """``loc``'s ``ops`` split into its calls: the groups connected by data flow among themselves, in the order
    they first run. An op that also fused a module outside ``loc`` seen first there (a Conv+BatchNorm that ran
    between two calls of a ReLU, fused into the second's op) starts another call."""
    def starts_a_call(k: int) -> bool:
        return any(graph.first_seen[other] == k and not other.within(loc) and not loc.within(other)
                   for other in graph.locations[k][1:])

    links = ((k, p) for k in ops if not starts_a_call(k) for t in graph.ops[k].inputs
             if (p := graph.producer.get(t)) is not None)
    return linked_groups(ops, links)


def _call_value(graph: ProgramGraph, loc: Location, call: int, group: list[int],
                fused: Mapping[Location, int]) -> ModuleValue:
    """One call's value (see :func:`module_values`)."""
    inside = set(group)
    outputs = set(graph.outputs.values())
    leaving = [t for k in group for t in graph.ops[k].outputs
               if t in outputs or any(c not in inside for c in graph.consumers.get(t, ()))]
    if len(leaving) == 1 and any(graph.ops[k].kind not in MOVES for k in group):
        finished = graph.ops[graph.producer[leaving[0]]].kind in FINISHING
        continued = None if finished else _continued_in(graph, loc, leaving[0])
        if continued is None:
            return ModuleValue(loc, call, leaving[0], None, tuple(group))
        return ModuleValue(loc, call, None, graph.locations[continued][0], tuple(group), continued)
    holder = next((c for t in leaving for c in graph.consumers.get(t, ()) if loc in graph.locations.get(c, ())[1:]),
                  fused.get(loc))
    return ModuleValue(loc, call, None, graph.locations[holder][0] if holder is not None else None, tuple(group),
                       holder)


def _continued_in(graph: ProgramGraph, loc: Location, tensor: int) -> int | None:
    """The op outside ``loc`` that reads ``tensor`` and names ``loc`` among the locations it fused (``loc``'s
    last op went into it), ``None`` if none does. An op of an enclosing module naming it fused only a reshape
    of the value (a residual Add taking a Linear's output back to 3-D): the value stands."""
    for c in graph.consumers.get(tensor, ()):
        locs = graph.locations.get(c, ())
        if loc in locs[1:] and not loc.within(locs[0]):
            return c
    return None


def resolve_location(loc: Location, segments: Mapping[str, Sequence[str]]) -> str | None:
    """The model's module path of ``loc``: each level is a module below the one before (a container that is never
    called, such as an ``nn.ModuleList``, has no level of its own) whose ``Class_attr`` is the level's text;
    ``segments``: that text -> the model's paths that have it (:func:`segment_index`). Where the program was
    converted from a wrapper around the model, the wrapper's levels are skipped. ``None``: no module fits.

    Example:
        >>> index = segment_index({"": "m.Net", "layers": "torch.nn.ModuleList", "layers.0": "m.Block",
        ...                        "layers.0.attn": "m.Attention"})
        >>> resolve_location(Location(("m.Net", "m.Block_0", "m.Attention_attn")), index)
        'layers.0.attn'
    """
    for start in range(1, len(loc.segments)):
        path: str | None = ""
        for seg in loc.segments[start:]:
            below = [p for p in segments.get(seg, ()) if not path or p.startswith(path + ".")]
            path = min(below, key=lambda p: (p.count("."), p)) if below else None
            if path is None:
                break
        if path:
            return path
    return None


def segment_index(classes: Mapping[str, str]) -> dict[str, list[str]]:
    """``Class_attr`` (a location's level) -> the module paths it names; ``classes``: module path -> its class's
    module-qualified name (the root's path ``""`` is no level).

    Example:
        >>> segment_index({"": "m.Net", "layer1.0": "m.Block"})
        {'m.Block_0': ['layer1.0']}
    """
    out: dict[str, list[str]] = {}
    for path, cls in classes.items():
        if path:
            out.setdefault(f"{cls}_{path.rsplit('.', 1)[-1]}", []).append(path)
    return out


def chain_matches(chain: str, path: str) -> bool:
    """Whether a location's chain (``0.attn``) may name the module ``path`` (``layers.0.attn``): its parts in
    order among the path's, the last the same (the chain leaves out containers that were never called).

    Example:
        >>> chain_matches("0.attn", "layers.0.attn"), chain_matches("attn", "layers.0.mlp"), chain_matches("", "")
        (True, False, True)
    """
    want, have = chain.split(".") if chain else [], path.split(".") if path else []
    if not want or not have:
        return want == have
    if want[-1] != have[-1]:
        return False
    it = iter(have)
    return all(part in it for part in want)


def resolve_chain(chain: str, paths: Sequence[str]) -> str | None:
    """The one of ``paths`` (a model's or a report's module paths) that a location's chain names, by names alone
    (:func:`chain_matches`; the fewest levels where several fit); leading levels no path has are a wrapper the
    program was converted from, skipped. ``None``: none fits.

    Example:
        >>> resolve_chain("0.attn", ["layers.0", "layers.0.attn", "layers.1.attn"])
        'layers.0.attn'
        >>> resolve_chain("wrapper.model.fc", ["fc", "head.fc"])
        'fc'
    """
    parts = chain.split(".") if chain else []
    for start in range(len(parts)):
        sub = ".".join(parts[start:])
        fits = [p for p in paths if chain_matches(sub, p)]
        if fits:
            return sub if sub in fits else min(fits, key=lambda p: (p.count("."), p))
    return None


def chain_for(path: str, chains: Iterable[str]) -> str | None:
    """The location chain among ``chains`` that names the module ``path`` (a model path, or a chain itself): the
    same text, else the longest chain that may name it (:func:`chain_matches`).

    Example:
        >>> chain_for("layers.0.attn", ["0", "0.attn", "1.attn"]), chain_for("fc", ["0.attn"])
        ('0.attn', None)
    """
    chains = list(chains)
    if path in chains:
        return path
    fits = [c for c in chains if c and chain_matches(c, path)]
    return max(fits, key=lambda c: (c.count("."), c)) if fits else None


def channels_first(shape: Sequence[int]) -> tuple[int, ...]:
    """The order of axes that takes a channels-last value of rank ``len(shape)`` to PyTorch's channels-first.

    Example:
        >>> channels_first((1, 8, 8, 16))
        (0, 3, 1, 2)
    """
    n = len(shape)
    return (0, n - 1, *range(1, n - 1))
