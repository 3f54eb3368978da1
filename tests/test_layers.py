"""lt.layers: one row per module call, names usable as taps, shapes that match."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import layertap as lt  # noqa: E402
from _tiny import tiny_clip  # noqa: E402
from layertap.errors import SelectorError  # noqa: E402


@pytest.fixture(scope="module")
def rn_table(resnet18, resnet_input):
    return lt.layers(resnet18, resnet_input)


def test_resnet18_rows(resnet18, rn_table):
    n_calls = 1 + sum(2 if name.endswith(".relu") and name.startswith("layer") else 1
                      for name, _ in resnet18.named_modules() if name)
    assert len(rn_table) == n_calls
    root = rn_table[0]
    assert (root.name, root.type, root.shapes, root.params) == ("", "ResNet", [[2, 1000]], sum(p.numel() for p in resnet18.parameters()))
    relu1 = rn_table.find("layer1.0.relu#1")
    assert (relu1.path, relu1.type, relu1.call, relu1.calls, relu1.shapes, relu1.dtypes) == (
        "layer1.0.relu", "ReLU", 1, 2, [[2, 64, 16, 16]], ["float32"])
    conv = rn_table.find("layer4.0.conv1")
    assert (conv.calls, conv.shapes, conv.params, conv.depth) == (1, [[2, 512, 2, 2]], 512 * 256 * 9, 3)
    with pytest.raises(SelectorError, match="did you mean: layer4.0.conv2, layer4.0.conv1"):
        rn_table.find("layer4.0.conv")


def test_every_name_is_a_tap_with_that_shape(resnet18, resnet_input, rn_table):
    values = lt.extract(resnet18, resnet_input, taps=rn_table.names)
    for row in rn_table.rows[1:]:
        assert [list(values[row.name].shape)] == row.shapes, row.name


def test_rows_are_in_call_order_parents_first(rn_table):
    names = rn_table.names
    assert names.index("layer2") < names.index("layer2.0") < names.index("layer2.0.conv1")
    assert names.index("layer2.0.relu#0") < names.index("layer2.0.conv2") < names.index("layer2.0.relu#1")


def test_render_and_json(rn_table):
    text = rn_table.render()
    assert "layer2.0.relu#1" in text and "BasicBlock" in text and "2x64x16x16" in text
    data = json.loads(rn_table.to_json())
    assert data["rows"][0]["type"] == "ResNet"
    assert {r["name"] for r in data["rows"]} >= {"layer4.0.conv1", "fc"}


def test_without_inputs_lists_modules_without_shapes(resnet18):
    table = lt.layers(resnet18)
    assert len(table) == len(list(resnet18.named_modules()))
    assert all(r.shapes is None and r.calls is None for r in table)
    assert "not run" in table.render()


def test_structured_outputs_and_other_method():
    clip = tiny_clip(layers=1)
    table = lt.layers(clip, pixel_values=torch.randn(1, 3, 32, 32), method="get_image_features")
    attn = table.find("vision_model.encoder.layers.0.self_attn")
    assert attn.structure == "tuple(Tensor[1,17,32], None)"
    assert attn.shapes == [[1, 17, 32]]
    assert table[0].structure.startswith("BaseModelOutputWithPooling(")
    assert not any(n.startswith("text_model") for n in table.names)
    assert "did not run in this get_image_features: text_model" in table.render()
    # the table shows structures compactly; JSON keeps the full text above
    assert "(1x17x32, None)" in table.render() and "(last_hidden_state=1x17x32" in table.render()


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.unused = nn.Linear(4, 4)
        self.a_head_with_a_rather_long_name_that_users_copy = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.a_head_with_a_rather_long_name_that_users_copy(x)


def test_tree_indent_idle_note_and_names_never_cut():
    table = lt.layers(Stack(), torch.randn(2, 4))
    # the ModuleList never runs: its elements sit directly under the root
    assert [r.depth for r in table.rows] == [0, 1, 1, 1, 2]
    # plain containers are not reported as "did not run"
    assert table.notes == ["1 module(s) did not run in this forward: unused"]
    text = table.render(width=70)
    for name in table.names:
        assert name in text, name
