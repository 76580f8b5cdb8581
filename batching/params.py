"""The engine's params, re-exported: they live in `core.params` (torch-free, shared by the API, storage, the worker
and the engine), beside the rules they read (`core.families`, `core.image_inputs`, `core.step_cache`,
`core.lora_files`, `core.errors`). `from batching import GenerationParams` and `import batching.params` keep working
with every name this module held before `core` existed."""

# ruff: noqa: F401

from core.errors import (
    InvalidParamsError,
    LoraFileError,
)
from core.families import (
    FALLBACK_FAMILY,
    FAMILIES,
    FamilySpec,
    family_of_model,
)
from core.image_inputs import (
    IMAGE_FIELDS,
    INPUT_FORMATS,
    MAX_DATA_URI_CHARS,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    RESIZE_MODES,
    canonical_data_uri,
    check_reference,
    image_size,
    input_images,
    is_data_uri,
    is_upload_id,
    job_images,
    open_image,
    to_data_uri,
    upright_size,
)
from core.lora_files import (
    LORA_SUFFIX,
    MAX_LORA_BYTES,
    check_lora_file,
)
from core.params import (
    CONTROL_CHARACTERS,
    DEFAULT_IMG2IMG_STRENGTH,
    DEFAULT_MODEL,
    DEFAULT_OUTPUT_QUALITY,
    DEVICE_PATTERN,
    LORA_KEY_PATTERN,
    LORA_NAME_PATTERN,
    MAX_FINISH_BY_SECONDS,
    MAX_GUIDANCE,
    MAX_LORA_SCALE,
    MAX_NUM_IMAGES,
    MAX_PIXELS,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MAX_SIZE,
    MAX_STEPS,
    MIN_EDIT_IMAGE_SIDE,
    MIN_GUIDANCE,
    MIN_SIZE,
    MIN_STEPS,
    OUTPUT_FORMATS,
    PRIORITIES,
    SAMPLERS,
    SHOWCASE_MODEL,
    SIZE_MULTIPLE,
    CompatibilityKey,
    GenerationParams,
    complete_by_from,
)
from core.step_cache import (
    CACHE_OFF,
    CacheSetting,
    check_cache,
)
from core.step_cache import (
    MAX_THRESHOLD as MAX_CACHE_THRESHOLD,
)
from core.step_cache import (
    PRESET_NAMES as CACHE_PRESETS,
)
