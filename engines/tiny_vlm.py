"""A tiny Idefics3 vision-language model with random weights, built locally (no download).

Why Idefics3: vLLM's ``idefics3`` module imports without torchvision (LLaVA, Qwen-VL,
Gemma3 and most others do not), its text side is a plain Llama (the same tiny one as
``engines.tiny_model``), transformers ships a PIL/numpy image processor for it
(``Idefics3ImageProcessorPil``), and vLLM expands ONE ``<image>`` token per image in a
prompt into the model's full image run, so token-id prompts stay simple.

Sizes: 224x224 images, patch 14 -> 16x16 patches, pixel-shuffle scale 2 -> 64 ``<image>``
tokens per image; vision tower 2 layers x 64 wide; text model ``llama_config`` from
``engines.tiny_model`` (its head_dim must stay >= 32: vLLM's CPU attention rejects 16).
Image splitting is off, so every image is one 224x224 tile whatever its size:
vLLM turns one ``<image>`` into ``<fake_token_around_image><global-img>`` + 64 x
``<image>`` + ``<fake_token_around_image>`` (67 tokens).
"""

from __future__ import annotations

from pathlib import Path

from engines.tiny_model import build_tokenizer, llama_config

IMAGE_TOKEN = "<image>"
# The Idefics3 processor looks these up by name; all must be single tokens in the vocabulary.
VLM_SPECIAL_TOKENS = [IMAGE_TOKEN, "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
IMAGE_SIZE = 224
PATCH_SIZE = 14
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # 64


def build_tiny_vlm(out: Path) -> None:
    """Write config, safetensors weights, tokenizer and processor configs for the tiny VLM to ``out``."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    torch.manual_seed(0)
    tokenizer = build_tokenizer(extra_special=VLM_SPECIAL_TOKENS)
    text = llama_config(len(tokenizer))
    config = Idefics3Config(
        text_config=text.to_dict(),
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE),
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        pad_token_id=text.pad_token_id, bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
        tie_word_embeddings=False,
    )
    Idefics3ForConditionalGeneration(config).save_pretrained(out, safe_serialization=True)

    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
    )
    Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                      image_seq_len=IMAGE_SEQ_LEN).save_pretrained(out)

