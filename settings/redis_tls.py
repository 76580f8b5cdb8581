"""The TLS options a Redis URL's query may hold (`rediss://`, `sentinels://`), checked once for both kinds."""

from __future__ import annotations

import os

TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")  # redis-py's and Celery's names
CERT_REQS = {"required": "required", "optional": "optional", "none": "none"}  # Celery's spellings map below
CERT_REQS.update({f"cert_{word}": word for word in CERT_REQS})


def checked_tls_options(name: str, options: dict[str, str]) -> dict[str, str]:
    """`options` with `ssl_cert_reqs` in redis-py's words, `required` when not given (certificates are checked
    unless the URL says otherwise); ValueError naming `name` for a value no client could take."""
    asked = options.get("ssl_cert_reqs", "required")
    if asked.lower() not in CERT_REQS:
        raise ValueError(f"{name}: ssl_cert_reqs must be required, optional or none (got {asked!r})")
    for option in TLS_OPTIONS[1:]:
        if option in options and not os.path.isfile(options[option]):
            raise ValueError(f"{name}: {option} names no readable file ({options[option]!r})")
    return {**options, "ssl_cert_reqs": CERT_REQS[asked.lower()]}
