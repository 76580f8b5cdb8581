"""One webhook POST under one hard deadline for the whole attempt: connect, TLS, send and read.

A socket timeout alone bounds each operation (a probe saw a receiver answering one byte every few
seconds "succeed" after 201 s with a 10 s timeout): `storage.outbound_http.DeadlineConnection` shuts
the socket down at the deadline, and connects to the addresses the URL policy checked for this
attempt (`storage.url_policy.webhook_addresses`), never to a fresh lookup of the name. Redirects are
never followed (http.client does not follow them).
"""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

from storage.outbound_http import DeadlineConnection
from storage.url_policy import Address


class AttemptDeadlineError(TimeoutError):
    """The receiver did not take the request and answer its status line and headers in time."""


def post_within(
    url: str, addresses: list[Address], body: bytes, headers: dict[str, str], seconds: float, *, deadline: float
) -> int:
    """POST `body` to `url` at the first of `addresses` that answers; return the response status. Raises
    AttemptDeadlineError when the attempt is not done by `deadline` (a time.monotonic() value, the end of the
    attempt's `seconds`), OSError or http.client.HTTPException otherwise."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        with DeadlineConnection(parts, addresses, deadline) as connection:
            connection.connection.request("POST", path, body=body, headers=headers)
            response = connection.connection.getresponse()  # status line and headers; the body is not read
            return response.status
    except (OSError, http.client.HTTPException) as e:  # the deadline's shutdown shows as one of these
        if time.monotonic() >= deadline:
            raise AttemptDeadlineError(f"no answer within {seconds:g}s") from e
        raise
