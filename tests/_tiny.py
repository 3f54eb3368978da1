"""Tiny models (random init, seeded) shared by several test files."""

from __future__ import annotations


def tiny_clip(layers: int = 2):
    """A CLIPModel with 32-wide, ``layers``-deep towers, 32 px images, vocab 100."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.CLIPConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=8),
        projection_dim=16,
    )
    return transformers.CLIPModel(cfg).eval()


def tiny_bert_config():
    """A BertConfig 32 wide, 2 layers deep, vocab 100, up to 32 tokens (the caller seeds the init)."""
    import transformers

    return transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=37, max_position_embeddings=32)


def small_cnn():
    """Conv-BN-ReLU stem and block, pool, Linear: 3x16x16 images in, 4 logits out (seed 0).

    Usable as a MODEL spec: ``tests/_tiny.py:small_cnn``.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("stem", nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()))
    model.add_module("block", nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()))
    model.add_module("pool", nn.AdaptiveAvgPool2d(1))
    model.add_module("flat", nn.Flatten())
    model.add_module("fc", nn.Linear(8, 4))
    return model.eval()


def pool_cnn(overflow: float = 1.0):
    """Three Conv-ReLU-MaxPool stages, GroupNorm, Linear: 3x16x16 images in, 4 logits out (seed 0).
    ``overflow`` scales the second conv's weights: above ~1e3 its outputs leave float16's range,
    and the GroupNorm after the pools brings them back."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential()
    for i, (cin, cout) in enumerate([(3, 8), (8, 8), (8, 8)], 1):
        model.add_module(f"conv{i}", nn.Conv2d(cin, cout, 3, padding=1))
        model.add_module(f"relu{i}", nn.ReLU())
        model.add_module(f"pool{i}", nn.MaxPool2d(2))
    model.add_module("norm", nn.GroupNorm(1, 8))
    model.add_module("flat", nn.Flatten())
    model.add_module("fc", nn.Linear(8 * 2 * 2, 4))
    with torch.no_grad():
        model.conv2.weight.mul_(overflow)
    return model.eval()
