"""settings/table.py is the one source of the `STEPWISE_*` variables: every name the tree uses is declared there,
every declared one is used, docs/configuration.md and .env.example are what it writes, and only the settings
modules read the environment. Each failure says where to declare or what to run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import settings
from settings import BY_NAME, SettingsError, read
from settings.files import CONFIGURATION_DOC, ENV_EXAMPLE, configuration_doc, env_example

ROOT = Path(__file__).resolve().parents[1]
HOW_TO_DECLARE = (
    "declare each STEPWISE_* variable once, as a Variable(...) in settings/table.py (its kind, default, "
    "one-line meaning and section), then run `python -m settings` to rewrite docs/configuration.md and .env.example"
)
NAME = re.compile(r"STEPWISE_[A-Z0-9_]*[A-Z0-9]")
# the undeclared name a test below reads
NOT_VARIABLES = {"STEPWISE_NOT_A_SETTING"}
SERVICE_PACKAGES = ("api", "core", "batching", "storage", "worker", "stepwise_cli")


def tracked_files() -> list[Path]:
    """The files that may name a variable: code, docs, compose and images (the table and its outputs aside)."""
    patterns = ["*.py", "*.md", "docker-compose.yml", "docker/*", "Makefile", "*.toml", "*.html", "*.js"]
    found = {path for pattern in patterns for path in ROOT.rglob(pattern)}
    skipped = {ROOT / "settings" / "table.py", CONFIGURATION_DOC, ENV_EXAMPLE}
    return sorted(
        path
        for path in found - skipped
        if path.is_file() and not {".venv", "var", "build", ".git", "node_modules"} & set(path.relative_to(ROOT).parts)
    )


def names_in(path: Path) -> set[str]:
    return set(NAME.findall(path.read_text(errors="replace"))) - NOT_VARIABLES


def test_every_stepwise_variable_the_tree_names_is_declared_in_the_table():
    undeclared = {}
    for path in tracked_files():
        for name in names_in(path) - set(BY_NAME):
            undeclared.setdefault(name, []).append(str(path.relative_to(ROOT)))

    assert not undeclared, f"undeclared variables (name: files naming it): {undeclared}; {HOW_TO_DECLARE}"


def test_every_declared_variable_is_read_by_some_process_or_by_compose():
    readers = [*(path for package in SERVICE_PACKAGES for path in (ROOT / package).rglob("*.py")), ROOT / "tests"]
    used = set()
    for path in readers:
        files = path.rglob("*.py") if path.is_dir() else [path]
        for file in files:
            used |= names_in(file)
    used |= names_in(ROOT / "docker-compose.yml")

    assert set(BY_NAME) - used == set(), "declared in settings/table.py but read by nothing: remove them"


def test_docs_configuration_and_env_example_are_what_the_table_writes():
    assert CONFIGURATION_DOC.read_text() == configuration_doc(), f"docs/configuration.md is stale: {HOW_TO_DECLARE}"
    assert ENV_EXAMPLE.read_text() == env_example(), f".env.example is stale: {HOW_TO_DECLARE}"


def test_env_example_names_every_declared_variable_and_no_other():
    named = set(re.findall(r"^#? ?(STEPWISE_[A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), flags=re.M))

    assert named == set(BY_NAME), f"missing {set(BY_NAME) - named}, unknown {named - set(BY_NAME)}; {HOW_TO_DECLARE}"


def environment_reads(path: Path) -> list[str]:
    """The places in a source file that read a STEPWISE_* variable from os.environ (`os.environ.get(...)`,
    `os.getenv(...)`, `os.environ[...]`, `... in os.environ`), or a name the code computes (it may be one)."""

    def is_os(node: ast.AST, attribute: str) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == attribute and ast.unparse(node.value) == "os"

    def is_environ(node: ast.AST) -> bool:
        return is_os(node, "environ")

    def key_read(node: ast.AST) -> ast.AST | None:
        """The key `node` reads from the environment, or None when it reads none."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if (node.func.attr == "get" and is_environ(node.func.value)) or is_os(node.func, "getenv"):
                return node.args[0]
        if isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            return node.slice
        if isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            return node.left
        return None

    places = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        key = key_read(node)
        if key is not None and (not isinstance(key, ast.Constant) or str(key.value).startswith("STEPWISE_")):
            places.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return places


def test_only_the_settings_package_reads_stepwise_variables_from_the_environment():
    reads = [
        place
        for package in SERVICE_PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for place in environment_reads(path)
    ]

    assert reads == [], f"read through `settings.read(NAME)` in the package's settings module instead: {reads}"


def test_only_settings_modules_and_the_command_line_call_read():
    callers = []
    for package in ("api", "batching", "storage", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "settings" and path.name != "settings.py":
                    callers += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name.startswith("read")]

    assert callers == [], "a package reads its variables in its settings module and passes the values on"


def test_the_table_refuses_bad_text_naming_the_variable_and_takes_unset_or_empty_as_the_default(monkeypatch):
    monkeypatch.setenv("STEPWISE_JOB_TTL", "")
    assert read("STEPWISE_JOB_TTL") == 7 * 24 * 3600
    for name, text in [
        ("STEPWISE_JOB_TTL", "0"),
        ("STEPWISE_MODEL_RETENTION", "-1"),
        ("STEPWISE_WORKER_TIMEOUT", "inf"),
        ("STEPWISE_API_PORT", "http"),
        ("STEPWISE_POLICY", "lifo"),
        ("STEPWISE_API_URL", "localhost:8000"),
        ("STEPWISE_LORA_CACHE_ADAPTERS", "0"),
    ]:
        monkeypatch.setenv(name, text)
        with pytest.raises(SettingsError, match=f"^{name} must be"):
            read(name)


def test_a_name_not_in_the_table_is_refused_saying_where_to_declare_it():
    with pytest.raises(KeyError, match="settings/table.py"):
        settings.read("STEPWISE_NOT_A_SETTING")


def test_a_bare_worker_runs_the_engine_with_the_engine_defaults():
    from batching.engine_config import EngineConfig
    from worker.settings import WorkerSettings

    engine = EngineConfig()
    for name in ("model", "device", "max_num_seqs", "policy", "preemption", "deterministic", "lora_mode"):
        assert getattr(WorkerSettings, name) == getattr(engine, name), name
    assert (WorkerSettings.lora_cache_adapters, WorkerSettings.lora_cache_bytes) == (
        engine.lora_cache_adapters,
        engine.lora_cache_bytes,
    )
    assert settings.default("STEPWISE_LORA_MAX_BYTES") == engine.lora_max_bytes
