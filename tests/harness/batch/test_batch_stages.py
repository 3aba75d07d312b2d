"""The Ray pipeline's stages on their own, without Ray: the ``engine=ray`` shard assembler."""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from harness.batch.scale.ray_llm import HEADER, ShardAssembler


def _assembler(commits: list[tuple[int, list[str]]]) -> ShardAssembler:
    assembler = ShardAssembler.__new__(ShardAssembler)  # no plan, tokenizer or folder: _commit is recorded
    assembler.headers, assembler.rows, assembler.done = {}, defaultdict(dict), set()

    def commit(shard, header, rows):
        commits.append((shard, sorted(r["troughput_id"] for r in rows)))
        return {"index": shard}

    assembler._commit = commit  # type: ignore[method-assign]
    return assembler


def _rows(*rows: tuple[int, str, str, int]) -> pd.DataFrame:
    return pd.DataFrame([{"troughput_shard": s, "troughput_id": rid, "__inference_error__": error,
                          "troughput_expect": expect} for s, rid, error, expect in rows])


def test_a_re_emitted_row_never_commits_a_shard_with_a_request_missing() -> None:
    commits: list[tuple[int, list[str]]] = []
    assembler = _assembler(commits)
    out = assembler(_rows((0, "", HEADER, 2), (0, "a", "", 0), (0, "a", "", 0)))  # a retried block sent a twice
    assert commits == [] and len(out["meta"]) == 0, "two rows of one request are not the shard's two requests"
    assembler(_rows((0, "b", "", 0)))
    assert commits == [(0, ["a", "b"])]
    assembler(_rows((0, "b", "", 0), (0, "", HEADER, 2)))  # late copies of a committed shard: ignored
    assert commits == [(0, ["a", "b"])] and not assembler.rows and not assembler.headers
