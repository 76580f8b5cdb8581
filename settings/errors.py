"""The settings package's one error."""

from __future__ import annotations


class SettingsError(ValueError):
    """A variable holds a value its process cannot take; the message names the variable."""
