"""The project as an image or a user gets it: the Docker build context (what .dockerignore lets through,
read with docker-py's own matcher), the wheel built from that context as docker/*.Dockerfile's wheel stage
builds it, and the Dockerfiles' instructions."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from docker.utils.build import exclude_paths

ROOT = Path(__file__).resolve().parents[2]


def build_context(dockerfile: str) -> set[str]:
    """The paths (files and folders, relative to the checkout) `docker build -f dockerfile .` sends."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return exclude_paths(str(ROOT), patterns, dockerfile=dockerfile)


def build_wheel(dockerfile: str, out_dir: Path) -> Path:
    """The wheel the Dockerfile's wheel stage builds: `pip wheel --no-deps .` over a copy of the build context
    (with this environment's setuptools, offline)."""
    context = out_dir / "context"
    for relative in sorted(build_context(dockerfile)):
        source, target = ROOT / relative, context / relative
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out_dir), "."],
        cwd=context,
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(context)
    (wheel,) = out_dir.glob("stepwise-*.whl")
    return wheel


@dataclass
class Stage:
    base: str  # the FROM image (ARGs not expanded)
    name: str | None  # FROM ... AS name
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, rest of the line)

    def arguments(self, keyword: str) -> list[str]:
        return [rest for word, rest in self.instructions if word == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # ARGs with defaults, before and after FROM lines alike
    stages: list[Stage]

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        text = re.sub(r"\\\n", " ", path.read_text())  # continuation lines joined
        args: dict[str, str] = {}
        stages: list[Stage] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            keyword = keyword.upper()
            if keyword == "ARG" and "=" in rest:
                name, _, value = rest.partition("=")
                args[name.strip()] = value.strip().strip('"')
            if keyword == "FROM":
                base, _, name = rest.partition(" AS ")
                stages.append(Stage(base.strip(), name.strip() or None))
            elif stages:
                stages[-1].instructions.append((keyword, rest.strip()))
        return cls(args, stages)

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda match: self.args.get(match.group(1), match.group(0)), text)

    @property
    def final(self) -> Stage:
        return self.stages[-1]
