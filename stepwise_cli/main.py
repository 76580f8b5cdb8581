"""The `stepwise` console script: one subcommand per module, imported only when used.

Each subcommand module defines `add_arguments(parser)` and `run(args) -> int`, so
`stepwise api` never imports torch and `stepwise generate` never imports Flask.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import signal
import sys

from settings import SettingsError

COMMANDS = {
    "generate": ("stepwise_cli.generate", "generate one image locally (no Redis)"),
    "up": ("stepwise_cli.up", "run everything on this machine with embedded defaults"),
    "api": ("stepwise_cli.api_cmd", "serve the HTTP API (granian)"),
    "worker": ("stepwise_cli.worker_cmd", "run a GPU worker (Celery, threads pool)"),
    "submit": ("stepwise_cli.submit", "submit a job to the API and optionally wait for it"),
    "status": ("stepwise_cli.status", "show a job: state, progress, image URLs or error"),
    "cancel": ("stepwise_cli.cancel", "cancel a queued or running job"),
    "jobs": ("stepwise_cli.jobs", "list your jobs, newest first"),
    "backfill": ("stepwise_cli.backfill", "push a JSONL/CSV file of prompts through the API"),
    "keys": ("stepwise_cli.keys", "create, list and revoke API keys kept in Redis"),
    "bench": ("stepwise_cli.bench", "run the benchmark suite"),
}


def installed_version() -> str:
    try:
        return importlib.metadata.version("stepwise")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepwise", description="step-level continuous batching for diffusion")
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # flags take their defaults from STEPWISE_* variables: a malformed one is refused in one line
        args = build_parser(argv).parse_args(argv)
        status = int(args.module.run(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not as a traceback at exit
        return status
    except BrokenPipeError:
        # `stepwise jobs | head`: the reader has what it wanted. Stop quietly, with the status a shell gives a
        # command that SIGPIPE stopped, and point stdout at /dev/null so the exit's own flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except SettingsError as e:
        command = next((arg for arg in argv if not arg.startswith("-")), None)
        print(f"stepwise {command}: {e}" if command else f"stepwise: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
