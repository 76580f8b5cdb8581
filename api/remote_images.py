"""Fetching image URLs (`init_image`, `mask_image`, `reference_images[i]`) at submit, from allowed hosts.

Nothing is fetched unless `STEPWISE_IMAGE_URL_HOSTS` lists hosts; then a URL must pass the
image URL policy (`storage.url_policy.check_image_url`: a listed host, and the webhooks'
address rule: no loopback, private, link-local or metadata address unless a listed range
holds it). The connection goes to the addresses the policy checked (the name is not
looked up again), a redirect is followed only to a URL that passes the same policy (at
most `MAX_REDIRECTS`), and the image is held to the input-image byte limit. The image is
then what an inline data URI would have been: the API checks it and stores it as an upload
of the tenant, so the job record holds its id.

One deadline (`STEPWISE_IMAGE_URL_TIMEOUT_SECONDS`) bounds all of a request's fetches: every
name lookup (redirects' included, on the policy's bounded lookup pool), each connect (given
the time left), the TLS handshake, the request and the body (a timer shuts the socket down
at the deadline). A request's URLs (a batch's, or a job's image and mask) are fetched at
most `MAX_CONCURRENT_FETCHES` at once, all by that deadline, so a request spends about one
deadline fetching whatever its number of URLs; a URL whose turn comes after it is not
requested and gets a 422 like one that timed out.

Why here and not in the worker: a bad URL (refused, unreachable, not an image, too large)
is answered at submit with a 422 naming the field instead of a job that fails later; the
worker machines need no outbound network; and the job runs on the bytes checked at submit
even if the remote image changes or disappears before a worker takes it.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeGuard
from urllib.parse import urljoin, urlsplit

from api.errors import ApiError, invalid
from core.errors import InvalidParamsError
from core.image_inputs import INPUT_FORMATS, MAX_IMAGE_BYTES, open_image, to_data_uri
from settings import default
from storage.outbound_http import DeadlineConnection
from storage.url_policy import Address, AllowList, ImageURLError, check_image_url

MAX_REDIRECTS = 3
# STEPWISE_IMAGE_URL_TIMEOUT_SECONDS: all of one request's URLs, redirects included
DEFAULT_FETCH_SECONDS: float = default("STEPWISE_IMAGE_URL_TIMEOUT_SECONDS")
MAX_CONCURRENT_FETCHES = 8  # URLs one request fetches at once (threads it holds while fetching)
READ_CHUNK_BYTES = 64 * 1024
REDIRECT_STATUSES = (301, 302, 303, 307, 308)

ImageURL = tuple[str, str]  # (field, url): ("jobs[3].init_image", "https://...")


def is_remote_url(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and value[:8].lower().startswith(("http://", "https://"))


def fetch_images(
    urls: Iterable[ImageURL], hosts: AllowList, *, seconds: float = DEFAULT_FETCH_SECONDS
) -> dict[ImageURL, str | ApiError]:
    """Each (field, url)'s image as a data URI, or its 422 ApiError naming the field: fetched at most
    MAX_CONCURRENT_FETCHES at once, all by one deadline `seconds` from now."""
    deadline = time.monotonic() + seconds
    todo = list(dict.fromkeys(urls))

    def fetch(field: str, url: str) -> str | ApiError:
        try:
            return fetch_image(field, url, hosts, seconds=seconds, deadline=deadline)
        except ApiError as e:
            return e

    if len(todo) <= 1:  # a single submit's one URL: no pool needed
        return {(field, url): fetch(field, url) for field, url in todo}
    # Every fetch ends by the deadline on its own (lookups, connects and reads are all bounded by it), so
    # leaving the pool waits about one deadline at most.
    with ThreadPoolExecutor(min(len(todo), MAX_CONCURRENT_FETCHES), thread_name_prefix="image-fetch") as pool:
        futures = {(field, url): pool.submit(fetch, field, url) for field, url in todo}
        return {key: future.result() for key, future in futures.items()}


def fetch_image(
    field: str, url: str, hosts: AllowList, *, seconds: float = DEFAULT_FETCH_SECONDS, deadline: float | None = None
) -> str:
    """The image at `url` as a data URI, or an ApiError (422) naming `field` that says why not. `deadline`
    (a time.monotonic() value, `seconds` from now unless given) bounds the whole fetch."""
    if deadline is None:
        deadline = time.monotonic() + seconds
    if time.monotonic() >= deadline:
        raise invalid(
            field,
            f"{field}: {_shown(url)} was not fetched: this request's image URLs took all of their {seconds:g}s"
            " (STEPWISE_IMAGE_URL_TIMEOUT_SECONDS)",
        )
    for _ in range(MAX_REDIRECTS + 1):
        try:
            addresses = check_image_url(url, hosts, deadline=deadline)
        except ImageURLError as e:
            raise invalid(field, f"{field} {e} (got {_shown(url)})") from e
        except TimeoutError as e:
            raise invalid(field, f"{field}: the host of {_shown(url)} did not resolve within {seconds:g}s") from e
        try:
            status, location, data = _get(url, addresses, deadline)
        except TimeoutError as e:
            raise invalid(field, f"{field}: {_shown(url)} did not answer within {seconds:g}s") from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise invalid(field, f"{field}: {_shown(url)} could not be fetched ({type(e).__name__}: {e})") from e
        if status in REDIRECT_STATUSES and location:
            url = urljoin(url, location)
            continue
        if status != 200:
            raise invalid(field, f"{field}: {_shown(url)} answered HTTP {status}")
        try:
            image = open_image(field, data)
        except InvalidParamsError as e:
            raise invalid(field, f"{e} (fetched from {_shown(url)})") from e
        assert image.format is not None  # open_image refuses formats outside INPUT_FORMATS
        return to_data_uri(data, INPUT_FORMATS[image.format])
    raise invalid(field, f"{field}: {_shown(url)} redirected more than {MAX_REDIRECTS} times")


def _get(url: str, addresses: list[Address], deadline: float) -> tuple[int, str | None, bytes]:
    """GET `url` from one of `addresses`: (status, Location header, body of a 200 up to the byte limit).
    Raises TimeoutError at the deadline, whatever the server is doing then: each connect gets the time
    left, and from the TLS handshake on a timer shuts the socket down at the deadline (a socket timeout
    alone bounds each read, and a server that drips a byte at a time would outlast it)."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with DeadlineConnection(parts, addresses, deadline) as connection:
        try:
            connection.connection.request(
                "GET", path, headers={"User-Agent": "stepwise-image-fetch", "Accept": "image/*"}
            )
            response = connection.connection.getresponse()
            if response.status != 200:
                return response.status, response.getheader("Location"), b""
            length = response.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > MAX_IMAGE_BYTES:
                raise ValueError(f"the image is {length} bytes, more than the {MAX_IMAGE_BYTES} allowed")
            chunks, size = [], 0
            while chunk := response.read1(READ_CHUNK_BYTES):
                size += len(chunk)
                if size > MAX_IMAGE_BYTES:
                    raise ValueError(f"the image is more than the {MAX_IMAGE_BYTES} bytes allowed")
                chunks.append(chunk)
            if connection.fired.is_set():  # the shutdown can look like the end of the body
                raise TimeoutError("deadline passed")
            return 200, None, b"".join(chunks)
        except (OSError, http.client.HTTPException) as e:
            if connection.fired.is_set():
                raise TimeoutError("deadline passed") from e
            raise


def _shown(url: str) -> str:
    return repr(url if len(url) <= 100 else url[:97] + "...")
