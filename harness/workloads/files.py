"""Workloads from users' own files: OpenAI Batch API JSONL, ShareGPT JSON, or plain JSONL.

Malformed input raises ``TroughputError`` naming the file, the place (``line N``,
1-based, in JSONL; ``record N``, the 0-based list index, in ShareGPT) and the fault.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from engines.base import Request
from harness.errors import TroughputError
from harness.workloads.base import Workload

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
_KINDS = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
          bool: "a boolean", type(None): "null"}

Parsed = tuple[str | None, list[int], int]  # id (None: the default id), prompt token ids, max_tokens
Records = Iterator[tuple[str, int, Any]]  # (place for messages, line number or index, parsed JSON)


class TextTokenizerLike(Protocol):
    """What is needed of a tokenizer: ``harness.tokens.TextTokenizer`` or a test's fake."""

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[dict]) -> list[int]: ...


class _Bad(Exception):
    """What is wrong with one record; the caller adds the file and the place."""


def from_file(cfg: Mapping[str, Any], tokenizer: TextTokenizerLike) -> Workload:
    """Read ``cfg["path"]`` (``format``: openai_batch, sharegpt, jsonl or auto) into a workload."""
    name = cfg["name"]
    path = Path(str(cfg["path"])).expanduser()
    if not path.is_file():
        raise TroughputError(f"workload {name!r}: file {path} not found")
    fmt = str(cfg.get("format") or "auto")
    fmt = _detect(path) if fmt == "auto" else fmt
    if fmt not in _FORMATS:
        raise TroughputError(f"workload {name!r}: unknown format {fmt!r}; use one of {', '.join(_FORMATS)} or auto")
    default = _config_int(cfg, "default_max_tokens")
    requests, skipped = _collect(path, fmt, tokenizer, default, _config_int(cfg, "max_requests"))
    if not requests:
        raise TroughputError(f"workload {name!r}: {path} holds no usable requests ({skipped} records skipped)")
    return Workload(name, requests, info={"source_file": str(path), "source_format": fmt, "skipped_records": skipped})


def _config_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise TroughputError(f"workload {cfg['name']!r}: {key} must be a positive integer, got {value!r}")
    return value


def _detect(path: Path) -> str:
    """``.json``: sharegpt; else openai_batch if the first record has ``custom_id``, else jsonl."""
    if path.suffix.lower() == ".json":
        return "sharegpt"
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return "jsonl"  # the loader reports the broken line
    return "openai_batch" if isinstance(record, dict) and "custom_id" in record else "jsonl"


def _collect(path: Path, fmt: str, tok: TextTokenizerLike, default: int | None,
             limit: int | None) -> tuple[list[Request], int]:
    """Convert records until ``limit`` requests; return them and the number of skipped records."""
    read, convert, id_prefix, rename_duplicates = _FORMATS[fmt]
    requests: list[Request] = []
    seen: dict[str, str] = {}  # id -> where it was first used
    skipped = 0
    for where, n, record in read(path):
        try:
            parsed = convert(_object(record, "record"), tok, default)
            if parsed is not None and not parsed[1]:
                raise _Bad("empty prompt")
        except _Bad as e:
            raise TroughputError(f"{path}, {where}: {e}") from None
        if parsed is None:
            skipped += 1
            continue
        rid = base = parsed[0] if parsed[0] is not None else f"{id_prefix}-{n}"
        if rid in seen and not rename_duplicates:
            raise TroughputError(f"{path}, {where}: duplicate id {rid!r} (first used on {seen[rid]})")
        k = 2
        while rid in seen:  # a clashing id becomes the first unused of id-2, id-3, ...
            rid, k = f"{base}-{k}", k + 1
        seen[rid] = where
        requests.append(Request(rid, parsed[1], parsed[2]))
        if limit is not None and len(requests) >= limit:
            break
    return requests, skipped


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise TroughputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _json_lines(path: Path) -> Records:
    """Each non-blank line parsed as JSON, with its 1-based line number."""
    for n, line in enumerate(_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TroughputError(f"{path}, line {n}: invalid JSON ({e.msg}, column {e.colno})") from None
        yield f"line {n}", n, record


def _json_list(path: Path) -> Records:
    """The items of a JSON list, with their 0-based index."""
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as e:
        raise TroughputError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(data, list):
        raise TroughputError(f"{path}: expected a JSON list of records, got {_kind(data)}")
    for i, record in enumerate(data):
        yield f"record {i}", i, record


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _object(value: Any, at: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"{at} must be a JSON object, got {_kind(value)}")
    return value


def _name(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _field(obj: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], at: str = "") -> Any:
    """``obj[key]``, which must be present, not null, and of one of ``kinds`` (a boolean is no integer)."""
    name, kinds = _name(at, key), kinds if isinstance(kinds, tuple) else (kinds,)
    value = obj.get(key)
    if value is None:
        raise _Bad(f"missing field {name!r}")
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise _Bad(f"field {name!r} must be {' or '.join(_KINDS[k] for k in kinds)}, got {_kind(value)}")
    return value


def _nonempty(text: str, name: str) -> str:
    if not text.strip():
        raise _Bad(f"field {name!r} is empty")
    return text


def _default(default: int | None, why: str) -> int:
    if default is None:
        raise _Bad(f"{why}, and no default_max_tokens is set")
    return default


def _max_tokens(obj: Mapping[str, Any], keys: tuple[str, ...], default: int | None, at: str = "") -> int:
    """The first of ``keys`` present (a positive integer), else the default."""
    for key in keys:
        if obj.get(key) is not None:
            value = _field(obj, key, int, at)
            if value <= 0:
                raise _Bad(f"field {_name(at, key)!r} must be positive, got {value}")
            return value
    return _default(default, f"missing field {_name(at, keys[0])!r}")


def _record_id(record: Mapping[str, Any]) -> str | None:
    return None if record.get("id") is None else str(_field(record, "id", (str, int)))


def _batch(record: dict, tok: TextTokenizerLike, default: int | None) -> Parsed:
    """One OpenAI Batch API line, for the chat or the completions endpoint."""
    custom_id = _field(record, "custom_id", str)
    if (method := _field(record, "method", str)) != "POST":
        raise _Bad(f"field 'method' must be 'POST', got {method!r}")
    url = _field(record, "url", str)
    body = _field(record, "body", dict)
    if url == CHAT_URL:
        messages = _field(body, "messages", list, "body")
        if not messages:
            raise _Bad("field 'body.messages' is empty")
        ids = tok.encode_chat([_chat_message(m, f"body.messages[{i}]") for i, m in enumerate(messages)])
        return custom_id, ids, _max_tokens(body, ("max_completion_tokens", "max_tokens"), default, "body")
    if url == COMPLETIONS_URL:
        return custom_id, _completion_prompt(body, tok), _max_tokens(body, ("max_tokens",), default, "body")
    raise _Bad(f"field 'url' must be {CHAT_URL!r} or {COMPLETIONS_URL!r}, got {url!r}")


def _chat_message(message: Any, at: str) -> dict[str, str]:
    """``{role, content}`` with content as text; a list of parts keeps its text parts, joined."""
    message = _object(message, at)
    content = _field(message, "content", (str, list), at)
    if isinstance(content, list):
        content = "\n".join(_text_part(part, f"{at}.content[{j}]") for j, part in enumerate(content))
    return {"role": _field(message, "role", str, at), "content": content}


def _text_part(part: Any, at: str) -> str:
    kind = _field(_object(part, at), "type", str, at)
    if kind in ("image_url", "input_image", "image"):
        raise _Bad(f"images in batch files are not supported yet ({at} is of type {kind!r})")
    if kind != "text":
        raise _Bad(f"{at} has type {kind!r}; only 'text' content parts are supported")
    return _field(part, "text", str, at)


def _completion_prompt(body: dict, tok: TextTokenizerLike) -> list[int]:
    """A string, a list of one string, or a list of token ids (used as they are)."""
    prompt = _field(body, "prompt", (str, list), "body")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tok.encode(_nonempty(prompt, "body.prompt"))
    if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt)
    raise _Bad("field 'body.prompt' must be a string, a list of one string, or a list of token ids")


def _sharegpt(record: dict, tok: TextTokenizerLike, default: int | None) -> Parsed | None:
    """Prompt: the turns up to the first human one; output length: the next gpt reply's. None: no human turn."""
    turns = _field(record, "conversations", list)
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
    return _record_id(record), tok.encode_chat(messages), output or _default(default, "no gpt reply to size the output")


def _sharegpt_turn(turn: Any, at: str) -> tuple[str, str]:
    turn = _object(turn, at)
    speaker = _field(turn, "from", str, at)
    if speaker not in SHAREGPT_ROLES:
        raise _Bad(f"field '{at}.from' must be one of {', '.join(SHAREGPT_ROLES)}, got {speaker!r}")
    return SHAREGPT_ROLES[speaker], _field(turn, "value", str, at)


def _plain(record: dict, tok: TextTokenizerLike, default: int | None) -> Parsed:
    """``{"prompt": str, "max_tokens"?: int, "id"?: str}``."""
    prompt = _nonempty(_field(record, "prompt", str), "prompt")
    return _record_id(record), tok.encode(prompt), _max_tokens(record, ("max_tokens",), default)


# format -> (record reader, record converter, prefix of default ids, whether clashing ids are renamed or an error)
_FORMATS: dict[str, tuple[Callable[[Path], Records], Callable[..., Parsed | None], str, bool]] = {
    "openai_batch": (_json_lines, _batch, "", False),
    "sharegpt": (_json_list, _sharegpt, "sharegpt", True),
    "jsonl": (_json_lines, _plain, "line", False),
}
