"""Which IP addresses stepwise may connect to on a user's behalf: globally routable unicast, and nothing else.

An allow list, not a deny list: an address passes only if it is in the space the internet routes to hosts
(IPv4 outside the blocks below, multicast and the reserved 240/4; IPv6 inside 2000::/3, the only global
unicast space allocated) and in none of the blocks of IANA's special-purpose address registries
(iana.org/assignments/iana-ipv4-special-registry and iana-ipv6-special-registry, as of 2025), and Python's
`ipaddress` calls it global as well. A registry block refuses even where the registry calls it globally
reachable: those are anycast services (PCP, TURN, AS112 DNS sinks, AMT relays), never a webhook receiver.
The tables are written here because the `ipaddress` of a given Python lags the registries (3.11.7 calls
192.0.0.192, 192.88.99.1, fec0::1 and 3fff::1 global).

Two IPv6 forms carry traffic to an IPv4 address and are judged by it: IPv4-mapped (::ffff:a.b.c.d) and the
well-known NAT64 prefix (64:ff9b::/96). Every other form that embeds an IPv4 address (IPv4-compatible ::/96,
6to4 2002::/16, Teredo 2001::/32, local-use NAT64 64:ff9b:1::/48) is in a refused block itself.

Host spellings: `ipv4_spelling` reads the numeric forms a resolver accepts for IPv4 (`3221225664`,
`0xc0000200`, `0300.0.0.01`, `192.168`), so such a host is judged as the address it is, never sent to DNS.
"""

from __future__ import annotations

import ipaddress
import re

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# block -> its name in the registry (the reason a refusal gives)
IPV4_SPECIAL_PURPOSE: dict[str, str] = {
    "0.0.0.0/8": '"this network"',
    "10.0.0.0/8": "private use",
    "100.64.0.0/10": "shared address space (carrier-grade NAT)",
    "127.0.0.0/8": "loopback",
    "169.254.0.0/16": "link-local (cloud metadata services)",
    "172.16.0.0/12": "private use",
    "192.0.0.0/24": "IETF protocol assignments",
    "192.0.2.0/24": "documentation (TEST-NET-1)",
    "192.31.196.0/24": "AS112 DNS service",
    "192.52.193.0/24": "AMT relay anycast",
    "192.88.99.0/24": "deprecated 6to4 relay anycast",
    "192.168.0.0/16": "private use",
    "192.175.48.0/24": "AS112 direct delegation",
    "198.18.0.0/15": "benchmarking",
    "198.51.100.0/24": "documentation (TEST-NET-2)",
    "203.0.113.0/24": "documentation (TEST-NET-3)",
    "224.0.0.0/4": "multicast",
    "240.0.0.0/4": "reserved for future use",
    "255.255.255.255/32": "limited broadcast",
}
IPV6_SPECIAL_PURPOSE: dict[str, str] = {
    "::/128": "unspecified",
    "::1/128": "loopback",
    "::/96": "IPv4-compatible (deprecated)",
    "64:ff9b:1::/48": "local-use IPv4/IPv6 translation",
    "100::/64": "discard-only",
    "100:0:0:1::/64": "dummy prefix",
    "2001::/23": "IETF protocol assignments (Teredo among them)",
    "2001:db8::/32": "documentation",
    "2002::/16": "6to4",
    "2620:4f:8000::/48": "AS112 direct delegation",
    "3fff::/20": "documentation",
    "5f00::/16": "segment routing SIDs",
    "fc00::/7": "unique local",
    "fe80::/10": "link-local",
    "fec0::/10": "site-local (deprecated)",
    "ff00::/8": "multicast",
}
GLOBAL_UNICAST_IPV6 = ipaddress.IPv6Network("2000::/3")
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the last 32 bits

_SPECIAL: list[tuple[Network, str]] = sorted(  # the most specific block first: it names the reason
    ((ipaddress.ip_network(block), name) for block, name in {**IPV4_SPECIAL_PURPOSE, **IPV6_SPECIAL_PURPOSE}.items()),
    key=lambda special: -special[0].prefixlen,
)


def why_not_global(address: Address) -> str | None:
    """None if `address` is globally routable unicast; else why not, naming the block it is in."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            return "an address scoped to one link"
        if address.ipv4_mapped is not None:
            inner = why_not_global(address.ipv4_mapped)
            return inner and f"IPv4-mapped {address.ipv4_mapped}: {inner}"
        if address in NAT64_WELL_KNOWN:
            ipv4 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
            inner = why_not_global(ipv4)
            return inner and f"NAT64 of {ipv4}: {inner}"
    for network, name in _SPECIAL:
        if address.version == network.version and address in network:
            return f"{network}: {name}"
    if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_IPV6:
        return "outside 2000::/3, the global unicast space"
    if not address.is_global:
        return "not global"
    return None


_IPV4_PART = re.compile(r"0x[0-9a-f]+|0[0-7]*|[1-9][0-9]*")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


class BadIPv4Spelling(ValueError):
    """A host whose last label is a number, but which is no IPv4 address (a resolver would not agree on it)."""


def ipv4_spelling(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host name spells in inet_aton's forms (1 to 4 parts, each decimal, 0-octal or 0x-hex,
    the last filling the bytes left), else None for a name. A host whose last label is numeric but that is no
    such address (`1.2.3.256`, `08`, `1.2.3.4.5`) raises BadIPv4Spelling, as a URL parser refuses it."""
    labels = host.lower().split(".")
    if not _NUMERIC_LABEL.fullmatch(labels[-1]):
        return None
    if len(labels) > 4 or not all(_IPV4_PART.fullmatch(label) for label in labels):
        raise BadIPv4Spelling(f"{host!r} is not a valid IPv4 address")
    values = [
        int(label, 16) if label.startswith("0x") else int(label, 8 if label.startswith("0") else 10) for label in labels
    ]
    *leading, last = values
    if any(value > 255 for value in leading) or last >= 256 ** (5 - len(values)):
        raise BadIPv4Spelling(f"{host!r} is not a valid IPv4 address (a part is too large)")
    number = last
    for index, value in enumerate(leading):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)
