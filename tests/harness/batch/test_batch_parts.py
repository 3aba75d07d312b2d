"""troughput-batch's parts on their own: shards, conversion, output lines, commits, images."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from harness.batch.job.convert import convert_shard
from harness.batch.job.images import image_resolver
from harness.batch.job.output import ENGINE_FAULT, failure, success
from harness.batch.job.plan import Plan, model_revision
from harness.batch.job.shards import iter_shards, scan
from harness.batch.job.state import JobState
from harness.core.errors import TroughputError
from harness.workloads.records import Options
from tests.harness.batch.conftest import chat, completion, png_data_url, write_jsonl
from tests.harness.workloads.test_files import FakeTokenizer

TOK = FakeTokenizer()


def test_scan_counts_records_and_finds_repeated_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "b.jsonl", [completion("a", "x"), "", completion("b", "y"), "{broken",
                                              completion("a", "z"), completion("b", "w"), completion("a", "v")])
    index = scan(path, "openai_batch")
    assert index.records == 6  # the blank line is none
    assert index.duplicates == {5: 1, 6: 3, 7: 1}
    assert index.shards(4) == 2


def test_shards_are_fixed_runs_of_records_and_skipped_ones_are_not_parsed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(7)] + ["{not json"])
    shards = list(iter_shards(path, "jsonl", 3, lambda i: i != 1))
    assert [s.index for s in shards] == [0, 2]
    assert [n for _, n, _ in shards[1].records] == [7, 8]
    assert isinstance(shards[1].records[1][2], Exception), "a broken line is the record's error, not the file's"
    assert [n for _, n, _ in next(iter_shards(path, "jsonl", 3, lambda i: i == 1)).records] == [4, 5, 6]


def test_each_record_converts_on_its_own_with_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "b.jsonl", [
        chat("ok", "hi", max_tokens=50), completion("long", "x" * 30, max_tokens=5), completion("ok", "again"),
        chat("img", [{"type": "image_url", "image_url": {"url": png_data_url()}}], max_tokens=2), "[1]"])
    index = scan(path, "openai_batch")
    shard = next(iter_shards(path, "openai_batch", 10, lambda i: True))
    items = convert_shard(shard, "openai_batch", TOK, Options(8, "as_given"), index, path, max_model_len=20)
    assert [(i.custom_id, i.request is not None) for i in items] == [
        ("ok", True), ("long", False), ("ok", False), ("img", False), (None, False)]
    assert items[0].request.max_tokens == 20 - len(items[0].request.prompt_token_ids), "capped to the room left"
    assert items[0].request.sampling == {"temperature": 1.0}
    errors = [i.error for i in items[1:]]
    assert errors[0].startswith(f"{path}, line 2: the prompt has 30 tokens; the model takes at most 20")
    assert errors[1] == f"{path}, line 3: duplicate id 'ok' (first used on line 1)"
    assert errors[2].startswith(f"{path}, line 4: body.messages[0].content[0] is an image")
    assert errors[3] == f"{path}, line 5: record must be a JSON object, got a list"


def test_output_lines_read_as_openai_types() -> None:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    items = convert_items()
    done = {"prompt_tokens": 4, "output_token_ids": [7, 8], "finish_reason": None}
    chat_line = success("job", items[0], done, "hé", "tiny", 1700000000)
    text_line = success("job", items[1], {**done, "finish_reason": "stop"}, "yo", "tiny", 1700000000)
    assert ChatCompletion.model_validate(chat_line["response"]["body"]).choices[0].message.content == "hé"
    typed = Completion.model_validate(text_line["response"]["body"])
    assert (typed.choices[0].text, typed.choices[0].finish_reason, typed.usage.total_tokens) == ("yo", "stop", 6)
    assert chat_line["response"]["body"]["choices"][0]["finish_reason"] == "length", "2 of max_tokens 2"
    assert chat_line == success("job", items[0], done, "hé", "tiny", 1700000000), "the same ids on a rerun"
    assert chat_line["id"] != text_line["id"] and chat_line["id"].startswith("batch_req_")
    bad = failure("job", items[0], "it broke", ENGINE_FAULT)
    assert bad["response"]["status_code"] == 500 and bad["error"] is None
    assert bad["response"]["body"]["error"] == {"message": "it broke", "type": "server_error", "param": None,
                                                "code": None}


def convert_items():
    from harness.batch.job.convert import Item
    from engines.base import Request

    return [Item("c", 1, "/v1/chat/completions", Request("c", [1], 2)),
            Item("t", 2, "/v1/completions", Request("t", [1], 5))]


def test_a_shard_commits_once_and_merges_in_order(tmp_path: Path) -> None:
    state = JobState(tmp_path / "out")
    state.shards_dir.mkdir(parents=True)
    state.work_dir.mkdir()
    assert state.commit(1, [{"custom_id": "b"}], [], {"index": 1})
    assert not state.commit(1, [{"custom_id": "b-again"}], [], {"index": 1}), "a second commit is dropped"
    with pytest.raises(TroughputError, match="1 of 2 shards are not committed"):
        state.merge(2)
    assert state.commit(0, [{"custom_id": "a"}], [{"custom_id": "x"}], {"index": 0})
    output, errors = state.merge(2)
    assert [json.loads(line)["custom_id"] for line in output.read_text().splitlines()] == ["a", "b"]
    assert errors.read_text() == '{"custom_id": "x"}\n'
    assert not list(state.root.rglob(".commit-*")), "no half-written shard is left"


def _plan(path: Path, out: Path, **fields) -> Plan:
    plan = Plan(input=str(path), format="openai_batch", output_dir=str(out), shard_size=2, engine="vllm",
                model={"name": "tiny", "path": "/m"}, knobs={}, ordering={"name": "as_given"}, python="python",
                **fields)
    plan.input_digest = scan(path, "openai_batch").digest
    return plan


def test_an_output_folder_holds_one_job(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "b.jsonl", [completion("a", "x")])
    plan = _plan(path, tmp_path / "out")
    state = JobState(plan.output_dir)
    state.adopt(plan)
    state.adopt(Plan.from_json(plan.to_json()))
    write_jsonl(path, [completion("a", "changed")])
    state.adopt(_plan(path, tmp_path / "out"))  # nothing committed yet: nothing to mix with
    state.commit(0, [], [], {"index": 0})
    with pytest.raises(TroughputError, match="different input_digest"):
        state.adopt(plan)


@pytest.mark.parametrize(("edit", "count"), [("middle", 12_000), ("last line", 6_000)])
def test_a_same_size_edit_anywhere_is_refused_once_a_shard_is_committed(tmp_path: Path, edit: str, count: int) -> None:
    """The whole file is hashed: a same-size edit in the middle of a ~3 MB file, or of the last line of a ~1.5 MB
    one (both unseen by the old digest of the size and the first and last MiB), is refused."""
    records = [completion(f"r{i}", f"prompt {i:05d} " + "x" * 200, max_tokens=2) for i in range(count)]
    path = write_jsonl(tmp_path / "b.jsonl", records)
    state = JobState(tmp_path / "out")
    state.adopt(_plan(path, tmp_path / "out"))
    state.commit(0, [], [], {"index": 0})
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if edit == "middle" else data.rindex(b"prompt %05d" % (count - 1)) + len("prompt 0000")
    data[at:at + 1] = b"Q" if data[at:at + 1] != b"Q" else b"R"
    path.write_bytes(bytes(data))
    assert path.stat().st_size == len(data)
    with pytest.raises(TroughputError, match=r"the input file's contents \(sha256 of every byte: sha256:"):
        state.adopt(_plan(path, tmp_path / "out"))


def test_the_model_and_remote_images_are_part_of_the_job(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "b.jsonl", [completion("a", "x")])
    state = JobState(tmp_path / "out")
    state.adopt(_plan(path, tmp_path / "out", model_revision="local:aaaa"))
    state.commit(0, [], [], {"index": 0})
    with pytest.raises(TroughputError, match="model_revision: 'local:aaaa' then, 'local:bbbb' now"):
        state.adopt(_plan(path, tmp_path / "out", model_revision="local:bbbb"))
    with pytest.raises(TroughputError, match="different allow_remote_images"):
        state.adopt(_plan(path, tmp_path / "out", model_revision="local:aaaa", allow_remote_images=True))


def test_a_local_models_revision_changes_with_its_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"layers": 4}')
    (tmp_path / "model.safetensors").write_bytes(b"0" * 100)
    first = model_revision({"path": str(tmp_path)})
    assert first == model_revision({"path": str(tmp_path)}) and first.startswith("local:")
    (tmp_path / "config.json").write_text('{"layers": 5}')
    assert model_revision({"path": str(tmp_path)}) != first
    assert model_revision({"path": "org/model", "revision": "abc123"}) == "abc123"


def test_images_from_data_urls_local_paths_and_remote_only_when_allowed(tmp_path: Path) -> None:
    resolve = image_resolver("<image>", tmp_path / "store", tmp_path, allow_remote=False)
    url = png_data_url()
    placeholder, first = resolve({"type": "image_url", "image_url": {"url": url}}, "m")
    assert placeholder == "<image>" and Path(first).parent == tmp_path / "store" and first.endswith(".png")
    assert resolve({"type": "image_url", "image_url": url}, "m")[1] == first, "stored once, by content"
    (tmp_path / "pic.png").write_bytes(base64.b64decode(url.split(",", 1)[1]))
    assert resolve({"type": "image_url", "image_url": {"url": "pic.png"}}, "m")[1] == str(tmp_path / "pic.png")
    faults = {"https://example.com/x.png": "not fetched; troughput reads no network unless you allow it",
              "data:image/png;base64,@@@": "not valid base64", "data:text/plain,hello": "must be base64",
              "data:image/png;base64,aGVsbG8=": "not a readable image", "missing.png": "not found"}
    for bad, why in faults.items():
        with pytest.raises(Exception, match=why):
            resolve({"type": "image_url", "image_url": {"url": bad}}, "m")
    assert image_resolver(None, tmp_path, tmp_path, True) is None, "a model without an image token takes no images"


def test_config_from_a_decision_or_a_tuned_engine_file(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from harness.batch.job.source import apply_source
    from harness.run.results import write_row
    from tests.conftest import ROOT

    results = tmp_path / "results"
    write_row(results, {"decision_id": "d1", "model": "tiny", "verdict": "clear winner", "workload": "unique",
                        "chosen.engine": "sim", "chosen.ordering": "shuffled", "chosen.knob.max_num_seqs": 64,
                        "chosen.output_tok_s": 500.0, "chosen.req_s": 50.0, "host_id": "amx-host"},
              kind="decisions", id_key="decision_id")
    write_row(results, {"run_id": "r7", "workload": "prefix_heavy", "output_tok_s": 321.0, "req_s": 9.0,
                        "env.host_id": "avx2-host"})
    tuned = tmp_path / "vllm-tuned.yaml"
    tuned.write_text("# Tuned by troughput-tune, study 'vllm-tiny', trial 4, run r7\n# objective values: [321.0]\n"
                     "# also set: ordering.seed=3\nname: vllm\npython: null\nenv: {}\nreplicas: 1\n"
                     "knobs:\n  max_num_seqs: 32\ncanonical: {}\n")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        base = [f"run.results_dir={results}", "batch.input=x", "batch.output_dir=y"]
        cfg, origin = apply_source(compose("batch", overrides=[*base, "batch.decision=d1"]))
        assert (cfg.engine.name, cfg.ordering.name, dict(cfg.engine.knobs)) == ("sim", "shuffled", {"max_num_seqs": 64})
        assert origin["kind"] == "decision" and origin["predicted_output_tok_s"] == 500.0
        assert origin["predicted_host_id"] == "amx-host", "the prediction names the host it was measured on"
        cfg, origin = apply_source(compose("batch", overrides=[*base, f"batch.engine_file={tuned}"]))
        assert cfg.engine.knobs.max_num_seqs == 32 and cfg.ordering.seed == 3
        assert (origin["run_id"], origin["trial"], origin["predicted_output_tok_s"]) == ("r7", 4, 321.0)
        assert origin["predicted_host_id"] == "avx2-host"
        with pytest.raises(TroughputError, match="was made for model 'tiny'"):
            apply_source(compose("batch", overrides=[*base, "batch.decision=d1", "model=tiny_vlm"]))
        with pytest.raises(TroughputError, match="decision 'nope' not found"):
            apply_source(compose("batch", overrides=[*base, "batch.decision=nope"]))


def test_a_prediction_from_another_host_is_labelled_not_comparable() -> None:
    from harness.batch.cli import summary

    row = {"status": "ok", "requests_ok": 10, "requests_failed": 0, "shards_committed": 1, "shards": 1,
           "shards_before": 0, "output_tok_s": 100.0, "req_s": 1.0, "generation_s": 10.0, "startup_s": 1.0,
           "predicted_output_tok_s": 500.0, "config_source.kind": "decision", "predicted_job_s": 2.0,
           "output.output": "out.jsonl", "output.errors": None, "output_dir": "out", "error": "",
           "config_source.predicted_host_id": "amx-host", "env.host_id": "avx2-host", "env.host": "EPYC"}
    assert "NOT COMPARABLE" in summary(row | {"predicted_other_host": True})
    assert "NOT COMPARABLE" not in summary(row | {"predicted_other_host": False})


@pytest.mark.parametrize("scale", ["local", "slurm"])
def test_engine_ray_outside_batch_scale_ray_is_refused_before_anything_runs(tmp_path: Path, scale: str) -> None:
    from harness.batch.launch import run_job

    path = write_jsonl(tmp_path / "b.jsonl", [completion("a", "x")])
    plan = _plan(path, tmp_path / "out")
    plan.engine, plan.scale = "ray", scale
    with pytest.raises(TroughputError, match="use batch.scale=ray"):
        run_job(plan, progress=False)
    assert not (tmp_path / "out").exists(), "refused before the folder is adopted"


def test_a_truncated_jpeg_is_the_record_s_error_not_the_engine_s(tmp_path: Path) -> None:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buffer, format="JPEG")
    cut = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    with Image.open(io.BytesIO(cut)) as image:
        image.verify()  # passes: PIL's verify() does not decode a JPEG's pixels
    resolve = image_resolver("<image>", tmp_path / "store", tmp_path, allow_remote=False)
    url = "data:image/jpeg;base64," + base64.b64encode(cut).decode()
    with pytest.raises(Exception, match="line 3: not a readable image"):
        resolve({"type": "image_url", "image_url": {"url": url}}, "line 3")


def test_array_tasks_engine_steps_and_fault_hook_notes_add_up_when_merged() -> None:
    """SLURM array tasks run engines of their own: their engines' step counts add up (none where no task's engine
    counts them, so the row takes the traces' steps), and a test hook's note is kept once."""
    from harness.batch.job.job import ShardsRun

    def part(steps: int | None, hooks: list[str]) -> dict:
        run = ShardsRun()
        run.engine_counted("worker 1", steps)
        run.fault_hooks = hooks
        return run.to_dict()

    merged = ShardsRun.merged([part(120, ["hook set"]), part(None, []), part(80, ["hook set"])])
    assert merged.engine_steps == 200 and merged.fault_hooks == ["hook set"]
    assert ShardsRun.merged([part(None, []), part(None, [])]).engine_steps is None
