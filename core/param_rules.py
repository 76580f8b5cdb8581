"""The rules a GenerationParams is checked by (`validate`, called when one is made): each violation raises
`InvalidParamsError` naming the field and the bad value."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import InvalidParamsError
from core.families import FAMILIES, FamilySpec
from core.image_inputs import REFERENCE_IMAGES, RESIZE_MODES, check_reference, image_size, is_data_uri, listed_images
from core.output_formats import OUTPUT_FORMATS, VIDEO_FORMATS
from core.param_limits import (
    CONTROL_CHARACTERS,
    LORA_KEY_PATTERN,
    MAX_FPS,
    MAX_LORA_SCALE,
    MAX_NUM_FRAMES,
    MAX_NUM_IMAGES,
    MAX_PIXELS,
    MAX_PROMPT_CHARS,
    MAX_REFERENCE_IMAGES,
    MAX_SEED,
    MAX_SIZE,
    MAX_STEPS,
    MAX_VIDEO_PIXELS,
    MIN_EDIT_IMAGE_SIDE,
    MIN_GUIDANCE,
    MIN_SIZE,
    MIN_STEPS,
    SAMPLERS,
)
from core.step_cache import check_cache

if TYPE_CHECKING:
    from core.params import GenerationParams


def validate(p: GenerationParams, spec: FamilySpec, is_known: bool = True) -> None:
    _check_str(p, "prompt", MAX_PROMPT_CHARS, allow_empty=False)
    _check_str(p, "negative_prompt", MAX_PROMPT_CHARS, allow_empty=True)
    if p.negative_prompt and spec.guidance_kind != "cfg":
        raise InvalidParamsError(
            "negative_prompt",
            p.negative_prompt,
            f"is not supported by {spec.name} models (they run no classifier-free guidance)",
        )
    for name in ("height", "width"):
        value = _check_int(p, name, MIN_SIZE, MAX_SIZE)
        if value % spec.size_multiple:
            raise InvalidParamsError(name, value, f"must be a multiple of {spec.size_multiple} for {spec.name} models")
    if p.height * p.width > MAX_PIXELS:
        raise InvalidParamsError("height", p.height, f"height*width must be at most {MAX_PIXELS}")
    _check_int(p, "num_inference_steps", max(MIN_STEPS, spec.min_steps), MAX_STEPS)
    _check_number(p, "guidance_scale", MIN_GUIDANCE, spec.max_guidance)
    if p.guidance_scale_2 is not None:
        if is_known and "guidance_scale_2" not in spec.model_fields:
            raise InvalidParamsError(
                "guidance_scale_2", p.guidance_scale_2, f"is not supported by {spec.name} models (they have one expert)"
            )
        _check_number(p, "guidance_scale_2", MIN_GUIDANCE, spec.max_guidance)
    num_images = _check_int(p, "num_images", 1, MAX_NUM_IMAGES)
    if p.seed is not None:  # image i uses seed + i: the last one must fit too
        _check_int(p, "seed", 0, MAX_SEED - (num_images - 1))
    if is_known and p.sampler not in spec.samplers:
        raise InvalidParamsError(
            "sampler", p.sampler, f"must be one of {', '.join(spec.samplers)} for {spec.name} models"
        )
    if p.sampler not in SAMPLERS:  # a folder model's job: any family's, checked against its own at submit
        raise InvalidParamsError("sampler", p.sampler, f"must be one of {', '.join(SAMPLERS)}")
    model = _check_str(p, "model", 500, allow_empty=False)
    if CONTROL_CHARACTERS.search(model):
        raise InvalidParamsError("model", model, "must not contain control characters (no model is named so)")
    _validate_frames(p, spec, is_known)
    _validate_output_format(p, spec, is_known)
    if p.lora is not None:
        _check_str(p, "lora", 200, allow_empty=False)
        if not LORA_KEY_PATTERN.fullmatch(p.lora):
            raise InvalidParamsError(
                "lora",
                p.lora,
                "must be an adapter name: letters, digits, '_', '.', '-' "
                "(at most 100, starting with a letter or digit)",
            )
    _check_number(p, "lora_scale", -MAX_LORA_SCALE, MAX_LORA_SCALE)
    check_cache(p.cache, spec.name, spec.step_cache)
    _validate_image_fields(p, spec, is_known)


def _validate_reference_images(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """The list's shape, length and items; each refusal names the item, `reference_images[i]`. A model whose
    family is not known yet (a folder) may list up to the loosest family's number: its engine checks its own."""
    listed = p.reference_images
    if listed is None:
        return
    if not isinstance(listed, tuple):
        raise InvalidParamsError(REFERENCE_IMAGES, listed, "must be a list of images (data: URIs or upload ids)")
    limit = spec.max_reference_images if is_known else MAX_REFERENCE_IMAGES
    if limit == 0:
        takers = ", ".join(name for name, other in FAMILIES.items() if other.max_reference_images)
        raise InvalidParamsError(
            f"{REFERENCE_IMAGES}[0]", "<image>", f"is not supported by {spec.name} models (only {takers} take a list)"
        )
    if len(listed) > limit:
        raise InvalidParamsError(
            f"{REFERENCE_IMAGES}[{limit}]",
            f"<{len(listed)} images>",
            f"is one too many: {spec.name} models take at most {limit} reference_images",
        )
    for index, value in enumerate(listed):
        check_reference(f"{REFERENCE_IMAGES}[{index}]", value)
    if p.init_image is not None:
        raise InvalidParamsError(
            "init_image", "<image>", "cannot be given with reference_images: it is their one-image form (list it)"
        )


def _validate_image_fields(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """Shapes and ranges only; decoding and sizes are checked by core.image_inputs.input_images."""
    for name in ("init_image", "mask_image"):
        if getattr(p, name) is not None:
            check_reference(name, getattr(p, name))
    _validate_reference_images(p, spec, is_known)
    if spec.init_image_role in ("edit", "reference"):
        _validate_edit_fields(p, spec)
    if spec.init_image_role == "first_frame" and p.init_image is not None and p.mask_image is not None:
        raise InvalidParamsError(
            "mask_image", "<image>", f"is not supported by {spec.name} models (init_image is the first frame)"
        )
    if spec.init_image_role == "none" and p.init_image is not None:
        raise InvalidParamsError("init_image", "<image>", f"is not supported by {spec.name} models yet")
    if p.mask_image is not None and p.init_image is None:
        raise InvalidParamsError("mask_image", "<image>", "needs an init_image")
    strength = _check_number(p, "strength", 0.0, 1.0)
    if strength == 0.0:
        raise InvalidParamsError("strength", p.strength, "must be above 0 (0 < strength <= 1)")
    if strength != 1.0 and p.init_image is None:
        raise InvalidParamsError("strength", p.strength, "needs an init_image")
    if strength != 1.0 and spec.init_image_role == "first_frame":
        raise InvalidParamsError(
            "strength", p.strength, f"must be 1 for {spec.name} models (init_image is the first frame; every step runs)"
        )
    if (
        p.init_image is not None
        and spec.init_image_role == "start"
        and spec.steps_to_run(p.num_inference_steps, strength) < 1
    ):
        raise InvalidParamsError(
            "strength", p.strength, f"runs no step of {p.num_inference_steps}: raise strength or num_inference_steps"
        )
    if p.resize_mode not in RESIZE_MODES:
        raise InvalidParamsError("resize_mode", p.resize_mode, f"must be one of {', '.join(RESIZE_MODES)}")
    _check_int(p, "output_quality", 1, 100)


def _validate_output_format(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """Images for an image family, videos for a video family (and images for its one-frame jobs); a folder
    model's job any format that fits its frame count, checked against its family at submit."""
    if p.output_format not in OUTPUT_FORMATS:
        raise InvalidParamsError("output_format", p.output_format, f"must be one of {', '.join(OUTPUT_FORMATS)}")
    allowed = spec.output_formats(p.num_frames) if is_known else tuple(OUTPUT_FORMATS)
    if p.num_frames > 1:
        allowed = tuple(name for name in allowed if name in VIDEO_FORMATS)
    if p.output_format not in allowed:
        what = f"a video of {p.num_frames} frames" if p.num_frames > 1 else f"{spec.name} models (they draw images)"
        raise InvalidParamsError("output_format", p.output_format, f"must be one of {', '.join(allowed)} for {what}")


def _validate_frames(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """num_frames and fps by the family's rules; a model whose family is not known yet (a folder) gets the
    loosest, and its engine checks its family's at submit."""
    num_frames = _check_int(p, "num_frames", 1, spec.max_num_frames if is_known else MAX_NUM_FRAMES)
    if is_known and (num_frames - 1) % spec.frames_per_latent:
        step = spec.frames_per_latent
        raise InvalidParamsError(
            "num_frames",
            num_frames,
            f"must be a multiple of {step} plus one (1, {step + 1}, {2 * step + 1}, ...) for {spec.name} models",
        )
    if num_frames * p.height * p.width > MAX_VIDEO_PIXELS:
        raise InvalidParamsError(
            "num_frames", num_frames, f"num_frames*height*width must be at most {MAX_VIDEO_PIXELS}"
        )
    if p.fps is not None:
        if is_known and not spec.is_video:
            raise InvalidParamsError("fps", p.fps, f"is not supported by {spec.name} models (they draw images)")
        _check_int(p, "fps", 1, MAX_FPS)


def _validate_edit_fields(p: GenerationParams, spec: FamilySpec) -> None:
    """An edit model's job edits its init_image, and a reference model's job is conditioned on it: whole, at the
    pipeline's size for it, with every step (strength does not apply: a folder model's job gets img2img's
    default before its family is known)."""
    listed = listed_images(p, spec)
    if p.init_image is None and not listed:
        if spec.init_image_role == "reference":
            return
        if spec.max_reference_images:
            raise InvalidParamsError(
                REFERENCE_IMAGES,
                None,
                f"is required by {spec.name} models: 1 to {spec.max_reference_images} images to edit "
                "(or one in init_image)",
            )
        raise InvalidParamsError("init_image", None, f"is required by {spec.name} models: the image to edit")
    what = "edit the whole image" if spec.init_image_role == "edit" else "read init_image as a reference image"
    if p.mask_image is not None:
        raise InvalidParamsError("mask_image", "<image>", f"is not supported by {spec.name} models (they {what})")
    if p.resize_mode != "none":
        raise InvalidParamsError(
            "resize_mode", p.resize_mode, f"must be none for {spec.name} models (the pipeline sizes the image itself)"
        )
    if spec.init_image_role != "edit":
        return
    for field, value in listed or [("init_image", p.init_image)]:
        if not is_data_uri(value):
            continue
        image_width, image_height = image_size(field, value)
        for area in spec.edit_areas():
            if min(spec.edit_size(image_width, image_height, area)) < MIN_EDIT_IMAGE_SIDE:
                raise InvalidParamsError(
                    field,
                    f"{image_width}x{image_height}",
                    f"is too narrow for {spec.name} models: sized to about {area} pixels, a side "
                    f"would be under {MIN_EDIT_IMAGE_SIDE}",
                )


def _check_str(p: GenerationParams, name: str, max_len: int, *, allow_empty: bool) -> str:
    value = getattr(p, name)
    if not isinstance(value, str):
        raise InvalidParamsError(name, value, "must be a string")
    if not allow_empty and not value.strip():
        raise InvalidParamsError(name, value, "must not be empty")
    if len(value) > max_len:
        raise InvalidParamsError(name, f"<{len(value)} characters>", f"must be at most {max_len} characters")
    if "\x00" in value:
        raise InvalidParamsError(name, value, "must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: no tokenizer, JSON encoder or Redis client takes it
            raise InvalidParamsError(name, value, "must be valid Unicode text (it holds a lone surrogate)") from e
    return value


def _check_int(p: GenerationParams, name: str, low: int, high: int) -> int:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParamsError(name, value, "must be an integer")
    if not low <= value <= high:
        raise InvalidParamsError(name, value, f"must be between {low} and {high}")
    return value


def _check_number(p: GenerationParams, name: str, low: float, high: float) -> float:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParamsError(name, value, "must be a number")
    if not low <= value <= high:  # also refuses NaN
        raise InvalidParamsError(name, value, f"must be between {low} and {high}")
    return float(value)
