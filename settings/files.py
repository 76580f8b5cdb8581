"""docs/configuration.md and .env.example, written from the table (`python -m settings` writes both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from settings.declaration import Variable
from settings.table import SECTIONS, VARIABLES

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"
ENV_EXAMPLE = ROOT / ".env.example"

DOC_HEAD = """\
# Configuration

<!-- Written by `python -m settings` from settings/table.py: edit the table, not this file. -->

Everything is set by `STEPWISE_*` environment variables; boto3 reads the standard `AWS_*` ones.
Each process checks every setting it reads when it starts and stops with one line naming a
malformed one (`STEPWISE_JOB_TTL must be an integer, at least 1 (got '0')`). Unset and empty are
the same: the default. `.env.example` lists every variable, for docker compose
(`cp .env.example .env`) or to export the ones you need for `stepwise up`, `worker` or `api`.
"""

ENV_HEAD = """\
# Every stepwise setting (written by `python -m settings` from settings/table.py; docs/configuration.md
# says more). Copy to .env for docker compose (`cp .env.example .env`), or export the ones you need for
# `stepwise up`/`worker`/`api`. A line starting with `#` shows the default; uncomment it to change it.
# The secrets (API keys, webhook secret, S3 secret, Flower's login) are empty: compose refuses to start until
# you set them, and every stepwise process refuses a placeholder (change-me, changeme, replace-me ...) in a
# secret (also a Redis URL's password and the AWS_* keys), naming the variable.
"""

ENV_TAIL = """\

# --- docker compose: the S3 server's credentials, Flower ---
# The S3 server's credentials; the API and workers sign with them. Make the secret with:
# python3 -c "import secrets; print(secrets.token_urlsafe(24))"
S3_ACCESS_KEY_ID=stepwise
S3_SECRET_ACCESS_KEY=
# Flower's login (user:password); Flower listens on 127.0.0.1 only.
FLOWER_BASIC_AUTH=
"""


def value_text(value: Any) -> str:
    """A default as the variable's text would give it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def default_cell(variable: Variable) -> str:
    if variable.default_text is not None:
        return variable.default_text
    text = value_text(variable.default)
    return f"`{text}`" if text else "unset"


def configuration_doc() -> str:
    parts = [DOC_HEAD]
    for section, heading in SECTIONS.items():
        parts.append(f"\n## {heading}\n\n| variable | default | takes | meaning |\n|---|---|---|---|\n")
        for variable in VARIABLES:
            if variable.section == section:
                cells = (f"`{variable.name}`", default_cell(variable), variable.kind.describe(), variable.meaning)
                parts.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |\n")
    return "".join(parts)


def env_example() -> str:
    parts = [ENV_HEAD]
    for section, heading in SECTIONS.items():
        parts.append(f"\n# --- {heading} ---\n")
        for variable in VARIABLES:
            if variable.section != section:
                continue
            derived = f" Default: {variable.default_text.replace('`', '')}." if variable.default_text else ""
            parts.append(f"# {variable.meaning[0].upper()}{variable.meaning[1:]}.{derived}\n")
            if variable.example is not None:
                parts.append(f"{variable.name}={variable.example}\n")
            else:
                parts.append(f"# {variable.name}={value_text(variable.default)}\n")
    parts.append(ENV_TAIL)
    return "".join(parts)


def write() -> list[Path]:
    """Rewrite both files; returns those that changed."""
    changed = []
    for path, text in ((CONFIGURATION_DOC, configuration_doc()), (ENV_EXAMPLE, env_example())):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed
