"""`stepwise generate`: one image or video on this machine, through the same engine the worker runs.

The file's extension says its format: .png, .jpg/.jpeg, .webp for an image; .mp4, .webm, .gif for a video
(`--num-frames` above 1, a video model's default)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.builtin_models import builtin_names
from core.output_formats import VIDEO_FORMATS
from core.params import DEVICE_PATTERN, SAMPLERS, SHOWCASE_MODEL
from core.step_cache import CACHE_OFF, cache_setting
from core.step_cache import PRESET_NAMES as CACHE_PRESETS
from settings import read
from stepwise_cli.image_args import image_file_uri

FLAG_OF_FIELD = {
    "prompt": "--prompt",
    "negative_prompt": "--negative-prompt",
    "num_inference_steps": "--steps",
    "guidance_scale": "--guidance",
    "seed": "--seed",
    "sampler": "--sampler",
    "height": "--height",
    "width": "--width",
    "model": "--model",
    "lora": "--lora",
    "lora_scale": "--lora-scale",
    "init_image": "--init-image",
    "reference_images": "--reference-image",
    "strength": "--strength",
    "cache": "--cache",
    "num_frames": "--num-frames",
    "fps": "--fps",
    "output_format": "--out",
}
EXTENSION_FORMATS = {"jpg": "jpeg"}  # a file extension -> its output_format, where they differ


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="what to draw")
    parser.add_argument(
        "--negative-prompt", default="", help="what to steer away from (families with CFG, guidance on)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a random one, printed)")
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the model family's)")
    parser.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="guidance scale (default: the model family's; SD/SDXL: <= 1 turns CFG off, "
        "Z-Image: 0 does, FLUX-dev: an embedded input)",
    )
    parser.add_argument("--sampler", default=None, choices=SAMPLERS, help="sampler (default: euler)")
    parser.add_argument(
        "--height",
        type=int,
        default=None,
        help="image height in pixels, a multiple of 8 (16 for FLUX and Z-Image); default: the family's",
    )
    parser.add_argument("--width", type=int, default=None, help="image width in pixels (default: the family's)")
    parser.add_argument(
        "--model",
        default=None,
        help=f"{', '.join(builtin_names())}, a diffusers folder or a cached Hugging Face repo id "
        f"(default: $STEPWISE_MODEL, else {SHOWCASE_MODEL})",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument(
        "--lora", default=None, help="a LoRA adapter: NAME.safetensors in the store $STEPWISE_LORA_URL (file:///folder)"
    )
    parser.add_argument("--lora-scale", type=float, default=1.0, help="the adapter's strength (default: 1.0)")
    parser.add_argument(
        "--init-image",
        type=Path,
        default=None,
        help="a PNG/JPEG/WebP file: image-to-image starts from it (its size unless --width/--height); "
        "FLUX.2 takes it as a reference image",
    )
    parser.add_argument(
        "--reference-image",
        dest="reference_images",
        type=Path,
        action="append",
        default=None,
        help="a PNG/JPEG/WebP file; give it once per image, in order: the images a Qwen-Image-Edit-Plus or FLUX.2 "
        "model reads (reference_images)",
    )
    parser.add_argument("--strength", type=float, default=None, help="with --init-image: fraction of the steps run")
    parser.add_argument(
        "--cache",
        type=cache_setting,
        default=None,
        help=f"step caching: {CACHE_OFF} (default), {', '.join(CACHE_PRESETS)}, or a threshold (0 < t <= 1); "
        "every family",
    )
    parser.add_argument(
        "--num-frames", type=int, default=None, help="video models: frames (Wan: 4k+1; default: the family's, 33)"
    )
    parser.add_argument("--fps", type=int, default=None, help="video models: frames per second (default: 16)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="file to write, its format by its extension: .png, .jpg, .webp, or for a video .mp4, .webm, .gif "
        "(default: stepwise.png, or stepwise.mp4 for a video)",
    )
    parser.add_argument(
        "--preview",
        type=Path,
        default=None,
        help="a JPEG file the live preview is written to while the job runs (an image viewer that reloads "
        "shows it; every --preview-every steps)",
    )
    parser.add_argument("--preview-every", type=int, default=4, help="steps between previews (default: 4)")


def run(args: argparse.Namespace) -> int:
    from core.errors import BatchingError, InvalidParamsError
    from core.params import GenerationParams

    try:
        init_image = image_file_uri(args.init_image) if args.init_image else None
        reference_images = [image_file_uri(path) for path in args.reference_images] if args.reference_images else None
    except OSError as e:
        flag = "--init-image" if e.filename == str(args.init_image) else "--reference-image"
        print(f"stepwise generate: error: {flag}: {e}", file=sys.stderr)
        return 2
    try:
        params = GenerationParams(
            prompt=args.prompt,
            negative_prompt=args.negative_prompt,
            seed=args.seed,
            num_inference_steps=args.steps,
            guidance_scale=args.guidance,
            sampler=args.sampler,
            height=args.height,
            width=args.width,
            model=args.model or read("STEPWISE_MODEL", SHOWCASE_MODEL),
            lora=args.lora,
            lora_scale=args.lora_scale,
            init_image=init_image,
            reference_images=reference_images,  # type: ignore[arg-type]  # a list: kept as a tuple
            strength=args.strength,
            cache=args.cache,
            num_frames=args.num_frames,
            fps=args.fps,
            output_format=output_format_of(args.out),  # type: ignore[arg-type]  # None: the model's default format
        )
    except InvalidParamsError as e:
        flag = FLAG_OF_FIELD.get(e.field.partition("[")[0], e.field)
        print(f"stepwise generate: error: {flag}: {e}", file=sys.stderr)
        return 2
    problem = device_problem(args.device)
    if problem:
        print(f"stepwise generate: error: --device: {problem}", file=sys.stderr)
        return 2
    if args.out is None:
        args.out = Path(f"stepwise.{params.output_format}")
    if not args.out.parent.is_dir():
        print(f"stepwise generate: error: --out: folder {str(args.out.parent)!r} does not exist", file=sys.stderr)
        return 2
    if args.preview is not None and args.preview_every < 1:
        print("stepwise generate: error: --preview-every: must be at least 1", file=sys.stderr)
        return 2
    from core.output_encoding import encode_outputs

    try:
        result = _generate(params, args.device, args.preview, args.preview_every)
        args.out.write_bytes(encode_outputs(result)[0])
    except (BatchingError, OSError) as e:
        print(f"stepwise generate: error: {e}", file=sys.stderr)
        return 1
    frames = f", {params.num_frames} frames at {params.fps} fps" if params.output_format in VIDEO_FORMATS else ""
    print(f"wrote {args.out} ({params.width}x{params.height}{frames}, seed {params.seed})")
    return 0


def output_format_of(out: Path | None) -> str | None:
    """The output format the file's extension names (None: the job's default; an unknown one is refused)."""
    if out is None or not out.suffix:
        return None
    extension = out.suffix.lower().lstrip(".")
    return EXTENSION_FORMATS.get(extension, extension)


def device_problem(device: str) -> str | None:
    """Why `device` cannot run here, or None: a bad name, or CUDA asked for where there is none."""
    if not DEVICE_PATTERN.fullmatch(device):
        return f"must be auto, cpu, cuda or cuda:N (got {device!r})"
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        return f"{device} asked for, but this machine has no usable CUDA device ({build}); use --device cpu or auto"
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return f"{device} asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


def _generate(params, device: str, preview_path: Path | None = None, preview_every: int = 4):
    from concurrent.futures import TimeoutError as FutureTimeout

    from tqdm import tqdm

    from batching.engine import DiffusionEngine, EngineConfig
    from batching.pipelines.loading import quiet_model_libraries

    quiet_model_libraries()

    config = EngineConfig(model=params.model, device=device, max_num_seqs=1, lora_url=read("STEPWISE_LORA_URL"))
    with DiffusionEngine(config) as engine:
        with tqdm(
            total=params.num_inference_steps, desc="denoising", unit="step", file=sys.stderr, disable=None
        ) as bar:  # None: a bar only on a terminal

            def show_progress(num_steps_done: int, num_steps_total: int) -> None:
                bar.total = num_steps_total  # the job's own step count (fewer with an init image's strength)
                bar.update(num_steps_done - bar.n)

            previews: list = []  # the newest, appended on the loop thread; written here, off the loop
            future = engine.submit(
                params,
                on_progress=show_progress,
                preview_every=preview_every if preview_path else 0,
                on_preview=previews.append if preview_path else None,
            )
            while True:
                try:
                    image = future.result(timeout=0.2)
                except FutureTimeout:
                    image = None
                if previews and preview_path is not None:  # the newest, at most every 0.2 s and once at the end
                    latest = previews[-1]
                    previews.clear()
                    latest.image().save(preview_path, format="JPEG", quality=85)
                if image is not None:
                    return image
