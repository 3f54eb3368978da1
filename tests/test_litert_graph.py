"""A LiteRT program's tensors by PyTorch module path: the location names litert-torch writes, read without LiteRT.

The names below are real: copied from litert-torch 0.10 conversions of torchvision's resnet18 and of a small
transformer (two blocks in an nn.ModuleList, each LayerNorm, attention with q/k/v/out Linear, LayerNorm, MLP).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from layertap.cli.main import main
from layertap.runtimes.litert_foreign import Located, ModelCalls, Pick, fit, match_calls
from layertap.runtimes.litert_graph import (
    Location,
    Op,
    ProgramGraph,
    chain_for,
    module_values,
    parse_locations,
    resolve_chain,
    resolve_location,
    segment_index,
    short_name,
    split_segment,
)

R = "torchvision.models.resnet.ResNet"
L1 = f"{R}/torch.nn.modules.container.Sequential_layer1"
B0 = f"{L1}/torchvision.models.resnet.BasicBlock_0"
B1 = f"{L1}/torchvision.models.resnet.BasicBlock_1"
DS = (f"{R}/torch.nn.modules.container.Sequential_layer2/torchvision.models.resnet.BasicBlock_0/"
      "torch.nn.modules.container.Sequential_downsample")
RELU, BN, CONV = "torch.nn.modules.activation.ReLU", "torch.nn.modules.batchnorm.BatchNorm2d", "torch.nn.modules.conv.Conv2d"
#: resnet18's op outputs: the stem's Conv+BatchNorm+ReLU fused into one CONV_2D (the ReLU's location first), a
#: block's residual Add with its ReLU (the block's own location second), a location the converter shared between
#: blocks (layer1.0's bn1 in layer1.1's ops), a downsample Sequential's children named 0 and 1
RESNET = {
    f"{R}/{CONV}_conv1;1": ["conv1"],
    f"{R}/{RELU}_relu;;{R}/{BN}_bn1;;{R}/{CONV}_conv1;1": ["relu", "bn1", "conv1"],
    f"{R}/torch.nn.modules.pooling.MaxPool2d_maxpool;2": ["maxpool"],
    f"{B0}/{RELU}_relu;;{B0};;{B0}/{BN}_bn2;;{B0}/{BN}_bn1;": ["layer1.0.relu", "layer1.0", "layer1.0.bn2",
                                                                "layer1.0.bn1"],
    f"{B1}/{BN}_bn2;;{B0}/{BN}_bn1;;{B1}/{CONV}_conv2;1": ["layer1.1.bn2", "layer1.0.bn1", "layer1.1.conv2"],
    f"{DS}/{BN}_1;;{DS}/{CONV}_0;1": ["layer2.0.downsample.1", "layer2.0.downsample.0"],
    f"{R}/torch.nn.modules.pooling.AdaptiveAvgPool2d_avgpool;1": ["avgpool"],
    "serving_default_output_0_output": [],
    "serving_default_args_0": [],
}
T = "__main__.Tiny"
TB0, TB1 = f"{T}/__main__.Block_0", f"{T}/__main__.Block_1"
LIN, ACT = "torch.nn.modules.linear.Linear", "torch.nn.modules.activation.ReLU"
#: the transformer's: a ModuleList's blocks appear as Block_0 / Block_1 (the list itself is never called), an
#: op of the attention module itself, the residual Add the block's output went into with the ReLU after it
TRANSFORMER = {
    f"{TB0}/torch.nn.modules.normalization.LayerNorm_ln1;11": ["0.ln1"],
    f"{TB0}/__main__.Attention_attn/{LIN}_q_proj;2": ["0.attn.q_proj"],
    f"{TB0}/__main__.Attention_attn/{LIN}_k_proj;;{TB0}/__main__.Attention_attn/{LIN}_q_proj;": ["0.attn.k_proj",
                                                                                                "0.attn.q_proj"],
    f"{TB0}/__main__.Attention_attn;": ["0.attn"],
    f"{TB0};;{TB0}/__main__.Attention_attn/{LIN}_out_proj;": ["0", "0.attn.out_proj"],
    f"{TB0}/torch.nn.modules.container.Sequential_mlp/torch.nn.modules.activation.GELU_1;": ["0.mlp.1"],
    f"{T}/{ACT}_act;;{T}/{ACT}_act;;{TB1};;{TB1}/torch.nn.modules.container.Sequential_mlp/{LIN}_2;": [
        "act", "1", "1.mlp.2"],
    f"{T}/torch.nn.modules.normalization.LayerNorm_norm;8": ["norm"],
}


@pytest.mark.parametrize("name, chains", [*RESNET.items(), *TRANSFORMER.items()])
def test_location_names_read_as_module_chains_producer_first(name, chains):
    locs = parse_locations(name)
    assert [loc.chain for loc in locs] == chains
    assert all(loc.segments[0] in (R, T) for loc in locs)  # the root's class leads every location


def test_a_level_is_a_class_and_the_last_part_of_its_attribute_path():
    assert split_segment(f"{RELU}_relu") == (RELU, "relu")
    assert split_segment("transformers.models.llama.modeling_llama.LlamaAttention_self_attn") == (
        "transformers.models.llama.modeling_llama.LlamaAttention", "self_attn")  # the attribute keeps its _
    assert split_segment("torchvision.models.densenet._DenseLayer_denselayer1") == (
        "torchvision.models.densenet._DenseLayer", "denselayer1")  # a private class keeps its leading _
    assert split_segment("m.f.<locals>.Net_0") == ("m.f.<locals>.Net", "0")
    assert split_segment(T) == (T, "")  # the root
    loc = parse_locations(f"{B1}/{BN}_bn2;1")[0]
    assert (loc.attrs, loc.depth, loc.within(parse_locations(f"{B1};")[0])) == (("layer1", "1", "bn2"), 3, True)


def test_short_names_keep_the_modules_and_the_number_never_a_bare_path():
    assert short_name(f"{R}/{RELU}_relu;;{R}/{BN}_bn1;;{R}/{CONV}_conv1;1") == "relu;bn1;conv1;1"
    assert short_name(f"{TB0}/__main__.Attention_attn;") == "0.attn;"
    assert short_name("serving_default_output_0_output") == "serving_default_output_0_output"


#: the transformer's module paths and classes as the model names them (a decoy with the same attribute below)
TINY_CLASSES = {"": T, "layers": "torch.nn.modules.container.ModuleList", "layers.0": "__main__.Block",
                "layers.0.attn": "__main__.Attention", "layers.0.attn.q_proj": LIN, "layers.1": "__main__.Block",
                "layers.1.mlp": "torch.nn.modules.container.Sequential", "layers.1.mlp.2": LIN, "act": ACT,
                "head": "__main__.Head", "head.0": "__main__.Other"}


def test_locations_resolve_to_model_paths_by_class_through_containers_never_called():
    index = segment_index(TINY_CLASSES)
    resolve = {loc.chain: resolve_location(loc, index) for name in TRANSFORMER for loc in parse_locations(name)
               if loc.chain in ("0.attn.q_proj", "0.attn", "act", "1")}
    assert resolve == {"0.attn.q_proj": "layers.0.attn.q_proj", "0.attn": "layers.0.attn", "act": "act", "1": "layers.1"}
    # a level is matched by its class too: head.0 is no Block
    assert resolve_location(Location((T, "__main__.Block_0")), segment_index({"": T, "head.0": "__main__.Other"})) is None
    # a program converted from a wrapper around the model: the wrapper's levels are skipped
    wrapped = Location(("w.Wrapper", "w.Inner_model", "__main__.Block_1", f"{LIN}_q_proj"))
    assert resolve_location(wrapped, segment_index({**TINY_CLASSES, "layers.1.q_proj": LIN})) == "layers.1.q_proj"
    # by names alone (a report's paths, a --tap)
    assert resolve_chain("0.attn.q_proj", list(TINY_CLASSES)) == "layers.0.attn.q_proj"
    assert resolve_chain("wrapper.model.act", list(TINY_CLASSES)) == "act"
    assert chain_for("layers.0.attn", ["0", "0.attn", "1.attn"]) == "0.attn"
    assert chain_for("layers.0.attn", ["0.attn.q_proj"]) is None


def _graph(ops: list[tuple[str, list[str], str, tuple[int, ...]]], inputs: dict[str, tuple[int, ...]],
           outputs: list[str]) -> ProgramGraph:
    """A program by hand: ``(kind, input tensors, output tensor, its shape)`` per op, tensors by name."""
    names, shapes = list(inputs), list(inputs.values())
    for _, _, out, shape in ops:
        names.append(out)
        shapes.append(shape)
    index = {n: i for i, n in enumerate(names)}
    graph_ops = [Op(k, kind, tuple(index[i] for i in ins), (index[out],)) for k, (kind, ins, out, _) in enumerate(ops)]
    return ProgramGraph(graph_ops, names, shapes, ["float32"] * len(names), {"args_0": 0},
                        {f"output_{i}": index[o] for i, o in enumerate(outputs)})


STEM_CONV = f"{R}/{RELU}_relu;;{R}/{BN}_bn1;;{R}/{CONV}_conv1;1"
BLOCK_ADD = f"{B0}/{RELU}_relu;;{B0};;{B0}/{BN}_bn2;;{B0}/{BN}_bn1;"


def _resnet_head() -> ProgramGraph:
    """resnet18's stem and first block as converted: the ops, their names and NHWC shapes."""
    return _graph([
        ("TRANSPOSE", ["x"], f"{R}/{CONV}_conv1;1", (1, 32, 32, 3)),
        ("PAD", [f"{R}/{CONV}_conv1;1"], f"{R}/{CONV}_conv1;2", (1, 38, 38, 3)),
        ("CONV_2D", [f"{R}/{CONV}_conv1;2"], STEM_CONV, (1, 16, 16, 64)),
        ("PADV2", [STEM_CONV], f"{R}/torch.nn.modules.pooling.MaxPool2d_maxpool;1", (1, 18, 18, 64)),
        ("MAX_POOL_2D", [f"{R}/torch.nn.modules.pooling.MaxPool2d_maxpool;1"],
         f"{R}/torch.nn.modules.pooling.MaxPool2d_maxpool;2", (1, 8, 8, 64)),
        ("CONV_2D", [f"{R}/torch.nn.modules.pooling.MaxPool2d_maxpool;2"],
         f"{B0}/{RELU}_relu;;{B0}/{BN}_bn1;;{B0}/{CONV}_conv1;1", (1, 8, 8, 64)),
        ("CONV_2D", [f"{B0}/{RELU}_relu;;{B0}/{BN}_bn1;;{B0}/{CONV}_conv1;1"],
         f"{B0}/{BN}_bn2;;{B0}/{BN}_bn1;;{B0}/{CONV}_conv2;1", (1, 8, 8, 64)),
        ("ADD", [f"{B0}/{BN}_bn2;;{B0}/{BN}_bn1;;{B0}/{CONV}_conv2;1", f"{R}/torch.nn.modules.pooling.MaxPool2d_maxpool;2"],
         BLOCK_ADD, (1, 8, 8, 64)),
        ("MEAN", [BLOCK_ADD], f"{R}/torch.nn.modules.pooling.AdaptiveAvgPool2d_avgpool;1", (1, 64)),
        ("FULLY_CONNECTED", [f"{R}/torch.nn.modules.pooling.AdaptiveAvgPool2d_avgpool;1"],
         "serving_default_output_0_output", (1, 10)),
    ], {"x": (1, 3, 32, 32)}, ["serving_default_output_0_output"])


def _held(graph: ProgramGraph) -> dict[str, str | None]:
    """``chain#call`` -> the short name of the tensor holding it, or ``fused into CHAIN``."""
    return {f"{v.location.chain}#{v.call}": graph.short_names[v.tensor] if v.tensor is not None else
            f"fused into {v.fused_into.chain if v.fused_into else None}" for v in module_values(graph)}


def test_each_module_call_is_the_one_tensor_its_ops_hand_on_or_fused_into_another():
    graph = _resnet_head()
    assert _held(graph) == {
        "conv1#0": "fused into relu",  # its transpose and padding stay; the Conv went into relu's op
        "relu#0": "relu;bn1;conv1;1", "bn1#0": "fused into relu",
        "maxpool#0": "maxpool;2",
        "layer1#0": "layer1.0.relu;layer1.0;layer1.0.bn2;layer1.0.bn1;",
        "layer1.0#0": "layer1.0.relu;layer1.0;layer1.0.bn2;layer1.0.bn1;",  # the block ends with its second ReLU
        "layer1.0.relu#0": "layer1.0.relu;layer1.0.bn1;layer1.0.conv1;1",
        "layer1.0.bn1#0": "fused into layer1.0.relu", "layer1.0.conv1#0": "fused into layer1.0.relu",
        # the Add names bn2 among its locations too, but a Conv finishes its value: bn2 is the CONV_2D's
        "layer1.0.bn2#0": "layer1.0.bn2;layer1.0.bn1;layer1.0.conv2;1", "layer1.0.conv2#0": "fused into layer1.0.bn2",
        "layer1.0.relu#1": "layer1.0.relu;layer1.0;layer1.0.bn2;layer1.0.bn1;",
        "avgpool#0": "avgpool;1",
    }
    assert graph.channels_last() >= {3, 5, 6, 7, 8}  # Conv and pool outputs, and the Add of two of them
    assert 9 not in graph.channels_last()  # the mean over H and W is [1, C]


def test_two_calls_back_to_back_stay_two_calls():
    # SmallNet's ReLU runs after bn1 and again after bn2; the second Conv+BatchNorm went into the second ReLU's
    # op, which reads the first ReLU's output directly
    root = "test_executorch.SmallNet"
    first, second = (f"{root}/{RELU}_relu;;{root}/{BN}_bn1;;{root}/{CONV}_conv1;2",
                     f"{root}/{RELU}_relu;;{root}/{BN}_bn2;;{root}/{CONV}_conv2;2")
    graph = _graph([("TRANSPOSE", ["x"], f"{root}/{CONV}_conv1;", (1, 16, 16, 3)),
                    ("CONV_2D", [f"{root}/{CONV}_conv1;"], first, (1, 16, 16, 8)),
                    ("CONV_2D", [first], second, (1, 16, 16, 16))], {"x": (1, 3, 16, 16)}, [second])
    assert _held(graph) == {"conv1#0": "fused into relu", "relu#0": "relu;bn1;conv1;2", "bn1#0": "fused into relu",
                            "relu#1": "relu;bn2;conv2;2", "bn2#0": "fused into relu", "conv2#0": "fused into relu"}


def test_tensors_fit_module_outputs_by_shape_in_pytorchs_layout():
    graph = _resnet_head()
    located = Located(graph, module_values(graph), graph.channels_last())
    assert fit(located, 6, (1, 64, 8, 8)) == Pick(6, (0, 3, 1, 2))  # NHWC back to NCHW
    assert fit(located, 9, (1, 64, 1, 1)) == Pick(9, None, (1, 64, 1, 1))  # the pool's [1, C] as [1, C, 1, 1]
    assert fit(located, 2, (1, 64, 16, 16)) is None  # the padded input is no output of the stem's Conv
    square = _graph([("CONV_2D", ["x"], "c", (1, 8, 8, 8)), ("TRANSPOSE", ["c"], "t", (1, 8, 8, 8))],
                    {"x": (1, 8, 8, 8)}, ["t"])
    both = Located(square, [], square.channels_last())
    # a shape both layouts fit: the graph says which (a Conv's output is NHWC; a transpose's is not known to be)
    assert fit(both, 1, (1, 8, 8, 8)) == Pick(1, (0, 3, 1, 2)) and fit(both, 2, (1, 8, 8, 8)) == Pick(2)
    linear = _graph([("FULLY_CONNECTED", ["x"], "y", (14, 32))], {"x": (14, 16)}, ["y"])
    assert fit(Located(linear, []), 1, (2, 7, 32)) == Pick(1, None, (2, 7, 32))  # [B*T, C] as [B, T, C]


def test_calls_are_matched_by_module_and_call_and_fused_ones_absorbed():
    graph = _resnet_head()
    located = Located(graph, module_values(graph), graph.channels_last())
    shapes = {("conv1", 0): (1, 64, 16, 16), ("bn1", 0): (1, 64, 16, 16), ("relu", 0): (1, 64, 16, 16),
              ("maxpool", 0): (1, 64, 8, 8), ("layer1.0.conv1", 0): (1, 64, 8, 8), ("layer1.0.bn1", 0): (1, 64, 8, 8),
              ("layer1.0.relu", 0): (1, 64, 8, 8), ("layer1.0.conv2", 0): (1, 64, 8, 8),
              ("layer1.0.bn2", 0): (1, 64, 8, 8), ("layer1.0.relu", 1): (1, 64, 8, 8), ("layer1.0", 0): (1, 64, 8, 8),
              ("layer1", 0): (1, 64, 8, 8), ("avgpool", 0): (1, 64, 1, 1), ("fc", 0): (1, 10)}
    classes = {"": R, "conv1": CONV, "bn1": BN, "relu": RELU, "maxpool": "torch.nn.modules.pooling.MaxPool2d",
               "layer1": "torch.nn.modules.container.Sequential", "layer1.0": "torchvision.models.resnet.BasicBlock",
               "layer1.0.conv1": CONV, "layer1.0.bn1": BN, "layer1.0.relu": RELU, "layer1.0.conv2": CONV,
               "layer1.0.bn2": BN, "avgpool": "torch.nn.modules.pooling.AdaptiveAvgPool2d",
               "fc": "torch.nn.modules.linear.Linear"}
    calls = match_calls(located, shapes, classes)
    assert sorted(calls.names) == sorted([("relu", 0), ("maxpool", 0), ("layer1.0.relu", 0), ("layer1.0.bn2", 0),
                                          ("layer1.0.relu", 1), ("layer1.0", 0), ("layer1", 0), ("avgpool", 0)])
    assert calls.absorbed == {("conv1", 0): ("relu", 0), ("bn1", 0): ("relu", 0), ("layer1.0.conv1", 0):
                              ("layer1.0.relu", 0), ("layer1.0.bn1", 0): ("layer1.0.relu", 0),
                              ("layer1.0.conv2", 0): ("layer1.0.bn2", 0)}
    assert calls.picks[calls.names[("layer1.0.bn2", 0)][0]].perm == (0, 3, 1, 2)
    # a module PyTorch ran twice that the program holds as one group: not told apart, never paired wrongly
    shapes[("maxpool", 1)] = (1, 64, 8, 8)
    calls = match_calls(located, shapes, classes)
    assert ("maxpool", 0) not in calls.names and "not told apart" in calls.missing[("maxpool", 1)]
    assert isinstance(ModelCalls(shapes, classes, {}), ModelCalls)


def test_node_data_keys_a_programs_nodes_by_their_ids(tmp_path):
    from types import SimpleNamespace

    from layertap.comparing import CompareReport, CompareRow
    from layertap.reports.nodedata import node_data, write_node_data

    rows = [CompareRow("conv1", "conv1", 0, "Conv2d", [1], None, None, "absorbed", None, fused_into="relu"),
            CompareRow("relu", "relu", 0, "ReLU", [1], 0.5, 0.5, "FAIL", False, onnx=["relu;bn1;conv1;1"]),
            CompareRow("layer1.0.relu#0", "layer1.0.relu", 0, "ReLU", [1], 1e-7, 1e-7, "pass", True),
            CompareRow("output", "", 0, "ResNet", [1], 0.1, 0.1, "FAIL", False, onnx=["output_0"])]
    nodes = [SimpleNamespace(id="0", outputs=("conv1;1",), module="conv1", call=0),
             SimpleNamespace(id="2", outputs=("relu;bn1;conv1;1",), module="relu", call=0),
             SimpleNamespace(id="5", outputs=("t",), module="layer1.0.relu", call=0),
             SimpleNamespace(id="9", outputs=("serving_default_output_0_output", "output_0"), module=None, call=None),
             SimpleNamespace(id="7", outputs=("u",), module=None, call=None)]
    data = node_data(CompareReport(rows), "m.tflite", nodes)
    assert {k: v["value"] for k, v in data["status"]["results"].items()} == {
        "0": "absorbed", "2": "FAIL (first divergence)", "5": "pass", "9": "FAIL"}
    assert data["module"]["results"]["7"]["value"] == "(root)" and data["error"]["results"]["2"]["value"] == 0.5
    paths = write_node_data(CompareReport(rows), "m.tflite", tmp_path / "nd.json", nodes)
    assert json.loads(paths[1].read_text())["results"]["5"]["value"] == "pass"


def test_node_data_is_refused_for_a_candidate_model_explorer_reads_no_nodes_of(tmp_path, capsys):
    program = tmp_path / "m.pte"
    program.write_bytes(b"\0" * 16)
    code = main(["compare", "torchvision:resnet18", str(program), "--node-data", str(tmp_path / "nd.json")])
    err = capsys.readouterr().err
    assert code == 2 and "--node-data" in err and "ExecuTorch program" in err and ".tflite" in err
    assert not list(tmp_path.glob("nd*.json"))
    assert np.array_equal(Pick(0).apply(np.ones((2, 3))), np.ones((2, 3)))
