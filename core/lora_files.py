"""What a LoRA adapter file must be, checked from its bytes without torch (the API's upload check and the engine's
read both apply it, before any tensor is built).

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor name -> dtype,
shape, data offsets; optionally `__metadata__`, strings to strings) and the data. The header is
checked as safetensors itself checks it, so a file that passes here also parses there and no
declared size is ever allocated: every tensor's offsets must match its dtype and shape exactly and
the tensors must tile the data with no gap or overlap (a 1-KB file cannot declare a 40-GB tensor).

Then the LoRA rules. Some tensor name must contain "lora" (diffusers refuses the file otherwise).
Among those names, in the formats diffusers reads (`X.lora_A.weight`/`X.lora_B.weight`, kohya's
`X.lora_down.weight`/`X.lora_up.weight`, and `X.down.weight`/`X.up.weight` as older diffusers and
XLabs write them), every down matrix has its up matrix and the other way round, both 2-D (linear)
or 4-D (conv) floating-point tensors of the same positive rank (down `[r, in, ...]`, up `[out, r, ...]`);
an alpha (`X.alpha`) is one finite floating-point number. Keys in other forms are left to diffusers.
Finite weights are checked after parsing, with torch (`store.py`).
"""

from __future__ import annotations

import json
import math
import struct

from core.errors import LoraFileError

LORA_SUFFIX = ".safetensors"
MAX_LORA_BYTES = 256 * 2**20  # one adapter file; the API's upload limit and the engine's read limit
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})  # what a LoRA weight or alpha may be
# (down suffix, up suffix) of each key format; the module name is what precedes the suffix
PAIR_SUFFIXES = (
    (".lora_A.weight", ".lora_B.weight"),
    (".lora_down.weight", ".lora_up.weight"),
    (".down.weight", ".up.weight"),  # older diffusers' `.lora.down.weight`, XLabs' `.qkv_lora1.down.weight`, ...
)
ALPHA_SUFFIX = ".alpha"
_SHOWN = 100  # characters of a tensor name quoted in a message


def check_lora_file(data: bytes) -> int:
    """The number of tensors in the adapter file `data`, or LoraFileError saying why it cannot be used."""
    header, data_start = _header(data)
    tensors = _tensor_entries(header, len(data) - data_start)
    _check_lora_keys(tensors, data, data_start)
    return len(tensors)


def _header(data: bytes) -> tuple[dict, int]:
    if len(data) < 8:
        raise LoraFileError("is not a safetensors file (shorter than its 8-byte header length)")
    (header_length,) = struct.unpack("<Q", data[:8])
    if header_length > min(len(data) - 8, MAX_HEADER_BYTES):
        raise LoraFileError(f"is not a safetensors file (its header length, {header_length}, exceeds the file)")
    try:
        header = json.loads(data[8 : 8 + header_length])
    except (UnicodeDecodeError, ValueError) as e:
        raise LoraFileError("is not a safetensors file (its header is not JSON)") from e
    except RecursionError as e:  # safetensors' header is flat: name -> {dtype, shape, data_offsets}
        raise LoraFileError("is not a safetensors file (its JSON header is nested too deeply)") from e
    if not isinstance(header, dict):
        raise LoraFileError("is not a safetensors file (its header is not a JSON object)")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise LoraFileError("is not a valid safetensors file (its __metadata__ must map strings to strings)")
    return header, 8 + header_length


def _tensor_entries(header: dict, data_length: int) -> dict[str, tuple[str, list[int], int]]:
    """name -> (dtype, shape, data start), each entry checked against the data it declares."""
    tensors: dict[str, tuple[str, list[int], int]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        problem = _entry_problem(entry)
        if problem:
            raise LoraFileError(f"is not a valid safetensors file (tensor {name[:_SHOWN]!r}: {problem})")
        start, end = entry["data_offsets"]
        num_bytes = math.prod(entry["shape"]) * DTYPE_BYTES[entry["dtype"]]
        if end - start != num_bytes:
            raise LoraFileError(
                f"is not a valid safetensors file (tensor {name[:_SHOWN]!r}: shape {entry['shape']} of "
                f"{entry['dtype']} is {num_bytes} bytes, its data_offsets span {end - start})"
            )
        tensors[name] = (entry["dtype"], entry["shape"], start)
        spans.append((start, end, name))
    position = 0
    for start, end, name in sorted(spans):
        if start != position:
            raise LoraFileError(
                f"is not a valid safetensors file (tensor {name[:_SHOWN]!r}'s data "
                f"{'overlaps another' if start < position else 'leaves a gap before it'})"
            )
        position = end
    if position != data_length:
        raise LoraFileError(
            f"is not a valid safetensors file (its tensors cover {position} of its {data_length} data bytes)"
        )
    if not tensors:
        raise LoraFileError("holds no tensors")
    return tensors


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        return f"unknown dtype {str(dtype)[:20]!r}"
    if not isinstance(shape, list) or not all(type(size) is int and size >= 0 for size in shape):
        return "shape must be a list of non-negative integers"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(offset) is int for offset in offsets):
        return "data_offsets must be two integers"
    if not 0 <= offsets[0] <= offsets[1]:
        return "data_offsets must be 0 <= begin <= end"
    return None


def _check_lora_keys(tensors: dict[str, tuple[str, list[int], int]], data: bytes, data_start: int) -> None:
    lora_names = [name for name in tensors if "lora" in name.lower()]  # diffusers' own test of a LoRA key
    if not lora_names:
        raise LoraFileError("holds no LoRA weights (no tensor name contains 'lora', as diffusers requires)")
    for down_suffix, up_suffix in PAIR_SUFFIXES:
        downs = {name.removesuffix(down_suffix) for name in lora_names if name.endswith(down_suffix)}
        ups = {name.removesuffix(up_suffix) for name in lora_names if name.endswith(up_suffix)}
        for module in sorted(downs ^ ups):
            present, missing = (down_suffix, up_suffix) if module in downs else (up_suffix, down_suffix)
            raise LoraFileError(f"has {(module + present)[:_SHOWN]!r} without its {missing.lstrip('.')!r}")
        for module in sorted(downs):
            _check_pair(module, tensors[module + down_suffix], tensors[module + up_suffix])
    for name, (dtype, shape, start) in tensors.items():
        if name.endswith(ALPHA_SUFFIX):
            _check_alpha(name, dtype, shape, data[data_start + start : data_start + start + DTYPE_BYTES[dtype]])


def _check_pair(module: str, down: tuple[str, list[int], int], up: tuple[str, list[int], int]) -> None:
    (down_dtype, down_shape, _), (up_dtype, up_shape, _) = down, up
    shown = module[:_SHOWN]
    if down_dtype not in FLOAT_DTYPES or up_dtype not in FLOAT_DTYPES:
        raise LoraFileError(
            f"has LoRA weights of {shown!r} in {down_dtype}/{up_dtype}; they must be one of "
            f"{', '.join(sorted(FLOAT_DTYPES))}"
        )
    if len(down_shape) not in (2, 4) or len(up_shape) != len(down_shape):
        raise LoraFileError(
            f"has LoRA weights of {shown!r} shaped {down_shape} and {up_shape}; both must be 2-D (linear) or 4-D (conv)"
        )
    if down_shape[0] < 1 or up_shape[1] != down_shape[0] or 0 in down_shape or 0 in up_shape:
        raise LoraFileError(
            f"has LoRA weights of {shown!r} shaped {down_shape} (down) and {up_shape} (up), which do not multiply: "
            "down must be [rank, in, ...] and up [out, rank, ...] with the same rank of at least 1"
        )


def _check_alpha(name: str, dtype: str, shape: list[int], raw: bytes) -> None:
    if dtype not in FLOAT_DTYPES or math.prod(shape) != 1:
        raise LoraFileError(f"has alpha {name[:_SHOWN]!r} of {dtype} {shape}; it must be one floating-point number")
    if dtype == "BF16":
        (value,) = struct.unpack("<f", b"\0\0" + raw)
    else:
        (value,) = struct.unpack({"F16": "<e", "F32": "<f", "F64": "<d"}[dtype], raw)
    if not math.isfinite(value):
        raise LoraFileError(f"has alpha {name[:_SHOWN]!r} of {value}; it must be a finite number")
