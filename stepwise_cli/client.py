"""A small HTTP client for the stepwise API, shared by `stepwise submit` and `stepwise backfill`.

Where the API is: `--api-url`/`--api-key`, else `STEPWISE_API_URL`/`STEPWISE_API_KEY`, else
what `stepwise up` saved in `<var dir>/stepwise.json`. The saved key is only sent to the
saved URL, so pointing `--api-url` at another server never leaks the local key.

Transient failures (connection errors, 5xx, 429) are retried with exponential backoff,
honouring `Retry-After`, for at most `retry_seconds`. Every retried POST carries an
`Idempotency-Key`, so a retry never creates a second job.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import tenacity
from requests.adapters import HTTPAdapter

from settings import read
from storage.job_record import TERMINAL_STATE_NAMES
from storage.redis_location import STATE_FILE_NAME

DEFAULT_API_URL = "http://127.0.0.1:8000"
MAX_RETRY_AFTER_SECONDS = 60.0
TERMINAL_STATES = TERMINAL_STATE_NAMES


class ClientError(Exception):
    """Base of every error raised by the stepwise HTTP client."""


class ApiResponseError(ClientError):
    """The API refused the request (a 4xx other than 429); `code` and `field` come from its body."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        super().__init__(f"{message} [{code}, HTTP {status}]")


class ApiUnreachableError(ClientError):
    """Nothing listens at the API's address (connection refused), for a client told not to wait for one."""


class TransientError(ClientError):
    """A failure worth retrying: no connection, a 5xx, or 429 (with the server's Retry-After)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


@dataclass(frozen=True)
class ApiTarget:
    url: str  # base URL without a trailing slash, e.g. http://127.0.0.1:8000
    key: str | None  # bearer token; None sends no Authorization header


def default_var_dir() -> Path:
    return Path(read("STEPWISE_VAR_DIR"))


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("API")
    group.add_argument("--api-url", help="API base URL (default: $STEPWISE_API_URL, else what `stepwise up` saved)")
    group.add_argument("--api-key", help="API key (default: $STEPWISE_API_KEY, else what `stepwise up` saved)")
    group.add_argument(
        "--var-dir",
        type=Path,
        default=None,
        help="where `stepwise up` saved its URL and key (default: $STEPWISE_VAR_DIR or ./var)",
    )


def save_local_target(var_dir: Path, target: ApiTarget, **extra: object) -> Path:
    """Write `{api_url, api_key, **extra}` readable by the owner only (it holds a secret)."""
    var_dir.mkdir(parents=True, exist_ok=True)
    path = var_dir / STATE_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"api_url": target.url, "api_key": target.key, **extra}, f)
        f.write("\n")
    return path


def load_local_target(var_dir: Path) -> ApiTarget | None:
    path = var_dir / STATE_FILE_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ClientError(f"cannot read {path}: {e}") from e
    return ApiTarget(url=str(data["api_url"]).rstrip("/"), key=data.get("api_key"))


def load_service_env(var_dir: Path) -> dict[str, str]:
    """The shared STEPWISE_* settings `stepwise up` saved for a worker joining its service; {} without one."""
    try:
        saved = json.loads((var_dir / STATE_FILE_NAME).read_text()).get("service_env") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(name): str(value) for name, value in saved.items() if str(name).startswith("STEPWISE_")}


def resolve_target(args: argparse.Namespace) -> ApiTarget:
    saved = load_local_target(args.var_dir or default_var_dir())
    url = args.api_url or read("STEPWISE_API_URL") or (saved.url if saved else DEFAULT_API_URL)
    url = url.rstrip("/")
    key = args.api_key or read("STEPWISE_API_KEY")
    if key is None and saved is not None and saved.url == url:
        key = saved.key
    return ApiTarget(url=url, key=key)


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


class ApiClient:
    """Thread-safe: one `requests.Session` with a connection pool sized for `max_connections`."""

    def __init__(
        self,
        target: ApiTarget,
        *,
        timeout: float = 30.0,
        retry_seconds: float = 60.0,
        max_connections: int = 10,
        on_retry: Callable[[ClientError, float], None] | None = None,
        retries_refused: bool = True,
    ) -> None:
        """`retries_refused=False`: a refused connection (no API there at all) ends the call at once, for
        commands a person runs to look (status, jobs, cancel); a submit keeps retrying (the API may be restarting)."""
        self.target = target
        self.timeout = timeout
        self.retries_refused = retries_refused
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max_connections)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if target.key:
            self.session.headers["Authorization"] = f"Bearer {target.key}"
        self._closed = threading.Event()
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientError),
            wait=_wait_retry_after_or_backoff,
            stop=tenacity.stop_after_delay(retry_seconds),
            sleep=self._sleep_unless_closed,
            before_sleep=((lambda state: on_retry(_retried_error(state), state.upcoming_sleep)) if on_retry else None),
            reraise=True,
        )

    def submit_job(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return self.request("POST", "/v1/jobs", json=body, headers=headers).json()

    def upload_image(self, path: Path) -> str:
        """POST /v1/uploads with the file as the body; returns the upload id."""
        from stepwise_cli.image_args import INPUT_TYPES

        content_type = INPUT_TYPES.get(path.suffix.lower(), "application/octet-stream")
        response = self.request("POST", "/v1/uploads", data=path.read_bytes(), headers={"Content-Type": content_type})
        return response.json()["id"]

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{quote(job_id, safe='')}").json()

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """The job's view after the cancel: `canceled` at once when queued, `cancel_requested` when running."""
        return self.request("POST", f"/v1/jobs/{quote(job_id, safe='')}/cancel").json()

    def list_jobs(self, *, state: str | None = None, limit: int = 20, cursor: str | None = None) -> dict[str, Any]:
        params = {"limit": limit, **({"state": state} if state else {}), **({"cursor": cursor} if cursor else {})}
        return self.request("GET", "/v1/jobs", params=params).json()

    def model_status(self, model: str) -> dict[str, Any] | None:
        """The model's entry of GET /v1/models; None when no worker served it recently (or the API
        predates /v1/models)."""
        try:
            models = self.request("GET", "/v1/models").json().get("models", [])
        except ApiResponseError:
            return None
        return next((entry for entry in models if entry.get("model") == model), None)

    def download_image(self, job_id: str, dest: Path, *, index: int = 0) -> Path:
        """Save image `index` of a finished job to `dest` (written whole, then renamed into place)."""
        response = self.request("GET", f"/v1/jobs/{job_id}/image", params={"index": index}, stream=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".part")
        with partial.open("wb") as f:
            for chunk in response.iter_content(chunk_size=1 << 16):
                f.write(chunk)
        partial.replace(dest)
        return dest

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self._retrying(self._send_once, method, path, **kwargs)

    def close(self) -> None:
        """Stop retrying at once (other threads' backoff sleeps end with ClientError) and drop connections."""
        self._closed.set()
        self.session.close()

    def _sleep_unless_closed(self, seconds: float) -> None:
        if self._closed.wait(seconds):
            raise ClientError("the client was closed while waiting to retry")

    def _send_once(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = self.target.url + path
        try:
            response = self.session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.Timeout as e:
            raise TransientError(f"{method} {url}: no answer within {self.timeout:.0f}s") from e
        except requests.ConnectionError as e:
            if not self.retries_refused and _is_refused(e):
                raise ApiUnreachableError(
                    f"no API answers at {self.target.url} (connection refused): is `stepwise up` running?"
                ) from e
            raise TransientError(f"{method} {url}: cannot connect ({_connection_failure(e)})") from e
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientError(
                f"{method} {url}: HTTP {response.status_code} {_error_message(response)}",
                retry_after=_retry_after_seconds(response),
            )
        if response.status_code >= 400:
            raise _api_error(response)
        return response


_backoff = tenacity.wait_exponential(multiplier=0.5, max=30) + tenacity.wait_random(0, 0.5)


def _retried_error(retry_state: tenacity.RetryCallState) -> ClientError:
    """The error a retry is about to answer: only `TransientError`s are retried, so one is there."""
    error = retry_state.outcome.exception() if retry_state.outcome else None
    assert isinstance(error, ClientError)
    return error


def _wait_retry_after_or_backoff(retry_state: tenacity.RetryCallState) -> float:
    error = retry_state.outcome.exception() if retry_state.outcome else None
    if isinstance(error, TransientError) and error.retry_after is not None:
        return min(error.retry_after, MAX_RETRY_AFTER_SECONDS)
    return _backoff(retry_state)


def _connection_failure(error: requests.ConnectionError) -> str:
    """`[Errno 111] Connection refused` rather than urllib3's nested repr."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return str(reason or error).rsplit(": ", 1)[-1]


def _is_refused(error: requests.ConnectionError) -> bool:
    """The address answered that nothing listens there (urllib3 keeps the socket's error as the cause)."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(getattr(reason, "__cause__", None), ConnectionRefusedError)


def _retry_after_seconds(response: requests.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _error_body(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def _error_message(response: requests.Response) -> str:
    error = _error_body(response)
    return str(error.get("message") or response.reason or "")


def _api_error(response: requests.Response) -> ApiResponseError:
    error = _error_body(response)
    return ApiResponseError(
        status=response.status_code,
        code=str(error.get("code") or f"http_{response.status_code}"),
        message=str(error.get("message") or response.text[:200] or response.reason),
        field=error.get("field"),
    )
