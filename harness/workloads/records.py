"""One record of a user's file converted on its own: OpenAI Batch line, ShareGPT record, or plain JSONL line.

``convert(fmt, record, tokenizer, options)`` returns a ``FileRecord`` (``None`` for a record
with nothing to ask, a ShareGPT record without a human turn) or raises ``RecordError``.
``harness.workloads.files`` uses it for a whole workload, ``troughput-batch`` per line.
"""

from __future__ import annotations

import json

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engines.base import Request
from harness.workloads.fields import RecordError, as_object, max_tokens, nonempty, or_default
from harness.workloads.fields import field as get
from harness.workloads.requested import OPENAI_DEFAULTS, SAMPLING_MODES, own_decoding

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
IMAGE_PART_TYPES = ("image_url", "input_image", "image")


class TextTokenizerLike(Protocol):
    """What is needed of a tokenizer: ``harness.core.tokens.TextTokenizer`` or a test's fake."""

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[dict]) -> list[int]: ...


# An image content part and its name in messages -> (the prompt's placeholder text, a local image path).
ImageResolver = Callable[[dict, str], tuple[str, str]]


@dataclass(frozen=True)
class Options:
    """How records become requests.

    Args:
        default_max_tokens: for records that give no length (``None``: such a record is an error).
        sampling: ``benchmark`` (greedy, exact lengths; constraints kept) or ``as_given``.
        images: turns image content parts into a placeholder and a file; ``None``: images are an error.
    """

    default_max_tokens: int | None = None
    sampling: str = "benchmark"
    images: ImageResolver | None = None

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLING_MODES)}, got {self.sampling!r}")


@dataclass(frozen=True)
class FileRecord:
    """A converted record: what ``Request`` needs, plus the endpoint and model an OpenAI line named."""

    id: str | None  # None: the caller gives the default id
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] | None = None
    constraint: dict[str, Any] | None = None
    images: list[str] = field(default_factory=list)
    url: str | None = None
    model: str | None = None
    expected: str | None = None   # the answer a plain record expects (``harness.quality.expected``)

    def request(self, rid: str) -> Request:
        return Request(rid, self.prompt_token_ids, self.max_tokens, list(self.images), self.sampling, self.constraint)


def convert(fmt: str, record: Any, tok: TextTokenizerLike, options: Options) -> FileRecord | None:
    """``record`` (parsed JSON) of format ``fmt`` as a ``FileRecord``; ``RecordError`` says what is wrong."""
    converted = CONVERTERS[fmt](as_object(record, "record"), tok, options)
    if converted is not None and not converted.prompt_token_ids:
        raise RecordError("empty prompt")
    return converted


def _batch(record: dict, tok: TextTokenizerLike, options: Options) -> FileRecord:
    """One OpenAI Batch API line, for the chat or the completions endpoint."""
    custom_id = get(record, "custom_id", str)
    if (method := get(record, "method", str)) != "POST":
        raise RecordError(f"field 'method' must be 'POST', got {method!r}")
    url = get(record, "url", str)
    body = get(record, "body", dict)
    images: list[str] = []
    if url == CHAT_URL:
        messages = get(body, "messages", list, "body")
        if not messages:
            raise RecordError("field 'body.messages' is empty")
        ids = tok.encode_chat([_chat_message(m, f"body.messages[{i}]", options, images)
                               for i, m in enumerate(messages)])
        length = max_tokens(body, ("max_completion_tokens", "max_tokens"), options.default_max_tokens, "body")
    elif url == COMPLETIONS_URL:
        ids, length = _completion_prompt(body, tok), max_tokens(body, ("max_tokens",), options.default_max_tokens,
                                                                "body")
    else:
        raise RecordError(f"field 'url' must be {CHAT_URL!r} or {COMPLETIONS_URL!r}, got {url!r}")
    sampling, constraint = own_decoding(body, "body", options.sampling, OPENAI_DEFAULTS)
    model = body.get("model")
    return FileRecord(custom_id, ids, length, sampling, constraint, images, url,
                      model if isinstance(model, str) else None)


def _chat_message(message: Any, at: str, options: Options, images: list[str]) -> dict[str, str]:
    """``{role, content}`` with content as text; a list of parts is joined, images become placeholders."""
    message = as_object(message, at)
    content = get(message, "content", (str, list), at)
    if isinstance(content, list):
        content = "\n".join(_part(part, f"{at}.content[{j}]", options, images) for j, part in enumerate(content))
    return {"role": get(message, "role", str, at), "content": content}


def _part(part: Any, at: str, options: Options, images: list[str]) -> str:
    kind = get(as_object(part, at), "type", str, at)
    if kind in IMAGE_PART_TYPES:
        if options.images is None:
            raise RecordError(f"{at} is an image ({kind!r}) and this model takes no images; "
                              f"use a vision-language model (model=tiny_vlm on CPU)")
        placeholder, path = options.images(part, at)
        images.append(path)
        return placeholder
    if kind != "text":
        raise RecordError(f"{at} has type {kind!r}; only 'text' and 'image_url' content parts are supported")
    return get(part, "text", str, at)


def _completion_prompt(body: dict, tok: TextTokenizerLike) -> list[int]:
    """A string, a list of one string, or a list of token ids (used as they are)."""
    prompt = get(body, "prompt", (str, list), "body")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tok.encode(nonempty(prompt, "body.prompt"))
    if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt)
    raise RecordError("field 'body.prompt' must be a string, a list of one string, or a list of token ids")


def _sharegpt(record: dict, tok: TextTokenizerLike, options: Options) -> FileRecord | None:
    """Prompt: the turns up to the first human one; output length: the next gpt reply's. None: no human turn."""
    turns = get(record, "conversations", list)
    roles_values = (_sharegpt_turn(turn, f"conversations[{i}]") for i, turn in enumerate(turns))
    messages = []
    for role, value in roles_values:
        messages.append({"role": role, "content": value})
        if role == "user":
            break
    else:
        return None
    reply = next((value for role, value in roles_values if role == "assistant"), "")
    output = len(tok.encode(reply)) if reply else 0
    length = output or or_default(options.default_max_tokens, "no gpt reply to size the output")
    sampling = None if options.sampling == "benchmark" else {}
    return FileRecord(_record_id(record), tok.encode_chat(messages), length, sampling)


def _sharegpt_turn(turn: Any, at: str) -> tuple[str, str]:
    turn = as_object(turn, at)
    speaker = get(turn, "from", str, at)
    if speaker not in SHAREGPT_ROLES:
        raise RecordError(f"field '{at}.from' must be one of {', '.join(SHAREGPT_ROLES)}, got {speaker!r}")
    return SHAREGPT_ROLES[speaker], get(turn, "value", str, at)


def _plain(record: dict, tok: TextTokenizerLike, options: Options) -> FileRecord:
    """``{"prompt": str, "max_tokens"?: int, "id"?: str, "expected"?: str | object}`` plus the fields of
    ``harness.workloads.requested``; an ``expected`` object is kept as its JSON text."""
    prompt = nonempty(get(record, "prompt", str), "prompt")
    sampling, constraint = own_decoding(record, "", options.sampling)
    expected = None
    if record.get("expected") is not None:
        answer = get(record, "expected", (str, dict))
        expected = answer if isinstance(answer, str) else json.dumps(answer)
    return FileRecord(_record_id(record), tok.encode(prompt), max_tokens(record, ("max_tokens",),
                                                                         options.default_max_tokens),
                      sampling, constraint, expected=expected)


def _record_id(record: dict) -> str | None:
    return None if record.get("id") is None else str(get(record, "id", (str, int)))


CONVERTERS: dict[str, Callable[[dict, TextTokenizerLike, Options], FileRecord | None]] = {
    "openai_batch": _batch, "sharegpt": _sharegpt, "jsonl": _plain,
}
