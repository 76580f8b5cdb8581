"""The worker fork server: a process that imports, once, the libraries a worker process spends its start
importing (torch, diffusers, transformers, peft, Celery: about 8 of a start's 10 CPU-seconds here), then starts
each test's worker as a fork of itself that runs `python -m celery ...` as the operator's command does, with that
worker's own arguments, environment, folder and log. Run as `python -m tests.support.fork_server`; the tests'
client is `tests.support.worker_forks`, which falls back to starting the process itself when a fork would not
be the same process (docstring there).

Only third-party libraries are imported here, never the project's own packages: those read STEPWISE_* settings
when imported, and each worker brings its own. The server stays single-threaded (a fork copies only the
calling thread, so another thread's held lock would stay held in the child forever): it says how many threads
it has once it has imported, and the client only asks it to fork when that is one.

Protocol, one JSON object a line on stdin and stdout (fds 0 and 1, written unbuffered, so a fork never carries
half a reply): first the server says `{"threads": N}`; then each request gets one reply:
- `{"start": {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}}` -> `{"pid": N}` once the child leads its
  own session (as `Popen(start_new_session=True)` returns once the child has called setsid), or `{"error": "..."}`;
- `{"poll": N}` -> `{"code": C}`: None while child N runs, else its exit code as `Popen.returncode` gives it
  (negative: the signal that ended it).
The server exits when its stdin closes (its test process ended); children it started live on until stopped.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback

# What a `celery -A worker worker` process imports that is not the project's (measured with -X importtime).
PRELOAD = (
    "torch",
    "sympy",
    "numpy",
    "PIL.Image",
    "safetensors.torch",
    "huggingface_hub",
    "tokenizers",
    "transformers",
    "peft",
    "accelerate",
    "diffusers",
    "diffusers.models.autoencoders",
    "diffusers.models.unets",
    "diffusers.schedulers",
    "botocore.session",
    "boto3",
    "redis",
    "requests",
    "httpx",
    "yaml",
    "jinja2",
    "kombu.transport.redis",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.worker.consumer",
    "celery.concurrency.thread",
)


def main() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional library this install lacks: the worker will not import it either
            pass
    say({"threads": len(os.listdir("/proc/self/task"))})
    codes: dict[int, int] = {}
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "start" in request:
            say(start(request["start"]))
        else:
            try:
                say({"code": poll(request["poll"], codes)})
            except ChildProcessError as e:  # not a child of this server: a bug in the client
                say({"error": f"no child {request['poll']}: {e}"})


def say(reply: dict) -> None:
    os.write(1, json.dumps(reply).encode() + b"\n")


def start(request: dict) -> dict:
    started_read, started_write = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(started_read)
        os.close(started_write)
        return {"error": f"fork failed: {e}"}
    if pid == 0:
        os.close(started_read)
        run_child(request, started_write)  # never returns
    os.close(started_write)
    with os.fdopen(started_read, "rb") as started:
        said = started.read(1)  # the child leads its session, or it died before that
    return {"pid": pid} if said else {"error": f"the child {pid} exited before it started"}


def run_child(request: dict, started_write: int) -> None:
    """In the fork: become what `Popen(argv, env=..., cwd=..., stdout=log, stderr=STDOUT, start_new_session=True)`
    starts, then run `python -m celery` with the request's arguments; exits with celery's code."""
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.write(started_write, b"1")
        os.close(started_write)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = request["argv"]
        assert argv[1:3] == ["-m", "celery"], argv
        sys.argv = ["celery", *argv[3:]]  # run_module puts the module's path first, as `python -m` does
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    try:
        runpy.run_module("celery", run_name="__main__", alter_sys=True)
    except SystemExit:
        raise  # the interpreter exits with its code, running exit handlers as a started process does
    sys.exit(0)


def poll(pid: int, codes: dict[int, int]) -> int | None:
    if pid not in codes:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            return None
        codes[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return codes[pid]


if __name__ == "__main__":
    main()
