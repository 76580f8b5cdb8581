"""The limits of a job's fields, the loosest over every family (a family may ask tighter: core.families), and
the names and patterns its fields are checked against. Torch-free; core.params hands every name on."""

from __future__ import annotations

import re

from core.families import FAMILIES
from settings.table import DEVICE

SAMPLERS = tuple(dict.fromkeys(name for spec in FAMILIES.values() for name in spec.samplers))  # any family's
DEFAULT_MODEL = "builtin:tiny"  # of a GenerationParams built in Python (the engine's own default model)
PRIORITIES = ("high", "normal", "low")  # a job's priority, highest first: queue order and engine admission

MIN_SIZE = 64
MAX_SIZE = 2048
SIZE_MULTIPLE = min(spec.size_multiple for spec in FAMILIES.values())  # the loosest; families may ask more
MAX_PIXELS = 2048 * 2048
MIN_STEPS = 1
MAX_STEPS = 200
MAX_PROMPT_CHARS = 2000
MIN_GUIDANCE = 0.0
MAX_GUIDANCE = max(spec.max_guidance for spec in FAMILIES.values())  # the loosest; families may ask less
MAX_SEED = 2**63 - 1
MAX_NUM_IMAGES = 8
MAX_REFERENCE_IMAGES = max(spec.max_reference_images for spec in FAMILIES.values())  # the loosest
MAX_NUM_FRAMES = max(spec.max_num_frames for spec in FAMILIES.values())  # the loosest; families may ask less
MAX_VIDEO_PIXELS = 161 * 1280 * 720  # frames x height x width of one video: ten seconds of 720p at 16 fps
MAX_FPS = 120
MAX_LORA_SCALE = 4.0
MIN_EDIT_IMAGE_SIDE = 32  # an edit image's sides once its pipeline sizes it (a thinner one would round to none)
DEFAULT_OUTPUT_QUALITY = 90  # JPEG/WebP quality when the job names none; PNG and the video formats ignore it
DEFAULT_IMG2IMG_STRENGTH = 0.8  # diffusers' img2img default; a job with a mask defaults to 1.0 (its inpaint default)
# A LoRA adapter is `NAME` (an operator adapter) or `tenants/TENANT/NAME` (a tenant's upload, as the
# worker resolves it); the API lets users name only `NAME`. The store holds `<key>.safetensors`.
LORA_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
LORA_KEY_PATTERN = re.compile(r"(tenants/[A-Za-z0-9_-]{1,64}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1: what no model name, path or repo id holds


# Device names an engine accepts (EngineConfig.device, STEPWISE_DEVICE, --device).
DEVICE_PATTERN = re.compile(DEVICE.pattern or "")


# What `stepwise up` (so `make run`) and `stepwise generate` serve when STEPWISE_MODEL is unset: a trained
# model that draws its prompts (docs/shapes.md). A bare worker or API serves STEPWISE_MODEL's default.
SHOWCASE_MODEL = "builtin:shapes"
