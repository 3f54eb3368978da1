"""Tiny transformers models (random init, seeded) shared by several test files."""

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
