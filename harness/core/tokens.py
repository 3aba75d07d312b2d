"""What the harness needs to know about a model's vocabulary, read from its files.

Only ``config.json`` and ``tokenizer.json`` are read here (plain JSON); text is
tokenized through ``transformers.AutoTokenizer`` only for users' files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from harness.core.errors import TroughputError


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

    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer  # tokenizer only, never model code

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))

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
