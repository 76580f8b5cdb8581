"""The built-in models, by name: `builtin:tiny`, `builtin:small`, `builtin:tiny-sdxl`, ...

They are named in `core.builtin_models` and built in `batching.builtin_models`; this module
keeps the names the engine's users import, and the command that builds one:

    python -m batching.builtin_model builtin:tiny-sdxl      # build if missing, print the folder
"""

from __future__ import annotations

import argparse
from pathlib import Path

from batching.builtin_models.folders import build_builtin_pipeline, builtin_model_path, save_builtin_model
from batching.settings import cache_dir
from core.builtin_models import BUILTIN_PREFIX, builtin_family, builtin_names, is_builtin
from core.errors import ModelLoadError

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
