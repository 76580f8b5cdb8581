"""The package import table (FORBIDDEN below; README "Packages"), checked in fresh interpreters.

Each check imports modules one by one in a new Python process and records which
forbidden modules appear in `sys.modules` after each import, so a failure names the
module that pulled the forbidden one in. Modules are discovered on disk with pkgutil,
so new files are checked without editing this test. A static scan of import
statements also catches imports made lazily inside functions, and finds import circles: no circle of
project modules may hold more than MAX_CIRCLE files (a larger one ties layers together that the table keeps
apart).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import networkx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# What the API process, the scheduler's tests and `python -m batching.builtin_model --help` load of the engine
TORCH_FREE_BATCHING_MODULES = [
    "batching",
    "batching.admission",
    "batching.builtin_model",
    "batching.builtin_models.folders",
    "batching.plan",
    "batching.scheduler",
    "batching.settings",
]

MODEL_STACK = {"torch", "diffusers", "transformers"}
SERVICES = {"flask", "celery", "redis", "boto3"}

# package -> the top-level names it must not load, from the ground floor up; `training` (how the trained built-ins
# were made) is never serving code
FORBIDDEN = {
    # the table of STEPWISE_* variables: standard library only, so that every package may import it
    "settings": MODEL_STACK | SERVICES | {"core", "batching", "storage", "worker", "api"},
    # what the API, storage, the worker and the engine share: params, families, image rules, built-in names, errors
    "core": MODEL_STACK | SERVICES | {"batching", "storage", "worker", "api", "training"},
    "batching": SERVICES | {"api", "worker", "storage", "training"},
    "storage": MODEL_STACK | {"flask", "celery", "batching", "api", "worker", "training"},
    "api": MODEL_STACK | {"batching", "worker", "training"},
    "worker": {"flask", "api", "training"},
}

# every package of the project, for the import-circle check
PROJECT_PACKAGES = [*FORBIDDEN, "lora", "stepwise_cli", "benchmarks", "training"]
MAX_CIRCLE = 3

_PROBE = """
import importlib, json, sys, traceback
modules, forbidden = json.loads(sys.argv[1])
forbidden = set(forbidden)

def offending():
    return {name for name in list(sys.modules) if name.split(".")[0] in forbidden}

report = {"pulled_in": {}, "errors": {}}
seen = offending()
for module in modules:
    try:
        importlib.import_module(module)
    except BaseException:
        report["errors"][module] = traceback.format_exc(limit=-3)
    new = offending() - seen
    if new:
        report["pulled_in"][module] = sorted(new)
    seen |= new
print(json.dumps(report))
"""


def discover_modules(package: str, root: Path = ROOT) -> list[str]:
    """Every module of `package` found on disk (the package itself first), without importing any."""
    modules = [package]

    def walk(path: Path, prefix: str) -> None:
        for info in pkgutil.iter_modules([str(path)]):
            modules.append(prefix + info.name)
            if info.ispkg:
                walk(path / info.name, prefix + info.name + ".")

    walk(root / package, package + ".")
    return modules


def probe(modules: list[str], forbidden: set[str], root: Path = ROOT) -> dict:
    """Import `modules` in order in a fresh interpreter; report what each pulled in and what failed."""
    argument = json.dumps([modules, sorted(forbidden)])
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, argument], cwd=root, capture_output=True, text=True, timeout=240
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def static_violations(package: str, forbidden: set[str], root: Path = ROOT) -> list[str]:
    """Import statements anywhere in the package's source (lazy ones included) that name a forbidden module."""
    violations = []
    for module in discover_modules(package, root):
        relative = Path(*module.split("."))
        path = root / relative / "__init__.py" if (root / relative).is_dir() else root / relative.with_suffix(".py")
        for name in _imported_names(path, module, root):
            if name.split(".")[0] in forbidden:
                violations.append(f"{module} imports {name}")
    return violations


def _imported_names(path: Path, module: str, root: Path) -> list[str]:
    """Absolute names of the modules a source file imports; `from x import y` counts x.y when y is a module, else x."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts[: len(parts) - node.level + (1 if path.name == "__init__.py" else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = root / Path(*base.split("."), alias.name)
                is_module = submodule.is_dir() or submodule.with_suffix(".py").exists()
                names.append(f"{base}.{alias.name}" if is_module else base)
    return names


def import_graph(packages: list[str], root: Path = ROOT) -> networkx.DiGraph:
    """Project module -> the project modules it imports (lazy imports too). `from package import module` is an
    arrow to the module, not to the package: Python runs a package's `__init__` before any module of it anyway."""
    modules = {
        module for package in packages if (root / package).is_dir() for module in discover_modules(package, root)
    }
    graph = networkx.DiGraph()
    graph.add_nodes_from(modules)
    for module in modules:
        relative = Path(*module.split("."))
        path = root / relative / "__init__.py" if (root / relative).is_dir() else root / relative.with_suffix(".py")
        for name in _imported_names(path, module, root):
            if name in modules and name != module:
                graph.add_edge(module, name)
    return graph


def import_circles(graph: networkx.DiGraph) -> list[list[str]]:
    """Each set of modules that import each other, round a circle (two or more), largest first."""
    circles = [sorted(c) for c in networkx.strongly_connected_components(graph) if len(c) > 1]
    return sorted(circles, key=len, reverse=True)


def _packages_on_disk() -> list[str]:
    return [package for package in FORBIDDEN if (ROOT / package / "__init__.py").exists()]


def test_batching_entry_points_and_scheduler_import_without_torch():
    report = probe(TORCH_FREE_BATCHING_MODULES, MODEL_STACK)

    assert report["errors"] == {}
    assert report["pulled_in"] == {}


@pytest.mark.parametrize("package", _packages_on_disk())
def test_no_module_of_a_package_loads_what_the_design_table_forbids(package):
    report = probe(discover_modules(package), FORBIDDEN[package])

    assert report["pulled_in"] == {}, f"{package} modules loaded forbidden modules"
    assert report["errors"] == {}, "\n".join(f"{module}:\n{error}" for module, error in report["errors"].items())


@pytest.mark.parametrize("package", _packages_on_disk())
def test_no_source_file_of_a_package_imports_what_the_design_table_forbids(package):
    assert static_violations(package, FORBIDDEN[package]) == []


def test_benchmarks_never_import_the_command_line_which_runs_them():
    """One direction between the two: `stepwise bench` imports `benchmarks`; a benchmark that needs a service
    starts it as a program (`python -m stepwise_cli.main ...`), never by importing the command line."""
    assert static_violations("benchmarks", {"stepwise_cli"}) == []


def test_no_package_the_wheel_ships_imports_the_tests_which_it_does_not():
    """`tests/` is not in the wheel (pyproject's package list), so a benchmark that imported `tests.support` failed
    from an installed wheel. Run from one: tests/test_installed_wheel.py."""
    included = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = sorted(pattern.rstrip("*") for pattern in included)

    assert "benchmarks" in shipped and "tests" not in shipped
    assert [violation for package in shipped for violation in static_violations(package, {"tests"})] == []


def test_no_import_circle_holds_more_than_three_modules():
    circles = import_circles(import_graph(PROJECT_PACKAGES))

    assert [circle for circle in circles if len(circle) > MAX_CIRCLE] == []


def test_the_circle_check_finds_a_circle_through_a_lazy_import_and_not_one_through_a_package(tmp_path):
    package = tmp_path / "core"
    package.mkdir()
    (package / "__init__.py").write_text("from core import a\n")  # a package naming its module is no circle
    (package / "a.py").write_text("from core import b\n")
    (package / "b.py").write_text("from core.c import thing\n")
    (package / "c.py").write_text("thing = 1\ndef later():\n    from core import a\n")
    (package / "d.py").write_text("import core.a\n")

    circles = import_circles(import_graph(["core"], tmp_path))

    assert circles == [["core.a", "core.b", "core.c"]]


def test_the_layering_checks_name_the_module_that_imports_a_forbidden_package(tmp_path):
    fake = tmp_path / "batching"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "eager.py").write_text("import json\nimport redis\n")
    (fake / "lazy.py").write_text("def upload():\n    from boto3 import client\n")
    forbidden = FORBIDDEN["batching"]

    report = probe(discover_modules("batching", tmp_path), forbidden, root=tmp_path)
    violations = static_violations("batching", forbidden, tmp_path)

    assert list(report["pulled_in"]) == ["batching.eager"] and "redis" in report["pulled_in"]["batching.eager"]
    assert violations == ["batching.eager imports redis", "batching.lazy imports boto3"]
