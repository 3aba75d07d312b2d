"""Image content parts of a batch file as local files: ``data:`` URLs, local paths, remote URLs when allowed.

Decoded and fetched images are stored under their content's sha256, so a repeated image
is one file (and one multimodal cache entry). Each image is opened and checked here, so
a broken one is an error for its request, not a failed shard.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import urllib.parse
import urllib.request
from pathlib import Path

from harness.workloads.fields import RecordError, as_object
from harness.workloads.records import IMAGE_PART_TYPES, ImageResolver

REMOTE = ("http://", "https://")
FETCH_TIMEOUT_S = 30


def image_resolver(placeholder: str | None, store: Path, base_dir: Path, allow_remote: bool,
                   read: dict[str, bytes | None] | None = None) -> ImageResolver | None:
    """A resolver for ``harness.workloads.records``; ``None`` when the model takes no images (no placeholder).

    Args:
        placeholder: the model's image token, put in the prompt once per image.
        store: where decoded and fetched images are written.
        base_dir: what a relative local path is relative to (the input file's folder).
        allow_remote: fetch ``http(s)`` URLs; otherwise such a part is an error.
        read: local images already read where the input is (``local_images``: path -> bytes, ``None`` for a file
            that was not there); given, a local path is looked up here, never on this node's disk, and its bytes
            are stored under ``store`` (``batch.scale=ray``: conversion runs on any node).
    """
    if not placeholder:
        return None

    def resolve(part: dict, at: str) -> tuple[str, str]:
        url = _url(part, at)
        if url.startswith("data:"):
            return placeholder, _store(_decode_data_url(url, at), store, at)
        if url.startswith(REMOTE):
            if not allow_remote:
                raise RecordError(f"{at}: remote image {url[:80]!r} not fetched; troughput reads no network "
                                  f"unless you allow it (batch.allow_remote_images=true)")
            return placeholder, _store(_fetch(url, at), store, at)
        path = local_path(url, base_dir)
        if read is not None:
            data = read.get(str(path))
            if data is None:
                raise RecordError(f"{at}: image file {str(path)!r} not found (on the input's node)")
            return placeholder, _store(data, store, at)
        if not path.is_file():
            raise RecordError(f"{at}: image file {str(path)!r} not found")
        _check(path.read_bytes(), at)
        return placeholder, str(path)

    return resolve


def local_path(url: str, base_dir: Path) -> Path:
    """A local image's path (``file://`` or a path, relative to ``base_dir``)."""
    path = Path(urllib.parse.unquote(url.removeprefix("file://"))).expanduser()
    return path if path.is_absolute() else base_dir / path


def local_images(records: list[tuple[str, int, object]], base_dir: Path) -> dict[str, bytes | None]:
    """The bytes of every local image the records' chat messages name (``None`` where the file is not there), read
    here: where the input is (``batch.scale=ray``'s read stage, on the driver's node), so they travel with the
    records to a convert task on any node. Records too broken to walk are left to the converter to report."""
    found: dict[str, bytes | None] = {}
    for _, _, record in records:
        body = record.get("body") if isinstance(record, dict) else None
        messages = body.get("messages") if isinstance(body, dict) else None
        for message in messages if isinstance(messages, list) else []:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, dict) or part.get("type") not in IMAGE_PART_TYPES:
                    continue
                try:
                    url = _url(part, "")
                except RecordError:
                    continue
                if url.startswith("data:") or url.startswith(REMOTE):
                    continue
                path = local_path(url, base_dir)
                if str(path) not in found:
                    found[str(path)] = path.read_bytes() if path.is_file() else None
    return found


def _url(part: dict, at: str) -> str:
    """The URL or path of an OpenAI ``image_url`` part (``{"url": ...}`` or a string), or ``input_image``/``image``."""
    kind = part["type"]
    value = part.get("image_url") if kind in ("image_url", "input_image") else part.get("image")
    if isinstance(value, dict):
        value = as_object(value, f"{at}.{kind}").get("url")
    if not isinstance(value, str) or not value:
        raise RecordError(f"{at}: an image part needs a URL or path in '{kind}'"
                          + (".url" if kind == "image_url" else ""))
    return value


def _decode_data_url(url: str, at: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise RecordError(f"{at}: a data: URL image must be base64 (data:image/...;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RecordError(f"{at}: the data: URL is not valid base64 ({e})") from None


def _fetch(url: str, at: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 - allowed by the user
            return response.read()
    except OSError as e:
        raise RecordError(f"{at}: cannot fetch image {url[:80]!r}: {e}") from None


def _store(data: bytes, store: Path, at: str) -> str:
    return str(stored(data, store, "." + _check(data, at)))


def stored(data: bytes, store: Path, suffix: str) -> Path:
    """``data`` in ``store`` named by its SHA-256 (plus ``suffix``), written once and atomically."""
    path = store / f"{hashlib.sha256(data).hexdigest()}{suffix}"
    if not path.exists():
        store.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


def _check(data: bytes, at: str) -> str:
    """The image format's usual file suffix; ``RecordError`` when the bytes are no image PIL can read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
            kind = (image.format or "img").lower()
        with Image.open(io.BytesIO(data)) as image:  # decoded as the engines will: verify() passes a truncated JPEG,
            image.convert("RGB")                     # whose OSError in an engine would end the worker, not the request
        return kind
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise RecordError(f"{at}: not a readable image ({e})") from None
