"""lt.extract on real zoo architectures (random weights, tiny configs, fixed seeds).

References come from the libraries' own mechanisms (``output_hidden_states``)
or from calling submodules by hand, never from layertap.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

import layertap as lt  # noqa: E402
from _tiny import tiny_clip  # noqa: E402
from layertap.errors import SelectorError  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        vocab_size=100, max_position_embeddings=32,
    )
    return transformers.BertModel(cfg).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def clip():
    return tiny_clip(layers=2)


def test_bert_encoder_layers_match_hidden_states(bert, ids):
    with torch.no_grad():
        ref = bert(input_ids=ids, output_hidden_states=True)
    out = lt.extract(bert, input_ids=ids, taps=["encoder.layer.0", "encoder.layer.1", "embeddings"])
    torch.testing.assert_close(out["embeddings"], ref.hidden_states[0], **TOL)
    torch.testing.assert_close(out["encoder.layer.0"], ref.hidden_states[1], **TOL)
    torch.testing.assert_close(out["encoder.layer.1"], ref.hidden_states[2], **TOL)
    # the ModelOutput flattens to output[field]
    torch.testing.assert_close(out["output[last_hidden_state]"], ref.last_hidden_state, **TOL)
    torch.testing.assert_close(out["output[pooler_output]"], ref.pooler_output, **TOL)


def test_bert_tuple_output_needs_index(bert, ids):
    with torch.no_grad():
        h1 = bert(input_ids=ids, output_hidden_states=True).hidden_states[1]
        att = bert.encoder.layer[1].attention
        by_hand = att.output(att.self(h1)[0], h1)  # submodules called by hand
    with pytest.raises(SelectorError) as e:
        lt.extract(bert, input_ids=ids, taps=["encoder.layer.1.attention"])
    assert "tuple(Tensor[2,7,32], None), not a tensor" in str(e.value)
    assert "encoder.layer.1.attention[0]" in str(e.value)
    out = lt.extract(bert, input_ids=ids, taps=["encoder.layer.1.attention[0]", "encoder[last_hidden_state]", "encoder[0]"])
    torch.testing.assert_close(out["encoder.layer.1.attention[0]"], by_hand, **TOL)
    torch.testing.assert_close(out["encoder[0]"], out["encoder[last_hidden_state]"])
    with pytest.raises(SelectorError, match="index \\[1\\] is out of range"):
        lt.extract(bert, input_ids=ids, taps=["encoder[1]"])  # ModelOutput [int] skips None fields


def test_bert_stop_early_at_an_encoder_layer(bert, ids):
    seen = []
    h = bert.pooler.register_forward_hook(lambda *a: seen.append(1))
    try:
        out = lt.extract(bert, input_ids=ids, taps=["encoder.layer.0", "q=encoder.layer.0.attention.self.query"],
                         stop_early=True)
    finally:
        h.remove()
    assert list(out) == ["q", "encoder.layer.0"] and not seen
    full = lt.extract(bert, input_ids=ids, taps=["encoder.layer.0"])
    torch.testing.assert_close(out["encoder.layer.0"], full["encoder.layer.0"])


def test_clip_non_forward_method(clip):
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = clip.vision_model(pixel_values=pixels, output_hidden_states=True)
        feats = clip.visual_projection(ref.pooler_output)
    out = lt.extract(clip, pixel_values=pixels, method="get_image_features",
                     taps=["vision_model.encoder.layers.1", "emb=visual_projection", "vision_model[pooler_output]"])
    torch.testing.assert_close(out["vision_model.encoder.layers.1"], ref.hidden_states[2], **TOL)
    torch.testing.assert_close(out["emb"], feats, **TOL)
    torch.testing.assert_close(out["vision_model[pooler_output]"], ref.pooler_output, **TOL)
    with pytest.raises(SelectorError, match="'text_model.encoder.layers.0' never ran in this get_image_features"):
        lt.extract(clip, pixel_values=pixels, method="get_image_features", taps=["text_model.encoder.layers.0"])
    early = lt.extract(clip, pixel_values=pixels, method="get_image_features",
                       taps=["vision_model.encoder.layers.0"], stop_early=True)
    assert list(early) == ["vision_model.encoder.layers.0"]
    torch.testing.assert_close(early["vision_model.encoder.layers.0"], ref.hidden_states[1], **TOL)


def test_clip_forward_both_towers(clip):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(2, 100, (2, 5), generator=g)
    pixels = torch.randn(2, 3, 32, 32, generator=g)
    with torch.no_grad():
        text_ref = clip.text_model(input_ids=ids, output_hidden_states=True)
    out = lt.extract(clip, input_ids=ids, pixel_values=pixels,
                     taps=["text_model.encoder.layers.0", "text_model.encoder.layers.0:input", "logit_scale=text_projection:input"])
    torch.testing.assert_close(out["text_model.encoder.layers.0"], text_ref.hidden_states[1], **TOL)
    torch.testing.assert_close(out["text_model.encoder.layers.0:input"], text_ref.hidden_states[0], **TOL)
    torch.testing.assert_close(out["logit_scale"], text_ref.pooler_output, **TOL)
    assert "output[logits_per_image]" in out


@pytest.fixture(scope="module")
def resnet10t():
    torch.manual_seed(0)
    return timm.create_model("resnet10t", pretrained=False).eval()


def test_timm_resnet_layers_and_stop_early(resnet10t):
    m = resnet10t
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        stem = m.maxpool(m.act1(m.bn1(m.conv1(x))))
        l1 = m.layer1(stem)
        l2 = m.layer2(l1)
        blk = m.layer3[0]
        c1 = blk.conv1(l2)
        logits = m(x)
    out = lt.extract(m, x, taps=["layer2", "layer3.0.conv1", "layer1:input"])
    torch.testing.assert_close(out["layer2"], l2, **TOL)
    torch.testing.assert_close(out["layer3.0.conv1"], c1, **TOL)
    torch.testing.assert_close(out["layer1:input"], stem, **TOL)
    torch.testing.assert_close(out["output"], logits, **TOL)
    ran = []
    h = m.layer3.register_forward_pre_hook(lambda *a: ran.append(1))
    try:
        early = lt.extract(m, x, taps=["layer2"], stop_early=True)
    finally:
        h.remove()
    assert list(early) == ["layer2"] and not ran  # timm's grad-checkpointing branch is dead in eval
    torch.testing.assert_close(early["layer2"], l2, **TOL)


def test_gpt2_block_input_by_name_and_layer_index_portable(ids):
    """GPT2 calls its blocks positionally: ``:input[hidden_states]`` still finds
    the argument. ``h.0[0]`` is the block's hidden state whether the installed
    transformers returns a tuple or a bare tensor (never a batch row)."""
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        ref = gpt2(input_ids=ids, output_hidden_states=True)
    taps = ["h.1:input[hidden_states]", "h.0[0]", "h.1.attn[0]"]
    out = lt.extract(gpt2, input_ids=ids, taps=taps)
    torch.testing.assert_close(out["h.1:input[hidden_states]"], ref.hidden_states[1], **TOL)
    torch.testing.assert_close(out["h.0[0]"], ref.hidden_states[1], **TOL)
    early = lt.extract(gpt2, input_ids=ids, taps=taps, stop_early=True)
    assert list(early) == list(out)[:3]  # call order, and no "output": the forward was cut
    for k in taps:
        torch.testing.assert_close(early[k], out[k], rtol=0, atol=0)
