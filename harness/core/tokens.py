"""What the harness needs to know about a model's vocabulary, read from its files.

Only ``config.json`` and ``tokenizer.json`` are read here (plain JSON); text is
tokenized through the class ``transformers.AutoTokenizer`` picks only for users' files.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from harness.core.errors import TroughputError

CLASS_DIR = Path(__file__).resolve().parents[2] / ".cache" / "troughput" / "tokenizer_class"


@dataclass
class Vocabulary:
    """The ordinary token ids of a model (no special or added tokens) and its named special ids."""

    model_dir: Path

    @cached_property
    def _tokenizer_json(self) -> dict:
        path = self.model_dir / "tokenizer.json"
        if not path.exists():
            raise TroughputError(f"{path} not found: the model needs a fast tokenizer (tokenizer.json)")
        return json.loads(path.read_text())

    @cached_property
    def added_tokens(self) -> dict[str, int]:
        return {t["content"]: int(t["id"]) for t in self._tokenizer_json.get("added_tokens", [])}

    @cached_property
    def ordinary_ids(self) -> np.ndarray:
        """Ids that are safe to put in a synthetic prompt."""
        model_vocab = self._tokenizer_json.get("model", {}).get("vocab", {})
        size = len(model_vocab) if model_vocab else _config_vocab_size(self.model_dir)
        return np.setdiff1d(np.arange(size, dtype=np.int64), np.array(sorted(self.added_tokens.values()), dtype=np.int64))

    def token_id(self, token: str) -> int:
        """The id of an added token such as ``<image>``."""
        try:
            return self.added_tokens[token]
        except KeyError:
            raise TroughputError(f"token {token!r} is not an added token of the tokenizer in {self.model_dir}") from None

    def random_tokens(self, n: int, rng: np.random.Generator) -> list[int]:
        ids = self.ordinary_ids
        return ids[rng.integers(0, len(ids), size=n)].tolist()


def _config_vocab_size(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not size:
        raise TroughputError(f"cannot tell the vocabulary size of {model_dir}")
    return int(size)


class TextTokenizer:
    """Turns users' text (and chat messages) into token ids with the model's own tokenizer."""

    def __init__(self, model_dir: Path, class_dir: Path = CLASS_DIR):
        self._tok = load_tokenizer(Path(model_dir), class_dir)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if not getattr(self._tok, "chat_template", None):
            raise TroughputError("the model's tokenizer has no chat template, needed for chat requests")
        ids = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]


def load_tokenizer(model_dir: Path, class_dir: Path = CLASS_DIR):
    """``AutoTokenizer.from_pretrained(model_dir)``, or the same call on the class it returned before.

    ``transformers.AutoTokenizer``'s module imports torch (seconds per process: each troughput-batch
    driver paid them); its ``TokenizersBackend``, the class it picks for most fast tokenizers, does not.
    Which class it picked is recorded in ``class_dir`` under a key of the transformers version, the folder
    and the two files its choice reads (``config.json``, ``tokenizer_config.json``); with such a record,
    ``TokenizersBackend.from_pretrained`` is called directly, as ``AutoTokenizer`` would have (tokenizer
    only, never model code). Any other class goes through ``AutoTokenizer`` every time.
    """
    record = class_dir / f"{_class_key(model_dir)}.json"
    try:
        known = json.loads(record.read_text())["class"]
    except (OSError, ValueError, KeyError):
        known = None
    if known == BACKEND:
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    name = f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}"
    try:   # a read-only checkout (or node) just loads through AutoTokenizer each time
        class_dir.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"class": name, "model_dir": str(model_dir.resolve())}))
        os.replace(tmp, record)
    except OSError:
        pass
    return tokenizer


BACKEND = "transformers.tokenization_utils_tokenizers.TokenizersBackend"


def _class_key(model_dir: Path) -> str:
    from importlib.metadata import version

    digest = hashlib.sha256(f"{version('transformers')}\0{model_dir.resolve()}".encode())
    for name in ("config.json", "tokenizer_config.json"):
        path = model_dir / name
        digest.update(b"\0" + (path.read_bytes() if path.is_file() else b"-"))
    return digest.hexdigest()[:32]
