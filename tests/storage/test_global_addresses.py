"""The webhook (and image URL) address policy allows globally routable unicast addresses only.

Table-driven over the addresses of the hardening probe (issue 48 E2: all seven were accepted at submit and by the
delivery check) and many more, each spelled as a URL literal and as the answer of a DNS name. The policy functions
are called directly with a resolver that answers from the table: no traffic is sent to any of these addresses.
"""

from __future__ import annotations

import socket
import time

import pytest

from storage import url_policy
from storage.global_addresses import BadIPv4Spelling, ipv4_spelling
from storage.url_policy import AllowList, WebhookURLError, check_webhook_url, webhook_addresses

NONE_ALLOWED = AllowList()

# (URL host as written, why the policy refuses it: a fragment of the reason)
REFUSED_HOSTS = [
    # the probe's findings
    ("192.0.0.192", "192.0.0.0/24"),
    ("[::ffff:192.0.0.192]", "IPv4-mapped 192.0.0.192"),
    ("3221225664", "192.0.0.0/24"),
    ("192.0.0.8", "192.0.0.0/24"),
    ("192.88.99.1", "6to4 relay anycast"),
    ("[fec0::1]", "site-local"),
    ("[3fff::1]", "documentation"),
    # the same address in every spelling a resolver takes
    ("0xc00000c0", "192.0.0.0/24"),
    ("0300.0.0.0300", "192.0.0.0/24"),
    ("0xc0.0.0.0xc0", "192.0.0.0/24"),
    ("192.0.192", "192.0.0.0/24"),
    ("192.192", "192.0.0.0/24"),
    ("[::ffff:c000:c0]", "IPv4-mapped 192.0.0.192"),
    ("[0:0:0:0:0:ffff:192.0.0.192]", "IPv4-mapped 192.0.0.192"),
    ("[64:ff9b::c000:c0]", "NAT64 of 192.0.0.192"),
    # IPv4 special-purpose registry, block by block
    ("0.0.0.0", '"this network"'),
    ("0.1.2.3", '"this network"'),
    ("0", '"this network"'),
    ("10.0.0.1", "private use"),
    ("012.0.0.1", "private use"),
    ("100.64.0.1", "shared address space"),
    ("100.127.255.254", "shared address space"),
    ("127.0.0.1", "loopback"),
    ("127.1", "loopback"),
    ("2130706433", "loopback"),
    ("0x7f000001", "loopback"),
    ("0177.0.0.1", "loopback"),
    ("169.254.169.254", "link-local"),
    ("172.16.0.1", "private use"),
    ("172.31.255.255", "private use"),
    ("192.0.0.9", "192.0.0.0/24"),  # PCP anycast: "globally reachable", never a webhook receiver
    ("192.0.0.10", "192.0.0.0/24"),
    ("192.0.0.170", "192.0.0.0/24"),
    ("192.0.2.1", "TEST-NET-1"),
    ("192.31.196.1", "AS112"),
    ("192.52.193.1", "AMT"),
    ("192.168.1.1", "private use"),
    ("192.175.48.1", "AS112"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.51.100.7", "TEST-NET-2"),
    ("203.0.113.9", "TEST-NET-3"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "broadcast"),
    # IPv6 special-purpose registry and what lies outside 2000::/3
    ("[::]", "unspecified"),
    ("[::1]", "loopback"),
    ("[::192.0.0.192]", "IPv4-compatible"),
    ("[::8.8.8.8]", "IPv4-compatible"),
    ("[::ffff:127.0.0.1]", "IPv4-mapped 127.0.0.1"),
    ("[::ffff:10.0.0.1]", "IPv4-mapped 10.0.0.1"),
    ("[64:ff9b::7f00:1]", "NAT64 of 127.0.0.1"),
    ("[64:ff9b:1::a9fe:a9fe]", "local-use"),
    ("[100::1]", "discard-only"),
    ("[2001::1]", "IETF protocol assignments"),
    ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "IETF protocol assignments"),  # Teredo
    ("[2001:1::1]", "IETF protocol assignments"),
    ("[2001:2::1]", "IETF protocol assignments"),
    ("[2001:db8::1]", "documentation"),
    ("[2002:808:808::1]", "6to4"),
    ("[2002:c000:c0::1]", "6to4"),
    ("[2620:4f:8000::1]", "AS112"),
    ("[3fff:fff::1]", "documentation"),
    ("[5f00::1]", "segment routing"),
    ("[fc00::1]", "unique local"),
    ("[fd00:ec2::254]", "unique local"),
    ("[fe80::1]", "link-local"),
    ("[fe80::1%25eth0]", "link"),
    ("[febf::1]", "link-local"),
    ("[fec0::1]", "site-local"),
    ("[ff02::1]", "multicast"),
    ("[4000::1]", "outside 2000::/3"),
    ("[1::1]", "outside 2000::/3"),
    ("[e000::1]", "outside 2000::/3"),
]
GLOBAL_HOSTS = [
    "8.8.8.8",
    "93.184.216.34",
    "1.1.1.1",
    "134744072",  # 8.8.8.8 as one number
    "0x08080808",
    "192.0.1.1",  # beside 192.0.0.0/24 and 192.0.2.0/24
    "192.88.98.1",
    "198.20.0.1",
    "100.128.0.1",
    "172.32.0.1",
    "223.255.255.254",
    "[2606:4700:4700::1111]",
    "[2a00:1450:4001:80b::200e]",
    "[2001:4860:4860::8888]",  # 2001:4860::/32 is outside 2001::/23
    "[::ffff:8.8.8.8]",
    "[64:ff9b::808:808]",
]
MALFORMED_HOSTS = ["1.2.3.256", "256.1", "1.2.3.4.5", "08", "0x", "1..2", "09.1.1.1", "4294967296"]


def resolving_to(address: str):
    """getaddrinfo as a resolver answers for a name that points at `address` (other names as usual)."""
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host == "hooks.example.com":
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    return fake


def resolved_form(host: str) -> str:
    """What a resolver returns for a name pointing at `host`: the address in its canonical text."""
    address = url_policy._literal(host.strip("[]").replace("%25", "%"))
    assert address is not None, host
    return str(address)


@pytest.mark.parametrize(("host", "why"), REFUSED_HOSTS)
def test_an_address_that_is_not_globally_routable_unicast_is_refused_at_submit_and_at_delivery(monkeypatch, host, why):
    with pytest.raises(WebhookURLError, match="not a globally routable unicast address") as at_submit:
        check_webhook_url(f"http://{host}:8080/hook", NONE_ALLOWED)
    assert why in str(at_submit.value)

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to(resolved_form(host)))
    with pytest.raises(WebhookURLError, match="not a globally routable unicast address"):
        check_webhook_url("https://hooks.example.com/hook", NONE_ALLOWED)
    with pytest.raises(WebhookURLError, match="not a globally routable unicast address"):  # the worker's check
        webhook_addresses("https://hooks.example.com/hook", NONE_ALLOWED, deadline=time.monotonic() + 5)


@pytest.mark.parametrize("host", GLOBAL_HOSTS)
def test_a_globally_routable_unicast_address_is_accepted_literally_and_behind_a_name(monkeypatch, host):
    assert check_webhook_url(f"https://{host}/hook", NONE_ALLOWED)

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to(resolved_form(host)))
    addresses = webhook_addresses("https://hooks.example.com/hook", NONE_ALLOWED, deadline=time.monotonic() + 5)
    assert [str(address) for address in addresses] == [resolved_form(host)]


@pytest.mark.parametrize("host", MALFORMED_HOSTS)
def test_a_numeric_host_that_is_no_ipv4_address_is_refused_and_never_looked_up(monkeypatch, host):
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", lambda *a, **k: pytest.fail(f"{host} was looked up"))

    with pytest.raises(WebhookURLError, match="names no valid host"):
        check_webhook_url(f"http://{host}/hook", NONE_ALLOWED)


def test_an_operator_allow_list_still_opens_a_refused_range():
    allow = AllowList.parse("192.0.0.0/24, fec0::/10")

    assert check_webhook_url("http://3221225664/hook", allow)
    assert check_webhook_url("http://[fec0::1]/hook", allow)
    with pytest.raises(WebhookURLError):
        check_webhook_url("http://192.0.2.1/hook", allow)


@pytest.mark.parametrize(
    ("spelling", "address"),
    [
        ("3221225664", "192.0.0.192"),
        ("0xC00000C0".lower(), "192.0.0.192"),
        ("0300.0.0.0300", "192.0.0.192"),
        ("192.0.192", "192.0.0.192"),
        ("192.12583104", "192.192.0.192"),
        ("0", "0.0.0.0"),
        ("4294967295", "255.255.255.255"),
    ],
)
def test_numeric_spellings_read_as_a_resolver_reads_them(spelling, address):
    assert str(ipv4_spelling(spelling)) == address
    assert socket.inet_aton(spelling) == socket.inet_aton(address)  # glibc's reading agrees


def test_a_name_is_not_a_numeric_spelling():
    assert ipv4_spelling("hooks.example.com") is None
    assert ipv4_spelling("1.2.3.example") is None
    with pytest.raises(BadIPv4Spelling):
        ipv4_spelling("example.08")
