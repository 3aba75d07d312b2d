"""The tiny Llama of the embedded default: random weights and a tokenizer trained here, no download.

Built by ``python -m engines.build_tiny tiny OUT_DIR`` (``engines.build_tiny``); the tiny
VLM (``engines.tiny_vlm``) reuses its tokenizer and text config. Needs torch,
transformers and tokenizers. Deterministic: fixed seeds, a fixed corpus, and the same
sizes every time.
"""

from __future__ import annotations

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
