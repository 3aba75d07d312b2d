"""harness.quality: the structured-output checks, agreement with a reference, accuracy against expected answers."""

import json

import pytest

from engines.base import Completion, Request
from harness.core.errors import TroughputError
from harness.quality import agreement, expected, structured

SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["a", "b"]}},
          "required": ["label"], "additionalProperties": False}


@pytest.mark.parametrize("constraint,text,result", [
    ({"kind": "json", "value": SCHEMA}, '{"label": "a"}', (True, True)),
    ({"kind": "json", "value": SCHEMA}, '{"label": "c"}', (True, False)),
    ({"kind": "json", "value": SCHEMA}, '{"label": "a"', (False, False)),
    ({"kind": "json_object", "value": None}, "[1, 2]", (True, False)),
    ({"kind": "json_object", "value": None}, '{"x": 1}', (True, True)),
    ({"kind": "regex", "value": "[0-9]+"}, "123", (True, True)),
    ({"kind": "regex", "value": "[0-9]+"}, "123a", (False, False)),
    ({"kind": "choice", "value": ["yes", "no"]}, "no", (True, True)),
    ({"kind": "choice", "value": ["yes", "no"]}, "no ", (False, False)),
])
def test_each_constraint_kind_is_checked_on_its_own_terms(constraint, text, result):
    assert structured.check(constraint, text) == result


def test_structured_columns_count_parsed_valid_and_truncated_over_constrained_requests_only():
    json_c = {"kind": "json", "value": SCHEMA}
    requests = [Request("a", [1], 8, constraint=json_c), Request("b", [1], 8, constraint=json_c),
                Request("c", [1], 8, constraint=json_c), Request("plain", [1], 8)]
    completions = [Completion("a", 1, [1], finish_reason="stop"), Completion("b", 1, [2], finish_reason="stop"),
                   Completion("c", 1, [3], finish_reason="length"), Completion("plain", 1, [4])]
    texts = {"a": '{"label": "a"}', "b": '{"label": "z"}', "c": '{"lab', "plain": "anything"}
    cols = structured.columns(requests, completions, lambda c: texts[c.id])
    assert (cols["quality.structured_requests"], cols["quality.parsed"], cols["quality.valid"],
            cols["quality.truncated"]) == (3, 2, 1, 1)
    assert cols["quality.valid_rate"] == pytest.approx(1 / 3) and cols["quality.constraint_kind"] == "json"
    assert structured.columns(requests[3:], completions[3:], lambda c: "x") == {}


def test_agreement_counts_identical_outputs_first_differences_and_matched_tokens():
    reference = {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4], "c": [5, 6]}
    outputs = {"a": [1, 2, 3, 4], "b": [1, 9, 3, 4], "c": [5, 6, 7], "extra": [1]}
    cols = agreement.columns(outputs, reference)
    assert (cols["quality.compared"], cols["quality.identical"]) == (3, 1)
    assert cols["quality.first_diff_mean"] == pytest.approx((1 + 2) / 2), "b differs at 1, c at its length 2"
    assert cols["quality.token_agreement"] == pytest.approx((4 + 3 + 2) / 10)
    same = agreement.columns(reference, reference)
    assert same["quality.identical_rate"] == 1.0 and same["quality.first_diff_mean"] is None


def test_expected_answers_give_exact_match_and_field_accuracy():
    texts = {"1": " positive\n", "2": '{"label": "a", "urgent": true}', "3": "nope"}
    answers = {"1": "positive", "2": '{"label": "a", "urgent": false}', "3": "yes", "missing": "x"}
    cols = expected.columns(texts, answers)
    assert cols["quality.expected_compared"] == 3 and cols["quality.exact_match"] == pytest.approx(1 / 3)
    assert cols["quality.field_accuracy"] == pytest.approx(1 / 2), "one of the two expected fields matches"


def test_expected_outputs_read_from_an_openai_batch_output_file(tmp_path):
    path = tmp_path / "expected.jsonl"
    chat = {"custom_id": "ü-1", "response": {"body": {"choices": [{"message": {"content": "yes"}}]}}}
    text = {"custom_id": "2", "response": {"body": {"choices": [{"text": "no"}]}}}
    path.write_text(json.dumps(chat) + "\n\n" + json.dumps(text) + "\n" + '{"custom_id": "3"}\n')
    with pytest.raises(TroughputError, match=r"expected.jsonl, line 4: not an OpenAI Batch output line"):
        expected.read_batch_outputs(path)
    path.write_text(json.dumps(chat) + "\n" + json.dumps(text) + "\n")
    assert expected.read_batch_outputs(path) == {"ü-1": "yes", "2": "no"}


def test_a_quality_check_that_fails_leaves_the_row_with_its_reason(tmp_path):
    from harness.run.runner import RunSpec, execute
    from harness.workloads.base import Workload
    from tests.conftest import FAKE_ENGINE

    workload = Workload("w", [Request("a", [1, 2], 2), Request("b", [3], 2)])
    spec = RunSpec(engine=FAKE_ENGINE, model={"path": str(tmp_path), "local_dir": str(tmp_path)}, workload=workload,
                   results_dir=tmp_path / "results", quality={"expected_outputs": str(tmp_path / "missing.jsonl")})
    row = execute(spec, progress=False)
    assert row["status"] == "ok" and "FileNotFoundError" in row["quality.error"]
