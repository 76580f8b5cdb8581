"""Train builtin:shapes from a seed on the CPU: first its VAE, then its UNet and text encoder.

    python -m training.shapes.train --out DIR --seed 0

Stage 1 trains the autoencoder to reconstruct the procedural images on crops (flat
colours are easy: a thousand or so small steps); the training set (every prompt at several
shape sizes) is then encoded once, and the encoder is final. Stages 1b and 1c fine-tune
the decoder alone on whole images, 1c also on latents pushed away from their mean as
classifier-free guidance pushes them. Stage 2 trains the UNet and the text encoder together
on the latents with the v-prediction objective on a zero-terminal-SNR schedule (see
`model.build_scheduler` for why) and an exponential moving average of the weights, which is
what gets saved; stage 3 continues from that average at a lower rate, and stage 4 at a
lower rate still with twice the share of empty prompts (for classifier-free guidance).
Each stage is reseeded from --seed, so it gives the same weights whether the earlier stages
ran in this process or were loaded (--vae-from, --unet-from). The folder written is an
ordinary `StableDiffusionPipeline.save_pretrained` folder (safetensors). A checkpoint is
saved every `--save-every` steps of a stage, so an interrupted run still leaves a usable
model. docs/shapes.md has the measurements behind each stage.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from batching.shapes.drawing import MAX_BOX_FRACTION, MIN_BOX_FRACTION, draw, random_example
from core.shapes_vocabulary import all_prompts
from training.optimization import AveragedOptimizer
from training.shapes import model as shapes_model
from training.shapes.latent_rgb_fit import save_latent_rgb

PROMPT_DROPOUT = 0.15  # share of training rows with the empty prompt (for classifier-free guidance)
UNET_LR = 1e-3
NUM_BOX_SIZES = 8  # shape sizes per prompt in the UNet's fixed training set
VAE_CROP = 32
VAE_LR = 2e-3
DECODER_LATENT_NOISE = 0.05  # of the latents' std, added before decoding in the decoder stages
DECODER_MAX_OVERSHOOT = 1.5  # stage 1c: latents pushed up to this far from their mean (see finetune_decoder)


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


def finetune_decoder(
    vae,
    rng: np.random.Generator,
    num_steps: int,
    batch_size: int,
    latent_noise: float,
    log,
    max_overshoot: float = 1.0,
    latent_mean: torch.Tensor | None = None,
) -> None:
    """Fine-tune the decoder alone on whole 128x128 images, the encoder (and so the latents) unchanged.

    Stage 1 trains on crops, but the VAE's group norms take their statistics over the whole
    image, so a whole image with two colours is normalised differently from a crop of one:
    after stage 1 a black triangle on red came back green and an orange circle on black
    came back red with a halo. The encoder is frozen, so the latents the UNet learns from
    stay those of stage 1; the decoder also sees the latents with a little extra noise
    (`latent_noise` of their standard deviation), so slightly-off latents from the UNet
    still decode to flat palette colours. With `max_overshoot` > 1 each latent is also pushed
    away from `latent_mean` (the training latents' mean, [1, 4, 1, 1]) by a factor drawn from
    1..max_overshoot, as classifier-free guidance pushes a sample away from the unconditional
    prediction (at guidance 10 the final latents lie 1.05-1.55x as far from the mean as at
    guidance 1), and decoded to the same image: without it a yellow background drawn at
    guidance 10 decodes whitish, a red one purple.
    """
    prompts = all_prompts()
    vae.requires_grad_(False)
    vae.decoder.requires_grad_(True)
    vae.post_quant_conv.requires_grad_(True)
    parameters = [p for p in vae.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=VAE_LR / 2, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=VAE_LR / 2, total_steps=num_steps, pct_start=0.1)
    vae.decoder.train()
    for step in range(num_steps):
        images = pixels_to_tensor([random_example(rng, prompts)[1] for _ in range(batch_size)])
        with torch.no_grad():
            latents = vae.encode(images).latent_dist.sample()
            latents = latents + latent_noise * latents.std() * torch.randn_like(latents)
            if max_overshoot > 1.0 and latent_mean is not None:
                factor = 1.0 + (max_overshoot - 1.0) * torch.from_numpy(rng.random(batch_size)).float()
                latents = latent_mean + factor.view(-1, 1, 1, 1) * (latents - latent_mean)
        reconstruction = vae.decode(latents).sample
        loss = F.mse_loss(reconstruction, images) + F.l1_loss(reconstruction, images)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 25 == 0 or step == num_steps - 1:
            log(f"decoder step {step} reconstruction {loss.item():.4f}")
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
    max_lr: float = UNET_LR,
    prompt_dropout: float = PROMPT_DROPOUT,
    pct_start: float = 0.03,
    stage: str = "unet",
):
    """The v-prediction loss over `num_steps` steps of `batch_size` latents; saves the EMA weights."""
    latent_means, latent_stds, token_ids = data
    empty_ids = tokenize(tokenizer, [""])  # [1, seq]
    run = AveragedOptimizer([unet, text_encoder], num_steps, max_lr, pct_start)
    ema_unet, ema_text_encoder = run.averages
    for step in range(min(num_steps, stop_after or num_steps)):
        rows = torch.randint(0, len(latent_means), (batch_size,))
        latents = latent_means[rows] + latent_stds[rows] * torch.randn_like(latent_means[rows])
        latents = latents * save.scaling_factor  # [b, 4, 16, 16]
        ids = token_ids[rows].clone()
        dropped = torch.rand(batch_size) < prompt_dropout
        ids[dropped] = empty_ids
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (batch_size,))
        noisy = scheduler.add_noise(latents, noise, timesteps)
        target = scheduler.get_velocity(latents, noise, timesteps)
        embeds = text_encoder(ids)[0]  # [b, seq, dim]
        prediction = unet(noisy, timesteps, encoder_hidden_states=embeds).sample
        loss = F.mse_loss(prediction, target)
        run.step(loss)
        if step % 50 == 0 or step == num_steps - 1:
            log(f"{stage} step {step} loss {loss.item():.4f} lr {run.lr:.2e}")
        if (step + 1) % save_every == 0 or step + 1 in (num_steps, stop_after):
            save(ema_unet, ema_text_encoder, step + 1)


class PipelineSaver:
    """Saves the pipeline with the current EMA weights; keeps the trained VAE and its scaling factor."""

    def __init__(self, out: Path, vae, tokenizer, scheduler, scaling_factor: float, log, started: float) -> None:
        self.out, self.vae, self.tokenizer, self.scheduler = out, vae, tokenizer, scheduler
        self.scaling_factor = scaling_factor
        self.log, self.started = log, started
        self.stage = "unet"
        self.steps_before = 0  # UNet steps of earlier stages, for training.json
        self.keep_checkpoints = False  # also save each checkpoint to OUT-<stage>-<steps>

    def __call__(self, unet, text_encoder, num_steps: int) -> None:
        self.last_unet, self.last_text_encoder = unet, text_encoder
        self._save(self.out, unet, text_encoder, num_steps)
        if self.keep_checkpoints:
            self._save(self.out.with_name(f"{self.out.name}-{self.stage}-{num_steps}"), unet, text_encoder, num_steps)

    def _save(self, out: Path, unet, text_encoder, num_steps: int) -> None:
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
        pipeline.save_pretrained(out)
        record = {"stage": self.stage, "unet_steps": self.steps_before + num_steps}
        record["seconds"] = round(time.time() - self.started, 1)
        (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        save_latent_rgb(out)  # the live previews' factors, fitted against this VAE
        self.log(f"saved {out} after {num_steps} {self.stage} steps")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="train builtin:shapes on procedural images (CPU)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the trained pipeline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)")
    parser.add_argument("--vae-steps", type=int, default=1500)
    parser.add_argument("--vae-batch", type=int, default=16)
    parser.add_argument("--decoder-steps", type=int, default=400, help="stage 1b: the decoder on whole images")
    parser.add_argument(
        "--decoder-overshoot-steps", type=int, default=250, help="stage 1c: the decoder on pushed latents"
    )
    parser.add_argument("--decoder-batch", type=int, default=4)
    parser.add_argument("--unet-steps", type=int, default=2000, help="stage 2's one-cycle schedule length")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=1250,
        help="stop stage 2 after this many UNet steps of its --unet-steps schedule",
    )
    parser.add_argument("--unet-batch", type=int, default=32)
    parser.add_argument("--finetune-steps", type=int, default=600, help="stage 3: more UNet steps, lower LR")
    parser.add_argument("--finetune-lr", type=float, default=5e-4)
    parser.add_argument("--finetune-dropout", type=float, default=PROMPT_DROPOUT)
    parser.add_argument(
        "--guidance-steps", type=int, default=1200, help="stage 4: more UNet steps with more empty prompts"
    )
    parser.add_argument("--guidance-lr", type=float, default=3e-4)
    parser.add_argument("--guidance-dropout", type=float, default=0.3)
    parser.add_argument("--save-every", type=int, default=250)
    parser.add_argument("--keep-checkpoints", action="store_true", help="also keep each checkpoint in OUT-<stage>-N")
    parser.add_argument("--vae-from", type=Path, help="a folder this script wrote: reuse its VAE (and skip stage 1)")
    parser.add_argument(
        "--unet-from", type=Path, help="a folder this script wrote: reuse its UNet and text encoder (skip stage 2)"
    )
    parser.add_argument(
        "--skip-finetune", action="store_true", help="with --unet-from a stage-3 folder: go straight to stage 4"
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
    data = encode_training_set(vae, tokenizer)  # the encoder is final after stage 1: 1b trains the decoder only
    scaling_factor = float(1.0 / data[0].std())
    vae.register_to_config(scaling_factor=scaling_factor)
    log(f"encoded {len(data[0])} training latents; scaling factor {scaling_factor:.4f}")
    if args.decoder_steps:
        torch.manual_seed(args.seed + 5)  # each stage reseeded: the same whether earlier ones ran or were loaded
        decoder_rng = np.random.default_rng(args.seed + 5)
        finetune_decoder(vae, decoder_rng, args.decoder_steps, args.decoder_batch, DECODER_LATENT_NOISE, log)
    if args.decoder_overshoot_steps:  # stage 1c: the same, with latents pushed away from their mean
        torch.manual_seed(args.seed + 6)
        decoder_rng = np.random.default_rng(args.seed + 6)
        finetune_decoder(
            vae, decoder_rng, args.decoder_overshoot_steps, args.decoder_batch, DECODER_LATENT_NOISE, log,
            max_overshoot=DECODER_MAX_OVERSHOOT, latent_mean=data[0].mean(dim=(0, 2, 3), keepdim=True),
        )  # fmt: skip
    vae.requires_grad_(False)

    args.out.mkdir(parents=True, exist_ok=True)
    save = PipelineSaver(args.out, vae, tokenizer, scheduler, scaling_factor, log, started)
    save.keep_checkpoints = args.keep_checkpoints
    if args.unet_from is None:
        torch.manual_seed(args.seed + 1)
        train_unet(
            unet, text_encoder, tokenizer, scheduler, data, args.unet_steps, args.unet_batch, save,
            args.save_every, log, args.stop_after,
        )  # fmt: skip
        unet, text_encoder = save.last_unet, save.last_text_encoder  # continue from the EMA weights
    else:
        from diffusers import UNet2DConditionModel
        from transformers import CLIPTextModel

        unet = UNet2DConditionModel.from_pretrained(args.unet_from / "unet", local_files_only=True)
        text_encoder = CLIPTextModel.from_pretrained(args.unet_from / "text_encoder", local_files_only=True)
        log(f"UNet and text encoder loaded from {args.unet_from}")
    if args.finetune_steps and not args.skip_finetune:
        torch.manual_seed(args.seed + 3)
        save.stage, save.steps_before = "finetune", min(args.unet_steps, args.stop_after or args.unet_steps)
        train_unet(
            unet, text_encoder, tokenizer, scheduler, data, args.finetune_steps, args.unet_batch, save,
            args.save_every, log, max_lr=args.finetune_lr, prompt_dropout=args.finetune_dropout,
            pct_start=0.05, stage="finetune",
        )  # fmt: skip
        unet, text_encoder = save.last_unet, save.last_text_encoder
    if args.guidance_steps:
        torch.manual_seed(args.seed + 4)
        save.stage = "guidance"
        save.steps_before = min(args.unet_steps, args.stop_after or args.unet_steps) + args.finetune_steps
        train_unet(
            unet, text_encoder, tokenizer, scheduler, data, args.guidance_steps, args.unet_batch, save,
            args.save_every, log, max_lr=args.guidance_lr, prompt_dropout=args.guidance_dropout,
            pct_start=0.1, stage="guidance",
        )  # fmt: skip
    log(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
