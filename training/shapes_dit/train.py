"""Train builtin:shapes-dit on the CPU: its transformer and text encoder, on builtin:shapes' VAE latents.

    python -m training.shapes_dit.train --out DIR --seed 0

The VAE is builtin:shapes' trained one, frozen, so the training set (every prompt at
NUM_BOX_SIZES shape sizes, at each of SIZES) is encoded once. The transformer and the text
encoder then learn the rectified-flow objective together: a row's latent x0 and noise n
are mixed at sigma, x = (1 - sigma) x0 + sigma n, and the transformer, told 1 - sigma as
ZImagePipeline tells it, predicts x0 - n (the negated velocity the pipeline steps with).
Sigma is drawn logit-normal and then shifted as the sampler's fixed shift shifts it, so
training sees the noise levels sampling visits. Each batch mixes the sizes, as the engine
mixes them in one forward. An exponential moving average of the weights is what gets
saved, every `--save-every` steps, so an interrupted run leaves a usable model; a second
run can continue from a folder (`--resume`) at another rate. The folder written is an
ordinary `ZImagePipeline.save_pretrained` folder (safetensors) with a training.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from batching.pipelines.zimage import shapes_dit
from batching.shapes.drawing import MAX_BOX_FRACTION, MIN_BOX_FRACTION, draw
from core.shapes_vocabulary import all_prompts
from training.optimization import EMA_DECAY, AveragedOptimizer
from training.shapes.latent_rgb_fit import save_latent_rgb

SIZES = (96, 112, 128)  # square image sides trained together (the VAE reconstructs every prompt from 96 up)
NUM_BOX_SIZES = 6  # shape sizes per prompt and image size in the fixed training set
PROMPT_DROPOUT = 0.15  # share of rows with the empty prompt (for classifier-free guidance)
LR = 1e-3


def pixels_to_tensor(images) -> torch.Tensor:
    array = np.stack([np.asarray(image, dtype=np.float32) for image in images])  # [n, H, W, 3]
    return torch.from_numpy(array).permute(0, 3, 1, 2) / 127.5 - 1.0  # [n, 3, H, W] in [-1, 1]


class TrainingSet:
    """Posterior means and stds of the VAE at each size, the prompt of each latent, and each prompt's tokens."""

    def __init__(self, vae, tokenizer, sizes: tuple[int, ...], log, num_box_sizes: int = NUM_BOX_SIZES) -> None:
        prompts = all_prompts()
        self.sizes = sizes
        self.token_ids = shapes_dit.caption_token_ids(tokenizer, [p.text for p in prompts])
        self.empty_ids = shapes_dit.caption_token_ids(tokenizer, [""])[0]
        fractions = np.linspace(MIN_BOX_FRACTION, MAX_BOX_FRACTION, num_box_sizes)
        self.means: dict[int, torch.Tensor] = {}  # size -> [n, c, size/8, size/8]
        self.stds: dict[int, torch.Tensor] = {}
        self.prompt_rows = torch.arange(len(prompts)).repeat_interleave(num_box_sizes)  # [n]
        with torch.no_grad():
            for size in sizes:
                means, stds = [], []
                for prompt in prompts:
                    pixels = pixels_to_tensor([draw(prompt, size, float(f)) for f in fractions])
                    posterior = vae.encode(pixels).latent_dist
                    means.append(posterior.mean)
                    stds.append(posterior.std)
                self.means[size], self.stds[size] = torch.cat(means), torch.cat(stds)
                log(f"encoded {len(self.means[size])} latents at {size}x{size}")
        self.shift, self.scale = vae.config.shift_factor, vae.config.scaling_factor

    def sample(self, num_rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`num_rows` scaled latents (per row [c, h, w], sizes mixed) and their prompts' token ids."""
        latents, token_ids = [], []
        for _ in range(num_rows):
            size = self.sizes[int(torch.randint(len(self.sizes), ()))]
            row = int(torch.randint(len(self.means[size]), ()))
            raw = self.means[size][row] + self.stds[size][row] * torch.randn_like(self.means[size][row])
            latents.append((raw - self.shift) * self.scale)
            token_ids.append(self.token_ids[int(self.prompt_rows[row])])
        return latents, token_ids


TIMESTEP_DRAWS = ("logit-normal", "uniform", "mixed")


def sample_sigmas(num_rows: int, shift: float, draw: str = "logit-normal") -> torch.Tensor:
    """Sigmas in (0, 1), shifted toward noise as the sampler's `shift` shifts its schedule.

    `logit-normal` favours the middle of the schedule; `uniform` visits every step of the
    sampler's schedule as often as sampling does (the last steps, where edges and corners
    are settled, get ten times the logit-normal share); `mixed` draws each row from one of
    the two at random.
    """
    # The draws are in the order the shipped stages made them, so each stage's command reproduces its weights.
    logit_normal = torch.sigmoid(torch.randn(num_rows))  # [num_rows]
    u = logit_normal
    if draw != "logit-normal":
        uniform = torch.rand(num_rows)
        u = uniform if draw == "uniform" else torch.where(torch.rand(num_rows) < 0.5, uniform, logit_normal)
    return shift * u / (1 + (shift - 1) * u)


def train(
    transformer,
    text_encoder,
    data: TrainingSet,
    num_steps: int,
    batch_size: int,
    save,
    save_every: int,
    log,
    max_lr: float = LR,
    pct_start: float = 0.03,
    stage: str = "train",
    stop_after: int | None = None,
    timesteps: str = "logit-normal",
    ema_decay: float = EMA_DECAY,
):
    """The flow-matching loss over `num_steps` steps (or the first `stop_after` of them) of `batch_size` rows;
    saves the EMA weights."""
    run = AveragedOptimizer([transformer, text_encoder], num_steps, max_lr, pct_start, ema_decay)
    ema_transformer, ema_text_encoder = run.averages
    num_steps_run = min(num_steps, stop_after or num_steps)
    for step in range(num_steps_run):
        latents, token_ids = data.sample(batch_size)
        dropped = torch.rand(batch_size) < PROMPT_DROPOUT
        token_ids = [data.empty_ids if drop else ids for ids, drop in zip(token_ids, dropped)]
        sigmas = sample_sigmas(batch_size, shapes_dit.FLOW_SHIFT, timesteps)  # [b]
        noises = [torch.randn_like(x0) for x0 in latents]
        noisy = [((1 - s) * x0 + s * n).unsqueeze(1) for x0, n, s in zip(latents, noises, sigmas)]  # [c, 1, h, w]
        captions = shapes_dit.caption_features(text_encoder, token_ids)
        outputs = transformer(noisy, 1 - sigmas, captions, return_dict=False)[0]
        loss = torch.stack([F.mse_loss(out.squeeze(1), x0 - n) for out, x0, n in zip(outputs, latents, noises)]).mean()
        run.step(loss)
        if step % 25 == 0 or step == num_steps - 1:
            log(f"{stage} step {step} loss {loss.item():.4f} lr {run.lr:.2e}")
        if (step + 1) % save_every == 0 or step + 1 == num_steps_run:
            save(ema_transformer, ema_text_encoder, step + 1)
    return ema_transformer, ema_text_encoder


class PipelineSaver:
    """Saves the pipeline with the given weights to `out` and, with `keep`, also to OUT-<stage>-<steps>."""

    def __init__(self, out: Path, vae, tokenizer, log, started: float, keep: bool, record: dict) -> None:
        self.out, self.vae, self.tokenizer, self.log, self.started = out, vae, tokenizer, log, started
        self.keep, self.record = keep, record
        self.stage, self.steps_before = "train", 0

    def __call__(self, transformer, text_encoder, num_steps: int) -> None:
        scheduler = shapes_dit.build_scheduler()
        pipeline = shapes_dit.assemble(self.vae, text_encoder, self.tokenizer, transformer, scheduler)  # EMA weights
        folders = [self.out]
        if self.keep:
            folders.append(self.out.with_name(f"{self.out.name}-{self.stage}-{num_steps}"))
        record = dict(self.record, stage=self.stage, transformer_steps=self.steps_before + num_steps)
        record["seconds"] = round(time.time() - self.started, 1)
        for folder in folders:
            pipeline.save_pretrained(folder)
            (folder / "training.json").write_text(json.dumps(record, indent=2) + "\n")
            save_latent_rgb(folder, "builtin:shapes-dit")  # the live previews' factors, fitted against its VAE
        self.log(f"saved {', '.join(map(str, folders))} after {num_steps} {self.stage} steps")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="train builtin:shapes-dit on procedural images (CPU)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the trained pipeline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--box-sizes", type=int, default=NUM_BOX_SIZES, help="shape sizes per prompt and size")
    parser.add_argument("--steps", type=int, default=3000, help="length of the one-cycle schedule")
    parser.add_argument("--stop-after", type=int, help="stop after this many steps of the --steps schedule")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--save-every", type=int, default=250)
    parser.add_argument("--keep-checkpoints", action="store_true", help="also keep each checkpoint in OUT-<stage>-N")
    parser.add_argument("--resume", type=Path, help="a folder this script wrote: continue from its weights")
    parser.add_argument("--stage", default="train", help="the stage's name in the log and training.json")
    parser.add_argument("--timesteps", choices=TIMESTEP_DRAWS, default="logit-normal", help="noise level draw")
    parser.add_argument("--ema-decay", type=float, default=EMA_DECAY, help="the saved average's decay")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    started = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {message}", flush=True)

    if args.resume is None:
        pipeline = shapes_dit.build_pipeline("shapes-dit")
        steps_before = 0
    else:
        from diffusers import DiffusionPipeline

        pipeline = DiffusionPipeline.from_pretrained(args.resume, local_files_only=True)
        steps_before = json.loads((args.resume / "training.json").read_text())["transformer_steps"]
        log(f"resumed from {args.resume} after {steps_before} steps")
    vae, tokenizer = pipeline.vae.eval().requires_grad_(False), pipeline.tokenizer
    torch.manual_seed(args.seed)
    data = TrainingSet(vae, tokenizer, tuple(args.sizes), log, args.box_sizes)
    record = {"sizes": args.sizes, "box_sizes": args.box_sizes, "batch": args.batch, "lr": args.lr}
    record.update(timesteps=args.timesteps, ema_decay=args.ema_decay)
    record["schedule_steps"] = args.steps
    save = PipelineSaver(args.out, vae, tokenizer, log, started, args.keep_checkpoints, record)
    save.stage, save.steps_before = args.stage, steps_before
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed + 1)
    train(
        pipeline.transformer, pipeline.text_encoder, data, args.steps, args.batch, save, args.save_every, log,
        max_lr=args.lr, pct_start=0.03 if args.resume is None else 0.1, stage=args.stage, stop_after=args.stop_after,
        timesteps=args.timesteps, ema_decay=args.ema_decay,
    )  # fmt: skip
    log(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
