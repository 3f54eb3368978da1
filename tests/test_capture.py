"""The capture engine: lt.tap / lt.extract against independent references.

References are computed in the test with functional ops (F.conv2d, F.linear...)
on the model's own parameters, so no module call and no hook is involved.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import layertap as lt  # noqa: E402
from layertap.errors import SelectorError  # noqa: E402
from layertap.pytorch import callgraph  # noqa: E402
from layertap.pytorch.capture import Capture  # noqa: E402


def no_hooks(model: nn.Module) -> bool:
    return all(
        not m._forward_hooks and not m._forward_pre_hooks
        and not m._forward_hooks_with_kwargs and not m._forward_pre_hooks_with_kwargs
        for m in model.modules()
    )


# -- functional resnet18 reference --------------------------------------------
def conv(c: nn.Conv2d, x):
    return F.conv2d(x, c.weight, c.bias, c.stride, c.padding, c.dilation, c.groups)


def bn(b: nn.BatchNorm2d, x):
    return F.batch_norm(x, b.running_mean, b.running_var, b.weight, b.bias, False, 0.0, b.eps)


def block_ref(blk, x) -> dict:
    """Every intermediate of a torchvision BasicBlock, by hand."""
    r = {}
    r["conv1"] = conv(blk.conv1, x)
    r["bn1"] = bn(blk.bn1, r["conv1"])
    r["relu#0"] = torch.relu(r["bn1"])
    r["conv2"] = conv(blk.conv2, r["relu#0"])
    r["bn2"] = bn(blk.bn2, r["conv2"])
    identity = x if blk.downsample is None else bn(blk.downsample[1], conv(blk.downsample[0], x))
    r["relu#1"] = torch.relu(r["bn2"] + identity)
    return r


def resnet_ref(model, x) -> dict:
    """Named intermediates of torchvision resnet18, computed without calling any module."""
    r = {}
    h = torch.relu(bn(model.bn1, conv(model.conv1, x)))
    r["relu"] = h
    h = F.max_pool2d(h, 3, 2, 1)
    r["maxpool"] = h
    for li in range(1, 5):
        layer = getattr(model, f"layer{li}")
        r[f"layer{li}:input"] = h
        for bi, blk in enumerate(layer):
            for k, v in block_ref(blk, h).items():
                r[f"layer{li}.{bi}.{k}"] = v
            h = r[f"layer{li}.{bi}.relu#1"]
        r[f"layer{li}"] = h
    r["fc:input"] = torch.flatten(F.adaptive_avg_pool2d(h, 1), 1)
    r["output"] = F.linear(r["fc:input"], model.fc.weight, model.fc.bias)
    return r


@pytest.fixture(scope="session")
def rn_ref(resnet18, resnet_input):
    with torch.no_grad():
        return resnet_ref(resnet18, resnet_input)


# -- resnet18 --------------------------------------------------------------------
def test_resnet18_layer4_conv1_and_second_relu(resnet18, resnet_input, rn_ref):
    """The seed's failing case: a deep conv, and the second call of BasicBlock's relu."""
    with lt.tap(resnet18, ["layer4.0.conv1", "layer2.0.relu#1", "layer2.0.relu#0", "fc:input"]) as taps:
        with torch.no_grad():
            y = resnet18(resnet_input)
    out = taps.outputs
    assert list(out) == ["layer2.0.relu#0", "layer2.0.relu#1", "layer4.0.conv1", "fc:input"]  # call order
    for name in out:
        torch.testing.assert_close(out[name], rn_ref[name], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, rn_ref["output"], rtol=1e-4, atol=1e-4)
    assert no_hooks(resnet18)


def test_reused_module_without_call_gives_every_call(resnet18, resnet_input, rn_ref):
    out = lt.extract(resnet18, resnet_input, taps=["layer3.1.relu", "last=layer3.1.relu#-1"])
    assert [k for k in out if k.startswith("layer3")] == ["layer3.1.relu#0", "layer3.1.relu#1"]
    torch.testing.assert_close(out["layer3.1.relu#0"], rn_ref["layer3.1.relu#0"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["layer3.1.relu#1"], rn_ref["layer3.1.relu#1"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["last"], out["layer3.1.relu#1"])
    torch.testing.assert_close(out["output"], rn_ref["output"], rtol=1e-4, atol=1e-4)


def test_value_is_cloned_before_an_inplace_relu_overwrites_it(resnet18, resnet_input, rn_ref):
    # bn1's output is modified in place by ReLU(inplace=True) right after.
    out = lt.extract(resnet18, resnet_input, taps=["layer1.0.bn1"])
    assert (out["layer1.0.bn1"] < 0).any()
    torch.testing.assert_close(out["layer1.0.bn1"], rn_ref["layer1.0.bn1"], rtol=1e-4, atol=1e-4)


def test_input_port_of_a_module(resnet18, resnet_input, rn_ref):
    out = lt.extract(resnet18, resnet_input, taps=["layer3:input", "x=layer3:input[0]", "layer3:input[0][0]"])
    torch.testing.assert_close(out["layer3:input"], rn_ref["layer3:input"], rtol=1e-4, atol=1e-4)
    # on an input, [0] is the first positional argument; a further [0] on that
    # one tensor is the tensor itself (a 1-tuple), never its first batch row
    torch.testing.assert_close(out["x"], rn_ref["layer3:input"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["layer3:input[0][0]"], rn_ref["layer3:input"], rtol=1e-4, atol=1e-4)


def test_index_on_a_single_tensor_is_the_tensor_not_a_batch_row(resnet18, resnet_input, rn_ref):
    # transformers 5 layers return a tensor where 4.x returned (hidden,): the
    # same selector must give the same value, as it does on the ONNX side.
    out = lt.extract(resnet18, resnet_input, taps=["layer2[0]", "a=layer2[-1]"])
    torch.testing.assert_close(out["layer2[0]"], rn_ref["layer2"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["a"], rn_ref["layer2"], rtol=1e-4, atol=1e-4)
    with pytest.raises(SelectorError, match=r"layer2\[1\]'.*one tensor: only \[0\] applies"):
        lt.extract(resnet18, resnet_input, taps=["layer2[1]"])


def test_detached_by_default_and_grad_on_request(resnet18, resnet_input):
    out = lt.extract(resnet18, resnet_input, taps=["layer1"])
    assert not out["layer1"].requires_grad and out["layer1"].grad_fn is None
    x = resnet_input.clone().requires_grad_(True)
    out = lt.extract(resnet18, x, taps=["layer1"], detach=False)
    assert out["layer1"].requires_grad
    out["layer1"].sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    resnet18.zero_grad(set_to_none=True)


def test_calls_accumulate_over_forwards_in_one_tap_block(resnet18, resnet_input, rn_ref):
    with torch.no_grad(), lt.tap(resnet18, ["fc"]) as taps:
        resnet18(resnet_input)
        resnet18(resnet_input[:1])
    assert list(taps.outputs) == ["fc#0", "fc#1"]
    torch.testing.assert_close(taps["fc#1"], rn_ref["output"][:1], rtol=1e-4, atol=1e-4)
    with pytest.raises(KeyError, match="did you mean: fc#1, fc#0"):
        taps["fc#"]


# -- a custom model: reused submodule at the top level, data-dependent control flow
class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.lin(x))


@dataclasses.dataclass
class Pair:
    main: torch.Tensor
    aux: torch.Tensor | None


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x, *, scale=None):
        y = self.lin(x)
        return Pair(y * scale if scale is not None else y, None)


class Reuser(nn.Module):
    """``shared`` runs 2 or 3 times depending on the data; ``head`` gets a keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = Shared()
        self.head = Head()
        self.calls = {"head": 0}

    def forward(self, x):
        h = self.inp(x)
        h = self.shared(h)
        if h.sum() > 0:  # data-dependent
            h = self.shared(h)
        h = self.shared(-h)
        self.calls["head"] += 1
        out = self.head(h, scale=torch.full((1,), 2.0))
        return {"logits": out.main, "hidden": h}

    def encode(self, x):
        """A non-forward method: only part of the model runs."""
        return self.shared(self.inp(x))


def reuser_ref(m: Reuser, x) -> dict:
    r = {}
    h = F.linear(x, m.inp.weight, m.inp.bias)
    r["inp"] = h
    calls = []

    def shared(v):
        calls.append((v, torch.tanh(F.linear(v, m.shared.lin.weight, m.shared.lin.bias))))
        return calls[-1][1]

    h = shared(h)
    if h.sum() > 0:
        h = shared(h)
    h = shared(-h)
    r["shared"] = calls
    r["head:input"] = h
    r["logits"] = F.linear(h, m.head.lin.weight, m.head.lin.bias) * 2.0
    return r


@pytest.fixture(scope="module")
def reuser():
    torch.manual_seed(0)
    return Reuser().eval()


def _inputs_with_calls(model, n_calls: int):
    """A seeded input for which ``shared`` runs ``n_calls`` times."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        x = torch.randn(3, 6, generator=g)
        if len(reuser_ref(model, x)["shared"]) == n_calls:
            return x
    raise AssertionError("no input found")


@pytest.mark.parametrize("n_calls", [2, 3])
def test_custom_reuse_and_control_flow(reuser, n_calls):
    x = _inputs_with_calls(reuser, n_calls)
    ref = reuser_ref(reuser, x)
    with torch.no_grad():
        out = lt.extract(reuser, x, taps=["shared", "shared.lin:input", "head:input", "head[main]", "head[0]"])
    for k, (v_in, v_out) in enumerate(ref["shared"]):
        torch.testing.assert_close(out[f"shared#{k}"], v_out)
        torch.testing.assert_close(out[f"shared.lin#{k}:input"], v_in)
    assert f"shared#{n_calls}" not in out
    torch.testing.assert_close(out["head:input"], ref["head:input"])
    torch.testing.assert_close(out["head[main]"], ref["logits"])
    torch.testing.assert_close(out["head[0]"], ref["logits"])
    torch.testing.assert_close(out["output[logits]"], ref["logits"])
    torch.testing.assert_close(out["output[hidden]"], ref["head:input"])
    # the last call, whatever the count
    last = lt.extract(reuser, x, taps=["shared#-1"])["shared#-1"]
    torch.testing.assert_close(last, ref["shared"][-1][1])


def test_keyword_argument_of_an_input_tap(reuser):
    x = _inputs_with_calls(reuser, 2)
    out = lt.extract(reuser, x, taps=["head:input[scale]", "head:input[0]"])
    torch.testing.assert_close(out["head:input[scale]"], torch.full((1,), 2.0))
    # without an index, the lone positional argument is the input (keywords are options)
    ref = reuser_ref(reuser, x)
    torch.testing.assert_close(lt.extract(reuser, x, taps=["head:input"])["head:input"], ref["head:input"])
    with pytest.raises(SelectorError, match="no key \\[scal\\]; did you mean: scale"):
        lt.extract(reuser, x, taps=["head:input[scal]"])


class TwoArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = Mix()

    def forward(self, a, b):
        return self.mix(a, b, mask=None)


class Mix(nn.Module):
    def forward(self, a, b, mask=None):
        return a + b


def test_input_with_several_arguments_needs_an_index():
    model = TwoArgs()
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(SelectorError, match=r"args\(a=Tensor\[2,3\], b=Tensor\[2,3\], mask=None\), not a tensor; .* e.g. mix:input\[a\]"):
        lt.extract(model, a, b, taps=["mix:input"])
    out = lt.extract(model, a, b, taps=["mix:input[1]", "mix:input[-2]", "mix"])
    torch.testing.assert_close(out["mix:input[1]"], b)
    torch.testing.assert_close(out["mix:input[-2]"], a)
    torch.testing.assert_close(out["mix"], a + b)
    with pytest.raises(SelectorError, match=r"positional argument \[2\] is out of range"):
        lt.extract(model, a, b, taps=["mix:input[2]"])
    assert no_hooks(model)


def test_non_tensor_value_error_shows_structure(reuser):
    x = _inputs_with_calls(reuser, 2)
    with pytest.raises(SelectorError) as e:
        lt.extract(reuser, x, taps=["head"])
    assert "Pair(main=Tensor[3,4], aux=None)" in str(e.value)
    assert "e.g. head[main]" in str(e.value)  # says how to pick one
    with pytest.raises(SelectorError, match="is None, not a tensor"):
        lt.extract(reuser, x, taps=["head[aux]"])
    assert no_hooks(reuser)


def test_non_forward_method(reuser):
    x = _inputs_with_calls(reuser, 2)
    out = lt.extract(reuser, x, taps=["inp", "shared", ":input"], method="encode")
    ref_inp = F.linear(x, reuser.inp.weight, reuser.inp.bias)
    torch.testing.assert_close(out["inp"], ref_inp)
    ref_enc = torch.tanh(F.linear(ref_inp, reuser.shared.lin.weight, reuser.shared.lin.bias))
    torch.testing.assert_close(out["shared"], ref_enc)
    torch.testing.assert_close(out["output"], ref_enc)
    torch.testing.assert_close(out[":input"], x)
    with pytest.raises(SelectorError, match="'head' never ran in this encode"):
        lt.extract(reuser, x, taps=["head"], method="encode")
    with pytest.raises(lt.LayertapError, match="unknown method of Reuser 'encod'; did you mean: encode"):
        lt.extract(reuser, x, taps=["inp"], method="encod")
    with lt.tap(reuser, ["shared"], method="encode", stop_early=True) as taps:
        reuser.encode(x)
    torch.testing.assert_close(taps.outputs["shared"], ref_enc)


def test_call_index_out_of_range_says_how_many(reuser):
    x = _inputs_with_calls(reuser, 3)
    with pytest.raises(SelectorError, match=r"call #3 is out of range; module 'shared' ran 3 times \(calls #0..#2\)"):
        lt.extract(reuser, x, taps=["shared#3"])
    with pytest.raises(SelectorError, match="call #-4 is out of range"):
        lt.extract(reuser, x, taps=["shared#-4"])


def test_unknown_module_lists_close_paths(reuser):
    with pytest.raises(SelectorError, match="unknown module 'shared.ln'; did you mean: shared.lin"):
        lt.extract(reuser, torch.randn(1, 6), taps=["shared.ln"])
    assert no_hooks(reuser)


# -- stop_early --------------------------------------------------------------------
def count_calls(model: nn.Module, paths: list[str]):
    """Test-side forward hooks counting calls (removed by the caller)."""
    counts = {p: 0 for p in paths}
    handles = [
        model.get_submodule(p).register_forward_hook(lambda m, a, o, p=p: counts.__setitem__(p, counts[p] + 1))
        for p in paths
    ]
    return counts, handles


def test_stop_early_resnet_reused_relu(resnet18, resnet_input, rn_ref):
    counts, handles = count_calls(resnet18, ["layer2.0.conv2", "layer2.1", "layer3.0.conv1", "fc"])
    try:
        out = lt.extract(resnet18, resnet_input, taps=["layer2.0.relu"], stop_early=True)
        assert list(out) == ["layer2.0.relu#0", "layer2.0.relu#1"]  # both calls, no 'output'
        for k in (0, 1):
            torch.testing.assert_close(out[f"layer2.0.relu#{k}"], rn_ref[f"layer2.0.relu#{k}"], rtol=1e-4, atol=1e-4)
        assert counts == {"layer2.0.conv2": 1, "layer2.1": 0, "layer3.0.conv1": 0, "fc": 0}
        # a pinned first call stops before the block's second half runs
        out = lt.extract(resnet18, resnet_input, taps=["layer2.0.relu#0"], stop_early=True)
        assert list(out) == ["layer2.0.relu#0"]
        assert counts["layer2.0.conv2"] == 1
        # an input tap stops before its module runs
        out = lt.extract(resnet18, resnet_input, taps=["layer3:input"], stop_early=True)
        torch.testing.assert_close(out["layer3:input"], rn_ref["layer3:input"], rtol=1e-4, atol=1e-4)
        assert counts["layer2.1"] == 1 and counts["layer3.0.conv1"] == 0 and counts["fc"] == 0
    finally:
        for h in handles:
            h.remove()
    assert not resnet18.layer2[1]._forward_hooks and no_hooks(resnet18)


def test_stop_early_with_tap_block(resnet18, resnet_input, rn_ref):
    with torch.no_grad(), lt.tap(resnet18, ["layer1"], stop_early=True) as taps:
        resnet18(resnet_input)
        pytest.fail("the forward should have been stopped")  # pragma: no cover
    assert taps.stopped
    torch.testing.assert_close(taps.outputs["layer1"], rn_ref["layer1"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_calls", [2, 3])
def test_stop_early_custom_reuse(reuser, n_calls):
    x = _inputs_with_calls(reuser, n_calls)
    ref = reuser_ref(reuser, x)
    full = lt.extract(reuser, x, taps=["shared", "shared.act"])
    reuser.calls["head"] = 0
    early = lt.extract(reuser, x, taps=["shared", "shared.act"], stop_early=True)
    # shared may run again until forward returns: nothing is cut, nothing lost
    assert list(early) == list(full) and "output[logits]" in early
    for k in range(n_calls):
        torch.testing.assert_close(early[f"shared#{k}"], ref["shared"][k][1])
    assert reuser.calls["head"] == 1
    # the input layer runs once: stop right after it, head never runs
    reuser.calls["head"] = 0
    early = lt.extract(reuser, x, taps=["inp"], stop_early=True)
    assert list(early) == ["inp"] and reuser.calls["head"] == 0
    torch.testing.assert_close(early["inp"], ref["inp"])
    # a pinned call of the reused module is complete when it returns
    early = lt.extract(reuser, x, taps=["shared#1"], stop_early=True)
    assert list(early) == ["shared#1"] and reuser.calls["head"] == 0
    torch.testing.assert_close(early["shared#1"], ref["shared"][1][1])
    assert no_hooks(reuser)


# -- hooks never survive ---------------------------------------------------------------
class Boom(RuntimeError):
    pass


class Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        raise Boom("model failed")


def test_no_hook_survives_a_model_exception():
    model = Exploding()
    with pytest.raises(Boom):
        with lt.tap(model, ["a", "b:input"]):
            model(torch.randn(1, 4))
    assert no_hooks(model)
    for stop in (False, True):
        with pytest.raises(Boom):
            lt.extract(model, torch.randn(1, 4), taps=["a", "b"], stop_early=stop)
        assert no_hooks(model)


def test_no_hook_survives_an_exception_in_the_with_block(resnet18):
    with pytest.raises(ZeroDivisionError):
        with lt.tap(resnet18, ["layer1", "fc:input"]):
            1 / 0  # noqa: B018 - the error raised inside the block
    assert no_hooks(resnet18)


def test_no_hook_survives_a_tap_error_raised_mid_forward(reuser):
    with pytest.raises(SelectorError):
        with lt.tap(reuser, ["inp", "head"]):  # head returns a dataclass: error inside the hook
            reuser(torch.randn(2, 6))
    assert no_hooks(reuser)


def test_hooks_removed_after_normal_exit_and_user_hooks_kept(resnet18, resnet_input):
    mine = resnet18.layer1.register_forward_hook(lambda m, a, o: None)
    try:
        lt.extract(resnet18, resnet_input, taps=["layer1", "layer1:input"], stop_early=True)
        assert len(resnet18.layer1._forward_hooks) == 1 and not resnet18.layer1._forward_pre_hooks
    finally:
        mine.remove()
    assert no_hooks(resnet18)


def test_capture_attach_twice_is_refused(reuser):
    cap = Capture(reuser, ["inp"])
    cap.attach()
    try:
        with pytest.raises(AssertionError):
            cap.attach()
    finally:
        cap.remove()
    assert no_hooks(reuser)


# -- the static analysis behind stop_early ----------------------------------------
class Aliased(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = self.a  # the same module under two names

    def forward(self, x):
        return self.b(self.a(x))


class LocalRef(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        f = self.a
        return f(f(x))


class TwicePerIteration(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.named = nn.ModuleDict({"p": nn.Linear(4, 4)})

    def forward(self, x):
        for blk in self.blocks:
            x = blk(blk(x))
        for _, m in self.named.items():
            x = m(x)
        return x


class Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.checkpointing = False

    def forward(self, x):
        if x.sum() > 0:
            y = self.a(x)
        else:
            y = self.a(-x)
        if self.checkpointing:
            y = torch.utils.checkpoint.checkpoint(self.b, y)
        else:
            y = self.b(y)
        return y


@pytest.mark.parametrize(
    "model, path, expected",
    [
        (Aliased(), "a", ""),
        (LocalRef(), "a", ""),
        (TwicePerIteration(), "blocks.0", ""),
        (TwicePerIteration(), "named.p", "named.p"),
        (Branches(), "a", "a"),  # one call in either branch
        (Branches(), "b", "b"),  # the checkpoint branch is dead while the flag is False
    ],
)
def test_completing_ancestor_is_conservative(model, path, expected):
    assert callgraph.completing_ancestor(model, path) == expected
    # whatever the analysis says, stop_early returns what a full run returns
    x = torch.randn(2, 4)
    full = lt.extract(model, x, taps=[path])
    early = lt.extract(model, x, taps=[path], stop_early=True)
    assert [k for k in early if not k.startswith("output")] == [k for k in full if not k.startswith("output")]


def test_completing_ancestor_sees_a_live_flag():
    m = Branches()
    m.checkpointing = True
    assert callgraph.completing_ancestor(m, "b") == ""


def test_completing_ancestor_resnet18(resnet18):
    assert callgraph.completing_ancestor(resnet18, "layer2.0.relu") == "layer2.0"
    assert callgraph.completing_ancestor(resnet18, "layer2.0.conv1") == "layer2.0.conv1"
    assert callgraph.completing_ancestor(resnet18, "") == ""


# -- arguments by name, error hints, errors inside try ---------
class PositionalCaller(nn.Module):
    """Calls its block positionally, as HF models do (``layer(h, mask, ...)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Gate()

    def forward(self, x):
        return self.block(x, torch.sigmoid(x), None)


class Gate(nn.Module):
    def forward(self, hidden_states, gate, bias=None):
        return {"aux": None, "out": hidden_states * gate}


def test_input_argument_by_parameter_name_when_passed_by_position():
    model = PositionalCaller()
    x = torch.randn(2, 3)
    out = lt.extract(model, x, taps=["block:input[hidden_states]", "block:input[gate]", "block[out]"], stop_early=True)
    torch.testing.assert_close(out["block:input[hidden_states]"], x)
    torch.testing.assert_close(out["block:input[gate]"], torch.sigmoid(x))
    torch.testing.assert_close(out["block[out]"], x * torch.sigmoid(x))
    with pytest.raises(SelectorError, match=r"args\(hidden_states=Tensor\[2,3\], gate=Tensor\[2,3\], bias=None\); "
                                            r"it has no key \[gat\]; did you mean: gate"):
        lt.extract(model, x, taps=["block:input[gat]"])


def test_not_a_tensor_error_suggests_an_index_that_works():
    model = PositionalCaller()
    x = torch.randn(2, 3)
    # a dict whose first entry is None: the hint names the tensor's key, not [0]
    with pytest.raises(SelectorError, match=r"not a tensor; pick one with an index, e.g. block\[out\]$"):
        lt.extract(model, x, taps=["block"])
    with pytest.raises(SelectorError, match=r"e.g. block:input\[hidden_states\]$"):
        lt.extract(model, x, taps=["block:input"])
    with pytest.raises(SelectorError, match=r"block'.*\[aux\] is None, not a tensor; there is no tensor to capture there$"):
        lt.extract(model, x, taps=["block[aux]"])
    assert no_hooks(model)


class Fallback(nn.Module):
    """Swallows exceptions around a call, as fused-kernel fallbacks do."""

    def __init__(self) -> None:
        super().__init__()
        self.fast = Gate()
        self.slow = nn.Linear(3, 3)

    def forward(self, x):
        try:
            y = self.fast(x, x)["out"]
        except Exception:  # noqa: BLE001 - the point of the test
            y = self.slow(x)
        return y


@pytest.mark.parametrize("stop_early", [False, True])
def test_a_tap_error_is_not_swallowed_by_the_models_except(stop_early):
    model = Fallback()
    x = torch.randn(2, 3)
    with pytest.raises(SelectorError, match=r"tap 'fast\[nope\]'.*no key \[nope\]"):
        lt.extract(model, x, taps=["fast[nope]"], stop_early=stop_early)
    assert no_hooks(model)


class Getter(nn.ModuleDict):
    """torchvision's IntermediateLayerGetter pattern: a ModuleDict that runs."""

    def forward(self, x):
        out = {}
        for name, module in self.items():
            x = module(x)
            out[name] = x
        return out


class LoopThenReuse(nn.Sequential):
    def forward(self, x):
        for m in self:
            x = m(x)
        return self[0](x)  # the first element runs again


def test_stop_early_inside_a_container_subclass_with_its_own_forward():
    model = nn.Sequential(nn.Tanh(), Getter({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4), "c": nn.Linear(4, 4)}))
    assert callgraph.completing_ancestor(model, "1.a") == "1.a"
    reuse = LoopThenReuse(nn.Linear(4, 4), nn.Linear(4, 4))
    assert callgraph.completing_ancestor(reuse, "0") == ""  # self[0] after the loop: not provably once
    x = torch.randn(2, 4)
    for m, taps, cut in ((model, ["1.a", "1[b]"], True), (reuse, ["0", "1"], False)):
        full = lt.extract(m, x, taps=taps)
        early = lt.extract(m, x, taps=taps, stop_early=True)
        assert ("output" not in early) is cut
        assert [k for k in early if k != "output"] == [k for k in full if not k.startswith("output")]
        for k in early:
            torch.testing.assert_close(early[k], full[k], rtol=0, atol=0)


def test_taps_hook_only_the_tapped_modules(resnet18):
    """What a tapped forward pays over a plain one: hooks on the tapped modules alone (no
    call numbering on the others), so ten taps on resnet18 hook nine of its 67 submodules."""
    taps = ["relu", "layer1", "layer1.0.conv1", "layer2.0.relu#1", "layer2", "layer3.1",
            "layer3", "layer4.0.conv2", "layer4", "fc:input"]
    with Capture(resnet18, taps):
        hooked = [p for p, m in resnet18.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    assert sorted(hooked) == sorted({t.split("#")[0].split(":")[0] for t in taps})
    assert no_hooks(resnet18)
