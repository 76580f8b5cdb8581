"""Abuse: who may do what, and where stepwise may be made to send requests.

Also covered elsewhere, not repeated here:
- `tests/api/test_auth.py`: no key or a wrong key gets 401 on every /v1 route; another tenant's
  job, image and cancel are 404, and its jobs are not listed;
- `tests/faults/test_webhook_outage.py::test_a_redirect_to_an_address_the_policy_refuses_is_not_followed`;
- `tests/api/test_validation.py`: webhook URLs outside the allow list get 422 at submit.
"""

from __future__ import annotations

import base64
import inspect
import ipaddress
import socket

import pytest
import requests

from api import keyring
from storage import url_policy
from storage.url_policy import AllowList, WebhookURLError, check_webhook_url
from tests.support.calls import auth as auth_header
from tests.support.calls import submit
from tests.support.processes import TENANT_KEYS, ApiProcess
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(120)

NO_ALLOW_LIST = AllowList()
REFUSED_URLS = [
    "http://127.0.0.1/hook",
    "http://127.1/hook",
    "http://2130706433/hook",
    "http://0x7f000001/hook",
    "http://0177.0.0.1/hook",
    "http://0.0.0.0/hook",
    "http://0/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:7f00:1]/hook",
    "http://localhost/hook",
    "http://LOCALHOST./hook",
    "http://localhost:8080/hook",
    "https://10.0.0.1/hook",
    "http://172.16.5.4/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest",
    "http://[fe80::1]/hook",
    "http://224.0.0.1/hook",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://user:pw@93.184.216.34/hook",
    "file:///etc/passwd",
    "gopher://93.184.216.34/",
    "http:///hook",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_webhook_urls_to_loopback_private_link_local_or_metadata_addresses_are_refused(url):
    with pytest.raises(WebhookURLError):
        check_webhook_url(url, NO_ALLOW_LIST)


# IPv6 forms that carry traffic to an embedded IPv4 address: 6to4 (2002::/16), Teredo (2001::/32,
# client address inverted) and NAT64 (64:ff9b::/96, and 64:ff9b:1::/48 with RFC 6052's layout). All but the
# well-known NAT64 prefix are special-purpose blocks, refused whatever they embed; NAT64 is judged by its IPv4.
EMBEDDED_PRIVATE_IPV4 = [
    "2002:7f00:1::",
    "2002:a9fe:a9fe::1",
    "2002:c0a8:101::",
    "2002:808:808::1",  # 6to4 of a public address: still refused, 6to4 needs the relays RFC 7526 deprecated
    "2001:0:4136:e378:8000:63bf:80ff:fffe",
    "2001:0:4136:e378:8000:63bf:f5ff:fefe",
    "64:ff9b::7f00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1:a00:0:100::",
    "64:ff9b:1:a9fe:a9:fe00::",
]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE_IPV4)
def test_ipv6_addresses_embedding_an_ipv4_address_are_refused_unless_nat64_of_a_global_one(monkeypatch, address):
    with pytest.raises(WebhookURLError, match="not a globally routable unicast address"):
        check_webhook_url(f"http://[{address}]/h", NO_ALLOW_LIST)
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to(address))
    with pytest.raises(WebhookURLError, match="not a globally routable unicast address"):
        check_webhook_url("https://hooks.example.com/stepwise", NO_ALLOW_LIST)


def test_the_well_known_nat64_form_of_a_global_ipv4_address_is_accepted():
    assert check_webhook_url("http://[64:ff9b::808:808]/h", NO_ALLOW_LIST)  # a literal: no lookup


def resolving_to(address: str, real=socket.getaddrinfo):
    """getaddrinfo as a DNS server would answer for a name that points at `address`."""

    def fake(host, port, *args, **kwargs):
        if host.endswith("example.com"):
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    return fake


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:192.168.0.1"])
def test_a_public_looking_name_that_resolves_to_a_private_address_is_refused(monkeypatch, address):
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to(address))

    with pytest.raises(WebhookURLError, match="not a globally routable unicast address"):
        check_webhook_url("https://hooks.example.com/stepwise", NO_ALLOW_LIST)


def test_allow_listed_hosts_and_ranges_are_accepted_and_nothing_else(monkeypatch):
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to("10.1.2.3"))
    allow = AllowList.parse("127.0.0.1, 10.0.0.0/8, hooks.internal")

    for url in (
        "http://127.0.0.1:9000/hook",
        "http://localhost/hook",
        "https://hooks.example.com/x",
        "http://hooks.internal/x",
    ):
        assert check_webhook_url(url, allow) == url
    for url in ("http://127.0.0.2/hook", "http://192.168.0.1/hook", "http://169.254.169.254/"):
        with pytest.raises(WebhookURLError):
            check_webhook_url(url, allow)
    assert ipaddress.ip_address("127.0.0.2") not in allow.networks[0]


# Allowed hosts, in URLs http.client cannot send (it refuses controls and spaces in a request line and cannot
# encode non-ASCII) or cannot parse: accepted at submit, such a webhook failed at every delivery attempt.
UNSENDABLE_URLS = [
    "http://127.0.0.1/caf\u00e9",
    "http://127.0.0.1/hook?name=caf\u00e9",
    "http://127.0.0.1/a b",
    "http://127.0.0.1/hook\r\nX-Injected: 1",
    "http://127.0.0.1/hook\t",
    "http://127.0.0.1/\x00",
    "http://[::1/hook",
    "http://[127.0.0.1]/hook",
    "http://127.0.0.1:0/hook",
]


@pytest.mark.parametrize("url", UNSENDABLE_URLS, ids=repr)
def test_a_webhook_url_that_could_never_be_sent_is_refused_even_to_an_allowed_host(url):
    allow = AllowList.parse("127.0.0.1, ::1")

    with pytest.raises(WebhookURLError):
        check_webhook_url(url, allow)
    assert check_webhook_url("http://127.0.0.1/caf%C3%A9?name=a%20b", allow)  # the same, percent-encoded


@pytest.fixture(scope="module")
def strict_api(tmp_path_factory):
    """`stepwise api` with no webhook allow list and an access log, as in production."""
    root = tmp_path_factory.mktemp("abuse")
    redis = RedisServer(root / "redis", appendonly=False).start()
    server = ApiProcess(
        root, redis.url, (root / "images").as_uri(), access_log=True, STEPWISE_WEBHOOK_ALLOW_HOSTS=""
    ).start()
    yield server, redis
    server.stop()
    redis.stop()


# Only loopback spellings go into requests (traffic and request bodies stay on loopback); the metadata and
# private addresses are checked against the policy function directly above.
@pytest.mark.parametrize(
    "url", ["http://localhost:9/hook", "http://127.0.0.1:9/hook", "http://[::1]/hook", "http://2130706433/hook"]
)
@pytest.mark.e2e
def test_the_api_refuses_a_webhook_url_to_this_machine(strict_api, url):
    api, _ = strict_api
    with requests.Session() as http:
        response = submit(http, api, {"prompt": "a fox", "webhook_url": url})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "webhook_url"


def test_api_keys_are_compared_in_constant_time_and_all_of_them_every_time(monkeypatch):
    source = inspect.getsource(keyring.KeyRing.caller_for)
    compared = []
    monkeypatch.setattr(keyring.hmac, "compare_digest", lambda a, b: compared.append(b) or a == b)
    ring = keyring.KeyRing(tuple(TENANT_KEYS.items()))

    assert "hmac.compare_digest(presented, expected)" in source and "presented ==" not in source
    for presented in ("sk_test_alice", "sk_test_carol", "nobody"):
        compared.clear()
        ring.tenant_for(presented)
        assert len(compared) == len(TENANT_KEYS)  # no early exit: the time does not tell which key matched


@pytest.mark.e2e
def test_api_keys_never_reach_the_logs(strict_api):
    api, redis = strict_api
    wrong_key = "sk_live_" + "q" * 24
    with requests.Session() as http:
        assert submit(http, api, {"prompt": "a fox"}).status_code == 202
        assert http.get(f"{api.url}/v1/jobs", headers=auth_header("bob"), timeout=10).status_code == 200
        assert (
            http.get(f"{api.url}/v1/jobs", headers={"Authorization": f"Bearer {wrong_key}"}, timeout=10).status_code
            == 401
        )
        # Keys where clients put them by mistake: a query string, a referer, Basic auth.
        assert http.get(f"{api.url}/v1/jobs?key={wrong_key}x", timeout=10).status_code == 401
        assert (
            http.get(f"{api.url}/healthz", headers={"Referer": f"https://x/?k={wrong_key}"}, timeout=10).status_code
            == 200
        )
        basic = base64.b64encode(f"{TENANT_KEYS['carol']}:".encode()).decode()
        assert (
            http.get(f"{api.url}/v1/jobs", headers={"Authorization": f"Basic {basic}"}, timeout=10).status_code == 401
        )
        redis.stop()  # errors are logged too
        try:
            assert submit(http, api, {"prompt": "a fox"}).status_code == 503
        finally:
            redis.start()

    logs = api.log_tail(10_000_000)
    assert "GET /v1/jobs" in logs and "POST /v1/jobs" in logs  # the access log is on
    for key in (*TENANT_KEYS.values(), wrong_key):
        assert key not in logs
