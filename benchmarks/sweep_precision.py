"""Sweep (correctness, not timing): reduced-precision candidates judged at their precision, healthy and faulty.

A corpus of reduced-precision candidates, healthy and with a fault injected at a known module, each compared
with its float32 reference (the PyTorch model, and the float32 file) by ``lt.compare`` with default options
(judged at the candidate's precision). Per model and exporter:

* exporters: TorchScript (``dynamo=False``, opset 17) and the default dynamo exporter (``dynamo=True``); the
  exporter is part of each case's label (``unet/dynamo``);
* candidates: a float16 conversion (onnxconverter-common, ``keep_io_types``, ``max_finite_val=65504``), a static
  int8 QDQ file (``quant_pre_process``, then ``quantize_static``, per-channel, calibrated on 32 realistic
  samples; where a calibrated range is not finite, an additive attention mask of -3.4e38 say, the nodes around
  that tensor are left in float32 and the file made again, as an engineer would: ``--int8-as-is`` keeps the
  first file), and the float32 file run by OpenVINO at bfloat16. A file ONNX Runtime cannot load is the
  converter's fault: a row saying so, before any comparison;
* faults, in the candidate file, at a node some module's call computes (by the candidate's scopes, else the
  float32 file's node making the same tensor, else a weight's parameter name), from tests/_faults.py: a wrong op
  (an activation made an ``Identity``, an ``Add`` a ``Sub``), a weight changed by 5% and by 2% (a quantised
  weight's scale), and for int8 a quantiser's scale 10x too small. A fault that fits no node is a row saying so
  ("no site"). A fault changes a value when the tensor it sits in differs (ONNX Runtime, the candidate with and
  without it, on the compared samples). It is named at its module when the first divergence holds the faulty
  value, is its module or a module inside it, or, its module not compared itself (absorbed, no counterpart), is
  the first module compared after it (the model's output excepted);
* models: the classifiers of before (torchvision resnet18, mobilenet_v3_small, densenet121, efficientnet_b0,
  timm deit_tiny, convnext_atto), the trained CREPE tiny, MTCNN RNet and ONet of the test suite (their weights:
  ``make trained``), and the graphs people deploy, built here: a U-Net (MaxPool, ConvTranspose, an
  ``nn.Upsample``, skip concats), an FPN detector (lateral 1x1 convs, top-down nearest ``F.interpolate``, one
  box/cls head shared by the levels), a DeepLab-like segmenter (dilated convs, ASPP, bilinear
  ``F.interpolate`` back to the input size), a small ViT (timm ``vit_tiny_patch16_224`` at 64x64, depth 4), a
  tiny BERT (``input_ids`` + ``attention_mask``, padded), an LSTM and a GRU over a sequence, CNNs with GroupNorm,
  LayerNorm (channels-last, ConvNeXt-like) and InstanceNorm, depthwise-separable convs with squeeze-excite, and
  a conv called twice (shared weights). Random weights are seeded; BatchNorm statistics are gathered on random
  batches, so activations sit at a trained model's scale.

A case that cannot run (the model, the export, the conversion or quantisation, ``lt.compare`` raising, no
OpenVINO at bfloat16) is a row with the one-line reason, counted as "could not run", never a silent gap.

Printed: a line per run (healthy: passes, with how many rows were compared, or the first divergence; fault: where
the first divergence is named, and whether that is the module the fault sits in), then a table of totals per
kind, per exporter and overall, every healthy run flagged and every case that could not run, each with the
options that repeat it alone, the healthy runs that passed comparing under half their rows, and the faults missed
or named elsewhere. The exit status is informational (0). The whole corpus takes about 6 minutes on 2 cores.

``--local`` compares with ``local=True``: each module judged by its own part run alone at the candidate's
format (the local split), which names at their module the faults the whole run's accumulated rounding hides.

Run:
    .venv/bin/python benchmarks/sweep_precision.py [--models unet,bert_tiny] [--exporters torchscript,dynamo]
        [--kinds fp16,int8,bf16] [--refs model,file] [--faults healthy,wrong_op,weight5,weight2,clip] [--keep DIR]
        [--local]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the trained architectures, their realistic inputs, the fault injectors

EXPORTERS = ("torchscript", "dynamo")
KINDS = ("fp16", "int8", "bf16")
REFS = ("model", "file")
FAULTS = ("healthy", "wrong_op", "weight5", "weight2", "clip")
#: ops a wrong-op fault turns into an Identity (an Add into a Sub), the first kind a file has
ACTIVATIONS = ("Relu", "Sigmoid", "HardSwish", "Erf", "PRelu", "Add", "Gelu", "Tanh", "Softmax")
WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU")
SAMPLES, CALIBRATION = 2, 32


# ---------------------------------------------------------------------------------------------- the models


def _conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, dilation * (k // 2), dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """Encoder/decoder: MaxPool down, ConvTranspose up twice and an ``nn.Upsample`` once, skip concats."""

    def __init__(self, c: int = 8, classes: int = 2):
        super().__init__()
        self.inc = nn.Sequential(_conv_bn(3, c), _conv_bn(c, c))
        self.down1 = nn.Sequential(nn.MaxPool2d(2), _conv_bn(c, 2 * c), _conv_bn(2 * c, 2 * c))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), _conv_bn(2 * c, 4 * c), _conv_bn(4 * c, 4 * c))
        self.down3 = nn.Sequential(nn.MaxPool2d(2), _conv_bn(4 * c, 8 * c), _conv_bn(8 * c, 8 * c))
        self.up1 = nn.ConvTranspose2d(8 * c, 4 * c, 2, stride=2)
        self.dec1 = nn.Sequential(_conv_bn(8 * c, 4 * c), _conv_bn(4 * c, 4 * c))
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = nn.Sequential(_conv_bn(4 * c, 2 * c), _conv_bn(2 * c, 2 * c))
        self.up3 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.dec3 = nn.Sequential(_conv_bn(3 * c, c), _conv_bn(c, c))
        self.outc = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        y = self.dec1(torch.cat([x3, self.up1(x4)], dim=1))
        y = self.dec2(torch.cat([x2, self.up2(y)], dim=1))
        y = self.dec3(torch.cat([x1, self.up3(y)], dim=1))
        return self.outc(y)


class DetHead(nn.Module):
    """A single-stage head (one module for every level): a conv tower, class logits and box offsets."""

    def __init__(self, c: int, anchors: int = 3, classes: int = 4):
        super().__init__()
        self.tower = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.cls = nn.Conv2d(c, anchors * classes, 3, padding=1)
        self.box = nn.Conv2d(c, anchors * 4, 3, padding=1)

    def forward(self, x):
        t = self.tower(x)
        return self.cls(t), self.box(t)


class FPNDetector(nn.Module):
    """Backbone (strides 4, 8, 16), lateral 1x1 convs, top-down nearest ``F.interpolate(scale_factor=2)``, 3x3
    smoothing convs, one head called on each level; outputs every level's logits and boxes concatenated."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 16, stride=2), _conv_bn(16, 16, stride=2))
        self.c3 = nn.Sequential(_conv_bn(16, 32, stride=2), _conv_bn(32, 32))
        self.c4 = nn.Sequential(_conv_bn(32, 64, stride=2), _conv_bn(64, 64))
        self.c5 = nn.Sequential(_conv_bn(64, 128, stride=2), _conv_bn(128, 128))
        self.lat3, self.lat4, self.lat5 = nn.Conv2d(32, c, 1), nn.Conv2d(64, c, 1), nn.Conv2d(128, c, 1)
        self.smooth3, self.smooth4 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.head = DetHead(c)

    def forward(self, x):
        c3 = self.c3(self.stem(x))
        c4 = self.c4(c3)
        c5 = self.c5(c4)
        p5 = self.lat5(c5)
        p4 = self.smooth4(self.lat4(c4) + F.interpolate(p5, scale_factor=2, mode="nearest"))
        p3 = self.smooth3(self.lat3(c3) + F.interpolate(p4, scale_factor=2, mode="nearest"))
        outs = [self.head(p) for p in (p3, p4, p5)]
        return torch.cat([o[0].flatten(2) for o in outs], 2), torch.cat([o[1].flatten(2) for o in outs], 2)


class ASPP(nn.Module):
    def __init__(self, cin: int, c: int):
        super().__init__()
        self.b0 = _conv_bn(cin, c, 1)
        self.b1 = _conv_bn(cin, c, 3, dilation=2)
        self.b2 = _conv_bn(cin, c, 3, dilation=4)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, c, 1), nn.ReLU())
        self.project = _conv_bn(4 * c, c, 1)

    def forward(self, x):
        pooled = F.interpolate(self.pool(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.project(torch.cat([self.b0(x), self.b1(x), self.b2(x), pooled], dim=1))


class DeepLabLike(nn.Module):
    """Output stride 4 with dilated convs, ASPP, a 1x1 classifier, bilinear ``F.interpolate`` to the input size."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.backbone = nn.Sequential(_conv_bn(3, 16, stride=2), _conv_bn(16, 32, stride=2), _conv_bn(32, 32),
                                      _conv_bn(32, 64, dilation=2), _conv_bn(64, 64, dilation=2))
        self.aspp = ASPP(64, 32)
        self.classifier = nn.Conv2d(32, classes, 1)

    def forward(self, x):
        y = self.classifier(self.aspp(self.backbone(x)))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


class SeqModel(nn.Module):
    """An ``nn.LSTM`` or ``nn.GRU`` (2 layers) over a sequence, an MLP head on the last step."""

    def __init__(self, cell: str, features: int = 8, hidden: int = 32, classes: int = 4):
        super().__init__()
        self.rnn = getattr(nn, cell)(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


class GroupNormNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()

        def gn(cin, cout, stride=1):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GroupNorm(4, cout), nn.SiLU())

        self.stem = gn(3, 16, 2)
        self.block1 = nn.Sequential(gn(16, 16), gn(16, 16))
        self.down = gn(16, 32, 2)
        self.block2 = nn.Sequential(gn(32, 32), gn(32, 32))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block1(x)
        x = self.down(x)
        x = x + self.block2(x)
        return self.fc(x.mean((2, 3)))


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, then LayerNorm and the MLP on channels-last values, a residual."""

    def __init__(self, c: int):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class LayerNormNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 4, stride=4)
        self.stem_norm = nn.LayerNorm(24)
        self.stage1 = nn.Sequential(ConvNeXtBlock(24), ConvNeXtBlock(24))
        self.down = nn.Conv2d(24, 48, 2, stride=2)
        self.stage2 = nn.Sequential(ConvNeXtBlock(48), ConvNeXtBlock(48))
        self.norm = nn.LayerNorm(48)
        self.fc = nn.Linear(48, classes)

    def forward(self, x):
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.stage2(self.down(self.stage1(x)))
        return self.fc(self.norm(x.mean((2, 3))))


class InstanceNormNet(nn.Module):
    """A style-transfer-like net: conv/InstanceNorm/ReLU down, residual blocks, ConvTranspose up, Tanh out."""

    def __init__(self):
        super().__init__()

        def cin(a, b, k=3, stride=1):
            return nn.Sequential(nn.Conv2d(a, b, k, stride, k // 2), nn.InstanceNorm2d(b, affine=True), nn.ReLU())

        self.enc = nn.Sequential(cin(3, 16, 5), cin(16, 32, stride=2))
        self.res1 = nn.Sequential(cin(32, 32), nn.Conv2d(32, 32, 3, padding=1), nn.InstanceNorm2d(32, affine=True))
        self.res2 = nn.Sequential(cin(32, 32), nn.Conv2d(32, 32, 3, padding=1), nn.InstanceNorm2d(32, affine=True))
        self.up = nn.Sequential(nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1),
                                nn.InstanceNorm2d(16, affine=True), nn.ReLU())
        self.out = nn.Conv2d(16, 3, 5, padding=2)

    def forward(self, x):
        y = self.enc(x)
        y = y + self.res1(y)
        y = y + self.res2(y)
        return torch.tanh(self.out(self.up(y)))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int = 4):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce, self.relu = nn.Conv2d(c, c // r, 1), nn.ReLU()
        self.expand, self.gate = nn.Conv2d(c // r, c, 1), nn.Hardsigmoid()
        # a trained SE's ReLU lets values through; at random init a whole reduce can be dead on every sample, and
        # quantize_static then calibrates its quantiser to [0, 0] (scale 1, zero point 0: the fused ReLU is lost)
        nn.init.uniform_(self.reduce.bias, 0.1, 0.5)

    def forward(self, x):
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))


class DwSepBlock(nn.Module):
    """Depthwise 3x3 + BN + ReLU6, squeeze-excite, pointwise 1x1 + BN (a residual when the shape allows)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.dw = nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6())
        self.se = SqueezeExcite(cin)
        self.pw = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.pw(self.se(self.dw(x)))
        return x + y if self.residual else y


class DwSepSE(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(DwSepBlock(16, 16, 1), DwSepBlock(16, 32, 2), DwSepBlock(32, 32, 1), DwSepBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class SharedConv(nn.Module):
    """One conv (and one ReLU) called twice: shared weights, ``block#1`` and ``block#2``."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = _conv_bn(3, 16, stride=2)
        self.block = nn.Conv2d(16, 16, 3, padding=1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        y = self.act(self.block(x))
        y = self.act(self.block(y)) + x
        return self.fc(y.mean((2, 3)))


def _vit():
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=4)


class Bert(nn.Module):
    """A tiny ``transformers`` BertModel called by keyword (``input_ids``, ``attention_mask``): the TorchScript
    exporter fills every positional parameter of ``BertModel.forward`` in, which transformers 5 refuses
    (``got multiple values for argument 'use_cache'``), so both exporters see this signature."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
        self.bert = BertModel(config)

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


def _zoo(family: str, name: str) -> Callable[[], nn.Module]:
    def build():
        if family == "timm":
            import timm

            return timm.create_model(name, pretrained=False)
        import torchvision

        return getattr(torchvision.models, name)()

    return build


def _trained_model(name: str) -> Callable[[], nn.Module]:
    def build():
        import _trained

        return getattr(_trained, name)()

    return build


def _images(size: int) -> Callable[[int], tuple[np.ndarray, ...]]:
    return lambda seed: (np.random.default_rng(seed).standard_normal((1, 3, size, size)).astype(np.float32),)


def _sequence(seed: int) -> tuple[np.ndarray, ...]:
    return (np.random.default_rng(seed).standard_normal((1, 16, 8)).astype(np.float32),)


def _tokens(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 1000, (1, 16), dtype=np.int64)
    mask = np.ones((1, 16), dtype=np.int64)
    mask[:, 16 - seed % 5:] = 0  # 0 to 4 padded positions
    ids[mask == 0] = 0
    return ids, mask


def _tones(seed: int) -> tuple[np.ndarray, ...]:
    import _trained

    return (_trained.tone_frames(1, seed=seed),)


def _faces(size: int) -> Callable[[int], tuple[np.ndarray, ...]]:
    def draw(seed: int) -> tuple[np.ndarray, ...]:
        import _trained

        return (_trained.face_crops(1, size=size, seed=seed),)

    return draw


@dataclass(frozen=True)
class Spec:
    """A model of the corpus: how it is built (seeded), one sample per seed, its inputs' names."""

    build: Callable[[], nn.Module]
    sample: Callable[[int], tuple[np.ndarray, ...]]
    names: tuple[str, ...] = ("x",)
    trained: bool = False  # its own trained weights: no BatchNorm statistics gathered


MODELS: dict[str, Spec] = {
    "resnet18": Spec(_zoo("torchvision", "resnet18"), _images(224)),
    "mobilenet_v3_small": Spec(_zoo("torchvision", "mobilenet_v3_small"), _images(224)),
    "densenet121": Spec(_zoo("torchvision", "densenet121"), _images(128)),
    "efficientnet_b0": Spec(_zoo("torchvision", "efficientnet_b0"), _images(160)),
    "deit_tiny_patch16_224": Spec(_zoo("timm", "deit_tiny_patch16_224"), _images(224)),
    "convnext_atto": Spec(_zoo("timm", "convnext_atto"), _images(128)),
    "crepe_tiny": Spec(_trained_model("crepe_tiny"), _tones, trained=True),
    "onet": Spec(_trained_model("onet"), _faces(48), trained=True),
    "rnet": Spec(_trained_model("rnet"), _faces(24), trained=True),
    "unet": Spec(UNet, _images(64)),
    "fpn_det": Spec(FPNDetector, _images(64)),
    "deeplab": Spec(DeepLabLike, _images(64)),
    "vit_tiny": Spec(_vit, _images(64)),
    "bert_tiny": Spec(Bert, _tokens, ("input_ids", "attention_mask")),
    "lstm": Spec(lambda: SeqModel("LSTM"), _sequence),
    "gru": Spec(lambda: SeqModel("GRU"), _sequence),
    "groupnorm": Spec(GroupNormNet, _images(64)),
    "layernorm": Spec(LayerNormNet, _images(64)),
    "instancenorm": Spec(InstanceNormNet, _images(64)),
    "dwsep_se": Spec(DwSepSE, _images(64)),
    "shared_conv": Spec(SharedConv, _images(64)),
}


def _samples(spec: Spec, n: int, seed: int) -> list[tuple[np.ndarray, ...]]:
    return [spec.sample(seed + i) for i in range(n)]


def _model(spec: Spec) -> nn.Module:
    """The model, seeded; BatchNorm statistics gathered on 4 batches of 8 samples (a cumulative average)."""
    torch.manual_seed(0)
    model = spec.build()
    norms = [] if spec.trained else [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    with torch.no_grad():
        model.train()
        for b in range(4 if norms else 0):
            batch = _samples(spec, 8, 123 + 8 * b)
            model(*(torch.from_numpy(np.concatenate(parts)) for parts in zip(*batch)))
    return model.eval()


# ---------------------------------------------------------------------------------------------- the files


def _quiet():
    """Exporters and converters print a lot: keep it off the sweep's lines."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def _export(model: nn.Module, spec: Spec, exporter: str, path: Path) -> Path:
    args = tuple(torch.from_numpy(a) for a in spec.sample(100))
    with _quiet():
        if exporter == "torchscript":
            torch.onnx.export(model, args, str(path), dynamo=False, input_names=list(spec.names), opset_version=17)
        else:
            torch.onnx.export(model, args, str(path), dynamo=True, input_names=list(spec.names))
    _loads(path, "the exporter")
    return path


def _candidate(kind: str, spec: Spec, fp32: Path, folder: Path, stem: str, as_is: bool = False) -> Path:
    import onnx

    if kind == "bf16":
        if not _bf16_here():
            raise RuntimeError("OpenVINO does not run bfloat16 here (absent, or this CPU lacks it)")
        return fp32
    if kind == "fp16":
        from onnxconverter_common import float16

        out = folder / f"{stem}-fp16.onnx"
        with _quiet():
            converted = float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True, max_finite_val=65504.0)
        onnx.save(converted, str(out))
        _loads(out, "onnxconverter-common")
        return out
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre, out = folder / f"{stem}-pre.onnx", folder / f"{stem}-int8.onnx"
    with _quiet():
        quant_pre_process(str(fp32), str(pre))
    excluded: list[str] = []
    for _ in range(3):
        calib = iter([dict(zip(spec.names, s)) for s in _samples(spec, CALIBRATION, 1000)])

        class Reader(CalibrationDataReader):
            def get_next(self):
                return next(calib, None)  # noqa: B023 - read within this try

        with _quiet():
            quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_exclude=excluded)
        bad = [] if as_is else _degenerate_quantisers(out)
        if not bad:
            break
        # what an engineer does: leave the nodes around a tensor whose calibrated range is not finite (an additive
        # attention mask of -3.4e38 gives a scale of inf) in float32; the file is otherwise as quantize_static made it
        excluded += [n for n in bad if n not in excluded]
    if excluded:
        print(f"{'':31s}({stem} int8: left in float32, their calibrated range not finite: {', '.join(excluded)})")
    _loads(out, "quant_pre_process + quantize_static")
    return out


def _degenerate_quantisers(path: Path) -> list[str]:
    """The nodes that make or read a tensor whose quantiser's scale is not finite (or zero)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    bad = set()
    for q in model.graph.node:
        if q.op_type == "QuantizeLinear" and q.input[1] in inits:
            scale = numpy_helper.to_array(inits[q.input[1]])
            if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
                bad.add(q.input[0])
    for _ in range(2):  # through the pair: the DequantizeLinear's output the readers take
        bad |= {o for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] in bad
                for o in n.output}
    return [n.name for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
            and (set(n.output) | set(n.input)) & bad]


def _loads(path: Path, what: str) -> None:
    """Raise when ONNX Runtime cannot load the file as it is (a converter's own fault, before any comparison)."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - reworded as the step that made the file
        raise RuntimeError(f"{what} wrote a file ONNX Runtime cannot load: {_error(e)}") from None


def _weight_of(node, made: dict, inits: set[str]) -> str | None:
    """The initializer ``scale_weight`` would change for this node (through a Cast, a DequantizeLinear's scale, a
    Transpose), or None: its second input is computed (attention's ``q @ k``), not a weight."""
    if len(node.input) < 2 or not node.input[1]:
        return None
    w = node.input[1]
    while w not in inits:
        reader = made.get(w)
        if reader is None or reader.op_type not in ("Cast", "DequantizeLinear", "Transpose", "Identity"):
            return None
        w = reader.input[1] if reader.op_type == "DequantizeLinear" else reader.input[0]
    return w


def _plain(path: str | None) -> str | None:
    if path and path.startswith(("_fn.", "model.")):
        path = path.split(".", 1)[1]
    return path or None


def _owners(cand: Path, fp32: Path) -> dict[str, tuple[str, int | None]]:
    """Tensor -> the module call whose value the node making it computes: by the candidate's own scopes, else by
    the float32 file's node making the same tensor (a converter that dropped the scopes), else by the weight's
    name (a dynamo file names an initializer by its parameter: ``head.0.weight_scale`` -> ``head.0``)."""
    import onnx

    from layertap.onnxfile.scopemap import ScopeMap

    out: dict[str, tuple[str, int | None]] = {}
    for path in (fp32, cand):  # the candidate's own scopes win
        model = onnx.load(str(path), load_external_data=False)
        smap = ScopeMap.from_model(model)
        if smap.source == "none":
            continue
        for index, (module, call) in smap.owners().items():
            if _plain(module):
                for t in model.graph.node[index].output:
                    out[t] = (_plain(module), call)
    model = onnx.load(str(cand), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        w = _weight_of(node, made, inits) if node.op_type in WEIGHTED else None
        name = (w or "").removesuffix("_scale").removesuffix("_quantized")
        if node.output and node.output[0] not in out and name.endswith(".weight") and "/" not in name and ":" not in name:
            out[node.output[0]] = (name.rsplit(".", 1)[0], None)
    return out


@dataclass
class Site:
    """Where a fault sits: the tensor it makes, its module (call), and the tensor it changes (the value check)."""

    tensor: str
    changed: str
    what: str
    owner: str | None = None
    call: int | None = None


def _inject(src: Path, dst: Path, fault: str, owners: dict) -> Site | str:
    """Write the fault into a copy, at a node some module's call computes; returns its site, or why it does not fit
    this file."""
    import onnx

    from _faults import replace_op, scale_weight, shrink_scale

    model = onnx.load(str(src), load_external_data=False)
    nodes = list(model.graph.node)
    inits = {i.name for i in model.graph.initializer}
    made = {o: n for n in nodes for o in n.output}

    def site(tensor: str, changed: str, what: str) -> Site:
        return Site(tensor, changed, what, *owners[tensor])

    if fault == "wrong_op":
        for op in ACTIVATIONS:
            found = [n for n in nodes if n.op_type == op and not any(i in inits for i in n.input[1:]) and n.output[0] in owners]
            if found:
                node = found[len(found) // 2]
                replace_op(src, dst, node.output[0], "Sub" if op == "Add" else "Identity")
                return site(node.output[0], node.output[0], f"{op} {node.name} -> {'Sub' if op == 'Add' else 'Identity'}")
        return f"no node of {', '.join(ACTIVATIONS)} (without constant inputs) inside a module"
    if fault.startswith("weight"):
        weighted = [n for n in nodes if n.op_type in WEIGHTED and _weight_of(n, made, inits) and n.output[0] in owners]
        if not weighted:
            return f"no {'/'.join(WEIGHTED)} node reading a weight inside a module"
        node = weighted[len(weighted) // 2]
        factor = 1.05 if fault == "weight5" else 1.02
        w = scale_weight(src, dst, node.output[0], factor)
        return site(node.output[0], node.output[0], f"{node.op_type} {node.name}: {w} x{factor}")
    readers: dict[str, list] = {}
    for n in nodes:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    quantised = [n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.input[0] in owners]
    if not quantised:
        return "no QuantizeLinear of a tensor a module computes"
    q = quantised[len(quantised) // 2]
    shrink_scale(src, dst, q.input[0], 0.1)
    dq = [r for r in readers.get(q.output[0], ()) if r.op_type == "DequantizeLinear"]
    return site(q.input[0], dq[0].output[0] if dq else q.input[0], f"QuantizeLinear {q.name}: scale x0.1")


def _outs(path: Path, tensor: str) -> set[str]:
    """The tensors standing for the value the faulty node computes (its outputs, their DequantizeLinear outputs)."""
    import onnx

    from layertap.onnxfile.scopemap import stand_ins

    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if tensor in n.output)
    names = {tensor, *node.output}
    through = stand_ins(model.graph)
    return names | {through[t] for t in names if t in through}


def _values(path: Path, tensor: str, feeds: list[dict]) -> list[np.ndarray]:
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    if tensor not in {o.name for o in model.graph.output}:
        model.graph.output.append(onnx.ValueInfoProto(name=tensor))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(session.run([tensor], f)[0], dtype=np.float64) for f in feeds]


def _fault_size(clean: Path, faulty: Path, tensor: str, feeds: list[dict]) -> float:
    """``max|faulty - clean| / max|clean|`` at the tensor the fault changes (ONNX Runtime, float32 runs)."""
    a, b = _values(clean, tensor, feeds), _values(faulty, tensor, feeds)
    diff = max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b))
    scale = max(float(np.max(np.abs(x))) if x.size else 0.0 for x in a)
    return diff / scale if scale else (np.inf if diff else 0.0)


# ---------------------------------------------------------------------------------------------- the runs


LOCAL = [False]  # --local: every comparison with local=True


def _compare(model, spec: Spec, kind: str, cand: Path, fp32: Path, ref: str):
    import layertap as lt
    from layertap.options import RuntimeOptions

    runs = None
    if kind == "bf16":
        runs = RuntimeOptions(**{"runtime" if ref == "model" else "cand_runtime": "openvino", "ov_precision": "bf16"})
    samples = _samples(spec, SAMPLES, 7)
    with contextlib.redirect_stderr(io.StringIO()):
        if ref == "model":
            tensors = [tuple(torch.from_numpy(a) for a in s) for s in samples]
            return lt.compare(model, tensors[0], cand, samples=tensors, runtime_options=runs, local=LOCAL[0])
        return lt.compare(fp32, None, cand, samples=[dict(zip(spec.names, s)) for s in samples], runtime_options=runs,
                          local=LOCAL[0])


def _right(report, owner: str | None, outs: set[str]) -> bool:
    """The first divergence is the fault's: a row holding the faulty value, its module, a module inside it (a fault
    in a module's own code, ``x + attn(x)``, shows first in the submodule that reads it), or, where the fault's
    module is not compared itself (absorbed: a Conv folded into its BatchNorm; no counterpart), the first module
    compared after it, the model's output excepted."""
    first = report.first_divergence_row
    if first is None:
        return False
    if set(first.onnx) & outs:
        return True
    if owner is None:
        return False
    if first.path == owner or first.path.startswith(owner + "."):
        return True
    rows = list(report.rows)
    own = [i for i, r in enumerate(rows) if r.path == owner]
    if not own or any(rows[i].ok is not None for i in own):
        return False
    after = next((r for r in rows[own[0] + 1:] if r.ok is not None), None)
    return after is first and first.name != "output"


def _owner_row(report, owner: str | None, outs: set[str]):
    for row in report.rows:
        if set(row.onnx) & outs or (owner is not None and row.path == owner and row.ok is not None):
            return row
    return None


def _counts(report) -> str:
    """``41 pass, 0 FAIL, 12 absorbed, 3 without counterpart``: how much of the model a verdict covers."""
    n = {k: sum(r.status == k for r in report.rows) for k in ("pass", "FAIL", "absorbed", "no counterpart")}
    return f"{n['pass']} pass, {n['FAIL']} FAIL, {n['absorbed']} absorbed, {n['no counterpart']} without counterpart"


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.2g}"


def _row_words(row) -> str:
    """``layer1.0.conv1 (FAIL: rel 0.012, format 0.0031, impl 0.011; <limit/weights/note>)``."""
    if row is None:
        return "-"
    words = f"{row.name} ({row.status}: rel {_g(row.rel_err)}, format {_g(row.format_rel)}, impl {_g(row.impl_rel)}"
    if row.local_format_rel is not None:
        words += f", local format {_g(row.local_format_rel)}, local impl {_g(row.local_impl_rel)}, gain {_g(row.local_impl_gain)}"
    return words + (f"; {row.remarks}" if row.remarks else "") + ")"


def _error(exc: BaseException) -> str:
    """One line: the exception's first line, and its root cause's when that is another exception."""
    def line(e: BaseException) -> str:
        text = next((t.strip() for t in str(e).splitlines() if t.strip()), "")
        return f"{type(e).__name__}: {text}"[:400]

    root = exc
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__
    return line(exc) if root is exc else f"{line(exc)} [cause: {line(root)}]"


def _attempt(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return fn(), None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - every failure (pytest's skip of absent weights too) is a row
        return None, _error(e)


@dataclass
class Tally:
    healthy: int = 0
    flagged: int = 0
    faults: int = 0
    changing: int = 0
    right: int = 0
    elsewhere: int = 0
    missed: int = 0
    cannot: int = 0
    no_site: int = 0


@dataclass
class Sweep:
    args: argparse.Namespace
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    flagged: list[str] = field(default_factory=list)
    cannot: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    thin: list[str] = field(default_factory=list)
    apart: list[str] = field(default_factory=list)

    def tally(self, exporter: str, kind: str) -> Tally:
        return self.tallies.setdefault((exporter, kind), Tally())

    def repeat(self, name: str, exporter: str, kind: str | None = None, fault: str | None = None,
               ref: str | None = None) -> str:
        parts = [f"--models {name}", f"--exporters {exporter}"]
        parts += [f"--kinds {kind}"] if kind else []
        parts += [f"--faults {fault}"] if fault else []
        parts += [f"--refs {ref}"] if ref else []
        return " ".join(parts)

    def could_not(self, label: str, runs: int, reason: str, repeat: str, tallies: list[Tally]) -> None:
        print(f"{label:52s}: COULD NOT RUN ({runs} run{'s' * (runs != 1)}): {reason}", flush=True)
        self.cannot.append(f"{label} ({runs} runs): {reason}\n      repeat: {repeat}")
        per = runs // max(len(tallies), 1)
        for t in tallies:
            t.cannot += per

    def planned(self, kind: str) -> list[str]:
        return [f for f in self.args.faults if f != "clip" or kind == "int8"]

    def runs_of(self, kinds: list[str]) -> int:
        return sum(len(self.planned(k)) for k in kinds) * len(self.args.refs)


def _label(name: str, exporter: str, kind: str = "", fault: str = "", ref: str = "") -> str:
    return f"{name + '/' + exporter:30s} {kind:4s} {fault:8s} {('vs ' + ref) if ref else ''}".rstrip()


def _sweep_model(sweep: Sweep, name: str, folder: Path) -> None:
    spec = MODELS[name]
    a = sweep.args
    model, err = _attempt(lambda: _model(spec))
    for exporter in a.exporters:
        start = time.monotonic()
        if err is not None:
            sweep.could_not(_label(name, exporter, "*"), sweep.runs_of(a.kinds), f"model: {err}",
                            sweep.repeat(name, exporter), [sweep.tally(exporter, k) for k in a.kinds])
            continue
        stem = f"{name}-{exporter}"
        fp32, xerr = _attempt(lambda: _export(model, spec, exporter, folder / f"{stem}.onnx"))  # noqa: B023
        if xerr is not None:
            sweep.could_not(_label(name, exporter, "*"), sweep.runs_of(a.kinds), f"export: {xerr}",
                            sweep.repeat(name, exporter), [sweep.tally(exporter, k) for k in a.kinds])
            continue
        for kind in a.kinds:
            _sweep_kind(sweep, name, spec, model, exporter, kind, fp32, folder, stem)
        print(f"{'':31s}({name}/{exporter}: {time.monotonic() - start:.0f} s)", flush=True)


def _sweep_kind(sweep: Sweep, name: str, spec: Spec, model, exporter: str, kind: str, fp32: Path, folder: Path,
                stem: str) -> None:
    a = sweep.args
    tally = sweep.tally(exporter, kind)
    base, err = _attempt(lambda: _candidate(kind, spec, fp32, folder, stem, a.int8_as_is))
    if err is not None:
        step = {"fp16": "float16 conversion", "int8": "quantisation", "bf16": "OpenVINO"}[kind]
        sweep.could_not(_label(name, exporter, kind, "*"), sweep.runs_of([kind]), f"{step}: {err}",
                        sweep.repeat(name, exporter, kind), [tally])
        return
    feeds = [dict(zip(spec.names, s)) for s in _samples(spec, SAMPLES, 7)]
    owners: dict = {}
    if any(f != "healthy" for f in sweep.planned(kind)):
        owners, oerr = _attempt(lambda: _owners(base, fp32))
        if oerr is not None:
            print(f"{'':31s}(the modules of {base.name}'s nodes could not be read: {oerr})")
            owners = {}
    for fault in sweep.planned(kind):
        cand, owner, call, outs, site, size = base, None, None, set(), None, None
        if fault != "healthy":
            cand = folder / f"{stem}-{kind}-{fault}.onnx"
            site, ierr = _attempt(lambda: _inject(base, cand, fault, owners))  # noqa: B023
            if ierr is not None or isinstance(site, str):
                for ref in a.refs:
                    label = _label(name, exporter, kind, fault, ref)
                    if ierr is not None:
                        sweep.could_not(label, 1, f"injection: {ierr}", sweep.repeat(name, exporter, kind, fault, ref), [tally])
                    else:
                        tally.no_site += 1
                        print(f"{label:52s}: no site: {site}", flush=True)
                continue
            owner, call = site.owner, site.call
            outs, werr = _attempt(lambda: _outs(base, site.tensor))  # noqa: B023
            outs = outs if werr is None else {site.tensor}
            size, serr = _attempt(lambda: _fault_size(base, cand, site.changed, feeds))  # noqa: B023
            if serr is not None:
                print(f"{'':31s}(the fault's size could not be measured: {serr})")
        reports = {}
        for ref in a.refs:
            label = _label(name, exporter, kind, fault, ref)
            report, cerr = _attempt(lambda: _compare(model, spec, kind, cand, fp32, ref))  # noqa: B023
            if cerr is not None:
                sweep.could_not(label, 1, f"lt.compare: {cerr}", sweep.repeat(name, exporter, kind, fault, ref), [tally])
                continue
            if fault == "healthy":
                reports[ref] = report
                if len(reports) == 2:
                    _ideals_agree(sweep, _label(name, exporter, kind, fault), reports,
                                  sweep.repeat(name, exporter, kind, fault))
                tally.healthy += 1
                if report.ok:
                    print(f"{label:52s}: ok ({_counts(report)})", flush=True)
                    compared = sum(r.status in ("pass", "FAIL") for r in report.rows)
                    if compared * 2 < len(report.rows):
                        sweep.thin.append(f"{label}: {_counts(report)}\n      repeat: "
                                          f"{sweep.repeat(name, exporter, kind, fault, ref)}")
                    continue
                tally.flagged += 1
                first = _row_words(report.first_divergence_row)
                footer = report.footer()[-1] if report.footer() else ""
                print(f"{label:52s}: FLAGGED at {first}; {footer} ({_counts(report)})", flush=True)
                sweep.flagged.append(f"{label}: first divergence {first}\n      {footer}\n"
                                     f"      repeat: {sweep.repeat(name, exporter, kind, fault, ref)}")
                continue
            tally.faults += 1
            changes = size is None or size > 1e-6
            tally.changing += changes
            right = _right(report, owner, outs)
            at = f"fault {site.what} in {owner}{'' if call is None else f' call {call}'} (changes its tensor by rel {_g(size)})"
            if right:
                tally.right += 1
                verdict = f"named {report.first_divergence} (right)"
            elif report.first_divergence is not None:
                tally.elsewhere += changes
                verdict = f"named {_row_words(report.first_divergence_row)}, NOT its module"
            else:
                tally.missed += changes
                verdict = f"MISSED; at its module: {_row_words(_owner_row(report, owner, outs))}"
            print(f"{label:52s}: {verdict}; {at}", flush=True)
            if not right and changes:
                sweep.wrong.append(f"{label}: {verdict}\n      {at}\n      repeat: {sweep.repeat(name, exporter, kind, fault, ref)}")


def _ideals_agree(sweep: Sweep, label: str, reports: dict, repeat: str) -> None:
    """The two ideal runs of one healthy candidate (the PyTorch forward rounded, the float32 file's graph rounded)
    should cost the same at a module: the rows where their ``format_rel`` is more than 3x apart (and above 1e-3)."""
    by_file = {r.name: r for r in reports["file"].rows if r.format_rel is not None}
    apart = []
    for r in reports["model"].rows:
        f = by_file.get(r.name)
        if r.format_rel is None or f is None:
            continue
        lo, hi = sorted((r.format_rel, f.format_rel))
        if hi > 1e-3 and hi > 3 * lo:
            apart.append((hi / max(lo, 1e-12), r.name, r.format_rel, f.format_rel))
    if apart:
        apart.sort(reverse=True)
        worst = "; ".join(f"{n} {_g(m)} vs {_g(f)}" for _, n, m, f in apart[:3])
        print(f"{'':31s}(ideal runs apart on {len(apart)} rows, format_rel vs model vs file: {worst})", flush=True)
        sweep.apart.append(f"{label}: {len(apart)} rows; worst: {worst}\n      repeat: {repeat}")


def _table(sweep: Sweep) -> None:
    a = sweep.args
    rows: list[tuple[str, Tally]] = []

    def total(keys) -> Tally:
        out = Tally()
        for k in keys:
            t = sweep.tallies.get(k)
            if t is not None:
                for f in vars(out):
                    setattr(out, f, getattr(out, f) + getattr(t, f))
        return out

    rows += [(kind, total([(e, kind) for e in a.exporters])) for kind in a.kinds]
    rows += [(exporter, total([(exporter, k) for k in a.kinds])) for exporter in a.exporters]
    rows += [("all", total([(e, k) for e in a.exporters for k in a.kinds]))]
    print("\ntotals          healthy flagged   faults named at module   named elsewhere   missed   "
          "could not run   no site")
    print("                (of healthy runs) (of faults that change)")
    for what, t in rows:
        print(f"{what:15s} {t.flagged:4d} / {t.healthy:<4d}      {t.right:4d} / {t.changing:<4d}            "
              f"{t.elsewhere:4d}           {t.missed:4d}     {t.cannot:4d}            {t.no_site:4d}")
    print(f"(a fault that changes no value: {total([(e, k) for e in a.exporters for k in a.kinds]).faults - rows[-1][1].changing}"
          " run(s), not counted)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
    parser.add_argument("--exporters", default=",".join(EXPORTERS), help="torchscript, dynamo")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fp16, int8, bf16")
    parser.add_argument("--refs", default=",".join(REFS), help="model (the PyTorch model), file (the float32 file)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=", ".join(FAULTS) + " (clip: int8 only)")
    parser.add_argument("--keep", default=None, help="write the corpus here (default: a temporary folder)")
    parser.add_argument("--local", action="store_true", help="compare with local=True: each module's own part judged")
    parser.add_argument("--int8-as-is", action="store_true",
                        help="keep quantize_static's file even where a calibrated range is not finite (by default the "
                             "nodes around such a tensor are quantised again left in float32)")
    a = parser.parse_args()
    for opt, allowed in (("models", MODELS), ("exporters", EXPORTERS), ("kinds", KINDS), ("refs", REFS), ("faults", FAULTS)):
        values = [v.strip() for v in getattr(a, opt).split(",") if v.strip()]
        unknown = [v for v in values if v not in allowed]
        if unknown or not values:
            parser.error(f"--{opt}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(allowed)}")
        setattr(a, opt, values)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    LOCAL[0] = a.local
    import layertap

    print(f"layertap from {Path(layertap.__file__).parent}; torch {torch.__version__}")
    sweep = Sweep(a)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in a.models:
            _sweep_model(sweep, name, folder)
    _table(sweep)
    for title, lines in (("healthy runs flagged", sweep.flagged), ("could not run", sweep.cannot),
                         ("healthy runs passed comparing under half their rows", sweep.thin),
                         ("healthy candidates whose two ideal runs cost 3x apart at some module", sweep.apart),
                         ("faults that change a value, missed or named elsewhere", sweep.wrong)):
        print(f"\n{title} ({len(lines)}):")
        for line in lines:
            print(f"  {line}")
    print(f"\nrepeat a case: .venv/bin/python benchmarks/sweep_precision.py <its options>; took {time.monotonic() - start:.0f} s")
    return 0


_BF16: list[bool] = []


def _bf16_here() -> bool:
    if not _BF16:
        try:
            from layertap.runtimes import open_runtime

            _BF16.append(open_runtime("openvino", ov_precision="bf16").describe().precision == "bfloat16")
        except Exception:  # noqa: BLE001 - no OpenVINO, or it refuses bf16 on this CPU
            _BF16.append(False)
    return _BF16[0]


if __name__ == "__main__":
    sys.exit(main())
