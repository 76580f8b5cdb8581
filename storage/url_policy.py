"""Which URLs stepwise may call: webhooks it POSTs to and input images it fetches.

One address rule for both: only globally routable unicast addresses (an allow list:
`storage.global_addresses`; IPv4 spelled as one number or in octal or hex parts is read as the
address it is), unless the operator's allow list names them. Webhooks: any host, allow list
`STEPWISE_WEBHOOK_ALLOW_HOSTS` (host names or CIDR ranges), checked by the API at submit and by
the worker before every delivery attempt (a DNS name may resolve differently later), which
connects to the addresses it checked (`webhook_addresses`; redirects are not followed). Input images
(`init_image` / `mask_image` URLs): only hosts listed in `STEPWISE_IMAGE_URL_HOSTS`, by name
or as an address in a listed range; a listed name's addresses must still be global unless
a listed range holds them, and the fetcher connects to the addresses checked here, so a
name cannot re-resolve elsewhere between check and fetch (`api.remote_images`).

A name lookup with a deadline (an image URL's fetch, a webhook URL's check at submit or a
delivery attempt) stops the caller waiting at that deadline: `getaddrinfo` cannot be
interrupted, so it runs on a pool of `NUM_LOOKUP_THREADS` threads. A lookup still hung then
keeps its thread until the resolver gives up (its own timeouts, resolv.conf's); while all of
them are held, further lookups wait in the pool's queue, by their own deadline still, and
are dropped from it at that deadline. A batch's webhook URLs are checked together
(`check_webhook_urls`): each distinct host looked up once, `LOOKUPS_PER_REQUEST` at a time, by
one deadline, so a request naming many hosts that never answer holds at most that many threads.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from urllib.parse import urlsplit

from settings import default
from storage.global_addresses import Address, BadIPv4Spelling, ipv4_spelling, why_not_global

NUM_LOOKUP_THREADS = 64  # name lookups with a deadline in flight at once, per process
LOOKUPS_PER_REQUEST = 8  # of them, one request's webhook checks at once (its image fetches: 8 at once too)
UNSENDABLE = re.compile(r"[^\x21-\x7e]")  # control characters, spaces and anything beyond ASCII

_lookups = ThreadPoolExecutor(NUM_LOOKUP_THREADS, thread_name_prefix="url-lookup")


class URLPolicyError(ValueError):
    """A URL stepwise was asked to call is malformed or points somewhere it must not call."""

    unresolved = False  # True: the host's name did not resolve (a DNS outage may end; a refused address will not)


class WebhookURLError(URLPolicyError):
    """The webhook URL is malformed or points somewhere stepwise must not call."""


class ImageURLError(URLPolicyError):
    """An input image's URL is malformed, names a host the operator does not allow, or points somewhere
    stepwise must not fetch from."""


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

    def __bool__(self) -> bool:
        return bool(self.host_names or self.networks)

    def allows_address(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in network for network in self.networks)


def check_webhook_url(
    url: str, allow: AllowList, *, seconds: float = default("STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS")
) -> str:
    """Return the URL if stepwise may call it, else raise WebhookURLError saying why (TimeoutError when its
    host does not resolve within `seconds`): `check_webhook_urls` for one URL."""
    outcome = check_webhook_urls([url], allow, deadline=time.monotonic() + seconds)[url]
    if outcome is not None:
        raise outcome
    return url


WebhookCheck = WebhookURLError | TimeoutError | None  # None: stepwise may call the URL


def check_webhook_urls(urls: Iterable[str], allow: AllowList, *, deadline: float) -> dict[str, WebhookCheck]:
    """Each URL's check: None if stepwise may call it, else the WebhookURLError saying why, or a
    TimeoutError when its host's name lookup was not answered by `deadline` (a time.monotonic() value).
    Each distinct host is looked up once (a listed name not at all), all of them at once on the lookup pool."""
    hosts: dict[str, tuple[str, int]] = {}  # url -> (host, port), for the URLs whose host needs a lookup
    checks: dict[str, WebhookCheck] = {}
    for url in dict.fromkeys(urls):
        try:
            host, port = _split(url, WebhookURLError)
            if host in allow.host_names:
                checks[url] = None
            elif (literal := _literal(host)) is not None:
                _check_addresses([literal], allow, WebhookURLError, "STEPWISE_WEBHOOK_ALLOW_HOSTS")
                checks[url] = None
            else:
                hosts[url] = (host, port)
        except WebhookURLError as e:
            checks[url] = e
    # the port only goes into the answers' socket addresses, which are not read: one lookup per host
    waiting = list(dict(hosts.values()).items())
    running: dict[Future[LookupAnswer], str] = {}
    host_checks: dict[str, WebhookCheck] = {}
    while waiting or running:
        # At most LOOKUPS_PER_REQUEST at once: hosts that never answer hold pool threads past the
        # deadline, and one request must not take them all from the others.
        while waiting and len(running) < LOOKUPS_PER_REQUEST:
            host, port = waiting.pop(0)
            running[_start_lookup(host, port)] = host
        done, _ = wait(running, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
        if not done:  # the deadline passed: what is running or not started yet did not resolve in time
            for lookup, host in running.items():
                lookup.cancel()
                host_checks[host] = TimeoutError()
            host_checks.update((host, TimeoutError()) for host, _ in waiting)
            break
        for lookup in done:
            host = running.pop(lookup)
            try:
                addresses = _answer(lookup, host, WebhookURLError, deadline)
                _check_addresses(addresses, allow, WebhookURLError, "STEPWISE_WEBHOOK_ALLOW_HOSTS")
                host_checks[host] = None
            except (WebhookURLError, TimeoutError) as e:
                host_checks[host] = e
    return checks | {url: host_checks[host] for url, (host, _) in hosts.items()}


def webhook_addresses(url: str, allow: AllowList, *, deadline: float) -> list[Address]:
    """The addresses a webhook delivery to `url` may connect to (connect to these, not to a fresh lookup),
    else raise WebhookURLError saying why, or TimeoutError when the name lookup is not answered by `deadline`.
    A listed name is looked up too (it must be connected to somewhere) and its addresses are not checked."""
    host, port = _split(url, WebhookURLError)
    addresses = _addresses(host, port, WebhookURLError, resolve=True, deadline=deadline)
    if host not in allow.host_names:
        _check_addresses(addresses, allow, WebhookURLError, "STEPWISE_WEBHOOK_ALLOW_HOSTS")
    return addresses


def check_image_url(
    url: str, hosts: AllowList, *, resolve: bool = True, deadline: float | None = None
) -> list[Address]:
    """The addresses stepwise may fetch the image at `url` from (connect to these, not to a fresh lookup),
    else raise ImageURLError saying why. `hosts` is STEPWISE_IMAGE_URL_HOSTS: nothing is fetched when empty.
    With a `deadline` (a time.monotonic() value), a name lookup not answered by then raises TimeoutError."""
    if not hosts:
        raise ImageURLError(
            "is a remote URL, and this service fetches none (the operator allows no hosts in "
            "STEPWISE_IMAGE_URL_HOSTS): send a data: URI or an upload id"
        )
    host, port = _split(url, ImageURLError)
    literal = _literal(host)
    if host not in hosts.host_names and not (literal is not None and hosts.allows_address(literal)):
        # refused before any name lookup: a host not listed costs stepwise nothing
        raise ImageURLError(f"names host {host!r}, which is not one the operator allows (STEPWISE_IMAGE_URL_HOSTS)")
    addresses = _addresses(host, port, ImageURLError, resolve=resolve, deadline=deadline)
    _check_addresses(addresses, AllowList(networks=hosts.networks), ImageURLError, "STEPWISE_IMAGE_URL_HOSTS")
    return addresses


def _split(url: str, error: type[URLPolicyError]) -> tuple[str, int]:
    """The URL's host (lowercase, no trailing dot) and port, after the checks every URL passes."""
    if not isinstance(url, str) or len(url) > 2048:
        raise error("must be a URL of at most 2048 characters")
    if UNSENDABLE.search(url):
        # http.client refuses these in a request line (or cannot encode them): such a URL could never be called
        raise error("must hold only printable ASCII without spaces: percent-encode the rest (punycode for a host)")
    try:
        parts = urlsplit(url)
    except ValueError as e:  # an unbalanced or invalid [IPv6] host
        raise error(f"is not a valid URL ({e})") from e
    if parts.scheme not in ("http", "https"):
        raise error("must use http or https")
    if parts.username or parts.password:
        raise error("must not contain credentials")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise error("must name a host")
    try:
        _literal(host)
    except BadIPv4Spelling as e:
        raise error(f"names no valid host: {e}") from e
    try:
        port = parts.port
    except ValueError as e:
        raise error("has an invalid port") from e
    if port == 0:
        raise error("has an invalid port (0)")
    return host, port or (443 if parts.scheme == "https" else 80)


def _literal(host: str) -> Address | None:
    """The address a host spells (also IPv4 as one number, or in octal or hex parts), else None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return ipv4_spelling(host)


def _addresses(
    host: str, port: int, error: type[URLPolicyError], *, resolve: bool, deadline: float | None = None
) -> list[Address]:
    """The host's addresses: itself for an address literal, its DNS answers otherwise (none unless `resolve`).
    With a `deadline`, the lookup runs on the lookup pool and raises TimeoutError if not answered by then."""
    literal = _literal(host)
    if literal is not None:
        return [literal]
    if not resolve:
        return []
    if deadline is not None:
        return _answer(_start_lookup(host, port), host, error, deadline)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        raise _unresolved(error, host) from e
    return _addresses_of(infos)


LookupAnswer = list[tuple]  # getaddrinfo's: (family, type, proto, canonname, sockaddr)


def _start_lookup(host: str, port: int) -> Future[LookupAnswer]:
    return _lookups.submit(socket.getaddrinfo, host, port, proto=socket.IPPROTO_TCP)


def _answer(lookup: Future[LookupAnswer], host: str, error: type[URLPolicyError], deadline: float) -> list[Address]:
    """The lookup's addresses, waiting for it until `deadline` at most (then TimeoutError)."""
    try:
        infos = lookup.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        lookup.cancel()  # still queued: never run; running: its thread stays held until it returns
        raise
    except (socket.gaierror, UnicodeError) as e:
        raise _unresolved(error, host) from e
    return _addresses_of(infos)


def _unresolved(error: type[URLPolicyError], host: str) -> URLPolicyError:
    e = error(f"host {host!r} does not resolve")
    e.unresolved = True
    return e


def _addresses_of(infos: LookupAnswer) -> list[Address]:
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]  # TCP: (host, port, ...)


def _check_addresses(addresses: list[Address], allow: AllowList, error: type[URLPolicyError], setting: str) -> None:
    """Refuse unless every address is globally routable unicast (storage.global_addresses) or allow-listed."""
    for address in addresses:
        why = why_not_global(address)
        if why is not None and not allow.allows_address(address):
            raise error(
                f"resolves to {address}, which is not a globally routable unicast address ({why}); "
                f"allow it with {setting}"
            )
