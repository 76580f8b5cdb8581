"""docker-compose.yml as `docker compose` would read it with a given .env, for tests on machines without Docker.

Compose replaces `${NAME}`, `${NAME:-default}` (unset or empty: the default, which may hold another
`${...}`) and `${NAME:?message}` (unset or empty: compose refuses to start, printing the message), and
`$$` stands for `$`. `interpolate` does the same to the file's text; `env_file` values as compose reads
them come from `read_env_file`.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

NAME = r"[A-Za-z_][A-Za-z0-9_]*"


class ComposeRefusal(Exception):
    """A `${NAME:?message}` whose variable is unset or empty: compose would not start."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"required variable {name} is missing a value: {message}")
        self.name = name


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines (comments and blank lines skipped), as compose reads a .env file."""
    values = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(rf"\s*({NAME})=(.*)", line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """The text with every `${...}` replaced as compose does; raises ComposeRefusal for the first required
    variable left empty."""
    out, index = [], 0
    while index < len(text):
        if text.startswith("$$", index):
            out.append("$")
            index += 2
        elif text.startswith("${", index):
            end = closing_brace(text, index + 2)
            out.append(substitute(text[index + 2 : end], env))
            index = end + 1
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def closing_brace(text: str, start: int) -> int:
    depth = 1
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise ValueError(f"unclosed ${{ in {text[start - 2 : start + 40]!r}")


def substitute(expression: str, env: dict[str, str]) -> str:
    match = re.fullmatch(rf"({NAME})(?:(:-|:\?)(.*))?", expression, flags=re.S)
    assert match, f"an interpolation compose would not read: ${{{expression}}}"
    name, operator, rest = match.groups()
    value = env.get(name, "")
    if value or operator is None:
        return value
    if operator == ":?":
        raise ComposeRefusal(name, rest)
    return interpolate(rest, env)


def required_variables(text: str) -> set[str]:
    """Every variable the file requires (`${NAME:?...}`)."""
    return set(re.findall(rf"\$\{{({NAME}):\?", text))


def load(path: Path, env: dict[str, str]) -> dict:
    """The compose file as compose would run it with `env` (its merge keys resolved)."""
    return yaml.safe_load(interpolate(path.read_text(), env))
