"""Bad input cannot flip a batch file's format, a request for another model is refused and counted, and a job
that answered nothing says so and exits non-zero (``troughput-batch`` on the scripted engine, in this process)."""

from __future__ import annotations

from pathlib import Path

from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE, ROOT
from tests.harness.batch.conftest import batch_app, chat, completion, read_jsonl, write_jsonl

FAKE = f"engine.name={FAKE_ENGINE}"
GREEDY = "batch.sampling=benchmark"


def test_the_issues_file_a_first_line_without_custom_id_does_not_make_it_plain_jsonl(tmp_path: Path) -> None:
    """Two chat requests, the first without custom_id, format auto: line 1 is its own error, line 2 is answered
    (the first-line rule read the file as plain JSONL: both lines failed, "0 ok, 2 failed", exit 0)."""
    first = {k: v for k, v in chat("one", "hello", max_tokens=2).items() if k != "custom_id"}
    path = write_jsonl(tmp_path / "batch.jsonl", [first, chat("two", "hi there", max_tokens=2)])
    out = tmp_path / "out"
    proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert [o["custom_id"] for o in read_jsonl(out / "output.jsonl")] == ["two"]
    [error] = read_jsonl(out / "errors.jsonl")
    assert error["custom_id"] is None
    assert f"{path}, line 1: missing field 'custom_id'" in error["response"]["body"]["error"]["message"]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["input_format"] == "openai_batch" and (row["requests_ok"], row["requests_failed"]) == (1, 1)


def test_a_file_whose_lines_disagree_is_refused_naming_lines_of_each_kind(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "batch.jsonl", [chat("a", "x", max_tokens=2), {"prompt": "plain", "max_tokens": 2},
                                                  completion("b", "y", max_tokens=2)])
    proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    assert "mixes two formats" in proc.stderr and "on 2 lines (lines 1, 3)" in proc.stderr
    assert "on 1 line (line 2)" in proc.stderr and "batch.format=openai_batch" in proc.stderr
    assert not (tmp_path / "out" / "shards").exists(), "refused before any shard ran"


def test_a_request_for_another_model_is_an_error_line_counted_in_the_row(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "batch.jsonl", [
        chat("mine", "hello", max_tokens=2),                                   # body.model "tiny": the job's model
        chat("other", "hello", max_tokens=2, model="NonExistModel"),
        completion("path", "hi", max_tokens=2, model=str(ROOT / ".cache/troughput/models/tiny")),  # its path: served
        {**completion("none", "hi", max_tokens=2), "body": {"prompt": "hi", "max_tokens": 2}},   # no model: served
        completion("alias", "hi", max_tokens=2, model="gpt-4o-mini"),
    ])
    out = tmp_path / "out"
    proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert [o["custom_id"] for o in read_jsonl(out / "output.jsonl")] == ["mine", "path", "none"]
    errors = {e["custom_id"]: e["response"] for e in read_jsonl(out / "errors.jsonl")}
    assert sorted(errors) == ["alias", "other"]
    assert errors["other"]["status_code"] == 404
    body = errors["other"]["body"]["error"]
    assert (body["code"], body["param"]) == ("model_not_found", "model")
    assert f"{path}, line 2: the request asks for model 'NonExistModel'; this job serves" in body["message"]
    assert "batch.served_model_names" in body["message"]
    [row] = read_rows(tmp_path / "results", "batch")
    assert (row["requests_ok"], row["requests_failed"], row["requests_other_model"]) == (3, 2, 2)
    assert "2 requests named a model this job does not serve" in proc.stdout
    # a declared alias is this job's model: answered (a new folder: the served names are part of the job)
    again = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={tmp_path / 'out2'}",
                      "batch.served_model_names=[gpt-4o-mini]")
    assert again.returncode == 0, again.stderr + again.stdout
    assert [o["custom_id"] for o in read_jsonl(tmp_path / "out2" / "output.jsonl")] == ["mine", "path", "none",
                                                                                         "alias"]
    changed = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}",
                        "batch.served_model_names=[gpt-4o-mini]")
    assert changed.returncode == 2 and "different served_model_names" in changed.stderr


def test_a_job_where_no_request_succeeded_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "batch.jsonl", [chat("a", "x", max_tokens=2, model="NonExistModel"),
                                                  '{"custom_id": "broken", ', completion("b", "y", n=2)])
    out = tmp_path / "out"
    args = [FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}", "batch.shard_size=2"]
    proc = batch_app(tmp_path, *args)
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.startswith("troughput-batch FAILED: no request succeeded. 0 ok, 3 failed this run")
    assert "no request succeeded: all 3 records of the input are error lines" in proc.stdout
    assert "the first: " in proc.stdout and "NonExistModel" in proc.stdout
    again = batch_app(tmp_path, *args)   # nothing left to run, and still nothing answered
    assert again.returncode == 1 and "FAILED: no request succeeded" in again.stdout
    rows = read_rows(tmp_path / "results", "batch")
    assert [r["status"] for r in rows] == ["failed", "failed"]
