"""Builds the embedded default models locally: no download, random weights, a tokenizer trained here.

``python -m engines.tiny_model KIND OUT_DIR`` with KIND ``tiny`` (Llama) or
``tiny_vlm``. Runs under an engine's interpreter (it needs torch, transformers
and tokenizers); the harness calls it when a model directory is missing.
Deterministic: fixed seeds, a fixed corpus, and the same sizes every time.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_SIZE = 2048


def corpus() -> list[str]:
    """A fixed, varied text for training the tokenizer (generated, no data set needed)."""
    import random

    rng = random.Random(1234)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words = ["".join(rng.choice(letters[: rng.randint(6, 26)]) for _ in range(rng.randint(1, 9)))
             for _ in range(3000)]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + rng.choice(".?!,;:")
             for _ in range(4000)]
    return lines + [str(i) for i in range(1000)] + ["<|system|> <|user|> <|assistant|>"]


def build_tokenizer(extra_special: list[str] = ()):  # type: ignore[assignment]
    """A byte-level BPE tokenizer trained on ``corpus()`` and wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                      unk_token="<unk>", pad_token="<pad>")
    if extra_special:
        wrapped.add_special_tokens({"additional_special_tokens": list(extra_special)})
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def llama_config(vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False, torch_dtype="float32",
    )


def build_tiny(out: Path) -> None:
    """A 4-layer Llama with random weights and the local tokenizer."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = LlamaForCausalLM(llama_config(len(tokenizer)))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def build_tiny_vlm(out: Path) -> None:
    """The tiny Idefics3 vision-language model (see ``engines.tiny_vlm``)."""
    from engines.tiny_vlm import build_tiny_vlm as build_vlm

    build_vlm(out)


BUILDERS = {"tiny": build_tiny, "tiny_vlm": build_tiny_vlm}


def build(kind: str, out_dir: str | os.PathLike) -> Path:
    """Build ``kind`` into ``out_dir`` atomically (a half-built model never appears there)."""
    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    if kind not in BUILDERS:
        raise SystemExit(f"unknown tiny model kind {kind!r}; known: {', '.join(BUILDERS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        BUILDERS[kind](tmp)
        (tmp / "troughput_build.json").write_text(json.dumps({"kind": kind}))
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():  # lost a race with another builder: theirs is as good
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m engines.tiny_model KIND OUT_DIR")
    print(build(sys.argv[1], sys.argv[2]))
