"""Train builtin:shapes-wan on the CPU: its VAE, then its transformer and text encoder.

    python -m training.shapes_wan.train --out DIR

Stage 1 (`vae`) trains the causal 3D VAE to reconstruct procedural clips, on 5-frame windows
(a first frame and one group of 4, the two kinds of chunk Wan's VAE encodes) of 32x32 crops, a
tenth of a whole clip's cost: Wan's VAE normalises each position on its own (RMS over channels),
so a crop is normalised as it is in a whole clip. Stage 1b (`decoder`) fine-tunes the decoder
alone on whole 9-frame clips, on latents with a little noise and pushed away from their mean as
classifier-free guidance pushes them, so slightly-off latents still decode to flat palette colours.
Every training prompt (the grammar's 672 less the held-out test cases,
`batching.shapes.clip_accuracy`) is then encoded at NUM_BOX_SIZES shape sizes, once; the
per-channel mean and std of those latents become the VAE's `latents_mean` and `latents_std`, as
in Wan's checkpoints. Stage 2 (`transformer`) trains the transformer and the text encoder
together on the rectified-flow objective as WanPipeline samples it: x = (1 - s) x0 + s n at
timestep 1000 s, the model predicts the velocity n - x0, s drawn uniformly and shifted by the
scheduler's flow_shift (so every step of the sampler's schedule is trained as often as sampling
visits it); 15% of rows get the empty prompt (classifier-free guidance), and the prompt's UMT5
states are zero-padded to 512 tokens as the pipeline pads them. An exponential moving average of
the weights is what gets saved, every `--save-every` steps, so an interrupted run leaves a usable
model. The folder is an ordinary `WanPipeline.save_pretrained` folder (safetensors) with a
training.json. docs/shapes-wan.md has the measurements.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from batching.pipelines.wan.adapter import MAX_SEQUENCE_LENGTH
from batching.shapes.clip_accuracy import NUM_FRAMES, SIZE, held_out_prompts
from batching.shapes.drawing import CLIP_MAX_BOX_FRACTION, CLIP_MIN_BOX_FRACTION, draw_clip
from core.shapes_vocabulary import all_moving_prompts
from training.optimization import AveragedOptimizer
from training.shapes_wan import model as shapes_wan

PROMPT_DROPOUT = 0.15
VAE_CROP, VAE_WINDOW = 32, 5  # a VAE training row: 5 frames of a 32x32 crop
VAE_LR = 2e-3
NUM_BOX_SIZES = 3
DECODER_LATENT_NOISE = 0.05  # of the latents' std
DECODER_MAX_OVERSHOOT = 1.3  # latents pushed up to this far from their mean in the decoder stage
TRANSFORMER_LR = 1e-3


def clips_to_tensor(clips: list[list]) -> torch.Tensor:
    """PIL frames, per clip, as the VAE's input: [n, 3, frames, H, W] in [-1, 1]."""
    array = np.stack([np.stack([np.asarray(frame, dtype=np.float32) for frame in clip]) for clip in clips])
    return torch.from_numpy(array).permute(0, 4, 1, 2, 3) / 127.5 - 1.0


def training_prompts():
    held_out = held_out_prompts()
    return [prompt for prompt in all_moving_prompts() if prompt not in held_out]


def random_clips(rng: np.random.Generator, prompts, num_clips: int) -> list[list]:
    clips = []
    for _ in range(num_clips):
        prompt = prompts[int(rng.integers(len(prompts)))]
        box_fraction = float(rng.uniform(CLIP_MIN_BOX_FRACTION, CLIP_MAX_BOX_FRACTION))
        clips.append(draw_clip(prompt, SIZE, NUM_FRAMES, box_fraction))
    return clips


def reconstruction_loss(reconstruction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(reconstruction, target) + F.l1_loss(reconstruction, target)


def train_vae(vae, rng: np.random.Generator, num_steps: int, batch_size: int, log) -> None:
    """Reconstruct 5-frame windows of 32x32 crops of random training clips."""
    prompts = training_prompts()
    with torch.no_grad():  # the posterior's log-variance starts at -8 (std 0.02), as builtin:shapes' VAE's
        vae.quant_conv.bias[vae.config.z_dim :] = -8.0
    optimizer = torch.optim.AdamW(vae.parameters(), lr=VAE_LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=VAE_LR, total_steps=num_steps, pct_start=0.05)
    vae.train()
    for step in range(num_steps):
        clips = clips_to_tensor(random_clips(rng, prompts, batch_size))  # [b, 3, 9, 64, 64]
        start = int(rng.integers(NUM_FRAMES - VAE_WINDOW + 1))
        top, left = (int(v) for v in rng.integers(0, SIZE - VAE_CROP + 1, size=2))
        crops = clips[:, :, start : start + VAE_WINDOW, top : top + VAE_CROP, left : left + VAE_CROP]
        posterior = vae.encode(crops).latent_dist
        reconstruction = vae.decode(posterior.sample()).sample
        loss = reconstruction_loss(reconstruction, crops) + 1e-6 * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0 or step == num_steps - 1:
            log(f"vae step {step} reconstruction {loss.item():.4f}")
    vae.eval()


def finetune_decoder(vae, rng: np.random.Generator, num_steps: int, batch_size: int, log) -> None:
    """The decoder alone on whole clips, from noisy latents pushed up to DECODER_MAX_OVERSHOOT from their mean."""
    prompts = training_prompts()
    vae.requires_grad_(False)
    decoder_modules = (vae.decoder, vae.post_quant_conv)
    parameters = [p for module in decoder_modules for p in module.parameters()]
    for parameter in parameters:
        parameter.requires_grad_(True)
    optimizer = torch.optim.AdamW(parameters, lr=VAE_LR / 4, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=VAE_LR / 4, total_steps=num_steps, pct_start=0.1)
    vae.decoder.train()
    for step in range(num_steps):
        clips = clips_to_tensor(random_clips(rng, prompts, batch_size))
        with torch.no_grad():
            latents = vae.encode(clips).latent_dist.sample()
            mean = latents.mean(dim=(0, 2, 3, 4), keepdim=True)
            latents = latents + DECODER_LATENT_NOISE * latents.std() * torch.randn_like(latents)
            factor = 1.0 + (DECODER_MAX_OVERSHOOT - 1.0) * torch.from_numpy(rng.random(batch_size)).float()
            latents = mean + factor.view(-1, 1, 1, 1, 1) * (latents - mean)
        loss = reconstruction_loss(vae.decode(latents).sample, clips)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 10 == 0 or step == num_steps - 1:
            log(f"decoder step {step} reconstruction {loss.item():.4f}")
    vae.requires_grad_(False)
    vae.eval()


class TrainingSet:
    """Every training prompt's clip at NUM_BOX_SIZES shape sizes, encoded once (posterior means and stds, in
    the VAE's raw scale), and each prompt's token ids."""

    def __init__(self, vae, tokenizer, log) -> None:
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        prompts = training_prompts()
        fractions = np.linspace(CLIP_MIN_BOX_FRACTION, CLIP_MAX_BOX_FRACTION, NUM_BOX_SIZES)
        means, stds = [], []
        with torch.no_grad():
            for start in range(0, len(prompts), 16):
                clips = [
                    draw_clip(p, SIZE, NUM_FRAMES, float(f)) for p in prompts[start : start + 16] for f in fractions
                ]
                posterior = vae.encode(clips_to_tensor(clips)).latent_dist
                means.append(posterior.mean)
                stds.append(posterior.std)
                if start % 160 == 0:
                    log(f"encoded {start + 16} of {len(prompts)} prompts")
        self.means, self.stds = torch.cat(means), torch.cat(stds)  # [n, z, latent frames, 16, 16]
        self.prompt_rows = torch.arange(len(prompts)).repeat_interleave(NUM_BOX_SIZES)
        self.channel_mean = self.means.mean(dim=(0, 2, 3, 4))  # [z]
        self.channel_std = self.means.std(dim=(0, 2, 3, 4))
        self.token_ids = [tokenizer(prompt_clean(p.text)).input_ids for p in prompts]
        self.empty_ids = tokenizer("").input_ids

    def sample(self, num_rows: int) -> tuple[torch.Tensor, list[list[int]]]:
        """`num_rows` normalised latents [rows, z, latent frames, 16, 16] (as the pipeline's latents) and their
        prompts' ids."""
        rows = torch.randint(len(self.means), (num_rows,))
        raw = self.means[rows] + self.stds[rows] * torch.randn_like(self.means[rows])
        shape = (1, -1, 1, 1, 1)
        latents = (raw - self.channel_mean.view(shape)) / self.channel_std.view(shape)
        return latents, [self.token_ids[int(self.prompt_rows[row])] for row in rows]


def prompt_states(text_encoder, token_ids: list[list[int]]) -> torch.Tensor:
    """UMT5's last hidden states of each prompt's own tokens, zero-padded to 512 as the pipeline pads them:
    [n, 512, dim]. Differentiable."""
    lengths = [len(ids) for ids in token_ids]
    padded = torch.zeros(len(token_ids), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(padded)
    for row, ids in enumerate(token_ids):
        padded[row, : len(ids)], mask[row, : len(ids)] = torch.tensor(ids), 1
    hidden = text_encoder(padded, mask).last_hidden_state * mask.unsqueeze(-1)  # [n, max_len, dim]
    return F.pad(hidden, (0, 0, 0, MAX_SEQUENCE_LENGTH - hidden.shape[1]))


def sample_sigmas(num_rows: int, shift: float) -> torch.Tensor:
    """Sigmas drawn uniformly and shifted as the scheduler's flow_shift shifts its schedule."""
    u = torch.rand(num_rows)
    return shift * u / (1 + (shift - 1) * u)


def train_transformer(transformer, text_encoder, data: TrainingSet, num_steps: int, batch_size: int, save,
                      save_every: int, log, max_lr: float = TRANSFORMER_LR):  # fmt: skip
    run = AveragedOptimizer([transformer, text_encoder], num_steps, max_lr, pct_start=0.03)
    ema_transformer, ema_text_encoder = run.averages
    for step in range(num_steps):
        latents, token_ids = data.sample(batch_size)
        dropped = torch.rand(batch_size) < PROMPT_DROPOUT
        token_ids = [data.empty_ids if drop else ids for ids, drop in zip(token_ids, dropped)]
        sigmas = sample_sigmas(batch_size, shapes_wan.FLOW_SHIFT).view(-1, 1, 1, 1, 1)
        noise = torch.randn_like(latents)
        noisy = (1 - sigmas) * latents + sigmas * noise
        states = prompt_states(text_encoder, token_ids)
        prediction = transformer(noisy, sigmas.flatten() * 1000, states, return_dict=False)[0]
        loss = F.mse_loss(prediction, noise - latents)
        run.step(loss)
        if step % 25 == 0 or step == num_steps - 1:
            log(f"transformer step {step} loss {loss.item():.4f} lr {run.lr:.2e}")
        if (step + 1) % save_every == 0 or step + 1 == num_steps:
            save(ema_transformer, ema_text_encoder, step + 1)


def finetune_folder(folder: Path, args, log) -> None:
    """Stage 3: more decoder steps on a trained folder's VAE. The encoder, and so the latents the transformer
    learned, stay as they are; only how latents become pixels gets sharper."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(folder / "vae", local_files_only=True)
    finetune_decoder(vae, np.random.default_rng(args.seed + 2), args.decoder_steps, args.decoder_batch, log)
    vae.save_pretrained(folder / "vae")
    record = json.loads((folder / "training.json").read_text())
    record["decoder_finetune_steps"] = record.get("decoder_finetune_steps", 0) + args.decoder_steps
    (folder / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"saved {folder / 'vae'} after {args.decoder_steps} more decoder steps")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="train builtin:shapes-wan on procedural clips (CPU)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the trained pipeline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)")
    parser.add_argument("--vae-steps", type=int, default=600)
    parser.add_argument("--vae-batch", type=int, default=8)
    parser.add_argument("--decoder-steps", type=int, default=60)
    parser.add_argument("--decoder-batch", type=int, default=4)
    parser.add_argument("--vae-from", type=Path, help="a folder this script wrote: take its VAE, skip stage 1")
    parser.add_argument(
        "--finetune-decoder",
        type=Path,
        help="a folder this script wrote: fine-tune its VAE's decoder for --decoder-steps more steps, in place",
    )
    parser.add_argument("--steps", type=int, default=3000, help="transformer steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=TRANSFORMER_LR)
    parser.add_argument("--save-every", type=int, default=250)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    started = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {message}", flush=True)

    torch.manual_seed(args.seed)
    if args.finetune_decoder is not None:
        finetune_folder(args.finetune_decoder, args, log)
        return 0
    pipeline = shapes_wan.build_pipeline()
    tokenizer, vae = pipeline.tokenizer, pipeline.vae
    record: dict = {"size": SIZE, "num_frames": NUM_FRAMES, "seed": args.seed, "batch": args.batch, "lr": args.lr}
    args.out.mkdir(parents=True, exist_ok=True)
    if args.vae_from is None:
        rng = np.random.default_rng(args.seed)
        train_vae(vae, rng, args.vae_steps, args.vae_batch, log)
        finetune_decoder(vae, rng, args.decoder_steps, args.decoder_batch, log)
        record.update(vae_steps=args.vae_steps, decoder_steps=args.decoder_steps)
    else:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(args.vae_from / "vae", local_files_only=True)
        record.update(json.loads((args.vae_from / "training.json").read_text()), vae_from=str(args.vae_from))
    vae.requires_grad_(False).eval()
    data = TrainingSet(vae, tokenizer, log)
    vae.register_to_config(latents_mean=data.channel_mean.tolist(), latents_std=data.channel_std.tolist())
    log(f"latents: mean {data.channel_mean.tolist()} std {data.channel_std.tolist()}")

    def save(transformer, text_encoder, num_steps: int) -> None:
        shapes_wan.assemble(vae, text_encoder, tokenizer, transformer).save_pretrained(args.out)
        saved = dict(record, transformer_steps=num_steps, seconds=round(time.time() - started, 1))
        (args.out / "training.json").write_text(json.dumps(saved, indent=2) + "\n")
        log(f"saved {args.out} after {num_steps} transformer steps")

    save(pipeline.transformer, pipeline.text_encoder, 0)  # the trained VAE, kept if the rest is interrupted
    torch.manual_seed(args.seed + 1)
    train_transformer(pipeline.transformer, pipeline.text_encoder, data, args.steps, args.batch, save,
                      args.save_every, log, max_lr=args.lr)  # fmt: skip
    log(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
