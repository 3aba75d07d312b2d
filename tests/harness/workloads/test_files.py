"""Loading users' files (OpenAI Batch JSONL, ShareGPT JSON, plain JSONL) into workloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.core.errors import TroughputError
from harness.workloads.files import from_file

ROLE_MARKS = {"system": 1001, "user": 1002, "assistant": 1003}
GENERATION_PROMPT = 1999


class FakeTokenizer:
    """One token per character; chat turns are led by a role marker."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [ROLE_MARKS[m["role"]], *self.encode(m["content"])]
        return [*ids, GENERATION_PROMPT]


TOK = FakeTokenizer()


def chat(*messages: tuple[str, str]) -> list[int]:
    return TOK.encode_chat([{"role": r, "content": c} for r, c in messages])


def write_lines(path: Path, records: list[Any]) -> Path:
    """One line per record; strings are written as they are (broken or blank lines)."""
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def load(path: Path, fmt: str = "auto", **cfg: Any):
    return from_file({"name": "mine", "path": str(path), "format": fmt, "default_max_tokens": 64,
                      "max_requests": None, **cfg}, TOK)


def batch_chat(cid: str, messages: list[dict], **body: Any) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": {"messages": messages, **body}}


def batch_completion(cid: str, prompt: Any, **body: Any) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": {"prompt": prompt, **body}}


def good_batch(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "batch.jsonl", [
        batch_chat("a", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], max_tokens=10),
        batch_chat("b", [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}],
                   max_completion_tokens=7),
        "",
        batch_completion("c", "abc", max_tokens=3),
        batch_completion("d", ["ab"], max_tokens=4),
        batch_completion("e", [5, 6, 7], max_tokens=5),
        batch_completion("f", "no length"),
    ])


def test_openai_batch(tmp_path: Path) -> None:
    wl = load(good_batch(tmp_path), "openai_batch")
    assert [r.id for r in wl.requests] == ["a", "b", "c", "d", "e", "f"]
    assert [r.max_tokens for r in wl.requests] == [10, 7, 3, 4, 5, 64]
    a, b, c, d, e, _ = wl.requests
    assert a.prompt_token_ids == chat(("system", "be brief"), ("user", "hi"))
    assert b.prompt_token_ids == chat(("user", "x\ny"))
    assert c.prompt_token_ids == [97, 98, 99]
    assert d.prompt_token_ids == [97, 98]
    assert e.prompt_token_ids == [5, 6, 7]
    assert wl.name == "mine"
    assert wl.info == {"source_file": str(tmp_path / "batch.jsonl"), "source_format": "openai_batch",
                       "skipped_records": 0}


def test_sharegpt(tmp_path: Path) -> None:
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([
        {"id": "x", "conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "hello"},
                                      {"from": "gpt", "value": "four"}, {"from": "human", "value": "later"}]},
        {"conversations": [{"from": "gpt", "value": "greeting"}, {"from": "human", "value": "q"}]},
        {"id": "none", "conversations": [{"from": "gpt", "value": "only me"}]},
        {"id": "x", "conversations": [{"from": "human", "value": "again"}, {"from": "gpt", "value": "ok"}]},
        {"id": 7, "conversations": []},
    ]))
    wl = load(path, "sharegpt")
    assert [r.id for r in wl.requests] == ["x", "sharegpt-1", "x-2"]
    assert [r.max_tokens for r in wl.requests] == [4, 64, 2]
    assert wl.requests[0].prompt_token_ids == chat(("system", "sys"), ("user", "hello"))
    assert wl.requests[1].prompt_token_ids == chat(("assistant", "greeting"), ("user", "q"))
    assert wl.info["skipped_records"] == 2
    assert wl.info["source_format"] == "sharegpt"


def test_plain_jsonl(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": "ab", "max_tokens": 2}, "", "  ",
                                              {"prompt": "c", "id": "mine"}, {"prompt": "d"}])
    wl = load(path, "jsonl")
    assert [r.id for r in wl.requests] == ["line-1", "mine", "line-5"]
    assert [r.max_tokens for r in wl.requests] == [2, 64, 64]
    assert [r.prompt_token_ids for r in wl.requests] == [[97, 98], [99], [100]]


@pytest.mark.parametrize(("name", "first", "fmt"), [
    ("c.json", None, "sharegpt"),
    ("b.jsonl", batch_completion("a", "x"), "openai_batch"),
    ("p.jsonl", {"prompt": "x"}, "jsonl"),
    ("p.txt", {"prompt": "x", "custom": 1}, "jsonl"),
])
def test_auto_detection(tmp_path: Path, name: str, first: Any, fmt: str) -> None:
    path = tmp_path / name
    if first is None:
        path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}]}]))
    else:
        write_lines(path, ["", first])
    assert load(path).info["source_format"] == fmt


def test_auto_detection_reads_the_whole_file_not_its_first_line(tmp_path: Path) -> None:
    """The issue's file: an OpenAI Batch file whose first line lacks custom_id (or is no JSON) is still OpenAI Batch
    (the first-line rule read it as plain JSONL and failed every line with "missing field 'prompt'")."""
    from harness.workloads.files import source

    no_id = {k: v for k, v in batch_chat("x", [{"role": "user", "content": "hi"}]).items() if k != "custom_id"}
    for first in (no_id, '{"custom_id": "broken", ', {"unrelated": 1}):
        path = write_lines(tmp_path / "b.jsonl", [first, batch_completion("b", "abc", max_tokens=2)])
        assert source({"name": "mine", "path": str(path), "format": "auto"})[1] == "openai_batch", first
    path = write_lines(tmp_path / "b.jsonl", [no_id, batch_completion("b", "abc", max_tokens=2)])
    with pytest.raises(TroughputError, match=r"line 1: missing field 'custom_id'"):
        load(path)
    path = write_lines(tmp_path / "p.jsonl", ["not json", {"prompt": "x"}, {"prompt": "y", "custom": 1}])
    assert source({"name": "mine", "path": str(path), "format": "auto"})[1] == "jsonl"


def test_a_file_whose_lines_disagree_is_an_error_naming_lines_of_each_kind(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "mixed.jsonl", [batch_completion("a", "x"), {"prompt": "p"}, "",
                                                  batch_completion("b", "y"), {"prompt": "q"}, {"prompt": "r"},
                                                  {"prompt": "s"}])
    with pytest.raises(TroughputError) as e:
        load(path)
    message = str(e.value)
    assert f"{path} mixes two formats" in message
    assert "OpenAI Batch requests (custom_id/method/url/body) on 2 lines (lines 1, 4)" in message
    assert "plain JSONL records (prompt) on 4 lines (lines 2, 5, 6, ...)" in message
    assert "workload.format=openai_batch" in message
    # named, the file is read as that format: the other lines are that format's errors
    with pytest.raises(TroughputError, match="line 2: missing field 'custom_id'"):
        load(path, "openai_batch")


def test_a_file_with_no_line_of_either_shape_names_the_setting(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "odd.jsonl", ["{broken", {"text": "no prompt"}, [1, 2]])
    with pytest.raises(TroughputError, match=r"cannot tell the format of .*odd.jsonl.*1 lines are no JSON.*"
                                             r"set workload.format="):
        load(path)


def test_max_requests_keeps_the_first_and_reads_no_further(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}, "{broken"])
    assert [r.id for r in load(path, max_requests=2).requests] == ["line-1", "line-2"]
    with pytest.raises(TroughputError, match="line 3"):
        load(path)


def test_records_without_length_need_a_default(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": "a", "max_tokens": 3}, {"prompt": "b"}])
    assert [r.max_tokens for r in load(path, default_max_tokens=9).requests] == [3, 9]
    with pytest.raises(TroughputError, match=r"line 2: missing field 'max_tokens', and no default_max_tokens"):
        load(path, default_max_tokens=None)


def test_broken_json_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "batch.jsonl", [batch_completion("a", "x"), batch_completion("b", "y"),
                                                  '{"custom_id": "c", "method": '])
    with pytest.raises(TroughputError) as err:
        load(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value) and "invalid JSON" in str(err.value)


BATCH_FAULTS = [
    ({"custom_id": "a", "method": "POST", "url": "/v1/completions"}, "missing field 'body'"),
    (batch_completion("a", "x") | {"url": "/v1/embeddings"}, "field 'url' must be"),
    (batch_completion("a", "x") | {"method": "GET"}, "'POST'"),
    ({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}, "missing field 'custom_id'"),
    (batch_chat("a", []), "'body.messages' is empty"),
    (batch_chat("a", [{"role": "user"}]), r"missing field 'body.messages\[0\].content'"),
    (batch_chat("a", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]),
     "is an image .* and this model takes no images"),
    (batch_completion("a", "x", max_tokens=0), "'body.max_tokens' must be positive"),
    (batch_completion("a", "x", max_tokens="5"), "'body.max_tokens' must be an integer, got a string"),
    (batch_completion("a", "x", max_tokens=True), "must be an integer, got a boolean"),
    (batch_completion("a", ""), "'body.prompt' is empty"),
    (batch_completion("a", []), "empty prompt"),
    (batch_completion("a", ["x", "y"]), "list of token ids"),
    ({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": []}, "'body' must be an object"),
    ([1, 2], "record must be a JSON object, got a list"),
]


@pytest.mark.parametrize(("record", "fault"), BATCH_FAULTS)
def test_batch_faults(tmp_path: Path, record: Any, fault: str) -> None:
    path = write_lines(tmp_path / "batch.jsonl", [batch_completion("ok", "fine"), record])
    with pytest.raises(TroughputError, match=fault) as err:
        load(path, "openai_batch")
    assert f"{path}, line 2:" in str(err.value)


def test_duplicate_custom_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "batch.jsonl", [batch_completion("a", "x"), batch_completion("b", "y"), "",
                                                  batch_completion("a", "z")])
    with pytest.raises(TroughputError, match=r"line 4: duplicate id 'a' \(first used on line 1\)"):
        load(path)


@pytest.mark.parametrize(("record", "fault"), [
    ({"id": "r", "conversations": "hi"}, "'conversations' must be a list"),
    ({"conversations": [{"from": "robot", "value": "q"}]}, r"'conversations\[0\].from' must be one of"),
    ({"conversations": [{"from": "human"}]}, r"missing field 'conversations\[0\].value'"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": 3}]}, "must be a string"),
    ({"conversations": [{"from": "human", "value": "q"}]}, "no gpt reply to size the output"),
    ("text", "record must be a JSON object"),
])
def test_sharegpt_faults_name_the_record(tmp_path: Path, record: Any, fault: str) -> None:
    path = tmp_path / "conv.json"
    good = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    path.write_text(json.dumps([good, good, record]))
    with pytest.raises(TroughputError, match=fault) as err:
        load(path, default_max_tokens=None)
    assert f"{path}, record 2:" in str(err.value)


def test_sharegpt_must_be_a_json_list(tmp_path: Path) -> None:
    path = tmp_path / "conv.json"
    path.write_text('{"conversations": []}')
    with pytest.raises(TroughputError, match="expected a JSON list"):
        load(path)
    path.write_text('[{"conversations": []},\n  {oops}]')
    with pytest.raises(TroughputError, match=r"invalid JSON at line 2"):
        load(path)


@pytest.mark.parametrize(("record", "fault"), [
    ({"prompt": "   "}, "'prompt' is empty"),
    ({"prompt": ["a"]}, "'prompt' must be a string, got a list"),
    ({"text": "a"}, "missing field 'prompt'"),
    ({"prompt": "a", "max_tokens": -1}, "'max_tokens' must be positive, got -1"),
    ({"prompt": "a", "id": "line-1"}, r"duplicate id 'line-1' \(first used on line 1\)"),
])
def test_plain_jsonl_faults(tmp_path: Path, record: Any, fault: str) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": "ok"}, record])
    with pytest.raises(TroughputError, match=fault) as err:
        load(path, "jsonl")
    assert f"{path}, line 2:" in str(err.value)


def test_missing_empty_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(TroughputError, match="nowhere.jsonl not found"):
        load(tmp_path / "nowhere.jsonl")
    empty = write_lines(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(TroughputError, match="no usable requests"):
        load(empty)
    only_skipped = tmp_path / "c.json"
    only_skipped.write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "hi"}]}]))
    with pytest.raises(TroughputError, match=r"no usable requests \(1 records skipped\)"):
        load(only_skipped)
    with pytest.raises(TroughputError, match="unknown format 'csv'"):
        load(empty, "csv")
    with pytest.raises(TroughputError, match="max_requests must be a positive integer"):
        load(empty, max_requests=0)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def sampled_batch(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "batch.jsonl", [
        batch_chat("t", [{"role": "user", "content": "hi"}], max_tokens=5, temperature=0.7, top_p=0.9, seed=3,
                   stop="\n"),
        batch_completion("plain", "x", max_tokens=4),
        batch_completion("js", "x", max_tokens=4, response_format={"type": "json_schema",
                                                                   "json_schema": {"name": "s", "schema": SCHEMA}}),
        batch_chat("jo", [{"role": "user", "content": "hi"}], max_tokens=4, response_format={"type": "json_object"}),
        batch_completion("txt", "x", max_tokens=4, response_format={"type": "text"}, n=1),
        batch_completion("ch", "x", max_tokens=4, structured_outputs={"choice": ["yes", "no"]}),
    ])


def test_benchmark_sampling_drops_the_requests_own_but_keeps_constraints(tmp_path: Path) -> None:
    wl = load(sampled_batch(tmp_path))
    by_id = {r.id: r for r in wl.requests}
    assert all(r.sampling is None for r in wl.requests)
    assert [r.id for r in wl.requests if r.exact_length] == ["t", "plain", "txt"]
    assert by_id["js"].constraint == {"kind": "json", "value": SCHEMA}
    assert by_id["jo"].constraint == {"kind": "json_object", "value": None}
    assert by_id["ch"].constraint == {"kind": "choice", "value": ["yes", "no"]}
    assert by_id["txt"].constraint is None


def test_as_given_sampling_keeps_both_with_openai_defaults(tmp_path: Path) -> None:
    wl = load(sampled_batch(tmp_path), sampling="as_given")
    by_id = {r.id: r for r in wl.requests}
    assert not any(r.exact_length for r in wl.requests)
    assert by_id["t"].sampling == {"temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n"]}
    assert by_id["plain"].sampling == {"temperature": 1.0}  # OpenAI's default when a body gives none
    assert by_id["js"].constraint == {"kind": "json", "value": SCHEMA}
    assert wl.fingerprint != load(sampled_batch(tmp_path)).fingerprint


def test_plain_jsonl_sampling_and_constraints(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [
        {"prompt": "a", "temperature": 0.5, "stop": ["x", "y"]},
        {"prompt": "b", "structured_outputs": {"regex": "[0-9]+"}},
        {"prompt": "c", "response_format": {"type": "json_object"}},
        {"prompt": "d"},
    ])
    given = load(path, sampling="as_given").requests
    assert [r.sampling for r in given] == [{"temperature": 0.5, "stop": ["x", "y"]}, {}, {}, {}]  # greedy default
    assert [r.constraint for r in given] == [None, {"kind": "regex", "value": "[0-9]+"},
                                             {"kind": "json_object", "value": None}, None]
    assert [r.exact_length for r in load(path).requests] == [True, False, False, True]


@pytest.mark.parametrize(("body", "fault"), [
    ({"n": 2}, r"field 'body.n' must be 1 \(one choice per request\), got 2"),
    ({"best_of": 3}, "'body.best_of' must be 1"),
    ({"response_format": {"type": "xml"}}, "'body.response_format.type' must be 'text', 'json_object' or"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "missing field 'body.response_format.json_schema.schema'"),
    ({"response_format": "json"}, "'body.response_format' must be an object"),
    ({"structured_outputs": {"choice": [], "regex": "a"}}, "must hold exactly one of"),
    ({"structured_outputs": {"regex": "("}}, "does not compile"),
    ({"structured_outputs": {"json_object": True}, "response_format": {"type": "json_object"}},
     "both constrain the output"),
])
def test_decoding_faults_name_file_and_line(tmp_path: Path, body: dict, fault: str) -> None:
    path = write_lines(tmp_path / "batch.jsonl", [batch_completion("ok", "fine"), batch_completion("bad", "x", **body)])
    for sampling in ("benchmark", "as_given"):
        with pytest.raises(TroughputError, match=fault) as err:
            load(path, sampling=sampling)
        assert f"{path}, line 2:" in str(err.value)


@pytest.mark.parametrize(("body", "fault"), [
    ({"temperature": 3}, r"sampling in body: temperature must be a number in \[0, 2\]"),
    ({"stop": ["a", ""]}, "stop must be a non-empty string"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"presence_penalty": 0.5}, "'body.presence_penalty' is not supported"),
    ({"logprobs": True}, "'body.logprobs' is not supported"),
])
def test_sampling_faults_only_when_sampling_is_kept(tmp_path: Path, body: dict, fault: str) -> None:
    path = write_lines(tmp_path / "batch.jsonl", [batch_completion("ok", "fine"), batch_completion("bad", "x", **body)])
    with pytest.raises(TroughputError, match=fault) as err:
        load(path, sampling="as_given")
    assert f"{path}, line 2:" in str(err.value)
    assert load(path).requests[1].exact_length  # benchmark mode drops what it does not use


def test_unknown_sampling_mode_and_non_utf8_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": "a"}])
    with pytest.raises(TroughputError, match="sampling must be one of benchmark, as_given"):
        load(path, sampling="creative")
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(TroughputError, match=r"line 2: not UTF-8 text"):
        load(path)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_sharegpt_is_read_one_record_at_a_time_at_any_chunk_size(tmp_path: Path, chunk: int) -> None:
    from harness.workloads.files import _json_list

    records = [{"id": f"é{i}", "conversations": [{"from": "human", "value": "q ] , [" * i}]} for i in range(5)]
    path = tmp_path / "conv.json"
    path.write_text("[\n" + ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n]\n", encoding="utf-8")
    assert [(w, n, r) for w, n, r in _json_list(path, chunk_chars=chunk)] == [(f"record {i}", i, r) for i, r in enumerate(records)]
    path.write_text('[{"conversations": []},\n  {oops}]')
    with pytest.raises(TroughputError, match=r"invalid JSON at line 2, column 4"):
        list(_json_list(path, chunk_chars=chunk))
    path.write_text('[{"a": 1} {"b": 2}]')
    with pytest.raises(TroughputError, match=r"line 1, column 11: Expecting ',' delimiter"):
        list(_json_list(path, chunk_chars=chunk))
    path.write_text("[]")
    assert list(_json_list(path, chunk_chars=chunk)) == []
