"""Loaded by every Python process started with this folder on PYTHONPATH (the fuzzed API and its
workers): host names never reach a DNS server. `localhost` is 127.0.0.1, an address is itself, and
every other name does not resolve, at once. The fuzzer generates webhook and image URLs with any host
name; this keeps each lookup they cause on this machine."""

from __future__ import annotations

import ipaddress
import socket

_getaddrinfo = socket.getaddrinfo


def _offline_getaddrinfo(host, port, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name is None or name == "localhost":
        return _getaddrinfo("127.0.0.1" if name else None, port, *args, **kwargs)
    try:
        ipaddress.ip_address(str(name).strip("[]").split("%")[0])
    except ValueError:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (offline fuzz resolver)") from None
    return _getaddrinfo(host, port, *args, **kwargs)


socket.getaddrinfo = _offline_getaddrinfo
