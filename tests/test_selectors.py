"""Tap selector grammar: parsing, canonical names, PATH#k naming, errors (pure Python)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layertap.errors import SelectorError
from layertap.selectors import Tap, index_text, parse_taps


@pytest.mark.parametrize(
    "text, fields",
    [
        ("layer4.0.conv1", ("layer4.0.conv1", None, "output", (), None)),
        ("layer2.1.relu#1", ("layer2.1.relu", 1, "output", (), None)),
        ("layer2.1.relu#-1", ("layer2.1.relu", -1, "output", (), None)),
        ("fc:input", ("fc", None, "input", (), None)),
        ("fc:output", ("fc", None, "output", (), None)),
        ("vision_model.encoder.layers.3[0]", ("vision_model.encoder.layers.3", None, "output", (0,), None)),
        ("emb=text_model.final_layer_norm", ("text_model.final_layer_norm", None, "output", (), "emb")),
        ("a=enc#-2:input[hidden][1]", ("enc", -2, "input", ("hidden", 1), "a")),
        ("enc['logits']", ("enc", None, "output", ("logits",), None)),
        ("[0]", ("", None, "output", (0,), None)),
        (":input", ("", None, "input", (), None)),
        ("  layer1  ", ("layer1", None, "output", (), None)),
    ],
)
def test_parse_fields(text, fields):
    t = Tap.parse(text)
    assert (t.path, t.call, t.port, t.index, t.alias) == fields


@pytest.mark.parametrize(
    "text, canonical, name",
    [
        ("fc:output", "fc", "fc"),
        ("layer2.1.relu#1:output[0]", "layer2.1.relu#1[0]", "layer2.1.relu#1[0]"),
        ("x=fc:input", "fc:input", "x"),
        ("enc['logits']", "enc[logits]", "enc[logits]"),
        ("", "", "output"),
    ],
)
def test_canonical_and_name(text, canonical, name):
    t = Tap.parse(text)
    assert t.canonical == canonical
    assert t.name == name


def test_name_for_call_inserts_call_before_port_and_index():
    assert Tap.parse("layer2.0.relu:input[0]").name_for_call(1) == "layer2.0.relu#1:input[0]"
    assert Tap.parse("r=layer2.0.relu").name_for_call(0) == "r#0"
    assert Tap.parse("m").with_call(3).name == "m#3"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("layer1#x", "must be an integer"),
        ("layer1#", "must be an integer"),
        ("layer1:inptu", "unknown port"),
        ("layer1:", "empty port"),
        ("layer1[0", "unbalanced brackets"),
        ("layer1[]", "empty [] index"),
        ("a=b=c", "more than one '='"),
        ("layer 1", "spaces"),
        ("layer1..conv", "empty component"),
        (".layer1", "empty component"),
        ("layer1.", "empty component"),
    ],
)
def test_malformed_selectors_name_the_fault(text, fragment):
    with pytest.raises(SelectorError) as e:
        Tap.parse(text)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_parse_rejects_non_strings():
    with pytest.raises(SelectorError, match="must be a string"):
        Tap.parse(3)  # type: ignore[arg-type]


def test_parse_taps_rejects_duplicate_names():
    with pytest.raises(SelectorError, match="both named 'fc'"):
        parse_taps(["fc", "fc:output"])
    assert [t.name for t in parse_taps(["fc", "a=fc"])] == ["fc", "a"]


def test_index_text():
    assert index_text([0, "logits"]) == "[0][logits]"


_ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
_path = st.lists(st.one_of(_ident, st.integers(0, 20).map(str)), min_size=0, max_size=4).map(".".join)


@given(
    path=_path,
    call=st.one_of(st.none(), st.integers(-5, 5)),
    port=st.sampled_from(["output", "input"]),
    index=st.lists(st.one_of(st.integers(-3, 3), _ident), max_size=3),
    alias=st.one_of(st.none(), _ident),
)
def test_canonical_text_round_trips(path, call, port, index, alias):
    t = Tap(path=path, call=call, port=port, index=tuple(index), alias=alias)
    assert Tap.parse(str(t)) == t
    assert Tap.parse(t.canonical).canonical == t.canonical
    if call is None and alias is None:
        # PATH#k names are themselves selectors for that one call
        assert Tap.parse(t.name_for_call(2)) == t.with_call(2)
