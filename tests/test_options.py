"""The option objects at the library boundary: ``lt.compare`` and ``lt.extract_dataset`` take
RuntimeOptions / SampleOptions and their documented keywords alike (a keyword not at its default
replaces the object's field); the CLI's argument groups build the same objects."""

from __future__ import annotations

import numpy as np
import pytest

import layertap as lt
from layertap.cli.args import Args, RuntimeArgs
from layertap.errors import LayertapError
from layertap.onnxfile.samples import write_tiny_model
from layertap.options import RuntimeOptions, SampleOptions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


def _errors(report):
    return [(r.name, r.max_abs) for r in report.rows]


def test_compare_takes_the_objects_as_it_takes_the_keywords(tiny, tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    by_keywords = lt.compare(tiny, None, tiny, samples=3, seed=5, ref_ort_optimizations=False, save_inputs=a)
    by_objects = lt.compare(tiny, None, tiny, sample_options=SampleOptions(samples=3, seed=5, save_inputs=b),
                            runtime_options=RuntimeOptions(ref_ort_optimizations=False))
    assert by_objects.samples == by_keywords.samples == 3
    assert _errors(by_objects) == _errors(by_keywords)
    drawn = np.load(a)["x"]
    assert drawn.shape == (3, 4) and np.array_equal(drawn, np.load(b)["x"])  # the same seeded samples
    again = lt.compare(tiny, None, tiny, ref_ort_optimizations=False, sample_options=SampleOptions(inputs=b, limit=2))
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


def test_the_runtime_group_builds_the_librarys_object():
    import argparse

    parser = argparse.ArgumentParser()
    group = RuntimeArgs(cand=True)
    group.add(parser)
    args = Args()
    group.parse(parser.parse_args(["--cand-runtime", "ort", "--providers", "CPU", "--no-ort-opt"]), args)
    assert args.runtime == RuntimeOptions(cand_runtime="ort", providers="CPU", ort_optimizations=False,
                                          ref_ort_optimizations=True)
