"""The commands README.md and docs/*.md show, as a user would type them (tests/test_doc_commands.py runs or checks
each): the lines of every ```sh block (a trailing backslash continues a line; `#` starts a comment), the `$ ` lines
of every ```console block, and the inline `code` spans of the prose that start with a command stepwise ships.

Each line is split as a shell splits it into simple commands (at `|`, `;`, `&&`, `||`, `$(...)`, a loop's
keywords), without the variable assignments in front, so `KEY=$(stepwise keys create --tenant team-a)` yields
`stepwise keys create --tenant team-a`."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
OPERATORS = {"$(", "2>", "2>&1"}  # besides the runs of `();<>|&` shlex gives as one token each
SHELL_KEYWORDS = {"do", "then", "else", "done", "fi", "for", "while", "until", "if", "in"}
INLINE_PROGRAMS = ("stepwise ", "make ", "celery -A worker ", "python -m ")


@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/families.md:200 (inline)": the file, line and kind, for a failure's message
    line: str  # the whole line as written
    argv: tuple[str, ...]  # one simple command of it, as the shell would pass it (quotes removed)
    env: tuple[tuple[str, str], ...] = ()  # the `NAME=value` assignments written in front of it

    @property
    def program(self) -> str:
        return self.argv[0]


def shell_lines(document: Path) -> list[tuple[int, str, str]]:
    """(line number, kind, text) of every command line of `document`: fenced blocks and inline spans."""
    text = document.read_text()
    found: list[tuple[int, str, str]] = []
    prose = text
    for block in re.finditer(r"^```(sh|console)\n(.*?)^```", text, flags=re.S | re.M):
        first_line = text[: block.start()].count("\n") + 2
        lines = block.group(2).splitlines()
        if block.group(1) == "console":
            lines = [line[2:] if line.startswith("$ ") else "" for line in lines]
        joined, start = "", first_line
        for number, line in enumerate(lines, start=first_line):
            if not joined:
                start = number
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            joined += line
            if is_open_quote(joined):  # a quoted argument goes on over the next line, as the shell reads it
                joined += "\n"
                continue
            if joined.strip() and not joined.lstrip().startswith("#"):
                found.append((start, block.group(1), joined.strip()))
            joined = ""
        prose = prose.replace(block.group(0), "\n" * block.group(0).count("\n"))
    for block in re.finditer(r"^```.*?^```", prose, flags=re.S | re.M):  # other fences (json, python ...)
        prose = prose.replace(block.group(0), "\n" * block.group(0).count("\n"))
    for span in re.finditer(r"`([^`]+)`", prose):
        command = " ".join(span.group(1).split())
        if command.startswith(INLINE_PROGRAMS):
            found.append((prose[: span.start()].count("\n") + 1, "inline", command))
    return found


def is_open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def simple_commands(line: str) -> list[tuple[tuple[str, ...], tuple[tuple[str, str], ...]]]:
    """The simple commands of one shell line (see the module's docstring)."""
    lexer = shlex.shlex(line.replace("$(", " $( "), posix=True, punctuation_chars="();<>|&")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in OPERATORS or token == "$" or re.fullmatch(r"[();<>|&]+", token):
            commands.append([])
        else:
            commands[-1].append(token)
    found = []
    for tokens in commands:
        if tokens and tokens[0] == "for":  # `for NAME in WORDS`: no command
            continue
        assignments = []
        while tokens and (tokens[0] in SHELL_KEYWORDS or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0])):
            if tokens[0] not in SHELL_KEYWORDS:
                assignments.append(tuple(tokens[0].split("=", 1)))
            tokens = tokens[1:]
        if tokens:
            found.append((tuple(tokens), tuple(assignments)))
    return found


def doc_commands() -> list[DocCommand]:
    commands = []
    for document in DOCUMENTS:
        for number, kind, line in shell_lines(document):
            where = f"{document.relative_to(ROOT)}:{number}" + (" (inline)" if kind == "inline" else "")
            commands += [DocCommand(where, line, argv, env) for argv, env in simple_commands(line)]
    return commands
