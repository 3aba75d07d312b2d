"""Lines of OpenAI's Batch output and error files.

Each line: ``id``, ``custom_id``, ``response`` (``status_code``, ``request_id``, ``body``) and
``error`` (OpenAI's ``BatchRequestOutput``). A success's ``body`` is a ``chat.completion`` or a
``text_completion`` object (``choices[0].message.content`` or ``choices[0].text``,
``finish_reason``, ``usage``); a failure's is ``{"error": {message, type, param, code}}`` with
status 400 (the request), 404 (a model the job does not serve, code ``model_not_found``) or 500
(the engine), as OpenAI's error files hold. Ids are derived
from the job and the custom_id, so a rerun writes the same ids.
"""

from __future__ import annotations

import hashlib
from typing import Any

from harness.batch.job.convert import MODEL_NOT_FOUND, Item
from harness.workloads.records import CHAT_URL

REQUEST_FAULT, ENGINE_FAULT = (400, "invalid_request_error"), (500, "server_error")
MODEL_FAULT = (404, "invalid_request_error")  # a request for a model the job does not serve (code model_not_found)


def _hex(job: str, item: Item, salt: str) -> str:
    key = f"{job}\0{item.line}\0{item.custom_id}\0{salt}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def success(job: str, item: Item, completion: dict[str, Any], text: str, model: str, created: int) -> dict[str, Any]:
    """The output line of a request that ran."""
    ids = completion["output_token_ids"]
    assert item.request is not None
    finish = completion.get("finish_reason") or ("length" if len(ids) >= item.request.max_tokens else "stop")
    usage = {"prompt_tokens": completion["prompt_tokens"], "completion_tokens": len(ids),
             "total_tokens": completion["prompt_tokens"] + len(ids)}
    if item.url == CHAT_URL:
        body = {"id": f"chatcmpl-{_hex(job, item, 'body')}", "object": "chat.completion", "created": created,
                "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                                                     "refusal": None},
                                             "logprobs": None, "finish_reason": finish}],
                "usage": usage, "system_fingerprint": None}
    else:
        body = {"id": f"cmpl-{_hex(job, item, 'body')}", "object": "text_completion", "created": created,
                "model": model, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                "usage": usage, "system_fingerprint": None}
    return _line(job, item, 200, body)


def failure(job: str, item: Item, message: str, fault: tuple[int, str] = REQUEST_FAULT) -> dict[str, Any]:
    """The error-file line of a request that did not run, with its reason (and the item's code where it has one:
    ``model_not_found`` is status 404 with ``param: "model"``, as OpenAI's and vLLM's answer it)."""
    if item.code == MODEL_NOT_FOUND:
        fault = MODEL_FAULT
    status, kind = fault
    param = "model" if item.code == MODEL_NOT_FOUND else None
    return _line(job, item, status, {"error": {"message": message, "type": kind, "param": param, "code": item.code}})


def _line(job: str, item: Item, status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"batch_req_{_hex(job, item, 'line')}", "custom_id": item.custom_id,
            "response": {"status_code": status, "request_id": f"req_{_hex(job, item, 'request')}", "body": body},
            "error": None}
