"""``batch.scale=ray`` with ``engine=ray``: Ray Data LLM's vLLM processor is the pipeline's engine stage.

The processor's rows are requests, not shards. ``explode`` turns each shard into one header
row (the shard's pickled ``Item``s and how many requests follow) and one row per request
(``tokenized_prompt``, ``sampling_params``). Header rows, and requests the processor cannot
take (images: it is given token ids), carry ``__inference_error__``, which every stage of the
processor passes through untouched. ``ShardAssembler``, one actor on the driver's node,
collects a shard's rows and commits it once all have come back; one that Ray restarts loses
the shards it was collecting (a rerun runs them again).
"""

from __future__ import annotations

import json
import pickle
from collections import defaultdict
from typing import Any

import numpy as np

from engines.base import Request
from engines.ray_data import RayDataEngine, _item
from harness.batch.job.plan import Plan

HEADER = "troughput: shard header"
IMAGES = ("engine=ray runs text prompts only: its processor takes images through its chat-template and "
          "multimodal stages, which need text prompts, not token ids; run this file with engine=vllm")
_BLANK = _item(0, Request("blank", [0], 1))


def _row(shard: int, rid: str = "", items: bytes = b"", expect: int = 0, error: str = "",
         item: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every row has every column (one Arrow schema): the shard's, the request's and the error."""
    item = item or _BLANK
    return {"troughput_shard": shard, "troughput_id": rid, "troughput_items": items, "troughput_expect": expect,
            "tokenized_prompt": item["tokenized_prompt"], "sampling_params": item["sampling_params"],
            "__inference_error__": error}


def explode(batch: dict[str, np.ndarray]) -> Any:
    """Shard rows (from ``ray_stages.convert``) as a header row and one row per request."""
    import pandas as pd

    rows = []
    for shard, items, requests in zip(batch["shard"], batch["items"], batch["requests"]):
        shard, requests = int(shard), pickle.loads(requests)
        rows.append(_row(shard, items=items, expect=len(requests), error=HEADER))
        for request in requests:
            if request.images:
                rows.append(_row(shard, request.id, error=IMAGES))
            else:
                rows.append(_row(shard, request.id, item=_item(0, request)))
    return pd.DataFrame(rows)


def processor(plan: Plan, gpus: float, actors: int) -> Any:
    """Ray Data LLM's processor for the job's knobs (as ``engine=ray`` builds it), ``actors`` replicas by default."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from engines.ray_data import STAGE_CPUS

    knobs = {k: v for k, v in plan.knobs.items() if v is not None}
    engine = RayDataEngine(plan.model, {"concurrency": actors, **knobs, "should_continue_on_error": True})
    engine.validate()
    config = vLLMEngineProcessorConfig(**engine._config_kwargs(gpus))
    return build_processor(config, preprocess_map_kwargs={"num_cpus": STAGE_CPUS},
                           postprocess_map_kwargs={"num_cpus": STAGE_CPUS})


class ShardAssembler:
    """Collects each shard's rows from the processor; commits a shard when its header and requests are in."""

    def __init__(self, plan_json: str, job: str):
        from harness.batch.job.state import JobState
        from harness.batch.scale.ray_stages import plan_of, tokenizer_of

        self.plan, self.job = plan_of(plan_json), job
        self.state, self.tok = JobState(self.plan.output_dir), tokenizer_of(self.plan.model["local_dir"])
        self.headers: dict[int, dict[str, Any]] = {}
        self.rows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)  # shard -> request id -> row
        self.done: set[int] = set()  # shards committed (or found committed) by this actor

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        metas = []
        for row in batch.to_dict("records"):
            shard = int(row["troughput_shard"])
            if shard in self.done:  # a retried block re-emitted a row of a shard already committed
                continue
            if row.get("__inference_error__") == HEADER:
                self.headers[shard] = row
            else:  # by id: a re-emitted row counts once, so a shard never commits with a request missing
                self.rows[shard].setdefault(str(row["troughput_id"]), row)
            header = self.headers.get(shard)
            if header is not None and len(self.rows[shard]) >= int(header["troughput_expect"]):
                metas.append(json.dumps(self._commit(shard, header, list(self.rows.pop(shard).values()))))
                del self.headers[shard]
                self.done.add(shard)
        return {"meta": np.array(metas, dtype=object)}

    def _commit(self, shard: int, header: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        from harness.batch.job.job import commit_shard

        errors, completions, arrivals, taken = {}, [], [], []
        for row in rows:
            if row.get("__inference_error__"):
                errors[row["troughput_id"]] = str(row["__inference_error__"])
                continue
            metrics = row.get("metrics") or {}
            if metrics.get("arrival_time"):
                arrivals.append(float(metrics["arrival_time"]))
            taken.append(float(row.get("time_taken_llm") or 0.0))
            completions.append({"id": row["troughput_id"], "prompt_tokens": int(row.get("num_input_tokens") or 0),
                                "output_token_ids": [int(t) for t in row.get("generated_tokens") or []],
                                "cached_tokens": None, "finish_reason": None, "text": None})
        result = {"completions": completions, "errors": errors, "measured": {"wall_s": max(taken, default=0.0)}}
        extra = {"started_at": min(arrivals)} if arrivals else {}
        meta = commit_shard(self.plan, self.state, self.tok, self.job, shard, pickle.loads(header["troughput_items"]),
                            result, {**extra, "engine": "ray.data.llm"})
        return meta or {"index": shard, "dropped": True}
