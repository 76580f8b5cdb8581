"""Write the tiny T5 tokenizer that builtin:tiny-flux ships with (its second text encoder's).

Like T5's own it is a Unigram model over SentencePiece pieces (`▁` marks a word start),
with `<pad>`, `</s>`, `<unk>` at ids 0, 1, 2 and `</s>` appended to every sequence. The
pieces are the printable ASCII characters and whole words from the CLIP tokenizer's word
list; a whole word scores higher than its spelling, so known words stay one token. It
needs no download and is small enough to commit. Run from the repository root to
regenerate `batching/assets/tiny-t5-tokenizer/`:

    python -m training.tokenizers.make_t5_tokenizer
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import Unigram

from batching.builtin_models.components import ASSETS_DIR
from training.tokenizers.make_tokenizer import WORDS, write_tokenizer_files

OUT_DIR = ASSETS_DIR / "tiny-t5-tokenizer"
PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "</s>", "<unk>"
WORD_START = "▁"
MODEL_MAX_LENGTH = 512  # FLUX.1-dev's T5 sequence length

# Log-probabilities: any known word beats spelling it out from characters.
WORD_SCORE, WORD_START_SCORE, CHAR_SCORE = -5.0, -3.0, -10.0


def build_pieces() -> list[tuple[str, float]]:
    specials = [(PAD_TOKEN, 0.0), (EOS_TOKEN, 0.0), (UNK_TOKEN, 0.0)]
    chars = [(chr(code), CHAR_SCORE) for code in range(ord("!"), ord("~") + 1)]
    words = [(WORD_START + word, WORD_SCORE) for word in WORDS]
    return specials + [(WORD_START, WORD_START_SCORE)] + chars + words


def build_tokenizer() -> Tokenizer:
    pieces = build_pieces()
    assert len(pieces) == len({piece for piece, _ in pieces})
    tokenizer = Tokenizer(Unigram(pieces, unk_id=2, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always", split=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme="always", split=True)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=["$A", EOS_TOKEN], pair=["$A", EOS_TOKEN, "$B", EOS_TOKEN], special_tokens=[(EOS_TOKEN, 1)]
    )
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)])
    return tokenizer


def write_tokenizer(out_dir: Path = OUT_DIR) -> Path:
    settings = {"eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN, "pad_token": PAD_TOKEN, "extra_ids": 0}
    return write_tokenizer_files(out_dir, "T5Tokenizer", MODEL_MAX_LENGTH, settings, build_tokenizer())


if __name__ == "__main__":
    print(write_tokenizer())
