"""Input images as the engine sees them (core.image_inputs.job_images, which the API runs too): unusual
images decode as diffusers' `load_image` and inpainting mask processor read them, and resizing stays bounded."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import load_image
from PIL import Image

from core.image_inputs import job_images
from core.params import GenerationParams

ROOT = Path(__file__).resolve().parents[2]


def encoded(image: Image.Image, image_format: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"  # the bytes decide the format


def pattern(width: int = 64, height: int = 64, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Noise over a left-to-right ramp: every orientation and channel mix-up shows, and masks have both halves."""
    ramp = np.linspace(0, 255, width)[None, :, None]
    noise = np.random.default_rng(seed).integers(-40, 40, (height, width, 3))
    return Image.fromarray(np.clip(ramp + noise, 0, 255).astype(np.uint8)).convert(mode)


def rotated_jpeg(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encoded(pattern(128, 64), "JPEG", exif=exif.tobytes())


def ycck_jpeg() -> bytes:
    """A CMYK JPEG whose Adobe marker says its components are YCCK (as Photoshop writes CMYK), which libjpeg
    then converts to CMYK: the pixels differ from the pattern's, the decoding path is the one to cover."""
    data = bytearray(encoded(pattern(mode="CMYK"), "JPEG"))
    data[data.index(b"Adobe") + 11] = 2  # APP14: "Adobe", version, flags0, flags1, transform (2: YCCK)
    return bytes(data)


def animated(image_format: str) -> bytes:
    frames = [pattern(seed=seed) for seed in range(3)]
    return encoded(frames[0], image_format, save_all=True, append_images=frames[1:])


ODD_IMAGES = [  # (name, bytes)
    ("CMYK jpeg", encoded(pattern(mode="CMYK"), "JPEG")),
    ("YCCK jpeg", ycck_jpeg()),
    ("palette png with transparency", encoded(pattern(mode="P"), transparency=3)),
    ("LA png", encoded(pattern(mode="LA"))),
    ("RGBA png, half transparent", encoded(Image.merge("RGBA", (*pattern().split(), pattern(mode="L"))))),
    ("1-bit png", encoded(pattern(mode="1"))),
    ("jpeg turned 90 degrees by EXIF", rotated_jpeg(6)),
    ("jpeg turned 180 degrees by EXIF", rotated_jpeg(3)),
    ("jpeg mirrored and turned by EXIF", rotated_jpeg(7)),
    ("animated png", animated("PNG")),
    ("animated webp", animated("WEBP")),
    ("multi-picture camera jpeg", encoded(pattern(), "MPO", save_all=True, append_images=[pattern(seed=1)])),
]


@pytest.mark.parametrize("name, data", ODD_IMAGES, ids=[case[0] for case in ODD_IMAGES])
def test_an_odd_image_decodes_as_diffusers_load_image_and_mask_processor_read_it(name, data):
    expected = load_image(Image.open(io.BytesIO(data)))  # diffusers: EXIF transpose, then RGB
    params = GenerationParams(
        prompt="a fox",
        init_image=data_uri(data),
        mask_image=data_uri(data),
        width=expected.width,
        height=expected.height,
    )
    mask_processor = VaeImageProcessor(do_normalize=False, do_binarize=True, do_convert_grayscale=True)
    expected_mask = mask_processor.preprocess(expected, height=expected.height, width=expected.width)  # [1, 1, H, W]

    init, mask = job_images(params)

    assert init is not None and mask is not None
    assert init.mode == "RGB" and np.array_equal(np.asarray(init), np.asarray(expected))
    assert np.array_equal(np.asarray(mask) / 255.0, expected_mask[0, 0].numpy())
    assert 0 < np.asarray(mask).mean() < 255, "a mask with both halves: the comparison sees their boundary"


def test_a_16_bit_gray_png_is_scaled_to_8_bits_where_pillow_would_clip_it():
    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (64, 1))
    params = GenerationParams(prompt="a fox", init_image=data_uri(encoded(Image.fromarray(ramp))))

    init, _ = job_images(params)

    assert init is not None
    assert np.array_equal(np.asarray(init)[..., 0], (ramp >> 8).astype(np.uint8)), "diffusers' convert: all white"


def test_crop_takes_the_center_of_an_image_wider_than_the_job():
    image = pattern(80, 64)
    params = GenerationParams(
        prompt="a fox", init_image=data_uri(encoded(image)), width=64, height=64, resize_mode="crop"
    )

    init, _ = job_images(params)

    assert init is not None and np.array_equal(np.asarray(init), np.asarray(image.crop((8, 0, 72, 64))))


CROP_A_THIN_IMAGE = """
import base64, io, resource, sys
import numpy as np
from PIL import Image
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from core.image_inputs import job_images
from core.params import GenerationParams
rows = (np.arange(16000) % 256).astype(np.uint8)[:, None, None].repeat(3, axis=2)  # 1x16000, row i is i % 256
buffer = io.BytesIO()
Image.fromarray(rows).save(buffer, format="PNG")
uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
init, _ = job_images(GenerationParams(prompt="a fox", init_image=uri, width=512, height=512, resize_mode="crop"))
print(int(np.asarray(init).min()), int(np.asarray(init).max()))
"""


def test_cropping_a_one_pixel_wide_image_to_the_job_needs_no_more_than_its_own_pixels():
    """Scaling the whole 1x16000 image to cover 512x512 first would take 512x8192000 pixels (12 GB)."""
    result = subprocess.run(
        [sys.executable, "-c", CROP_A_THIN_IMAGE],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr[-2000:]
    low, high = map(int, result.stdout.split())
    assert abs(low - 8000 % 256) <= 1 and abs(high - 8000 % 256) <= 1, "the center rows, 7999.5 to 8000.5"
