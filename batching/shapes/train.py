"""Train builtin:shapes from a seed on the CPU: first its VAE, then its UNet and text encoder.

    python -m batching.shapes.train --out DIR --seed 0

Stage 1 trains the autoencoder to reconstruct the procedural images (flat colours
are easy: a thousand or so small steps). Stage 2 encodes a fixed set of images once
(every prompt at several shape sizes) and trains the UNet and the text encoder
together on those latents with the v-prediction objective on a zero-terminal-SNR
schedule (see `model.build_scheduler` for why) and an exponential moving average of
the weights, which is what gets saved. A share of prompts is replaced by the empty prompt so that
classifier-free guidance works. The folder written is an ordinary
`StableDiffusionPipeline.save_pretrained` folder (safetensors). A checkpoint is saved
every `--save-every` UNet steps, so an interrupted run still leaves a usable model.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from batching.shapes import model as shapes_model
from batching.shapes.drawing import MAX_BOX_FRACTION, MIN_BOX_FRACTION, draw, random_example
from batching.shapes.vocabulary import all_prompts

PROMPT_DROPOUT = 0.15  # share of training rows with the empty prompt (for classifier-free guidance)
EMA_DECAY = 0.995
NUM_BOX_SIZES = 8
VAE_CROP = 32
VAE_LR = 2e-3  # shape sizes per prompt in the UNet's fixed training set


def pixels_to_tensor(images) -> torch.Tensor:
    array = np.stack([np.asarray(image, dtype=np.float32) for image in images])  # [n, H, W, 3]
    return torch.from_numpy(array).permute(0, 3, 1, 2) / 127.5 - 1.0  # [n, 3, H, W] in [-1, 1]


def train_vae(vae, rng: np.random.Generator, num_steps: int, batch_size: int, log) -> None:
    """Reconstruct random VAE_CROP-pixel crops of the procedural images (a quarter of the cost of whole ones)."""
    prompts = all_prompts()
    with torch.no_grad():  # start the posterior's log-variance at -8 (std 0.02), not 0: with a
        # std of 1 the decoder sees mostly noise, and Adam needs thousands of steps to move a bias by 8
        vae.quant_conv.bias[vae.config.latent_channels :] = -8.0
    optimizer = torch.optim.AdamW(vae.parameters(), lr=VAE_LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=VAE_LR, total_steps=num_steps, pct_start=0.05)
    vae.train()
    for step in range(num_steps):
        images = pixels_to_tensor([random_crop(random_example(rng, prompts)[1], rng) for _ in range(batch_size)])
        posterior = vae.encode(images).latent_dist
        reconstruction = vae.decode(posterior.sample()).sample
        reconstruction_loss = F.mse_loss(reconstruction, images) + F.l1_loss(reconstruction, images)
        loss = reconstruction_loss + 1e-6 * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == num_steps - 1:
            flat = images.mean(dim=(2, 3), keepdim=True).expand_as(images)  # what a VAE that sees no edges gives
            baseline = F.mse_loss(flat, images) + F.l1_loss(flat, images)
            log(
                f"vae step {step} reconstruction {reconstruction_loss.item():.4f} "
                f"(each crop's mean colour: {baseline.item():.4f})"
            )
    vae.eval()


def random_crop(image, rng: np.random.Generator):
    left, top = (int(v) for v in rng.integers(0, image.width - VAE_CROP + 1, size=2))
    return image.crop((left, top, left + VAE_CROP, top + VAE_CROP))


@torch.no_grad()
def encode_training_set(vae, tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Posterior means and stds of every prompt at NUM_BOX_SIZES sizes, and their token ids."""
    prompts = all_prompts()
    box_fractions = np.linspace(MIN_BOX_FRACTION, MAX_BOX_FRACTION, NUM_BOX_SIZES)
    means, stds, texts = [], [], []
    for prompt in prompts:
        images = pixels_to_tensor([draw(prompt, 128, float(f)) for f in box_fractions])
        posterior = vae.encode(images).latent_dist
        means.append(posterior.mean)
        stds.append(posterior.std)
        texts += [prompt.text] * NUM_BOX_SIZES
    token_ids = tokenize(tokenizer, texts)
    return torch.cat(means), torch.cat(stds), token_ids  # [n, 4, 16, 16] twice, [n, seq]


def tokenize(tokenizer, texts: list[str]) -> torch.Tensor:
    return tokenizer(
        texts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids


def train_unet(
    unet,
    text_encoder,
    tokenizer,
    scheduler,
    data,
    num_steps: int,
    batch_size: int,
    save,
    save_every: int,
    log,
    stop_after: int | None = None,
):
    latent_means, latent_stds, token_ids = data
    empty_ids = tokenize(tokenizer, [""])  # [1, seq]
    parameters = list(unet.parameters()) + list(text_encoder.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=1e-3, weight_decay=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=num_steps, pct_start=0.03)
    ema_unet, ema_text_encoder = copy.deepcopy(unet).eval(), copy.deepcopy(text_encoder).eval()
    unet.train()
    text_encoder.train()
    for step in range(min(num_steps, stop_after or num_steps)):
        rows = torch.randint(0, len(latent_means), (batch_size,))
        latents = latent_means[rows] + latent_stds[rows] * torch.randn_like(latent_means[rows])
        latents = latents * save.scaling_factor  # [b, 4, 16, 16]
        ids = token_ids[rows].clone()
        dropped = torch.rand(batch_size) < PROMPT_DROPOUT
        ids[dropped] = empty_ids
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (batch_size,))
        noisy = scheduler.add_noise(latents, noise, timesteps)
        embeds = text_encoder(ids)[0]  # [b, seq, dim]
        prediction = unet(noisy, timesteps, encoder_hidden_states=embeds).sample
        loss = F.mse_loss(prediction, scheduler.get_velocity(latents, noise, timesteps))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        decay = min(EMA_DECAY, (1 + step) / (10 + step))
        with torch.no_grad():
            for ema, live in ((ema_unet, unet), (ema_text_encoder, text_encoder)):
                for ema_param, param in zip(ema.parameters(), live.parameters()):
                    ema_param.lerp_(param, 1 - decay)
        if step % 50 == 0 or step == num_steps - 1:
            log(f"unet step {step} loss {loss.item():.4f} lr {schedule.get_last_lr()[0]:.2e}")
        if (step + 1) % save_every == 0 or step + 1 in (num_steps, stop_after):
            save(ema_unet, ema_text_encoder, step + 1)


class PipelineSaver:
    """Saves the pipeline with the current EMA weights; keeps the trained VAE and its scaling factor."""

    def __init__(self, out: Path, vae, tokenizer, scheduler, scaling_factor: float, log, started: float) -> None:
        self.out, self.vae, self.tokenizer, self.scheduler = out, vae, tokenizer, scheduler
        self.scaling_factor = scaling_factor
        self.log, self.started = log, started

    def __call__(self, unet, text_encoder, num_steps: int) -> None:
        from diffusers import StableDiffusionPipeline

        pipeline = StableDiffusionPipeline(
            vae=self.vae,
            text_encoder=text_encoder,
            tokenizer=self.tokenizer,
            unet=unet,
            scheduler=self.scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipeline.save_pretrained(self.out)  # type: ignore[attr-defined]  # mypy reads diffusers' torch-less dummy class
        (self.out / "training.json").write_text(
            json.dumps({"unet_steps": num_steps, "seconds": round(time.time() - self.started, 1)}, indent=2) + "\n"
        )
        self.log(f"saved {self.out} after {num_steps} unet steps")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="train builtin:shapes on procedural images (CPU)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the trained pipeline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)")
    parser.add_argument("--vae-steps", type=int, default=1500)
    parser.add_argument("--vae-batch", type=int, default=16)
    parser.add_argument("--unet-steps", type=int, default=2000)
    parser.add_argument("--unet-batch", type=int, default=32)
    parser.add_argument("--save-every", type=int, default=250)
    parser.add_argument("--vae-from", type=Path, help="a folder this script wrote: reuse its VAE (and skip stage 1)")
    parser.add_argument(
        "--stop-after",
        type=int,
        help="stop after this many UNet steps, on the --unet-steps schedule "
        "(reproduces a checkpoint of a longer run exactly)",
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    started = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {message}", flush=True)

    tokenizer = shapes_model.build_tokenizer()
    vae = shapes_model.build_vae()
    text_encoder = shapes_model.build_text_encoder(tokenizer)
    unet = shapes_model.build_unet()
    scheduler = shapes_model.build_scheduler()

    if args.vae_from is None:
        train_vae(vae, rng, args.vae_steps, args.vae_batch, log)
    else:
        from diffusers import AutoencoderKL

        vae = AutoencoderKL.from_pretrained(args.vae_from / "vae", local_files_only=True)
        log(f"VAE loaded from {args.vae_from}")
    vae.eval().requires_grad_(False)
    data = encode_training_set(vae, tokenizer)
    scaling_factor = float(1.0 / data[0].std())
    vae.register_to_config(scaling_factor=scaling_factor)
    log(f"encoded {len(data[0])} training latents; scaling factor {scaling_factor:.4f}")

    torch.manual_seed(args.seed + 1)  # the UNet stage is the same whether the VAE was trained now or loaded
    args.out.mkdir(parents=True, exist_ok=True)
    save = PipelineSaver(args.out, vae, tokenizer, scheduler, scaling_factor, log, started)
    train_unet(
        unet,
        text_encoder,
        tokenizer,
        scheduler,
        data,
        args.unet_steps,
        args.unet_batch,
        save,
        args.save_every,
        log,
        args.stop_after,
    )
    log(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
