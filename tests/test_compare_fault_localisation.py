"""Fault localisation of the PyTorch vs ONNX comparison: each test reproduces, at its mechanism,
one false alarm or one miss a fault-injection study found (a fault at the right module, and no
alarm on a faithful export).
"""

from __future__ import annotations

import pytest

EXPORTERS = [False, True]  # dynamo


def _row(report, name):
    return next(r for r in report.rows if r.name == name)


def _export(torch_mod, model, x, path, dynamo):
    torch_mod.onnx.export(model, (x,), str(path), dynamo=dynamo)
    return path


# -- tuple elements paired by data flow ---------------------------------------
@pytest.fixture(scope="module")
def tiny_wav2vec2(torch_mod):
    transformers = pytest.importorskip("transformers")
    torch_mod.manual_seed(0)
    # conv_dim[-1] == hidden_size: feature_projection returns two 1x79x32 tensors
    cfg = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
    )
    return transformers.Wav2Vec2Model(cfg).eval(), torch_mod.randn(1, 800, generator=torch_mod.Generator().manual_seed(1))


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_equal_shaped_tuple_elements_pair_by_data_flow(torch_mod, tiny_wav2vec2, tmp_path, dynamo):
    """feature_projection returns (hidden_states, norm_hidden_states): equal shapes, ONNX order reversed."""
    import layertap as lt

    model, x = tiny_wav2vec2
    path = _export(torch_mod, model, x, tmp_path / "w2v.onnx", dynamo)
    report = lt.compare(model, x, path)
    fp = _row(report, "feature_projection")
    assert fp.status == "pass" and fp.rel_err < 1e-4, str(report)
    assert len(fp.onnx) == 2
    # the pairing followed the children: the LayerNorm's tensor answers norm_hidden_states
    assert _row(report, "feature_projection.layer_norm").onnx[0] in fp.onnx
    assert report.ok, str(report)


# -- BatchNorm folds under TorchScript ---------------------------------------------
def _bn_net(torch_mod):
    timm_layers = pytest.importorskip("timm.layers")

    class Net(torch_mod.nn.Module):
        """A Conv + timm BatchNormAct2d (darknet's block), then DenseNet's naming (conv0, norm0)."""

        def __init__(self):
            super().__init__()
            self.conv = torch_mod.nn.Conv2d(3, 8, 3, bias=False)
            self.bn = timm_layers.BatchNormAct2d(8, act_layer=torch_mod.nn.LeakyReLU)
            self.features = torch_mod.nn.Sequential()
            self.features.add_module("conv0", torch_mod.nn.Conv2d(8, 8, 3, bias=False))
            self.features.add_module("norm0", torch_mod.nn.BatchNorm2d(8))
            self.features.add_module("relu0", torch_mod.nn.ReLU())

        def forward(self, x):
            return self.features(self.bn(self.conv(x)))

    torch_mod.manual_seed(0)
    net = Net().eval()
    with torch_mod.no_grad():
        for m in net.modules():
            if isinstance(m, torch_mod.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
    return net


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_bn_folds_found_and_named_from_the_model(torch_mod, tmp_path, dynamo):
    import layertap as lt

    net = _bn_net(torch_mod)
    x = torch_mod.randn(1, 3, 16, 16)
    report = lt.compare(net, x, _export(torch_mod, net, x, tmp_path / "bn.onnx", dynamo))
    assert report.ok, str(report)
    # BatchNormAct2d: its act child has a node, yet its BatchNorm was folded into the Conv
    assert _row(report, "conv").status == "absorbed"
    assert _row(report, "bn").status == "pass"
    # the absorber is the module PyTorch ran after the Conv (norm0), never a guessed bn0
    conv0, norm0 = _row(report, "features.conv0"), _row(report, "features.norm0")
    assert conv0.status == "absorbed" and conv0.note == "fused into features.norm0; compared there"
    assert norm0.status == "pass" and norm0.max_abs < 1e-4
    assert "bn0" not in str(report)


# -- honest summary ------------------------------------------------------------------
def test_summary_names_uncompared_modules_before_the_divergence():
    from layertap.comparing import FAIL, NO_COUNTERPART, PASS, CompareReport, CompareRow

    rows = [
        CompareRow("a", "a", 0, "Linear", [1], 0.0, 0.0, PASS, True),
        CompareRow("attn", "attn", 0, "Attention", [1], None, None, NO_COUNTERPART, None, note="rewritten"),
        CompareRow("norm2", "norm2", 0, "LayerNorm", [1], 1.0, 1.0, FAIL, False),
    ]
    report = CompareReport(rows)
    assert [r.name for r in report.uncompared_before(rows[2])] == ["attn"]
    text = "\n".join(report.footer())
    assert "every module before it agrees" not in text
    assert "attn just before it was not compared" in text
    clean = CompareReport([rows[0], rows[2]])
    assert "every module before it agrees" in "\n".join(clean.footer())


# -- rewritten attention checked numerically --------------------------------------------
@pytest.fixture(scope="module")
def swin_block(torch_mod, tmp_path_factory):
    """torchvision's ShiftedWindowAttention between two LayerNorms, dynamo export: the optimizer
    removes transposes at attn's boundary, so the scopes refuse attn's output tensor."""
    swin = pytest.importorskip("torchvision.models.swin_transformer")

    class Blk(torch_mod.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = torch_mod.nn.LayerNorm(16)
            self.attn = swin.ShiftedWindowAttention(16, [4, 4], [2, 2], 2)
            self.norm2 = torch_mod.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm2(x + self.attn(self.norm1(x)))

    torch_mod.manual_seed(0)
    model, x = Blk().eval(), torch_mod.randn(1, 8, 8, 16)
    path = _export(torch_mod, model, x, tmp_path_factory.mktemp("swin") / "blk.onnx", True)
    return model, x, path


def test_rewritten_attention_is_compared_when_its_tensor_matches(swin_block):
    import layertap as lt
    from layertap.onnxfile.scopemap import ScopeMap

    model, x, path = swin_block
    import onnx

    attn = next(c for c in ScopeMap.from_model(onnx.load(str(path))).counterparts() if c.path == "attn")
    assert attn.note and attn.unverified  # the guard refuses it on structure alone
    report = lt.compare(model, x, path)
    row = _row(report, "attn")
    assert row.status == "pass" and "checked numerically" in row.note, str(report)
    assert report.ok


def test_fault_inside_rewritten_attention_is_reported_at_attention(torch_mod, swin_block):
    """A fault inside the rewritten call: its tensor differs and so does the next module's, so
    the divergence is the call itself, not the LayerNorm after it."""
    import copy

    import layertap as lt

    model, x, path = swin_block
    faulty = copy.deepcopy(model)
    with torch_mod.no_grad():
        faulty.attn.proj.weight.mul_(1.2)
    report = lt.compare(faulty, x, path)
    row = _row(report, "attn")
    assert row.status == "FAIL" and row.rel_err > 0.01 and "divergence starts here" in row.note, str(report)
    assert report.first_divergence == "attn"
    assert _row(report, "norm1").status == "pass"


def test_rewritten_attention_off_by_less_than_norm2_can_see_still_fails(swin_block, tmp_path):
    """attn's output x1.002 (in the graph): the residual sum dilutes it below the tolerance at
    norm2, yet the rewritten call's own tensor differs, so attn is the FAIL and the divergence."""
    import numpy as np

    import layertap as lt
    from _faults import scale_module_output

    model, x, path = swin_block
    scale_module_output(path, tmp_path / "blk.onnx", "attn", np.full(16, 1.002))
    report = lt.compare(model, x, tmp_path / "blk.onnx")
    row = _row(report, "attn")
    assert _row(report, "norm2").status == "pass" and _row(report, "output").status == "pass", str(report)
    assert row.status == "FAIL" and row.rel_err == pytest.approx(2e-3, rel=1e-2) and "norm2) agrees" in row.note
    assert report.first_divergence == "attn" and not report.ok
