"""Property tests: random nested modules (depth, reuse, tuple outputs, raises).

For every generated model, each tap equals a reference computed by a separate
evaluator that walks the same plan with ``F.linear`` on the same parameters
(no module calls, so no hooks involved), and no hook survives, whatever the
forward raises.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import layertap as lt  # noqa: E402
from layertap.errors import SelectorError  # noqa: E402

D = 4


class Boom(RuntimeError):
    pass


class Leaf(nn.Module):
    def __init__(self, raise_on_call: int | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.raise_on_call = raise_on_call
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.raise_on_call is not None and self.calls - 1 == self.raise_on_call:
            raise Boom("planned failure")
        return torch.tanh(self.lin(x))


class Block(nn.Module):
    """Runs its children in ``order`` (indices may repeat: reuse); may return a tuple."""

    def __init__(self, kids: list[nn.Module], order: list[int], tuple_out: bool, branch: bool) -> None:
        super().__init__()
        self.kids = nn.ModuleList(kids)
        self.order = order
        self.tuple_out = tuple_out
        self.branch = branch

    def forward(self, x):
        for i in self.order:
            y = self.kids[i](x)
            x = y[0] if isinstance(y, tuple) else y
        if self.branch and float(x.sum()) > 0:  # data-dependent control flow
            y = self.kids[0](x)
            x = y[0] if isinstance(y, tuple) else y
        return (x, x * 2.0) if self.tuple_out else x


@st.composite
def plans(draw, depth=0):
    """A nested description: ('leaf',) or ('block', kids, order, tuple_out, branch)."""
    if depth >= 2 or draw(st.integers(0, 2)) == 0:
        return ("leaf",)
    kids = draw(st.lists(plans(depth=depth + 1), min_size=1, max_size=3))
    order = draw(st.lists(st.integers(0, len(kids) - 1), min_size=1, max_size=4))
    return ("block", kids, order, draw(st.booleans()), draw(st.booleans()))


def build(plan) -> nn.Module:
    if plan[0] == "leaf":
        return Leaf()
    _, kids, order, tuple_out, branch = plan
    return Block([build(k) for k in kids], order, tuple_out, branch)


def reference(mod: nn.Module, x, path: str, rec: dict):
    """Evaluate without calling any module, recording (path -> [outputs per call])."""
    rec.setdefault(path + ":input", []).append(x.detach().clone())
    if isinstance(mod, Leaf):
        out = torch.tanh(F.linear(x, mod.lin.weight, mod.lin.bias))
    else:
        prefix = f"{path}." if path else ""
        cur = x
        for i in mod.order:
            y = reference(mod.kids[i], cur, f"{prefix}kids.{i}", rec)
            cur = y[0] if isinstance(y, tuple) else y
        if mod.branch and float(cur.sum()) > 0:
            y = reference(mod.kids[0], cur, f"{prefix}kids.0", rec)
            cur = y[0] if isinstance(y, tuple) else y
        out = (cur, cur * 2.0) if mod.tuple_out else cur
    rec.setdefault(path, []).append(out)
    return out


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(plan=plans(), data=st.data())
def test_every_tap_matches_reference(plan, data):
    torch.manual_seed(0)
    model = build(plan).eval()
    x = torch.randn(2, D)
    rec: dict = {}
    with torch.no_grad():
        reference(model, x, "", rec)
    ran = [p for p in rec if not p.endswith(":input") and p]
    if not ran:
        return
    path = data.draw(st.sampled_from(sorted(ran)))
    outs = rec[path]
    port = data.draw(st.sampled_from(["output", "input"]))
    n = len(outs)
    call = data.draw(st.one_of(st.none(), st.integers(-n, n - 1)))
    values = rec[path + ":input"] if port == "input" else outs
    is_tuple = isinstance(values[0], tuple)
    selector = path + ("" if call is None else f"#{call}") + (":input" if port == "input" else "") + ("[0]" if is_tuple else "")
    got = lt.extract(model, x, taps=[selector])
    expected_vals = [v[0] if isinstance(v, tuple) else v for v in values]
    if call is None and n > 1:
        for k in range(n):
            name = path + f"#{k}" + (":input" if port == "input" else "") + ("[0]" if is_tuple else "")
            torch.testing.assert_close(got[name], expected_vals[k])
    else:
        k = 0 if call is None else call
        torch.testing.assert_close(got[lt.Tap.parse(selector).name], expected_vals[k])
    # stop_early never changes what is captured
    early = lt.extract(model, x, taps=[selector], stop_early=True)
    for name, value in early.items():
        if not name.startswith("output"):
            torch.testing.assert_close(value, got[name])
    assert no_hooks(model)


@SETTINGS
@given(plan=plans(), data=st.data())
def test_no_hook_survives_a_raise(plan, data):
    model = build(plan).eval()
    torch.manual_seed(0)
    x = torch.randn(2, D)
    rec: dict = {}
    with torch.no_grad():
        reference(model, x, "", rec)
    leaves = [(n, m) for n, m in model.named_modules() if isinstance(m, Leaf) and n in rec]
    name, leaf = data.draw(st.sampled_from(leaves))
    leaf.raise_on_call = 0
    taps = [n for n, _ in leaves][:3]
    with pytest.raises(Boom):
        with lt.tap(model, taps):
            model(x)
    assert no_hooks(model)
    leaf.raise_on_call, leaf.calls = None, 0
    with pytest.raises(Boom):
        leaf.raise_on_call = 0
        lt.extract(model, x, taps=taps, stop_early=data.draw(st.booleans()))
    assert no_hooks(model)


def test_bad_tap_leaves_no_hook():
    model = Block([Leaf(), Leaf()], [0, 1], tuple_out=True, branch=False)
    with pytest.raises(SelectorError, match="tuple"):
        lt.extract(model, torch.randn(2, D), taps=["r="])  # the root's tuple under a name: not one tensor
    assert no_hooks(model)
