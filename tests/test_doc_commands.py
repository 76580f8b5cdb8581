"""Every command README.md and docs/*.md show, as written (tests/support/doc_commands.py finds them): each
`stepwise` command parses with the CLI's own parser, each `celery -A worker` command names a command the workers
register, each `make` target and `python -m` module exists and takes the flags shown, and the commands that run
without a service (`stepwise generate`, the model builders) run here and write what they say. The commands that
need a running service are run against `stepwise up` in tests/cli/up/test_readme_and_shell.py (the README's tour)
and tests/api/test_videos_end_to_end.py (the docs' video script); those that need a GPU, a cluster, docker or
another host (a Kubernetes apply, `docker compose up`, `aws s3api`, a real checkpoint) are checked here as
far as this machine allows: their stepwise parts parse."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import subprocess
import sys

import av
from PIL import Image

from settings import default
from stepwise_cli.main import build_parser, main
from tests.support.doc_commands import ROOT, DocCommand, doc_commands
from tests.support.routes import ROUTES
from tests.support.servers import child_env

COMMANDS = doc_commands()


def of_program(program: str) -> list[DocCommand]:
    return [command for command in COMMANDS if command.program == program]


def written(command: DocCommand) -> list[str]:
    """Its arguments without a synopsis's `[optional]` brackets: `keys list [--json]` is `keys list --json`."""
    return [argument.strip("[]") for argument in command.argv[1:] if argument.strip("[]")]


def without_optional(arguments: tuple[str, ...]) -> list[str]:
    """The arguments without a synopsis's `[optional ones]`: the command as it runs with the fewest."""
    kept, depth = [], 0
    for argument in arguments:
        depth += argument.count("[")
        if depth == 0:
            kept.append(argument)
        depth -= argument.count("]")
    return kept


def parse_error(argv: list[str]) -> str | None:
    """What argparse says of `stepwise ARGV`, or None when it parses (`--help` included)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            build_parser(argv).parse_args(argv)
    except SystemExit as e:
        return None if e.code == 0 else said.getvalue().strip().splitlines()[-1]
    return None


def test_the_docs_show_commands_of_every_kind_this_test_checks():
    programs = {command.program for command in COMMANDS}

    assert {"stepwise", "celery", "make", "python", "curl"} <= programs
    assert len(of_program("stepwise")) > 100


def help_of(path: list[str]) -> str | None:
    """`stepwise PATH --help`'s text, or None when PATH names no command."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(io.StringIO()):
            build_parser([*path, "--help"]).parse_args([*path, "--help"])
    except SystemExit as e:
        return said.getvalue() if e.code == 0 else None
    return None


def mention_error(argv: list[str]) -> str | None:
    """Prose names a command (`stepwise keys revoke`) or one of its options (`stepwise submit --out`) without a
    whole command line: the command must exist and take that option. None when it does."""
    path, option = (argv[:-1], argv[-1]) if argv and argv[-1].startswith("--") else (argv, None)
    help_text = help_of(path) if not any(word.startswith("-") for word in path) else None
    if help_text is None:
        return "names no stepwise command"
    if option is not None and not re.search(rf"{re.escape(option)}\b", help_text):
        return f"stepwise {' '.join(path)} takes no {option}"
    return None


def is_quoted_output(command: DocCommand) -> bool:
    """A message a command prints, quoted in prose (`stepwise api: STEPWISE_... is ...`), not a command."""
    return len(command.argv) > 1 and command.argv[1].endswith(":")


def test_every_stepwise_command_in_the_readme_and_docs_parses_as_written():
    """A whole command line parses; an inline span that only names a command or an option names real ones."""
    refused = []
    for command in of_program("stepwise"):
        if is_quoted_output(command):
            continue
        error = parse_error(written(command))
        if error and command.where.endswith("(inline)"):
            error = mention_error(written(command)) and error
        if error:
            refused.append(f"{command.where}: `{command.line}`: {error}")

    assert refused == [], "\n".join(refused)


def test_every_celery_command_in_the_docs_names_one_the_workers_answer():
    from celery.worker.control import Panel

    import worker  # noqa: F401  (registers the project's own inspect and control commands)

    shown = [c for c in of_program("celery") if c.argv[1:3] == ("-A", "worker") and c.argv[3] in ("inspect", "control")]
    unknown = [f"{c.where}: `{c.line}`" for c in shown if c.argv[4] not in (*Panel.data, "...")]  # ...: any

    assert len(shown) > 10
    assert unknown == [], "\n".join(unknown)


def test_every_make_target_the_docs_name_is_in_the_makefile():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    missing = [f"{c.where}: `{c.line}`" for c in of_program("make") if written(c)[0] not in targets]

    assert missing == [], "\n".join(missing)


def test_every_program_file_the_docs_run_exists():
    shown = [c for c in COMMANDS if "/" in c.program] + [c for c in COMMANDS if c.program.endswith("python")]
    files = {c.program if "/" in c.program and not c.program.endswith("python") else c.argv[1] for c in shown}
    files = {path for path in files if not path.startswith("-")}

    assert {path for path in files if not (ROOT / path).is_file()} == set()


def test_every_python_module_the_docs_run_exists_and_takes_the_flags_shown():
    """`python -m MODULE --help` for each (one interpreter for all); each flag a doc passes must be in its help."""
    flags: dict[str, set[str]] = {}
    for command in of_program("python") + of_program("python3"):
        if command.argv[1] == "-m":
            shown = {argument.split("=")[0] for argument in written(command)[2:] if argument.startswith("--")}
            flags.setdefault(command.argv[2], set()).update(shown)
    missing = sorted(module for module in flags if importlib.util.find_spec(module) is None)
    assert missing == []
    with_flags = sorted(module for module, shown in flags.items() if shown)

    helps = json.loads(
        subprocess.run(
            [sys.executable, "-c", HELP_OF_MODULES, *with_flags],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.splitlines()[-1]
    )

    unknown = {module: sorted(f for f in flags[module] if f not in helps[module]) for module in with_flags}
    assert {module: shown for module, shown in unknown.items() if shown} == HISTORICAL_FLAGS


# Commands the docs quote as they ran for a past measurement, named with its commit there (docs/api.md: the
# server choice, at 226318f); the options went with what they chose between.
HISTORICAL_FLAGS = {
    "benchmarks.api_submit": ["--worker-class"],
    "benchmarks.slow_clients": ["--server"],
    "benchmarks.waiting_clients": ["--server"],
}


HELP_OF_MODULES = """
import contextlib, io, json, runpy, sys
helps = {}
for module in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [module, "--help"]
    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out):
        runpy.run_module(module, run_name="__main__")
    helps[module] = out.getvalue()
print(json.dumps(helps))
"""


def generate_commands() -> list[DocCommand]:
    """Every `stepwise generate` the docs show (in prose, those with an --out file: the others are parts of a
    sentence), and the command before one in its block that makes the adapter it reads."""
    return [
        c
        for c in COMMANDS
        if (c.argv[:2] == ("stepwise", "generate") and ("--out" in c.argv or not c.where.endswith("(inline)")))
        or c.argv[:3] == ("python", "-m", "benchmarks.random_loras")
    ]


def test_every_stepwise_generate_in_the_docs_runs_as_written_and_writes_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "var").mkdir()
    ran = []
    for command in generate_commands():
        with monkeypatch.context() as scoped:
            for name, value in command.env:
                scoped.setenv(name, value.replace("$PWD", str(tmp_path)))
            argv = without_optional(command.argv[1:])  # the program's arguments
            if command.program == "python":
                from benchmarks.random_loras import main as make_loras

                assert make_loras(argv[2:]) == 0, command.where  # after `-m benchmarks.random_loras`
                continue
            status = main(argv)
        assert status == 0, f"{command.where}: `{command.line}` exited {status}"
        out = tmp_path / (argv[argv.index("--out") + 1] if "--out" in argv else "stepwise.png")
        if out.suffix == ".mp4":
            with av.open(str(out)) as video:
                frames = list(video.decode(video.streams.video[0]))
            assert len(frames) == int(argv[argv.index("--num-frames") + 1]), command.where
        else:
            with Image.open(out) as image:
                assert image.format == out.suffix.lstrip(".").upper().replace("JPG", "JPEG"), command.where
        ran.append(command.where)

    assert len(ran) >= 10, ran  # the families' list, the LoRA one, the README's and the video


def test_the_readme_promises_preview_events_only_for_jobs_that_ask_as_the_default_gives_none():
    readme = " ".join((ROOT / "README.md").read_text().split())
    (sentence,) = [s for s in re.split(r"(?<=\.) ", readme) if "`preview`" in s]

    assert default("STEPWISE_PREVIEW_EVERY") == 0  # a job that gives no preview_every gets none
    assert '"preview_every"' in sentence and "none by default" in sentence, sentence


def curl_request(command: DocCommand) -> tuple[str, str] | None:
    """(method, path) of a `curl` the docs show against the API, or None for one to another server."""
    url = next(
        (a for a in command.argv[1:] if re.match(r"(\$API|https?://127\.0\.0\.1:8000|localhost:8000)/", a)), None
    )
    if url is None:
        return None
    path = "/" + url.split("/", 3 if url.startswith("http") else 1)[-1].split("?")[0]
    arguments = command.argv[1:]
    if "-X" in arguments:
        method = arguments[arguments.index("-X") + 1]
    else:
        method = "POST" if {"-d", "-F", "--data-binary"} & set(arguments) else "GET"
    return method.lower(), path


def test_every_curl_in_the_docs_calls_a_route_the_api_serves_with_that_method():
    patterns = {(re.sub(r"\{[^}]+\}", "[^/]+", path), method) for path, method in ROUTES}
    shown = [(command, request) for command in of_program("curl") if (request := curl_request(command))]
    unknown = [
        f"{command.where}: {method.upper()} {path}"
        for command, (method, path) in shown
        if not any(method == m and re.fullmatch(pattern, path) for pattern, m in patterns)
    ]

    assert len(shown) > 30
    assert unknown == [], "\n".join(unknown)
