"""Which webhook URLs stepwise may call: no loopback, private, link-local or metadata
addresses unless allow-listed (`STEPWISE_WEBHOOK_ALLOW_HOSTS`: host names or CIDR ranges).

Checked by the API when a job is submitted and again by the worker before every delivery
attempt (a DNS name may resolve differently later; redirects are not followed).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


class WebhookURLError(ValueError):
    """The webhook URL is malformed or points somewhere stepwise must not call."""


@dataclass(frozen=True)
class AllowList:
    host_names: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> AllowList:
        names: set[str] = set()
        networks = []
        for item in (text or "").split(","):
            item = item.strip().lower()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                names.add(item)
        return cls(frozenset(names), tuple(networks))

    @classmethod
    def from_env(cls) -> AllowList:
        return cls.parse(os.environ.get("STEPWISE_WEBHOOK_ALLOW_HOSTS"))

    def allows_address(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in network for network in self.networks)


NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the last 32 bits
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215, with RFC 6052's /48 layout


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries traffic to, for the forms that embed one:
    IPv4-mapped (::ffff:a.b.c.d), 6to4 (2002::/16), Teredo (2001::/32, the client) and NAT64."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    value = int(address)
    if address in NAT64_WELL_KNOWN:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address in NAT64_LOCAL_USE:  # bits 48-63 hold the first half, bits 64-71 are the reserved u-octet
        return ipaddress.IPv4Address(((value >> 64) & 0xFFFF) << 16 | ((value >> 40) & 0xFFFF))
    return None


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None and not _is_public(inner):
            return False
        if address.ipv4_mapped is not None:
            return True
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def check_webhook_url(url: str, allow: AllowList | None = None, *, resolve: bool = True) -> str:
    """Return the URL if stepwise may call it, else raise WebhookURLError saying why."""
    allow = allow if allow is not None else AllowList.from_env()
    if not isinstance(url, str) or len(url) > 2048:
        raise WebhookURLError("must be a URL of at most 2048 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookURLError("must use http or https")
    if parts.username or parts.password:
        raise WebhookURLError("must not contain credentials")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise WebhookURLError("must name a host")
    try:
        port = parts.port
    except ValueError as e:
        raise WebhookURLError("has an invalid port") from e
    if host in allow.host_names:
        return url
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    elif not resolve:
        return url
    else:
        try:
            infos = socket.getaddrinfo(host, port or (443 if parts.scheme == "https" else 80), proto=socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError) as e:
            raise WebhookURLError(f"host {host!r} does not resolve") from e
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]  # TCP: (host, port, ...)
    for address in addresses:
        if not _is_public(address) and not allow.allows_address(address):
            raise WebhookURLError(
                f"resolves to {address}, a private, loopback, link-local or metadata address "
                "(allow it with STEPWISE_WEBHOOK_ALLOW_HOSTS)"
            )
    return url
