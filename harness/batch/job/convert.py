"""A shard's records as requests, one record at a time: each becomes a request or an error, never both."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engines.base import Request
from harness.batch.job.shards import Index, Shard, default_id
from harness.workloads.fields import RecordError
from harness.workloads.records import CHAT_URL, COMPLETIONS_URL, Options, TextTokenizerLike, convert

MODEL_NOT_FOUND = "model_not_found"
URL_OF_FORMAT = {"sharegpt": CHAT_URL, "jsonl": COMPLETIONS_URL}  # the response shape for non-OpenAI records


@dataclass
class Item:
    """One record of the shard: its request, or the reason it has none."""

    custom_id: str | None
    line: int
    url: str
    request: Request | None = None
    error: str | None = None
    model: str | None = None
    code: str | None = None   # the error's code where it has one (``model_not_found``)


def convert_shard(shard: Shard, fmt: str, tok: TextTokenizerLike, options: Options, index: Index,
                  source: Path, max_model_len: int | None, models: Collection[str] | None = None) -> list[Item]:
    """Every record of ``shard`` as an ``Item``, in file order.

    A record that repeats an earlier record's id (``index.duplicates``), that is malformed, or
    whose prompt leaves no room in ``max_model_len`` is an error naming the file and line;
    ``max_tokens`` is capped to the room left. ``models``: the names the job serves
    (``Plan.served_models``); a request whose ``model`` names another is an error line with code
    ``model_not_found`` (as vLLM's and OpenAI's batch runners answer it), never answered by this
    job's model; a request naming none is answered.
    """
    items = []
    for where, n, record in shard.records:
        cid = _declared_id(fmt, n, record)
        url = _url(fmt, record)
        try:
            if isinstance(record, RecordError):
                raise record
            if n in index.duplicates:
                raise RecordError(f"duplicate id {cid!r} (first used on {_place(fmt, index.duplicates[n])})")
            converted = convert(fmt, record, tok, options)
            if converted is None:
                raise RecordError("nothing to ask: no human turn")
            if models is not None and converted.model is not None and converted.model not in models:
                why = _other_model(converted.model, models)
                items.append(Item(cid, n, converted.url or url, error=f"{source}, {where}: {why}",
                                  model=converted.model, code=MODEL_NOT_FOUND))
                continue
            request = _fit(converted.request(cid or default_id(fmt, n)), max_model_len)
            items.append(Item(cid, n, converted.url or url, request, model=converted.model))
        except RecordError as e:
            items.append(Item(cid, n, url, error=f"{source}, {where}: {e}"))
    return items


def _other_model(asked: str, models: Collection[str]) -> str:
    served = ", ".join(repr(m) for m in sorted(models))
    return (f"the request asks for model {asked!r}; this job serves {served}: it is not answered by another model. "
            f"If {asked!r} is a name for this job's model, add it to batch.served_model_names")


def _fit(request: Request, max_model_len: int | None) -> Request:
    if max_model_len is None:
        return request
    room = max_model_len - len(request.prompt_token_ids)
    if room <= 0:
        raise RecordError(f"the prompt has {len(request.prompt_token_ids)} tokens; the model takes at most "
                          f"{max_model_len} (max_model_len) including the output")
    return replace(request, max_tokens=min(request.max_tokens, room))


def _declared_id(fmt: str, n: int, record: Any) -> str | None:
    """The record's own id (``custom_id`` for OpenAI Batch), as far as it can be read; else the default id."""
    key = "custom_id" if fmt == "openai_batch" else "id"
    value = record.get(key) if isinstance(record, dict) else None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    return None if fmt == "openai_batch" else default_id(fmt, n)


def _url(fmt: str, record: Any) -> str:
    if fmt == "openai_batch" and isinstance(record, dict) and record.get("url") in (CHAT_URL, COMPLETIONS_URL):
        return str(record["url"])
    return URL_OF_FORMAT.get(fmt, CHAT_URL)


def _place(fmt: str, n: int) -> str:
    return f"record {n}" if fmt == "sharegpt" else f"line {n}"
