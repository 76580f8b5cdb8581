"""DeepCache for `UNet2DConditionModel` (the SD and SDXL families), decided per sample in one forward.

The UNet's forward split at its shallowest skip connection: the time (and SDXL's added)
embedding, `conv_in` and the first down block run on every row; each caching sample's
first-down-block output is compared with the one at its last full step
(`step_cache_rows.decide`). The deep path (the other down blocks, the mid block and every
up block but the last) runs only on the rows of samples that compute, gathered into a
smaller batch; a sample that skips takes, as the last up block's input, what the deep path
gave it at its last full step (DeepCache's cached high-level features). The last up block
(with the shallow skip connections of this step) and the output convolution run on every
row. The calls are the model's own blocks, in the order of its forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines.contract import CachedForward, CachedSample
from batching.pipelines.step_cache_rows import decide, keep, rows_to_run, sample_rows

NUM_BLOCKS_KEPT = 2  # the first down block and the last up block: the shallow path


def num_unet_blocks(unet: Any) -> int:
    """Down blocks, the mid block and up blocks: the blocks a full forward runs."""
    return len(unet.down_blocks) + (unet.mid_block is not None) + len(unet.up_blocks)


def deep_cached_forward(
    unet: Any,
    sample: torch.Tensor,  # [rows, in_channels, h, w]
    timesteps: torch.Tensor,  # [rows]
    encoder_hidden_states: torch.Tensor,  # [rows, seq, dim]
    added_cond_kwargs: dict[str, torch.Tensor] | None,
    samples: Sequence[CachedSample],
    *,
    may_gather: bool,
) -> CachedForward:
    """The UNet's prediction [rows, out_channels, h, w] and which samples skipped."""
    upsample_factor = 2**unet.num_upsamplers
    forwards_upsample_size = any(dim % upsample_factor for dim in sample.shape[-2:])
    emb = unet.time_embedding(unet.get_time_embed(sample=sample, timestep=timesteps), None)  # [rows, temb]
    aug_emb = unet.get_aug_embed(
        emb=emb, encoder_hidden_states=encoder_hidden_states, added_cond_kwargs=added_cond_kwargs or {}
    )
    if aug_emb is not None:
        emb = emb + aug_emb
    if unet.time_embed_act is not None:
        emb = unet.time_embed_act(emb)
    context = unet.process_encoder_hidden_states(
        encoder_hidden_states=encoder_hidden_states, added_cond_kwargs=added_cond_kwargs
    )
    hidden = unet.conv_in(sample)
    shallow_res: tuple[torch.Tensor, ...] = (hidden,)
    hidden, res = _down(unet.down_blocks[0], hidden, emb, context)
    shallow_res += res
    num_rows = hidden.shape[0]
    features = list(hidden)  # per row [c, h/2, w/2]: the first down block's output
    skipped = decide(samples, features)
    rows = rows_to_run(samples, skipped, num_rows, may_gather)
    last_block = unet.up_blocks[-1]
    deep_out: list[torch.Tensor | None] = [None] * num_rows  # per row: the last up block's input
    if rows:
        if len(rows) < num_rows:
            index = torch.tensor(rows, device=hidden.device)
            part, part_emb, part_context = hidden[index], emb[index], context[index]
            part_res = tuple(tensor[index] for tensor in shallow_res)
        else:
            part, part_emb, part_context, part_res = hidden, emb, context, shallow_res
        for block in unet.down_blocks[1:]:
            part, res = _down(block, part, part_emb, part_context)
            part_res += res
        if unet.mid_block is not None:
            part = _mid(unet.mid_block, part, part_emb, part_context)
        for block in unet.up_blocks[:-1]:
            block_res, part_res = part_res[-len(block.resnets) :], part_res[: -len(block.resnets)]
            upsample_size = part_res[-1].shape[2:] if forwards_upsample_size else None
            part = _up(block, part, part_emb, part_context, block_res, upsample_size)
        for position, row in enumerate(rows):
            deep_out[row] = part[position]
    for sample_, sample_row_range, is_skip in zip(samples, sample_rows(samples), skipped):
        if is_skip:
            assert sample_.state is not None and sample_.state.cached is not None
            for index_in_sample, row in enumerate(sample_row_range):
                deep_out[row] = sample_.state.cached[index_in_sample]
    keep(samples, skipped, features, deep_out)
    deep = torch.stack(deep_out)  # type: ignore[arg-type]  # every row has one now
    hidden = _up(last_block, deep, emb, context, shallow_res[: len(last_block.resnets)], None)  # the rest: deep
    if unet.conv_norm_out:
        hidden = unet.conv_act(unet.conv_norm_out(hidden))
    return CachedForward(unet.conv_out(hidden), skipped)


def _down(block: Any, hidden: torch.Tensor, emb: torch.Tensor, context: torch.Tensor):
    if getattr(block, "has_cross_attention", False):
        return block(hidden_states=hidden, temb=emb, encoder_hidden_states=context)
    return block(hidden_states=hidden, temb=emb)


def _mid(block: Any, hidden: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    if getattr(block, "has_cross_attention", False):
        return block(hidden, emb, encoder_hidden_states=context)
    return block(hidden, emb)


def _up(block: Any, hidden: torch.Tensor, emb: torch.Tensor, context: torch.Tensor, res: tuple, upsample_size):
    if getattr(block, "has_cross_attention", False):
        return block(
            hidden_states=hidden,
            temb=emb,
            res_hidden_states_tuple=res,
            encoder_hidden_states=context,
            upsample_size=upsample_size,
        )
    return block(hidden_states=hidden, temb=emb, res_hidden_states_tuple=res, upsample_size=upsample_size)
