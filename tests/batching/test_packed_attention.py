"""Packed rows (batching.pipelines.packing) and attention per segment (batching.pipelines.packed_attention).

Every DiT family's packed forward rests on these: a row's tokens found by their offsets, joined with
another stream's row by row, and attention that never lets one row's queries see another row's keys.
The engine-level guarantees (each job equal to itself alone, no padding position) are in
test_families.py; here, the parts, and which kernel runs where.
"""

from __future__ import annotations

import pytest
import torch

from batching.pipelines.packed_attention import attend, attention_kernel
from batching.pipelines.packing import Joint, Segments

CPU = torch.device("cpu")


def test_flash_attention_s_varlen_kernel_is_chosen_on_cuda_in_half_precision_and_sdpa_everywhere_else():
    cuda = torch.device("cuda")

    assert attention_kernel(cuda, torch.bfloat16, 128) == "varlen"
    assert attention_kernel(cuda, torch.float16, 64) == "varlen"
    assert attention_kernel(cuda, torch.float32, 128) == "sdpa", "FlashAttention takes half precision only"
    assert attention_kernel(cuda, torch.bfloat16, 260) == "sdpa", "a head larger than FlashAttention's 256"
    assert attention_kernel(CPU, torch.bfloat16, 128) == "sdpa"
    assert attention_kernel(CPU, torch.float32, 128) == "sdpa"


def row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """One row alone, as diffusers' native attention runs it: [tokens, heads, head_dim]."""
    heads_first = [t[None].transpose(1, 2) for t in (query, key, value)]
    return torch.nn.functional.scaled_dot_product_attention(*heads_first).transpose(1, 2)[0]


@pytest.mark.parametrize("lengths", [(5, 20, 11), (8, 8, 8)], ids=["rows of their own lengths", "equal rows"])
def test_each_row_attends_to_its_own_tokens_only_as_it_would_alone(lengths):
    generator = torch.Generator().manual_seed(0)
    rows = Segments(lengths, CPU)
    query, key, value = (torch.randn(rows.num_tokens, 4, 16, generator=generator) for _ in range(3))

    out = attend(query, key, value, rows, rows)

    for own, row_query, row_key, row_value in zip(rows.split(out), *(rows.split(t) for t in (query, key, value))):
        torch.testing.assert_close(own, row_attention(row_query, row_key, row_value), rtol=1e-6, atol=1e-6)
    changed = key.clone()
    changed[: lengths[0]] += 10.0  # the first row's keys
    other_rows = slice(lengths[0], None)
    assert torch.equal(attend(query, changed, value, rows, rows)[other_rows], out[other_rows]), "rows never meet"


def test_queries_attend_to_their_own_row_of_a_context_of_another_length():
    generator = torch.Generator().manual_seed(1)
    query_rows, context_rows = Segments((6, 14), CPU), Segments((3, 3), CPU)
    query = torch.randn(query_rows.num_tokens, 2, 8, generator=generator)
    key, value = (torch.randn(context_rows.num_tokens, 2, 8, generator=generator) for _ in range(2))

    out = attend(query, key, value, query_rows, context_rows)

    for own, row_query, row_key, row_value in zip(
        query_rows.split(out), query_rows.split(query), context_rows.split(key), context_rows.split(value)
    ):
        torch.testing.assert_close(own, row_attention(row_query, row_key, row_value), rtol=1e-6, atol=1e-6)


def test_two_streams_join_row_by_row_and_come_apart_unchanged():
    text, image = Segments((2, 2, 2), CPU), Segments((1, 4, 2), CPU)
    text_tokens = torch.arange(6)[:, None] + 100  # row r's text: 100 + 2r, 101 + 2r
    image_tokens = torch.arange(7)[:, None]
    joint = Joint((text, image))

    joined = joint.join(text_tokens, image_tokens)

    assert joined[:, 0].tolist() == [100, 101, 0, 102, 103, 1, 2, 3, 4, 104, 105, 5, 6]
    assert joint.segments.lengths == (3, 6, 4)
    back_text, back_image = joint.unjoin(joined)
    assert torch.equal(back_text, text_tokens) and torch.equal(back_image, image_tokens)


def test_a_row_s_values_reach_its_tokens_and_a_subset_of_rows_packs_on_its_own():
    rows = Segments((3, 1, 2), CPU)

    assert rows.per_token(torch.tensor([10, 20, 30])).tolist() == [10, 10, 10, 20, 30, 30]
    assert rows.cu_seqlens.tolist() == [0, 3, 4, 6]
    selected, index = rows.select([0, 2])
    assert selected.lengths == (3, 2) and index.tolist() == [0, 1, 2, 4, 5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's varlen kernel runs on CUDA only")
def test_on_cuda_the_varlen_kernel_equals_attention_row_by_row():
    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(2)
    rows = Segments((77, 300, 129), device)
    query, key, value = (
        torch.randn(rows.num_tokens, 8, 64, generator=generator, device=device, dtype=torch.bfloat16) for _ in range(3)
    )
    assert attention_kernel(device, query.dtype, 64) == "varlen"

    out = attend(query, key, value, rows, rows)

    for own, row_query, row_key, row_value in zip(rows.split(out), *(rows.split(t) for t in (query, key, value))):
        torch.testing.assert_close(own, row_attention(row_query, row_key, row_value), rtol=2e-2, atol=2e-2)


def test_a_layout_is_kept_while_its_rows_run_and_rows_of_unknown_identity_get_a_fresh_one():
    from batching.pipelines.packing import LayoutCache

    builds: list[str] = []
    cache: LayoutCache[str] = LayoutCache(size=2)

    def build(name: str):
        return lambda: builds.append(name) or name

    for key in ("group a", "group b", "group a", "group b"):  # two groups in turn: each built once
        assert cache.get((key,), build(key)) == key
    cache.get(None, build("unknown"))
    cache.get(None, build("unknown"))
    cache.get(("group c",), build("group c"))  # a third group: the least recently used one goes
    cache.get(("group a",), build("group a"))

    assert builds == ["group a", "group b", "unknown", "unknown", "group c", "group a"]
