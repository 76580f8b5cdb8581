"""`stepwise up` in process: what its banner shows (no configured secret), the model it gives the API,
settings refused before any child starts, and what it says when a child exits on its own."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.settings import ApiSettings
from core.shapes_vocabulary import parse_moving_prompt, parse_prompt
from stepwise_cli import up
from stepwise_cli.client import ApiTarget, save_local_target
from stepwise_cli.supervisor import MAX_FAST_FAILURES, ServiceError, Supervisor, mask_password, mask_urls
from tests.support.servers import free_port

CONFIGURED_KEY = "sk_configured_by_the_operator_0123456789"
REDIS_PASSWORD = "s3cret-redis-pw"


def up_args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def make_banner(api_key: up.ApiKeyChoice, redis_url: str, tmp_path: Path) -> str:
    env = {
        "STEPWISE_STORAGE_URL": (tmp_path / "images").as_uri(),
        "STEPWISE_WORKER_METRICS_PORT": "0",
        "STEPWISE_MODEL": "builtin:tiny",
        "STEPWISE_DEVICE": "cpu",
    }
    return up.banner(
        "http://127.0.0.1:8000", api_key, tmp_path / "stepwise.json", env, redis_url, 1.0, custom_var_dir=False
    )


def test_the_banner_never_prints_a_configured_key_or_a_redis_password(tmp_path):
    text = make_banner(
        up.ApiKeyChoice(CONFIGURED_KEY, is_generated=False), f"redis://:{REDIS_PASSWORD}@127.0.0.1:6380/0", tmp_path
    )

    assert CONFIGURED_KEY not in text and REDIS_PASSWORD not in text
    assert "redis://:***@127.0.0.1:6380/0" in text
    assert "$STEPWISE_API_KEY" in text  # the curl hint still works for someone who holds the key


def test_the_banner_prints_a_key_up_generated_and_a_local_redis_url_whole(tmp_path):
    text = make_banner(up.ApiKeyChoice("sk_generated", is_generated=True), "redis://127.0.0.1:6380/0", tmp_path)

    assert "sk_generated" in text and "Bearer sk_generated" in text
    assert "\n    celery -A worker inspect engine_stats\n" in text  # it finds up's Redis (storage.redis_location)


def test_a_configured_key_is_not_reported_as_generated(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_API_KEYS", f"ops:{CONFIGURED_KEY}")
    assert up.choose_api_key(tmp_path) == up.ApiKeyChoice(CONFIGURED_KEY, is_generated=False)
    monkeypatch.delenv("STEPWISE_API_KEYS")
    assert up.choose_api_key(tmp_path).is_generated


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("rediss://user:pw@h/0", "rediss://user:***@h/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        (
            "connecting to redis://:pw@h:1/0 failed; retry redis://:pw2@h:2/0",
            "connecting to redis://:***@h:1/0 failed; retry redis://:***@h:2/0",
        ),
    ],
)
def test_passwords_in_urls_are_masked_wherever_they_appear_in_a_line(text, masked):
    assert mask_urls(text) == masked
    if "://" in text and " " not in text:
        assert mask_password(text) == masked


def test_up_model_becomes_the_apis_default_model(tmp_path, monkeypatch):
    monkeypatch.delenv("STEPWISE_MODEL", raising=False)
    env = up.child_environment(up_args(model="/models/stable-diffusion-v1-5"), tmp_path, "sk_k")
    monkeypatch.setattr(os, "environ", env)

    assert env["STEPWISE_MODEL"] == "/models/stable-diffusion-v1-5"
    assert ApiSettings.from_env().default_model == "/models/stable-diffusion-v1-5"


def test_a_bad_setting_stops_up_before_any_child_starts_with_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_WEBHOOK_SECRET", "whsec_change-me")
    env = up.child_environment(up_args(), tmp_path, "sk_k")

    error = up.settings_error(env)

    assert error is not None and error.count("\n") == 1
    assert "STEPWISE_WEBHOOK_SECRET" in error
    assert os.environ["STEPWISE_WEBHOOK_SECRET"] == "whsec_change-me"  # up's own environment is restored


def test_a_child_that_keeps_failing_right_after_starting_is_given_up_on_saying_why_and_what_it_said_last():
    supervisor = Supervisor()
    supervisor.start(
        "worker", [sys.executable, "-c", "print('loading'); print('worker: nothing to do, bye')"], dict(os.environ)
    )
    try:
        deadline = time.monotonic() + 60
        with pytest.raises(ServiceError) as raised:
            while time.monotonic() < deadline:
                supervisor.sleep(0.05)
    finally:
        supervisor.stop_all()

    message = str(raised.value)
    assert "worker exited with status 0 although nothing asked it to stop" in message
    assert "worker: nothing to do, bye" in message
    assert f"failed {MAX_FAST_FAILURES} times in a row" in message


def test_a_killed_child_is_restarted_after_a_backoff_and_runs_again(capsys):
    supervisor = Supervisor()
    child = supervisor.start(
        "api", [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(120)"], dict(os.environ)
    )
    first_pid = child.process.pid
    try:
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while child.process.pid == first_pid or child.process.poll() is not None:
            assert time.monotonic() < deadline, capsys.readouterr().out
            supervisor.sleep(0.05)
    finally:
        supervisor.stop_all()

    said = capsys.readouterr().out
    assert "api was killed by SIGKILL" in said and "restarting it in 1s" in said
    assert f"restarted api (pid {child.process.pid})" in said


def test_the_embedded_redis_keeps_the_port_an_earlier_up_saved_unless_it_is_taken(tmp_path):
    port = free_port()
    save_local_target(tmp_path, ApiTarget("http://127.0.0.1:8000", "sk_k"), redis_url="redis://x", redis_port=port)

    assert up.embedded_redis_port(None, tmp_path) == (port, None)
    assert up.embedded_redis_port(6390, tmp_path) == (6390, None)  # --redis-port wins
    with socket.create_server(("127.0.0.1", port)):
        other, note = up.embedded_redis_port(None, tmp_path)
    assert other != port and f"port {port}" in note and "stepwise.json" in note


def test_the_banner_names_the_page_and_a_prompt_the_served_model_draws(tmp_path):
    text = make_banner(up.ApiKeyChoice("sk_generated", is_generated=True), "redis://127.0.0.1:6380/0", tmp_path)
    assert "page:     http://127.0.0.1:8000/" in text
    assert up.suggested_prompt("builtin:shapes") == "a red circle on a blue background"
    assert parse_prompt(up.suggested_prompt("builtin:shapes")) is not None  # one the shapes model draws
    assert parse_moving_prompt(up.suggested_prompt("builtin:shapes-wan")) is not None  # the video one's grammar


def test_the_banners_curl_hint_sends_the_key_when_pasted_into_a_shell(tmp_path):
    text = make_banner(up.ApiKeyChoice("sk_configured", is_generated=False), "redis://127.0.0.1:6380/0", tmp_path)
    hint = text[text.index("curl ") : text.index("/v1/jobs") + len("/v1/jobs")]
    # A stand-in curl that prints the arguments the shell gave it.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "curl").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake_bin / "curl").chmod(0o755)

    result = subprocess.run(
        ["bash", "-c", hint],
        env={"PATH": f"{fake_bin}:/usr/bin:/bin", "STEPWISE_API_KEY": "sk_from_the_shell"},
        capture_output=True,
        text=True,
        timeout=10,
    )

    arguments = result.stdout.splitlines()
    assert "Authorization: Bearer sk_from_the_shell" in arguments, result
    body = json.loads(arguments[arguments.index("-d") + 1])
    assert body == {"prompt": up.suggested_prompt("builtin:tiny")}
