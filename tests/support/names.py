"""Faked name resolution for the URL policy's tests: names that resolve to several loopback addresses.

The policy checks every address a name resolves to, so each name below holds one address that a
policy allowing only 127.0.0.1 refuses (127.0.0.2), first, in the middle or last: a check of the
first address alone, or of the last, lets one of them through. Every address is loopback, so
nothing these names lead to leaves the machine.
"""

from __future__ import annotations

import socket

REFUSED_AMONG = {  # name -> the addresses it resolves to, in the resolver's order
    "refused-first.test": ("127.0.0.2", "127.0.0.1", "127.0.0.1"),
    "refused-middle.test": ("127.0.0.1", "127.0.0.2", "127.0.0.1"),
    "refused-last.test": ("127.0.0.1", "127.0.0.1", "127.0.0.2"),
}


def answer(addresses: tuple[str, ...], port) -> list:
    """What `socket.getaddrinfo` returns for a name with these IPv4 addresses."""
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in addresses]
