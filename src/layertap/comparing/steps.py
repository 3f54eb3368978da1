"""``compare(..., steps=N)``: a prefill and N greedy decode steps, each one a sample of the one driver.

Sample 0 is the prompt (prefill); sample ``k`` feeds one token: the reference's greedy choice
after sample ``k - 1``, forced on both sides. Each side keeps its own cache: PyTorch its
``DynamicCache``, the file its ``present.*`` outputs, fed back as its ``past.*`` inputs
(:class:`StepCandidate` asks for them with every run). Rows are not merged over samples: each
keeps the token position of its call (``token``, ``tokens``) and is named ``PATH@POS``
(``PATH@FIRST..LAST`` for the prompt), so the first failing row names module and token.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError
from ..onnxfile.kvcache import KvLayout, step_feeds
from .driver import Sample
from .onnx_side import OrtSide
from .rows import CompareRow
from .torch_ref import TorchReference

#: the most decode steps one compare runs
MAX_STEPS = 4096


def check_steps(steps: Any) -> int:
    """``steps`` as a count of decode steps (0: the prompt alone), or a one-line error.

    Example:
        >>> check_steps(3)
        3
        >>> check_steps(-1)
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: steps must be a whole number of decode steps from 0 to 4096, got -1
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_STEPS:
        raise LayertapError(f"steps must be a whole number of decode steps from 0 to {MAX_STEPS}, got {steps!r}")
    return steps


class StepCandidate:
    """The candidate file with its cache outputs taken from every run (for the next step's feed)."""

    def __init__(self, side: OrtSide, layout: KvLayout) -> None:
        self.side, self.layout = side, layout
        self.blocked = side.blocked
        self.presents: dict[int, dict[str, np.ndarray]] = {}  # id(feed) -> its run's present outputs

    @property
    def runs(self) -> int:
        return self.side.runs

    @property
    def sessions(self) -> int:
        return self.side.sessions

    def _wanted(self, names: list[str]) -> list[str]:
        return list(dict.fromkeys([*names, *self.layout.present.values()]))

    def prepare(self, names: list[str]) -> None:
        self.side.prepare(self._wanted(names))

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run exposing ``names`` and the present outputs (kept for the step after ``feed``'s)."""
        wanted = self._wanted(names)
        values = self.side.run(wanted, feed)
        self.presents[id(feed)] = {p: values[c] for p, c in self.layout.present.items()}
        return values

    def present_after(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The cache after the run on ``feed`` as the next step's past (a run of its own when no batch ran yet)."""
        if id(feed) not in self.presents:
            self.run([], feed)
        return self.presents.pop(id(feed))

    def local_graph(self, scopes: Any = None) -> Any:
        return self.side.local_graph(scopes)

    def describe(self) -> Any:
        return self.side.describe()

    def notes(self, label: str | None, rounding: bool) -> list[str]:
        return self.side.notes(label, rounding)

    def close(self) -> None:
        self.side.close()


class StepReference(TorchReference):
    """The model over a prompt and ``steps`` greedy decode steps (samples ``0..steps``)."""

    def __init__(self, model: Any, runs: list[tuple[tuple, dict]], cand: OrtSide, *, steps: int, **options: Any) -> None:
        if len(runs) != 1:
            raise LayertapError("steps= decodes one prompt: give one sample (input_ids), not several")
        super().__init__(model, runs, cand, **options)
        self.decoder = _decoder_layout(self.layout, cand)
        self.candidate = StepCandidate(cand, self.decoder)
        self.n_samples = steps + 1
        self.steps_args = self._prompt_args(*runs[0])
        self.first = _past_length(self.feeds[0], self.decoder)
        self.prompt = int(self.feeds[0][self.decoder.ids or "input_ids"].shape[-1])
        self.tokens: list[np.ndarray] = []  # the reference's greedy token after each sample

    def _prompt_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The prompt's arguments with a cache PyTorch fills in place (the decode steps read it)."""
        import transformers

        kwargs = dict(kwargs)
        name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        if kwargs.get("cache") is None and kwargs.get("past_key_values") is None:
            kwargs[name] = transformers.DynamicCache(config=self.model.config)
        self.cache = kwargs.get("cache", kwargs.get("past_key_values"))
        kwargs["use_cache"] = True
        return args, kwargs

    def sample(self, index: int, budget: int) -> Sample:
        """Sample 0: the prompt; sample k: the token the reference chose after sample k - 1."""
        if index == 0:
            a, k = self.steps_args
            feed = self.feeds[0]
        else:
            a, k, feed = self._step_args(index)
        self.runs_args = [(a, k)]
        self.feeds = [feed]
        sample = super().sample(0, budget)
        logits = sample.builder.store.get(self._root_key(sample))[0]
        self.tokens.append(np.asarray(logits[:, -1]).argmax(-1).astype(np.int64)[:, None])
        return sample

    def _step_args(self, index: int) -> tuple[tuple, dict, dict[str, np.ndarray]]:
        import torch

        token = self.tokens[index - 1]
        past = self.candidate.present_after(self.feeds[0])
        ids_name = self.decoder.ids or "input_ids"
        feed = {ids_name: token.astype(self.feeds[0][ids_name].dtype), **past}
        feed.update({n: a.astype(self.feeds[0][n].dtype) for n, a in step_feeds(self.decoder, token, past).items()})
        kwargs = {k: v for k, v in self.steps_args[1].items() if k not in ("input_ids", "attention_mask")}
        kwargs["input_ids"] = torch.from_numpy(token)
        mask = self.steps_args[1].get("attention_mask")
        if mask is not None:
            kwargs["attention_mask"] = torch.ones(mask.shape[0], mask.shape[1] + index, dtype=mask.dtype)
        return (), kwargs, {n: feed[n] for n in self.feeds[0] if n in feed}

    @staticmethod
    def _root_key(sample: Sample) -> int:
        return max(it.mc.key for it in sample.items)

    def merge_rows(self, per_sample: Sequence[Sequence[CompareRow]], criterion: Any) -> tuple[list[CompareRow], dict[str, int]]:
        """Every sample's rows in step order, each named by its token position."""
        rows: list[CompareRow] = []
        for index, sample_rows in enumerate(per_sample):
            first = self.first if index == 0 else self.first + self.prompt + index - 1
            count = self.prompt if index == 0 else 1
            at = f"{first}..{first + count - 1}" if count > 1 else str(first)
            rows.extend(dataclasses.replace(r, name=f"{r.name}@{at}", token=first, tokens=count,
                                            fused_into=r.fused_into and f"{r.fused_into}@{at}") for r in sample_rows)
        return rows, {}

    def notes(self, candidate: Any, rounding: bool) -> list[str]:
        """The reference's notes and how the tokens were chosen."""
        chosen = ", ".join(str(int(t[0, 0])) for t in self.tokens[:-1][:12])
        more = ", ..." if len(self.tokens) > 13 else ""
        return [*super().notes(candidate, rounding),
                f"prefill of {self.prompt} token(s), then {self.n_samples - 1} greedy decode step(s) on the "
                f"reference's tokens ({chosen}{more}), each side fed its own cache"]


def _decoder_layout(layout: KvLayout | None, cand: OrtSide) -> KvLayout:
    """The candidate's cache layout, refused when the file cannot decode step by step."""
    ins = ", ".join(n for n, _ in cand.inputs)
    if layout is None:
        raise InputSpecError(f"steps= needs a decoder file with a KV cache (past inputs and present outputs); "
                             f"{cand.path} takes {ins}")
    if not layout.present or layout.ids is None:
        outs = ", ".join(o.name for o in cand.proto.graph.output)
        raise InputSpecError(f"cannot match the cache of {cand.path} for decode steps: inputs {ins}; outputs {outs} "
                             "(expected input_ids, past_key_values.N.key/value in and present.N.key/value out)")
    return layout


def _past_length(feed: dict[str, np.ndarray], layout: KvLayout) -> int:
    first = feed.get(layout.past[0])
    return int(first.shape[2]) if first is not None and first.ndim == 4 else 0
