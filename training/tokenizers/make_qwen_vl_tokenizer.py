"""Write the tiny Qwen2.5-VL tokenizer that builtin:tiny-qwen-image and builtin:tiny-qwen-image-edit ship with.

It is the tiny Qwen tokenizer of `make_qwen_tokenizer` (byte-level BPE, whole-word merges,
the chat special tokens) plus what the Qwen-Image pipelines need of Qwen2.5-VL's:
- the vision special tokens (`<|vision_start|>`, `<|image_pad|>`, ...), which the edit
  pipeline's processor expands into one token per merged image patch;
- every pre-token of the two pipelines' system prompts as one token, so each prompt
  template's system part is exactly as many tokens as with Qwen2.5-VL's own tokenizer
  (34 for `QwenImagePipeline`, 64 for `QwenImageEditPipeline`): the tokens the pipelines
  drop before handing the text encoder's states to the transformer are the system part.

Run from the repository root to regenerate `batching/assets/tiny-qwen-vl-tokenizer/`:

    python -m training.tokenizers.make_qwen_vl_tokenizer
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, pre_tokenizers

from batching.builtin_models.components import ASSETS_DIR
from training.tokenizers.make_qwen_tokenizer import (
    CHAT_TEMPLATE,
    END_OF_TEXT,
    IM_END,
    PRETOKENIZE_PATTERN,
    build_tokenizer,
)
from training.tokenizers.make_tokenizer import bytes_to_unicode, write_tokenizer_files

OUT_DIR = ASSETS_DIR / "tiny-qwen-vl-tokenizer"
MODEL_MAX_LENGTH = 131072  # Qwen2.5-VL's; the pipelines truncate (or not) themselves
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")

# The system parts of the pipelines' prompt templates (diffusers 0.42.1), up to the user's text.
SYSTEM_PROMPTS = (
    "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of "
    "the objects and background:",
    "Describe the key features of the input image (color, shape, size, texture, objects, background), then "
    "explain how the user's text instruction should alter or modify the image. Generate a new image that meets "
    "the user's requirements while maintaining consistency with the original input where appropriate.",
)


def system_prompt_pieces() -> list[str]:
    """The byte-level pre-tokens of the system prompts, as Qwen2's pre-tokenizer splits them."""
    to_unicode = bytes_to_unicode()
    split = pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False)
    pieces = [piece for text in SYSTEM_PROMPTS for piece, _ in split.pre_tokenize_str(text)]
    byte_level = ("".join(to_unicode[byte] for byte in piece.encode("utf-8")) for piece in pieces)
    return list(dict.fromkeys(piece for piece in byte_level if len(piece) > 1))


def write_tokenizer(out_dir: Path = OUT_DIR) -> Path:
    special = {"bos_token": None, "eos_token": IM_END, "pad_token": END_OF_TEXT, "unk_token": None}
    settings = {**special, "padding_side": "right", "add_prefix_space": False, "chat_template": CHAT_TEMPLATE}
    tokenizer = build_tokenizer(system_prompt_pieces(), VISION_TOKENS)
    return write_tokenizer_files(out_dir, "Qwen2Tokenizer", MODEL_MAX_LENGTH, settings, tokenizer)


if __name__ == "__main__":
    print(write_tokenizer())
