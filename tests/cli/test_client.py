"""The CLI's HTTP client against a scripted HTTP server: retries, Retry-After, errors, where the API is."""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stepwise_cli.client import (
    ApiClient,
    ApiResponseError,
    ApiTarget,
    TransientError,
    resolve_target,
    save_local_target,
)


class ScriptedServer:
    """Answers each request with the next scripted (status, headers, body); records what it got."""

    def __init__(self, script: list[tuple[int, dict[str, str], dict]]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, str, dict[str, str], float]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def _answer(self) -> None:
                owner.requests.append((self.command, self.path, dict(self.headers), time.monotonic()))
                status, headers, body = owner.script.pop(0) if owner.script else (500, {}, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def make(script):
        server = ScriptedServer(script)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


ACCEPTED = (202, {}, {"job_id": "j1", "state": "queued"})


def test_a_full_queue_is_retried_after_the_servers_retry_after(scripted):
    server = scripted([(429, {"Retry-After": "1"}, {"error": {"code": "queue_full", "message": "full"}}), ACCEPTED])
    client = ApiClient(ApiTarget(server.url, "k"), retry_seconds=10)
    assert client.submit_job({"prompt": "a fox"}, idempotency_key="row-1")["job_id"] == "j1"
    (_, _, first, t0), (_, _, second, t1) = server.requests
    assert t1 - t0 >= 0.9
    assert first["Idempotency-Key"] == second["Idempotency-Key"] == "row-1"
    assert first["Authorization"] == "Bearer k"


def test_server_errors_are_retried_with_backoff_and_the_same_idempotency_key(scripted):
    server = scripted([(503, {}, {}), (502, {}, {}), ACCEPTED])
    client = ApiClient(ApiTarget(server.url, None), retry_seconds=10)
    assert client.submit_job({"prompt": "a fox"})["job_id"] == "j1"
    keys = {headers["Idempotency-Key"] for _, _, headers, _ in server.requests}
    assert len(server.requests) == 3 and len(keys) == 1


def test_an_invalid_field_is_not_retried_and_names_the_field(scripted):
    error = {"error": {"code": "invalid_params", "message": "height must be a multiple of 8", "field": "height"}}
    server = scripted([(422, {}, error)])
    client = ApiClient(ApiTarget(server.url, None), retry_seconds=10)
    with pytest.raises(ApiResponseError) as caught:
        client.submit_job({"prompt": "a fox", "height": 100})
    assert (caught.value.status, caught.value.field) == (422, "height")
    assert len(server.requests) == 1


def test_retries_stop_after_the_retry_budget():
    client = ApiClient(ApiTarget("http://127.0.0.1:9", None), retry_seconds=1.0)  # nothing listens on port 9
    started = time.monotonic()
    with pytest.raises(TransientError):
        client.get_job("j1")
    assert time.monotonic() - started < 10


def namespace(tmp_path: Path, **values) -> argparse.Namespace:
    return argparse.Namespace(**{"api_url": None, "api_key": None, "var_dir": tmp_path, **values})


def test_the_url_and_key_saved_by_up_are_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("STEPWISE_API_URL", raising=False)
    monkeypatch.delenv("STEPWISE_API_KEY", raising=False)
    path = save_local_target(tmp_path, ApiTarget("http://127.0.0.1:8123", "sk_saved"))
    assert path.stat().st_mode & 0o777 == 0o600
    assert resolve_target(namespace(tmp_path)) == ApiTarget("http://127.0.0.1:8123", "sk_saved")


def test_flags_beat_environment_beat_saved_file(tmp_path, monkeypatch):
    save_local_target(tmp_path, ApiTarget("http://127.0.0.1:8123", "sk_saved"))
    monkeypatch.setenv("STEPWISE_API_URL", "http://env:1/")
    monkeypatch.setenv("STEPWISE_API_KEY", "sk_env")
    assert resolve_target(namespace(tmp_path)) == ApiTarget("http://env:1", "sk_env")
    assert resolve_target(namespace(tmp_path, api_url="http://flag:2", api_key="sk_flag")) == ApiTarget(
        "http://flag:2", "sk_flag"
    )


def test_the_saved_key_is_never_sent_to_another_url(tmp_path, monkeypatch):
    monkeypatch.delenv("STEPWISE_API_URL", raising=False)
    monkeypatch.delenv("STEPWISE_API_KEY", raising=False)
    save_local_target(tmp_path, ApiTarget("http://127.0.0.1:8123", "sk_saved"))
    assert resolve_target(namespace(tmp_path, api_url="https://elsewhere.example")).key is None


def test_image_flags_send_a_url_as_is_and_a_file_as_an_upload_or_inline(tmp_path):
    from stepwise_cli.image_args import add_image_arguments, image_fields

    parser = argparse.ArgumentParser()
    add_image_arguments(parser, format_flag="--format")
    picture = tmp_path / "door.png"
    picture.write_bytes(b"\x89PNG...")
    args = parser.parse_args(["--init-image", "https://images.example.com/house.png", "--mask", str(picture)])

    uploaded = image_fields(args, upload=lambda path: f"upl_for_{path.name}")
    inline = image_fields(args)

    assert uploaded == {"init_image": "https://images.example.com/house.png", "mask_image": "upl_for_door.png"}
    assert inline["init_image"] == "https://images.example.com/house.png"
    assert inline["mask_image"].startswith("data:image/png;base64,")


def test_the_reference_image_flag_given_several_times_sends_a_list_in_order(tmp_path):
    from stepwise_cli.image_args import add_image_arguments, image_fields

    parser = argparse.ArgumentParser()
    add_image_arguments(parser, format_flag="--format")
    picture = tmp_path / "room.png"
    picture.write_bytes(b"\x89PNG...")
    args = parser.parse_args(
        ["--reference-image", "https://images.example.com/fox.png", "--reference-image", str(picture)]
    )

    fields = image_fields(args, upload=lambda path: f"upl_for_{path.name}")

    assert fields == {"reference_images": ["https://images.example.com/fox.png", "upl_for_room.png"]}
