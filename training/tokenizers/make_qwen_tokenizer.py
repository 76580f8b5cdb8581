"""Write the tiny Qwen tokenizer that builtin:tiny-zimage ships with (its Qwen3 text encoder's).

Like Qwen2/Qwen3's own it is byte-level BPE: the 256 byte characters, merges that make
whole words single tokens (with and without the leading-space marker `Ġ`), no BOS, and
the chat special tokens. Its chat template renders a conversation the way Qwen3's does
for what the Z-Image family's pipeline asks (one user message, a generation prompt, thinking enabled;
batching/pipelines/zimage/adapter.py):

    <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n

It needs no download and is small enough to commit. Run from the repository root to
regenerate `batching/assets/tiny-qwen-tokenizer/`:

    python -m training.tokenizers.make_qwen_tokenizer
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from batching.builtin_models.components import ASSETS_DIR
from training.tokenizers.make_tokenizer import WORDS, bytes_to_unicode, write_tokenizer_files

OUT_DIR = ASSETS_DIR / "tiny-qwen-tokenizer"
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK_TOKENS = ("<think>", "</think>")  # Qwen3 adds them as ordinary (not special) tokens
SPACE_MARKER = bytes_to_unicode()[ord(" ")]  # "Ġ"
MODEL_MAX_LENGTH = 512  # the Z-Image pipeline's max_sequence_length
CHAT_WORDS = ["user", "assistant", "system"]

# Qwen2's pre-tokenizer split: contractions, letters with one leading non-letter, single
# digits, punctuation runs, newlines, spaces.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def apply_merges(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """BPE on one word: repeatedly merge the adjacent pair of lowest rank."""
    while len(symbols) > 1:
        pairs = [(ranks.get(pair, len(ranks)), index) for index, pair in enumerate(zip(symbols, symbols[1:]))]
        rank, index = min(pairs)
        if rank == len(ranks):
            break
        symbols = symbols[:index] + [symbols[index] + symbols[index + 1]] + symbols[index + 2 :]
    return symbols


def whole_word_merges(words: list[str]) -> list[tuple[str, str]]:
    """Merges that make each word one token under BPE's lowest-rank-first rule.

    Each word's new merges join what the earlier merges already make of it, left to
    right, and rank after every earlier merge; so they cannot break an earlier word,
    and no earlier merge can split this one differently.
    """
    ranks: dict[tuple[str, str], int] = {}
    for word in words:
        pieces = apply_merges(list(word), ranks)
        prefix = pieces[0]
        for piece in pieces[1:]:
            ranks.setdefault((prefix, piece), len(ranks))
            prefix += piece
    return list(ranks)


def build_tokenizer(extra_pieces: Sequence[str] = (), extra_special_tokens: Sequence[str] = ()) -> Tokenizer:
    """`extra_pieces`: byte-level pre-tokens (after WORDS, so they change no earlier word) each made one token;
    `extra_special_tokens`: added after the chat ones."""
    words = WORDS + CHAT_WORDS
    merges = whole_word_merges(words + [SPACE_MARKER + word for word in words] + list(extra_pieces))
    alphabet = list(bytes_to_unicode().values())
    tokens = alphabet + [left + right for left, right in merges]
    assert len(tokens) == len(set(tokens))
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    special_tokens = (END_OF_TEXT, IM_START, IM_END, *extra_special_tokens)
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in special_tokens])
    tokenizer.add_tokens([AddedToken(token, special=False) for token in THINK_TOKENS])
    return tokenizer


def write_tokenizer(out_dir: Path = OUT_DIR) -> Path:
    special = {"bos_token": None, "eos_token": IM_END, "pad_token": END_OF_TEXT, "unk_token": None}
    settings = {**special, "padding_side": "right", "add_prefix_space": False, "chat_template": CHAT_TEMPLATE}
    return write_tokenizer_files(out_dir, "Qwen2Tokenizer", MODEL_MAX_LENGTH, settings, build_tokenizer())


if __name__ == "__main__":
    print(write_tokenizer())
