"""A delivery attempt re-checks the webhook URL's addresses and connects to the ones it checked, and its name
lookup ends by the attempt's deadline. Name resolution is faked in-process (`.test` names); the receiver
listens on 127.0.0.1, so nothing leaves the machine."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from storage import url_policy
from tests.support.names import REFUSED_AMONG, answer
from tests.support.servers import silent_tcp_server
from tests.support.webhook_receiver import WebhookReceiver

# STEPWISE_WEBHOOK_ALLOW_HOSTS=127.0.0.1 (a range of one address: names are checked), unsigned
LOOPBACK_ONLY = {"allow": url_policy.AllowList.parse("127.0.0.1"), "secret": None}


@pytest.fixture
def receiver():
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def names(monkeypatch):
    """`rebinding.test` resolves to 127.0.0.1 once, then to 127.0.0.2 (a DNS rebinding name); `slow.test`
    hangs (up to 60 s, released when the test ends); `outage.test` fails to resolve once, then resolves;
    the names of `tests.support.names.REFUSED_AMONG` resolve to their addresses; other names resolve for real
    (addresses only here).
    Yields the `.test` names looked up, in order."""
    looked_up: list[str] = []
    release = threading.Event()
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if not host.endswith(".test"):
            return real(host, port, *args, **kwargs)
        looked_up.append(host)
        if host == "slow.test":
            release.wait(60)
        if host == "outage.test":  # the resolver fails once (a DNS outage), then answers
            if looked_up.count(host) == 1:
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        if host in REFUSED_AMONG:
            return answer(REFUSED_AMONG[host], port)
        address = "127.0.0.1" if looked_up.count(host) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", fake)
    yield looked_up
    release.set()


def test_an_attempt_connects_to_the_address_it_checked_and_the_next_attempt_checks_again(receiver, names):
    from worker.webhooks import post_once

    url = f"http://rebinding.test:{receiver.server.server_port}/hook"

    first = post_once(url, "msg_rebind", {"type": "job.started"}, timeout=5, **LOOPBACK_ONLY)

    assert first.is_delivered, first
    (delivery,) = receiver.received("/hook")
    assert delivery.headers["host"].startswith("rebinding.test"), "the request still names the URL's host"
    assert names == ["rebinding.test"], "connected to the checked 127.0.0.1, not to a second lookup's 127.0.0.2"

    second = post_once(url, "msg_rebind", {"type": "job.started"}, timeout=5, **LOOPBACK_ONLY)

    assert not second.is_delivered and second.is_final, second
    assert "resolves to 127.0.0.2" in second.error
    assert len(receiver.received("/hook")) == 1


def test_an_attempt_whose_name_lookup_hangs_ends_by_its_deadline_and_may_be_retried(names):
    from worker.webhooks import post_once

    started = time.monotonic()
    outcome = post_once("http://slow.test/hook", "msg_slow", {"type": "job.started"}, timeout=1, **LOOPBACK_ONLY)

    assert not outcome.is_delivered and not outcome.is_final, outcome
    assert "AttemptDeadlineError" in outcome.error and "did not resolve within 1s" in outcome.error
    assert time.monotonic() - started < 1 + 5, "the 60 s lookup did not hold the attempt"


def test_an_attempt_whose_name_does_not_resolve_may_be_retried_and_the_next_one_delivers(receiver, names):
    """The name resolved at submit; failing now is likely a DNS outage, not a refused address: not final."""
    from worker.webhooks import post_once

    url = f"http://outage.test:{receiver.server.server_port}/hook"

    first = post_once(url, "msg_outage", {"type": "job.started"}, timeout=5, **LOOPBACK_ONLY)

    assert not first.is_delivered and not first.is_final, first
    assert "does not resolve" in first.error
    assert receiver.received("/hook") == []

    second = post_once(url, "msg_outage", {"type": "job.started"}, timeout=5, **LOOPBACK_ONLY)

    assert second.is_delivered, second
    assert len(receiver.received("/hook")) == 1


@pytest.fixture
def silent_server():
    with silent_tcp_server() as listener:
        yield listener


def test_an_https_attempt_whose_tls_handshake_stalls_ends_by_its_deadline(silent_server):
    from worker.webhooks import post_once

    started = time.monotonic()
    outcome = post_once(
        f"https://127.0.0.1:{silent_server.getsockname()[1]}/hook", "msg_tls", {}, timeout=1, **LOOPBACK_ONLY
    )

    assert not outcome.is_delivered and not outcome.is_final, outcome
    assert "AttemptDeadlineError" in outcome.error
    assert time.monotonic() - started < 1 + 5


@pytest.mark.parametrize("name", sorted(REFUSED_AMONG))
def test_an_attempt_to_a_name_with_one_refused_address_is_refused_and_sends_nothing(receiver, names, name):
    from worker.webhooks import post_once

    outcome = post_once(
        f"http://{name}:{receiver.server.server_port}/hook", "msg_mixed", {"type": "x"}, timeout=5, **LOOPBACK_ONLY
    )

    assert not outcome.is_delivered and outcome.is_final, outcome
    assert "resolves to 127.0.0.2" in outcome.error
    assert receiver.received("/hook") == []
