"""One rule for every secret: a value anyone could read in a published file is refused at start, naming the variable.

The secrets: the table's variables marked `is_secret` (the API keys, the admin keys, the webhook secret, the
command line's key) and, of a Redis URL (`STEPWISE_REDIS_URL`, also `is_secret`), its password; and the S3
credentials boto3 reads itself, `FOREIGN_SECRETS`, which every process that reads the storage settings checks
(storage.settings). deploy/kubernetes/secret.yaml holds a placeholder in each, so applied unchanged it starts
nothing.

A placeholder is a documented placeholder in any common spelling: "change me", "replace me", "change this",
"replace this", "fill me in" or "placeholder", in any case, with any separators or none (change-me, changeme,
CHANGEME, change_me, Change.Me, replace-me ...), anywhere in the value (also inside a `whsec_` secret's
base64); or a value this project once published as an example.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from settings.errors import SettingsError

# Placeholder phrases, lowercase with separators removed: what examples (ours, and .env files copied from
# them or from other projects' templates) put where a secret goes.
PLACEHOLDER_PHRASES = ("changeme", "replaceme", "changethis", "replacethis", "fillmein", "placeholder")
PUBLISHED_SECRETS = (  # example values this project once published: anyone can read them
    "whsec_Y2hhbmdlLW1lLWNoYW5nZS1tZS1jaGFuZ2UtbWUhIQ==",
)
FOREIGN_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")  # read by boto3 from the environment


class PlaceholderSecretError(SettingsError):
    """A secret holds a placeholder. The message names the variable, never the value."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"{name} holds a placeholder (such as 'change-me', or a published example): anyone can read it. "
            "Set a secret of your own (docs/configuration.md says how to make one)"
        )
        self.name = name


def is_placeholder(text: str) -> bool:
    """True when the text holds a placeholder phrase in any spelling (also base64-encoded after `whsec_`), or
    is a value this project published."""
    if text in PUBLISHED_SECRETS:
        return True
    decoded = ""
    try:
        decoded = base64.b64decode(text.removeprefix("whsec_"), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        pass
    return any(phrase in _letters(part) for part in (text, decoded) for phrase in PLACEHOLDER_PHRASES)


def _letters(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def secret_parts(text: str) -> list[str]:
    """What of a secret variable's value is secret: of URLs (`redis://:PASSWORD@host`, and Celery's
    `sentinel://...;sentinel://...` lists) their passwords, of anything else the whole value."""
    if "://" not in text:
        return [text]
    passwords = []
    for url in text.split(";"):
        try:
            password = urlsplit(url.strip()).password
        except ValueError:  # the variable's own check says what is wrong with it
            continue
        if password:
            passwords.append(password)
    return passwords


def check_secret(name: str, text: str) -> None:
    """Raise PlaceholderSecretError naming `name` if the secret parts of `text` hold a placeholder."""
    if any(is_placeholder(part) for part in secret_parts(text)):
        raise PlaceholderSecretError(name)


def check_foreign_secrets(environ: Mapping[str, str] = os.environ) -> None:
    """The same rule for the secrets other libraries read from the environment (FOREIGN_SECRETS)."""
    for name in FOREIGN_SECRETS:
        text = environ.get(name, "")
        if text:
            check_secret(name, text)
