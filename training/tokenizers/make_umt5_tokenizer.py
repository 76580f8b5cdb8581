"""Write the tiny UMT5 tokenizer that the Wan built-ins ship with (builtin:tiny-wan, -wan-i2v, -wan22).

Wan's text encoder is UMT5-XXL, whose tokenizer is T5's kind, loaded as `T5Tokenizer` (a Unigram
model over SentencePiece pieces, `▁` marking a word start, `<pad>`, `</s>`, `<unk>` at ids 0, 1, 2
and `</s>` after every sequence) over a multilingual vocabulary. This one keeps the tiny T5
tokenizer's pieces (`make_t5_tokenizer`: printable ASCII and whole English words) and adds, as
single-character pieces, the characters of the Chinese negative prompt Wan's model cards recommend
(`WAN_NEGATIVE_PROMPT`), so that prompt encodes without `<unk>`. (No byte pieces: transformers'
`T5Tokenizer` builds its Unigram model without byte fallback, for UMT5's real vocabulary too.) Run
from the repository root to regenerate `batching/assets/tiny-umt5-tokenizer/`:

    python -m training.tokenizers.make_umt5_tokenizer
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from batching.builtin_models.components import ASSETS_DIR
from training.tokenizers import make_t5_tokenizer
from training.tokenizers.make_t5_tokenizer import CHAR_SCORE, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN, WORD_SCORE, WORD_START
from training.tokenizers.make_tokenizer import write_tokenizer_files

OUT_DIR = ASSETS_DIR / "tiny-umt5-tokenizer"
MODEL_MAX_LENGTH = 512  # WanPipeline's max_sequence_length
WAN_NEGATIVE_PROMPT = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，"
    "丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，"
    "静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)


def build_tokenizer(extra_words: tuple[str, ...] = ()) -> Tokenizer:
    """The tokenizer; `extra_words` (builtin:shapes-wan's prompt words the shared list lacks) become whole-word
    pieces after the others, so every other id stays as the Wan built-ins have it."""
    from tokenizers.models import Unigram

    characters = sorted({char for char in WAN_NEGATIVE_PROMPT if not char.isascii()})
    pieces = make_t5_tokenizer.build_pieces() + [(char, CHAR_SCORE) for char in characters]
    known = {piece for piece, _ in pieces}
    words = [WORD_START + word for word in dict.fromkeys(extra_words)]
    pieces += [(word, WORD_SCORE) for word in words if word not in known]
    assert len(pieces) == len({piece for piece, _ in pieces})
    tokenizer = make_t5_tokenizer.build_tokenizer()
    tokenizer.model = Unigram(pieces, unk_id=2, byte_fallback=False)
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)])
    return tokenizer


def write_tokenizer(out_dir: Path = OUT_DIR, extra_words: tuple[str, ...] = ()) -> Path:
    settings = {"eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN, "pad_token": PAD_TOKEN, "extra_ids": 0}
    return write_tokenizer_files(out_dir, "T5Tokenizer", MODEL_MAX_LENGTH, settings, build_tokenizer(extra_words))


if __name__ == "__main__":
    print(write_tokenizer())
