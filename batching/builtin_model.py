"""The built-in models, by name: `builtin:tiny`, `builtin:small`, `builtin:tiny-sdxl`, ...

They live in `batching.builtin_models` (a registry plus one module per family); this
module keeps the names the rest of the project imports, and the command that builds one:

    python -m batching.builtin_model builtin:tiny-sdxl      # build if missing, print the folder
"""

from __future__ import annotations

import argparse
from pathlib import Path

from batching.builtin_models.registry import (
    BUILTIN_PREFIX,
    build_builtin_pipeline,
    builtin_family,
    builtin_model_path,
    builtin_names,
    cache_dir,
    is_builtin,
    save_builtin_model,
)
from batching.errors import ModelLoadError

__all__ = [
    "BUILTIN_PREFIX",
    "builtin_family",
    "builtin_model_path",
    "builtin_names",
    "build_builtin_pipeline",
    "cache_dir",
    "is_builtin",
    "save_builtin_model",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build a built-in model and print its folder")
    parser.add_argument("model", nargs="?", default="builtin:tiny", help=", ".join(builtin_names()))
    parser.add_argument("--out", type=Path, help="save here instead of the cache folder")
    args = parser.parse_args(argv)
    try:
        folder = save_builtin_model(args.model, args.out) if args.out else builtin_model_path(args.model)
    except ModelLoadError as error:
        parser.error(str(error))
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
