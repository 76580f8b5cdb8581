"""The pixel checker on images and clips whose truth is known: the procedural generator's, noise, and wrong
prompts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from PIL import Image

from batching.shapes.checker import check_clip, check_image
from batching.shapes.drawing import (
    CLIP_MAX_BOX_FRACTION,
    CLIP_MIN_BOX_FRACTION,
    MAX_BOX_FRACTION,
    MIN_BOX_FRACTION,
    draw,
    draw_clip,
)
from core.shapes_vocabulary import (
    DIRECTIONS,
    SHAPES,
    MovingShapePrompt,
    ShapePrompt,
    all_moving_prompts,
    all_prompts,
    parse_moving_prompt,
    parse_prompt,
)


def test_every_generated_image_passes_for_its_own_prompt_at_the_smallest_and_largest_size():
    failures = [
        (prompt.text, fraction, result.reason)
        for prompt in all_prompts()
        for fraction in (MIN_BOX_FRACTION, MAX_BOX_FRACTION)
        if not (result := check_image(draw(prompt, 128, fraction), prompt))
    ]
    assert failures == []


def test_a_generated_image_fails_for_any_other_shape_or_swapped_colours():
    accepted = []
    for prompt in all_prompts():
        image = draw(prompt, 128, 0.6)
        others = [ShapePrompt(prompt.foreground, shape, prompt.background) for shape in SHAPES if shape != prompt.shape]
        others.append(ShapePrompt(prompt.background, prompt.shape, prompt.foreground))
        accepted += [other.text for other in others if check_image(image, other)]
    assert accepted == []


def test_noise_and_flat_images_are_rejected():
    rng = np.random.default_rng(0)
    prompts = all_prompts()
    noise = [Image.fromarray(rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)) for _ in range(20)]
    assert not any(check_image(image, prompts[i * 7]) for i, image in enumerate(noise))
    blank = Image.new("RGB", (128, 128), (30, 60, 220))
    assert not check_image(blank, "a red circle on a blue background")


def test_an_off_centre_shape_is_rejected():
    image = Image.new("RGB", (128, 128), (245, 245, 245))
    image.paste(draw(ShapePrompt("red", "square", "white"), 64, 0.75), (0, 0))
    assert not check_image(image, "a red square on a white background")


def test_prompts_outside_the_grammar_are_reported_not_guessed():
    assert parse_prompt("a Red Circle on a blue background.") == ShapePrompt("red", "circle", "blue")
    assert parse_prompt("a red fox on a blue background") is None
    assert parse_prompt("a red circle on a red background") is None
    assert "not a shapes prompt" in check_image(Image.new("RGB", (128, 128)), "a cat").reason


def test_drawn_clips_pass_for_their_own_moving_prompt_and_fail_for_any_other_direction_shape_or_colours():
    failures, accepted = [], []
    for index, prompt in enumerate(all_moving_prompts()[::9]):  # 75 of 672: every colour, shape and direction
        fraction = (CLIP_MIN_BOX_FRACTION, CLIP_MAX_BOX_FRACTION)[index % 2]
        clip = draw_clip(prompt, 64, 9, fraction)
        if not (result := check_clip(clip, prompt)):
            failures.append((prompt.text, fraction, result.reason))
        others = [replace(prompt, direction=d) for d in DIRECTIONS if d != prompt.direction]
        others += [replace(prompt, shape=shape) for shape in SHAPES if shape != prompt.shape]
        others.append(replace(prompt, foreground=prompt.background, background=prompt.foreground))
        accepted += [other.text for other in others if check_clip(clip, other)]
    assert failures == [] and accepted == []


def test_a_still_shape_a_clip_played_backwards_and_noise_fail_the_clip_check():
    prompt = MovingShapePrompt("red", "circle", "right", "blue")
    clip = draw_clip(prompt, 64, 9)
    still = [clip[4]] * 9
    assert check_clip(still, prompt).direction is None and not check_clip(still, prompt)
    backwards = check_clip(clip[::-1], prompt)
    assert not backwards and backwards.direction == "left" and backwards.shape == "circle"
    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(9)]
    assert not check_clip(noise, prompt)
    assert not check_clip(clip, "a red circle on a blue background")  # not a moving prompt


def test_the_moving_grammar_reads_every_moving_prompt_and_the_still_grammar_none_of_them():
    moving = all_moving_prompts()
    assert len(moving) == 672 and all(parse_moving_prompt(prompt.text) == prompt for prompt in moving)
    assert not any(parse_prompt(prompt.text) for prompt in moving)
    assert not any(parse_moving_prompt(prompt.text) for prompt in all_prompts())
    assert parse_moving_prompt("An Orange square moving Left on a white background.") == MovingShapePrompt(
        "orange", "square", "left", "white"
    )
    assert parse_moving_prompt("a red circle moving sideways on a blue background") is None
