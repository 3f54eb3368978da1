"""The option objects at the library boundary: ``lt.compare``, ``lt.fix``, ``lt.repro``, ``lt.export`` and
``lt.extract_dataset`` take Criterion / RuntimeOptions / SampleOptions / Model (and their own objects) beside
a few everyday keywords (a keyword given explicitly replaces the object's field, whatever its value); each
takes at most 12 parameters; the CLI's argument groups build the same objects."""

from __future__ import annotations

import numpy as np
import pytest

import layertap as lt
from layertap.cli.args import Args, InputArgs, RuntimeArgs, SampleArgs, ToleranceArgs
from layertap.errors import LayertapError
from layertap.metrics import Criterion
from layertap.onnxfile.samples import write_tiny_model
from layertap.options import RuntimeOptions, SampleOptions, merged_criterion


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


def _errors(report):
    return [(r.name, r.max_abs) for r in report.rows]


def test_compare_takes_the_objects_as_it_takes_the_keywords(tiny, tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    by_keywords = lt.compare(tiny, None, tiny, samples=3, sample_options=SampleOptions(seed=5, save_inputs=a),
                             runtime_options=RuntimeOptions(ref_ort_optimizations=False))
    by_objects = lt.compare(tiny, None, tiny, sample_options=SampleOptions(samples=3, seed=5, save_inputs=b),
                            runtime_options=RuntimeOptions(ref_ort_optimizations=False))
    assert by_objects.samples == by_keywords.samples == 3
    assert _errors(by_objects) == _errors(by_keywords)
    drawn = np.load(a)["x"]
    assert drawn.shape == (3, 4) and np.array_equal(drawn, np.load(b)["x"])  # the same seeded samples
    again = lt.compare(tiny, None, tiny, sample_options=SampleOptions(inputs=b, limit=2),
                       runtime_options=RuntimeOptions(ref_ort_optimizations=False))
    assert again.samples == 2 and again.ok


def test_a_keyword_replaces_the_objects_field(tiny):
    merged = RuntimeOptions.merged(RuntimeOptions(runtime="ort", cand_providers=["CPU"]), ort_optimizations=False)
    assert (merged.runtime, merged.cand_providers, merged.ort_optimizations) == ("ort", ["CPU"], False)
    arrays = [np.ones((1, 4), np.float32)] * 2
    assert SampleOptions.merged(SampleOptions(seed=1), samples=arrays).samples is arrays
    with pytest.raises(LayertapError, match="expected a layertap.options.SampleOptions, got dict"):
        lt.compare(tiny, None, tiny, sample_options={"samples": 2})
    # the object's own checks still apply: OpenVINO's options without OpenVINO are refused
    with pytest.raises(LayertapError, match="apply to the OpenVINO runtime"):
        lt.compare(tiny, None, tiny, runtime_options=RuntimeOptions(ov_device="CPU"))


def _parsed(groups, argv):
    import argparse

    parser = argparse.ArgumentParser()
    for g in groups:
        g.add(parser)
    ns, args = parser.parse_args(argv), Args()
    for g in sorted(groups, key=lambda g: g.order):
        g.parse(ns, args)
    return args


def test_the_runtime_group_builds_the_librarys_object():
    args = _parsed((RuntimeArgs(cand=True),), ["--cand-runtime", "ort", "--providers", "CPU", "--no-ort-opt"])
    assert args.runtime == RuntimeOptions(cand_runtime="ort", providers="CPU", ort_optimizations=False,
                                          ref_ort_optimizations=True)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """The tiny model with its last node 1% off: ``neg`` fails ``rel`` at 1e-3, passes ``cosine``."""
    import onnx
    import onnx.helper as h

    folder = tmp_path_factory.mktemp("scaled")
    model = onnx.load(str(write_tiny_model(folder)))
    scale = h.make_node("Constant", [], ["k"], name="/neg/k", value=h.make_tensor("k", onnx.TensorProto.FLOAT, [], [-1.01]))
    mul = h.make_node("Mul", ["/act/Relu_output_0", "k"], ["y"], name="/neg/Mul")
    del model.graph.node[1]
    model.graph.node.extend([scale, mul])
    path = folder / "scaled.onnx"
    onnx.save(model, str(path))
    return path


def test_compare_takes_a_criterion_as_it_takes_the_keywords(tiny, scaled):
    assert not lt.compare(tiny, None, scaled, samples=2).ok
    assert lt.compare(tiny, None, scaled, samples=2, metric="cosine").ok
    assert lt.compare(tiny, None, scaled, samples=2, criterion=Criterion(metric="cosine")).ok
    assert lt.compare(tiny, None, scaled, samples=2, criterion=Criterion(rtol=0.05)).ok
    # a keyword given replaces the object's field, even at the keyword's default value
    assert not lt.compare(tiny, None, scaled, samples=2, criterion=Criterion(rtol=0.05), rtol=1e-3).ok
    with pytest.raises(LayertapError, match="expected a layertap.metrics.Criterion, got dict"):
        lt.compare(tiny, None, scaled, criterion={"metric": "cosine"})
    with pytest.raises(LayertapError, match="min_cosine must be a number in"):
        lt.compare(tiny, None, scaled, criterion=Criterion(metric="cosine", min_cosine=2.0))


def test_a_chosen_tolerance_is_never_fitted_to_a_reduced_precision():
    assert merged_criterion(Criterion(), rtol=None, atol=None)[1] is False
    assert merged_criterion(Criterion(rtol=1e-2))[1] is True
    assert merged_criterion(None, atol=1e-5)[1] is True  # given, though at the default value
    rule, _ = merged_criterion(Criterion(metric="sqnr", min_sqnr_db=20.0), metric="rel", check_finite=True)
    assert (rule.metric, rule.min_sqnr_db, rule.check_finite) == ("rel", 20.0, True)  # given: it wins, default or not


def test_the_sample_and_tolerance_groups_build_the_librarys_objects(tmp_path):
    groups = (InputArgs(), ToleranceArgs(metrics=True), SampleArgs(inputs_help="", samples_help="", reading=True))
    args = _parsed(groups, ["--inputs", "s.npz", "--limit", "3", "--seed", "4", "--metric", "cosine",
                            "--min-cosine", "0.99", "--check-finite"])
    assert args.sampling == SampleOptions(inputs="s.npz", limit=3, seed=4)
    assert args.tolerance.criterion == Criterion(metric="cosine", min_cosine=0.99, check_finite=True)
    assert not args.tolerance.given and args.tolerance.chosen() == {}
    args = _parsed(groups, ["--samples", "2", "--rtol", "1e-3"])
    assert args.sampling == SampleOptions(samples=2) and args.tolerance.chosen() == {"rtol": 1e-3, "atol": 1e-5}
    with pytest.raises(LayertapError, match="give --inputs or --samples, not both"):
        _parsed(groups, ["--samples", "2", "--inputs", "s.npz"])
    with pytest.raises(LayertapError, match="--limit applies to the samples of --inputs"):
        _parsed(groups, ["--limit", "2"])
    fixing = (InputArgs(), SampleArgs(inputs_help="", samples_help="", default_samples=8, check_exists=True))
    assert _parsed(fixing, []).sampling == SampleOptions(samples=8)
    with pytest.raises(LayertapError, match=f"--inputs '{tmp_path / 'none'}' does not exist"):
        _parsed(fixing, ["--inputs", str(tmp_path / "none")])


def test_repro_and_fix_read_the_samples_of_an_options_object(tiny, scaled, tmp_path):
    samples = tmp_path / "s.npz"
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    x[1] *= 100  # the worst sample of the 1% error
    np.savez(samples, x=x)
    report = lt.repro(tiny, None, scaled, out=tmp_path / "pkg", sample_options=SampleOptions(inputs=samples))
    assert report.reproduced and report.module == "neg"
    packaged = np.load(tmp_path / "pkg" / "inputs.npz")
    assert np.array_equal(packaged["/act/Relu_output_0"], np.maximum(x[1:2], 0))  # the call's input of that sample
    with pytest.raises(LayertapError, match="repro packages one sample"):
        lt.repro(tiny, None, scaled, out=tmp_path / "pkg2", sample_options=SampleOptions(samples=3))
    np.savez(samples, x=np.concatenate([x, np.full((1, 4), 1e6, np.float32)]))  # the fourth beyond float16
    every = lt.fix(tiny, to="fp16", out=None, sample_options=SampleOptions(inputs=samples))
    first_two = lt.fix(tiny, to="fp16", out=None, sample_options=SampleOptions(inputs=samples, limit=2))
    assert every.kept and first_two.ok and not first_two.kept


def test_a_keyword_given_at_its_default_still_wins(tiny, scaled):
    """The merge once let an object's field beat a keyword given at the keyword's default value."""
    assert SampleOptions.merged(SampleOptions(seed=5), seed=0).seed == 0
    assert RuntimeOptions.merged(RuntimeOptions(ort_optimizations=False), ort_optimizations=True).ort_optimizations
    assert merged_criterion(Criterion(metric="cosine"), metric="rel")[0].metric == "rel"
    # the scaled file passes by cosine and fails by rel: metric="rel" given decides
    assert lt.compare(tiny, None, scaled, samples=2, criterion=Criterion(metric="cosine")).ok
    assert not lt.compare(tiny, None, scaled, samples=2, criterion=Criterion(metric="cosine"), metric="rel").ok
    with pytest.raises(LayertapError, match="SampleOptions has no field colour"):
        SampleOptions.merged(None, colour="red")


@pytest.mark.parametrize("name", ["compare", "repro", "fix", "export", "extract_dataset", "run", "extract", "tap",
                                  "layers", "add_outputs", "onnx_layers", "load_features"])
def test_no_public_function_takes_more_than_twelve_parameters(name):
    import inspect

    assert len(inspect.signature(getattr(lt, name)).parameters) <= 12


def test_a_model_spec_is_a_reference_as_a_module_is(tmp_path):
    """compare, repro and fix load a MODEL spec themselves (its example input from --input specs or its
    defaults), as extract_dataset does: the CLI hands them the spec."""
    spec = "tests/_tiny.py:small_cnn"
    path = tmp_path / "m.onnx"
    loaded = lt.Model(spec)
    from layertap.pytorch.reference import example_call, load

    ref = load(loaded)
    args, _, _ = example_call(ref, ["1x3x16x16"], SampleOptions())
    lt.export(ref.module, args, path, exporter="torchscript")
    by_spec = lt.compare(spec, ["1x3x16x16"], path, samples=2)
    by_module = lt.compare(ref.module, None, path, sample_options=SampleOptions(samples=[args, example_call(
        ref, ["1x3x16x16"], SampleOptions(seed=1))[0]]))
    assert by_spec.ok and by_spec.samples == 2 and _errors(by_spec) == _errors(by_module)
    fixed = lt.fix(lt.Model(spec), ["1x3x16x16"], to="fp16", out=None, samples=2)
    assert fixed.ok
