"""``lt.add_outputs``: expose intermediate tensors of an existing ONNX file as outputs.

Modelled on ``onnx.utils.Extractor``: one class of small single-verb helpers,
plain errors up front, but without loading the weights. The graph is read with
``load_external_data=False`` and only graph outputs (and a few ``Identity``
nodes) are added, so memory does not grow with weight size.

External data in the output (``DST`` in another folder than ``SRC``): ONNX
Runtime refuses data paths that leave a model's folder, so references cannot
point back at the originals. Decision: when ``DST`` sits in ``SRC``'s folder
the output refers to the very same data files (no copy, instant, the input's
files are only read); otherwise each data file is copied next to ``DST`` as
``DST.data`` (``DST.data1``, ... when there are several; a fresh name when
replacing an earlier ``DST``, see :mod:`layertap.onnxfile.publish`) and the
references are rewritten. The copy is a copy-on-write clone where the file
system offers one, else only the data ranges of a sparse file are copied
(:func:`layertap.files.writes.copy_data`); never a link, so editing the output
cannot change the input. Write into the input's folder to avoid copying big
weights elsewhere.

Naming: a tensor asked for by name keeps its name; a module output gets its
selector's name (``layer3.1``, ``layer2.0.relu#1``) through an ``Identity`` node.

A tensor inside an ``If``/``Loop``/``Scan`` subgraph is carried out to the main
graph first (:mod:`layertap.onnxfile.branches`): an output of the enclosing node
under the tensor's own name, empty when its branch did not run, stacked over the
iterations of a loop. ``all=True`` marks the main graph's tensors only.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from ..errors import LayertapWarning, OnnxFileError, unknown_name
from ..files.reads import operation, refuse_inputs
from ..files.writes import check_output_path, copy_data, temp_path
from ..selectors import Tap
from .branches import Carrier, branch_tensors, has_subgraphs
from .modelfile import ModelFile, read_model
from .publish import publish
from .scopemap import ScopeMap, expose_fused_values_in_place, is_fused_llm, stand_ins
from .tensor_types import TensorTyper, tensor_types
from .walk import attribute_graphs, defines

if TYPE_CHECKING:  # pragma: no cover
    import onnx

ALL_WARNING = (
    "--all marks every tensor as an output: ONNX Runtime cannot fuse nodes whose outputs are graph outputs, "
    "so the edited model runs different (slower) kernels than the original"
)
_IDENTITY_PREFIX = "layertap/Identity/"


def add_outputs(src: str | os.PathLike, dst: str | os.PathLike, tensors: Sequence[str] = (), modules: Sequence[str] = (),
                all: bool = False, *, typer: TensorTyper | None) -> list[str]:  # noqa: A002 - lt.add_outputs' keyword
    """Write a copy of ``src`` to ``dst`` with extra graph outputs; return their names
    (``lt.add_outputs``: :func:`layertap.runtimes.add_outputs` hands in ONNX Runtime as ``typer``).

    ``tensors`` are ONNX tensor names (node outputs, graph inputs, initializers);
    ``modules`` are tap selectors of PyTorch module paths (``layer3.1``,
    ``layer2.0.relu#1``, ``fc:input``), resolved through the exporter's scope
    information; ``all=True`` marks every node output (and warns: it blocks ORT
    fusions). The original outputs stay first and unchanged; ``src`` is never
    modified and ``dst`` is written atomically. ``typer`` types what shape inference
    leaves open (``None``: nothing does, and such a tensor is refused).

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> path = str(write_tiny_model(tempfile.mkdtemp()))  # y = -relu(x); modules act, neg
        >>> add_outputs(path, path.replace("m.onnx", "tapped.onnx"), modules=["act"], typer=None)
        ['act']
    """
    with operation():
        out = check_output_path(dst, inputs=(src,), suffixes=(".onnx",))
        mf = read_model(src)
        adder = OutputAdder(mf, typer=typer)
        pairs = adder.resolve(tensors=tensors, modules=modules, all=all)
        added = adder.apply(pairs)
        refuse_inputs(out)  # now that the external data files are known
        _write(mf, out)
    return added


class OutputAdder:
    """Resolve requests to tensors and add them, typed, as graph outputs of ``mf.model``.

    An editor: works in place on ``mf.model`` (give it a model of your own, such as the copy
    :func:`~layertap.onnxfile.modelfile.read_model` just loaded; the file is untouched). Besides the
    outputs (and an ``Identity`` per alias) it adds nodes only to carry branch tensors out
    (:attr:`carried`) and, reading a fused decoder's module scopes, to make its hidden values
    tensors (:attr:`exposed_fused`). ``typer`` types what shape inference leaves open.

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> path = str(write_tiny_model(tempfile.mkdtemp()))  # y = -relu(x); modules act, neg
        >>> adder = OutputAdder(read_model(path))
        >>> adder.apply(adder.resolve(tensors=["x"], modules=["act"])), adder.outputs
        (['x', 'act'], ['y', 'x', 'act'])
    """

    def __init__(self, mf: ModelFile, *, typer: TensorTyper | None = None) -> None:
        self.mf = mf
        self.typer = typer
        self.graph = mf.model.graph
        self._scopes = None
        self._stand_ins: dict[str, str] | None = None
        self._produced = {t for n in self.graph.node for t in n.output if t}
        self._inputs = {i.name for i in self.graph.input}
        self._inits = {i.name for i in self.graph.initializer}
        self.outputs = [o.name for o in self.graph.output]
        self._carrier: Carrier | None = None
        self._branches: dict[str, str] | None = None
        #: branch tensors carried out to the main graph -> where they are computed
        self.carried: dict[str, str] = {}
        #: the values a fused decoder's ops hide were made tensors of the graph (for its module scopes)
        self.exposed_fused = False

    # -- resolving --------------------------------------------------------------
    @property
    def scopes(self):
        if self._scopes is None:
            # the module taps of a fused decoder name tensors its graph must then compute
            if is_fused_llm(self.graph):
                self.exposed_fused = expose_fused_values_in_place(self.graph)
            self._scopes = ScopeMap.from_model(self.mf.model, branches=True)
        return self._scopes

    def known_tensors(self) -> set[str]:
        return self._produced | self._inputs | self._inits

    def resolve(self, tensors: Iterable[str] = (), modules: Iterable[str] = (), all: bool = False) -> list[tuple[str, str]]:  # noqa: A002
        """``[(output name, tensor)]`` for every request, in request order."""
        pairs = [self.resolve_tensor(t) for t in tensors]
        for text in modules:
            pairs.extend(self.resolve_module(text))
        if all:
            warnings.warn(ALL_WARNING, stacklevel=3)
            pairs.extend((t, t) for n in self.graph.node for t in n.output if t)
        return dedupe(pairs)

    def resolve_tensor(self, name: str) -> tuple[str, str]:
        """A tensor by its ONNX name (also a name recorded by ``lt.export``)."""
        if name in self.known_tensors():
            self.note_quantized(name)
            return (name, name)
        if self.carry(name) is not None:
            return (name, name)
        where = self.nested_location(name)
        if where:
            raise OnnxFileError(f"tensor {name!r} is {where}; only tensors of the main graph can become outputs")
        raise OnnxFileError(unknown_name("tensor", name, sorted(self.known_tensors() | set(self.branch_tensors()))))

    def note_quantized(self, name: str) -> None:
        """Warn (one line) when the graph computes with ``name``'s dequantised copy, not with ``name``.

        The tensor asked for is still the one returned: the user named it. Its
        ``QuantizeLinear -> DequantizeLinear`` output is what the graph really uses
        (and what a module tap answers), so the note names that tensor.
        """
        if self._stand_ins is None:
            self._stand_ins = stand_ins(self.graph)
        used = self._stand_ins.get(name)
        if used is not None:
            warnings.warn(
                f"tensor {name!r} is quantised: the graph computes with its QuantizeLinear -> DequantizeLinear "
                f"value {used!r} (tap that name for the value the model uses)",
                LayertapWarning,
                stacklevel=4,
            )

    def resolve_module(self, text: str) -> list[tuple[str, str]]:
        """A module tap (``layer2.0.relu#1``); names already made outputs by ``lt.export`` pass through."""
        if text in self.outputs:
            return [(text, text)]
        return self.resolve_scoped(Tap.parse(text))

    def resolve_scoped(self, tap: Tap) -> list[tuple[str, str]]:
        """A module tap through the file's scopes; a tensor of a branch it answers with is carried out."""
        pairs = self.scopes.resolve(tap)
        known = self.known_tensors()
        for _, tensor in pairs:
            if tensor not in known:
                self.carry(tensor)
        return pairs

    def branch_tensors(self) -> dict[str, str]:
        """The tensors of the subgraphs (``If``/``Loop``/``Scan``) -> where each is computed; read once."""
        if self._branches is None:
            self._branches = branch_tensors(self.graph) if has_subgraphs(self.graph) else {}
        return self._branches

    def carry(self, name: str) -> str | None:
        """Carry a tensor of an ``If``/``Loop``/``Scan`` subgraph out to the main graph (see
        :mod:`layertap.onnxfile.branches`); its main-graph name, or ``None`` when no subgraph computes it."""
        where = self.branch_tensors().get(name)
        if where is None:
            return None
        if self._carrier is None:
            self._carrier = Carrier(self.mf.model)
        got = self._carrier.carry(name)
        if got is not None:
            self._produced.add(got)
            self.carried[got] = where
        return got

    def nested_location(self, name: str) -> str | None:
        """Where ``name`` lives when it is not a main-graph tensor (a subgraph, a function), else ``None``."""
        for node in self.graph.node:
            for a in node.attribute:
                if any(defines(g, name) for g in attribute_graphs(a)):
                    return f"inside the '{a.name}' subgraph of {node.op_type} node {node.name or '(unnamed)'!r}"
        for f in self.mf.model.functions:
            if any(name in n.output for n in f.node) or name in f.input or name in f.output:
                return f"inside the local function {f.domain}:{f.name} (functions are expanded only at run time)"
        return None

    # -- adding -------------------------------------------------------------------
    def apply(self, pairs: Sequence[tuple[str, str]]) -> list[str]:
        """Add ``(name, tensor)`` pairs as typed outputs; return the names added."""
        import onnx

        pairs = [(n, t) for n, t in dedupe(pairs) if n not in self.outputs]
        self._check_names(pairs)
        types = self._types([t for _, t in pairs])
        for name, tensor in pairs:
            if name != tensor:
                self.graph.node.append(
                    onnx.helper.make_node("Identity", [tensor], [name], name=_IDENTITY_PREFIX + name)
                )
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(types[tensor])
            vi.name = name
            self.graph.output.append(vi)
            self.outputs.append(name)
        return [n for n, _ in pairs]

    def _check_names(self, pairs: Sequence[tuple[str, str]]) -> None:
        taken = self.known_tensors()
        for name, tensor in pairs:
            if name != tensor and name in taken:
                raise OnnxFileError(
                    f"cannot name an output {name!r}: the graph already has a tensor of that name; "
                    f"give the tap an alias (ALIAS={name})"
                )

    def _types(self, tensors: Sequence[str]) -> dict[str, "onnx.ValueInfoProto"]:
        """Type and shape per tensor: shape inference first, the typer (ONNX Runtime) for the rest."""
        known = tensor_types(self.mf.model, self.mf.folder, tensors, typer=self.typer)
        still = [t for t in dict.fromkeys(tensors) if t not in known]
        if still:
            raise OnnxFileError(
                f"cannot find the type of tensor {still[0]!r} (shape inference and ONNX Runtime both failed); "
                "refusing to write an untyped output"
            )
        return known


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------
def _write(mf: ModelFile, out: Path) -> None:
    """Write the edited model and (in another folder) copies of its data, as one unit (see publish)."""
    copies: dict[str, Path] = {}
    try:
        if mf.external and out.parent.resolve() != mf.folder.resolve():
            for loc in mf.data_files():
                copies[loc] = temp_path(out, suffix=".data.tmp")
                copy_data(mf.folder / loc, copies[loc])  # a clone or the data ranges alone where the system can
        publish(mf.model, out, copies)
    finally:
        for tmp in copies.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
def dedupe(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The one rule for repeated requests: the same name for the same tensor counts once.

    The same name for two different tensors is refused.

    Example:
        >>> dedupe([("layer1.0", "t1"), ("layer1.0", "t1"), ("b", "t1")])
        [('layer1.0', 't1'), ('b', 't1')]
    """
    seen: dict[str, str] = {}
    out = []
    for name, tensor in pairs:
        if name in seen:
            if seen[name] != tensor:
                raise OnnxFileError(f"two requests are both named {name!r}; give one an alias (ALIAS=PATH)")
            continue
        seen[name] = tensor
        out.append((name, tensor))
    return out
