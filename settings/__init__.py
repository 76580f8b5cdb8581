"""Every `STEPWISE_*` variable, declared once (`settings.table`), and the one reader of them (`read`).

- Only this package reads `STEPWISE_*` variables from `os.environ`. The settings modules
  (`storage.settings`, `api.settings`, `worker.settings`, `batching.settings`) and the command line's
  flags read them through `read`, which checks the text against the variable's kind and refuses it
  with one line naming the variable; they build their settings objects and check what spans several.
- docs/configuration.md and .env.example are written from the table: `python -m settings`.
- Standard library only, so every package may import it: the engine (which imports no service
  package) and the API (which loads no torch) alike.
"""

from __future__ import annotations

import os
from typing import Any

from settings.declaration import SettingsError, Variable, read_variable
from settings.table import SECTIONS, VARIABLES

BY_NAME = {variable.name: variable for variable in VARIABLES}

__all__ = [
    "BY_NAME",
    "SECTIONS",
    "VARIABLES",
    "SettingsError",
    "Variable",
    "declared",
    "default",
    "read",
    "read_if_set",
]


def declared(name: str) -> Variable:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared: add it to settings/table.py, then run `python -m settings`") from None


def read(name: str, default: Any = None) -> Any:
    """The variable's checked value; unset or empty: `default` when given, else its declared default."""
    return read_variable(declared(name), default)


def read_if_set(name: str) -> Any:
    """The variable's checked value when it is set (and not empty), else None whatever its default: for
    readers that act differently when a variable is unset (`stepwise up` starts its own Redis)."""
    variable = declared(name)
    return read_variable(variable) if os.environ.get(name, "") != "" else None


def default(name: str) -> Any:
    """The variable's declared default (None where its reader derives one)."""
    return declared(name).default
