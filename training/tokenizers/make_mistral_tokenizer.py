"""Write the tiny Mistral tokenizer that builtin:tiny-flux2 ships with (its Mistral 3 text encoder's).

Like Mistral's Tekken tokenizer it is byte-level BPE with the control tokens first
(`<unk>`, `<s>`, `</s>`, `[INST]`, `[/INST]`, `[IMG]`, `<pad>`, `[IMG_BREAK]`,
`[IMG_END]`, `[SYSTEM_PROMPT]`, `[/SYSTEM_PROMPT]`), then the 256 byte characters, then
merges that make whole words single tokens: the prompt words, and the words of the
system message FLUX.2's pipeline puts before every prompt. Its chat template renders a
conversation as Mistral Small 3's does for what `Flux2Pipeline` asks (a system message,
one user message of text blocks, no generation prompt):

    <s>[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT][INST]{prompt}[/INST]

FLUX.2-dev's own `tokenizer` folder is a `PixtralProcessor` (this tokenizer plus an image
processor for the text encoder's vision tower). Transformers builds that processor only
with torchvision, which this project does not install; the pipeline's prompt encoding
calls only its `apply_chat_template` on text, which the tokenizer alone answers the same
way, so the built-in ships the tokenizer. It needs no download and is small enough to
commit. Run from the repository root to regenerate `batching/assets/tiny-mistral-tokenizer/`:

    python -m training.tokenizers.make_mistral_tokenizer
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from batching.builtin_models.components import ASSETS_DIR
from training.tokenizers.make_qwen_tokenizer import PRETOKENIZE_PATTERN, SPACE_MARKER, whole_word_merges
from training.tokenizers.make_tokenizer import WORDS, bytes_to_unicode, write_tokenizer_files

OUT_DIR = ASSETS_DIR / "tiny-mistral-tokenizer"
UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
CONTROL_TOKENS = (
    *(UNK, BOS, EOS, "[INST]", "[/INST]", "[IMG]", PAD, "[IMG_BREAK]", "[IMG_END]"),
    *("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
)
MODEL_MAX_LENGTH = 512  # Flux2Pipeline's max_sequence_length
# The words of diffusers' FLUX.2 system message (pipelines/flux2/system_messages.py), so it is a few tokens.
SYSTEM_WORDS = """
You are AI that reasons about image descriptions give structured responses focusing object
relationships attribution actions without speculation
""".split()

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set blocks = [{'type': 'text', 'text': message['content']}] -%}"
    "{%- else -%}{%- set blocks = message['content'] -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[INST]' -}}{%- endif -%}"
    "{%- for block in blocks -%}"
    "{%- if block['type'] == 'text' -%}{{- block['text'] -}}{%- else -%}{{- '[IMG]' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if message['role'] == 'system' -%}{{- '[/SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[/INST]' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)


def build_tokenizer() -> Tokenizer:
    words = WORDS + SYSTEM_WORDS
    merges = whole_word_merges(words + [SPACE_MARKER + word for word in words])
    tokens = list(CONTROL_TOKENS) + list(bytes_to_unicode().values()) + [left + right for left, right in merges]
    assert len(tokens) == len(set(tokens))
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=UNK, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in CONTROL_TOKENS])
    return tokenizer


def write_tokenizer(out_dir: Path = OUT_DIR) -> Path:
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    settings = {**special, "padding_side": "right", "add_prefix_space": False, "chat_template": CHAT_TEMPLATE}
    return write_tokenizer_files(out_dir, "PreTrainedTokenizerFast", MODEL_MAX_LENGTH, settings, build_tokenizer())


if __name__ == "__main__":
    print(write_tokenizer())
