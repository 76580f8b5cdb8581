"""Write the tiny CLIP tokenizer that the built-in model ships with.

The vocabulary is CLIP's byte-level alphabet (256 characters and their end-of-word
`</w>` forms), whole-word merges for a short list of words common in prompts, and
the two special tokens. It needs no download and is small enough to commit.
Run from the repository root to regenerate `batching/assets/tiny-clip-tokenizer/`:

    python -m training.tokenizers.make_tokenizer
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batching.builtin_models.components import ASSETS_DIR

if TYPE_CHECKING:
    from tokenizers import Tokenizer

OUT_DIR = ASSETS_DIR / "tiny-clip-tokenizer"
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 77

WORDS = """
a an the of in on at with and or by to from for is under over near behind
photo photograph painting drawing portrait landscape illustration render sketch
red orange yellow green blue purple pink brown black white gray golden silver
fox cat dog bird horse cow fish owl wolf bear lion tiger rabbit dragon robot
man woman girl boy child person people face eyes hair
tree trees forest flower flowers grass garden river lake sea ocean beach
mountain mountains hill sky cloud clouds sun moon star stars night day
sunset sunrise snow rain fog winter summer autumn spring
house city street road bridge castle tower room window door car boat train
small big large tiny old young new dark bright light soft sharp detailed
beautiful cute happy sad quiet calm highly quality best style art digital oil
watercolor cinematic lighting background high resolution
""".split()


def bytes_to_unicode() -> dict[int, str]:
    """CLIP's (and GPT-2's) reversible map from bytes to printable characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def whole_word_merges(words: list[str]) -> list[tuple[str, str]]:
    """Left-to-right merges that turn each word into a single `word</w>` token."""
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for word in words:
        if len(word) < 2:
            continue
        prefix = word[0]
        for index, char in enumerate(word[1:], start=1):
            right = char + "</w>" if index == len(word) - 1 else char
            pair = (prefix, right)
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            prefix += char
    return merges


def build_vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    alphabet = list(bytes_to_unicode().values())
    tokens = alphabet + [char + "</w>" for char in alphabet]
    tokens += ["".join(pair) for pair in merges]
    tokens += [BOS_TOKEN, EOS_TOKEN]
    assert len(tokens) == len(set(tokens))
    return {token: index for index, token in enumerate(tokens)}


def write_tokenizer_files(
    out_dir: Path,
    tokenizer_class: str,
    model_max_length: int,
    settings: dict[str, Any],
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write `tokenizer_config.json` (class, maximum length, then `settings`) and, for a `tokenizers` tokenizer,
    its `tokenizer.json`, into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    config = {"tokenizer_class": tokenizer_class, "model_max_length": model_max_length, **settings}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out_dir


def write_tokenizer(out_dir: Path = OUT_DIR) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    merges = whole_word_merges(WORDS)
    vocab = build_vocab(merges)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{left} {right}" for left, right in merges]
    (out_dir / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    return write_tokenizer_files(out_dir, "CLIPTokenizer", MODEL_MAX_LENGTH, {**special, "do_lower_case": True})


if __name__ == "__main__":
    print(write_tokenizer())
