"""init_image / mask_image as http(s) URLs: fetched at submit only from hosts the operator allows
(STEPWISE_IMAGE_URL_HOSTS), through the webhooks' address rule.

Every request here goes to a loopback image server: the app under test allows 127.0.0.1
explicitly (a listed range is the operator's way to allow a private address). Refusals of
other addresses are tested on the policy function itself, with name resolution faked, so
no request ever leaves the machine; so are the host names the app lists (`images.test`
resolves to 127.0.0.1, `slow.test` hangs), through the `names` fixture.
"""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
import time

import pytest

from api import create_app
from api.remote_images import MAX_CONCURRENT_FETCHES
from api.settings import ApiSettings
from core.image_inputs import MAX_IMAGE_BYTES, is_upload_id
from storage import url_policy
from storage.settings import StorageSettings
from storage.url_policy import AllowList, ImageURLError, check_image_url
from tests.support.app_context import get_task_queue_of, stored_params
from tests.support.calls import auth
from tests.support.names import REFUSED_AMONG, answer
from tests.support.pictures import JOB, image_bytes, mask_uri
from tests.support.processes import TENANT_KEYS
from tests.support.servers import silent_tcp_server

PICTURE = image_bytes(96, 72, seed=3)  # a size no default has: the job's size must come from the image


class ImageHandler(http.server.BaseHTTPRequestHandler):
    paths_seen: list[str]  # set per server

    def do_GET(self) -> None:  # noqa: N802  # http.server's name
        self.paths_seen.append(self.path)
        port = self.server.server_address[1]
        routes = {
            "/cat.png": lambda: self._send(200, PICTURE, "image/png"),
            "/hop": lambda: self._redirect("/cat.png"),
            "/hop-to-unlisted-name": lambda: self._redirect(f"http://localhost:{port}/cat.png"),
            "/hop-to-slow-name": lambda: self._redirect(f"http://slow.test:{port}/cat.png"),
            "/together.png": self._together,
            "/loop": lambda: self._redirect("/loop"),
            "/missing.png": lambda: self._send(404, b"not here", "text/plain"),
            "/page.html": lambda: self._send(200, b"<html>not an image</html>", "text/html"),
            "/huge.png": lambda: self._send_headers(200, MAX_IMAGE_BYTES + 1, "image/png"),
            "/endless.png": self._endless,
            "/drip.png": self._drip,
        }
        routes.get(self.path, lambda: self._send(404, b"", "text/plain"))()

    def _send_headers(self, status: int, length: int, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self._send_headers(status, len(body), content_type)
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _endless(self) -> None:  # no Content-Length: the byte limit must stop the read
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        chunk = b"\0" * 65536
        try:
            for _ in range(MAX_IMAGE_BYTES // len(chunk) + 10):
                self.wfile.write(chunk)
        except OSError:
            pass

    def _drip(self) -> None:  # a byte every 0.2 s: each read is quick, the whole body never ends in time
        self._send_headers(200, len(PICTURE), "image/png")
        try:
            for byte in PICTURE:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def _together(self) -> None:  # waits (briefly) for company: answers at once only to overlapping requests
        overlap = self.server.overlap  # type: ignore[attr-defined]
        with overlap.changed:
            overlap.num_in_flight += 1
            overlap.max_in_flight = max(overlap.max_in_flight, overlap.num_in_flight)
            overlap.changed.notify_all()
            overlap.changed.wait_for(lambda: overlap.num_in_flight > 1, timeout=0.5)
        try:
            self._send(200, PICTURE, "image/png")
        finally:
            with overlap.changed:
                overlap.num_in_flight -= 1

    def log_message(self, *args) -> None:
        pass


class Overlap:
    """How many requests for /together.png the server held at once."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.num_in_flight = 0
        self.max_in_flight = 0


@pytest.fixture(scope="module")
def image_server():
    handler = type("Handler", (ImageHandler,), {"paths_seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.paths_seen = handler.paths_seen  # type: ignore[attr-defined]
    server.overlap = Overlap()  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


def url_of(server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


@pytest.fixture
def fetching_client(redis_url, tmp_path):
    """The app with 127.0.0.1 and some names (resolved only through the `names` fixture) as its image hosts,
    and a 1 s fetch deadline."""
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        image_url_hosts=AllowList.parse(", ".join(["127.0.0.1", "images.test", "slow.test", *REFUSED_AMONG])),
        image_url_timeout_seconds=1.0,
        accept_unserved_models=True,
    )
    app = create_app({"TESTING": True, "API_SETTINGS": settings})
    yield app, app.test_client()
    get_task_queue_of(app).close()


def submit(client, body: dict):
    return client.post("/v1/jobs", json=body, headers=auth())


def test_an_image_url_on_an_allowed_host_is_fetched_and_kept_as_an_upload(fetching_client, image_server):
    app, client = fetching_client

    response = submit(client, {**JOB, "init_image": url_of(image_server, "/cat.png"), "strength": 0.5})

    assert response.status_code == 202, response.json
    assert (response.json["params"]["width"], response.json["params"]["height"]) == (96, 72), "the image's size"
    upload_id = stored_params(app, response.json["job_id"])["init_image"]
    assert is_upload_id(upload_id), "the record keeps an upload id, not the URL"
    with app.app_context():
        from api.resources import get_upload_store

        data_uri = get_upload_store().get("alice", upload_id)
    assert data_uri is not None and data_uri.startswith("data:image/png;base64,")


def test_a_redirect_on_an_allowed_host_is_followed_and_the_mask_may_be_a_url_too(fetching_client, image_server):
    _, client = fetching_client
    mask_url = url_of(image_server, "/cat.png")  # any picture decodes as a mask (thresholded gray)

    response = submit(client, {**JOB, "init_image": url_of(image_server, "/hop"), "mask_image": mask_url})

    assert response.status_code == 202, response.json
    assert response.json["params"]["strength"] == 1.0


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/hop-to-unlisted-name", "names host 'localhost', which is not one the operator allows"),
        ("/loop", "redirected more than 3 times"),
        ("/missing.png", "answered HTTP 404"),
        ("/page.html", "must be a PNG, JPEG or WebP image"),
        ("/huge.png", f"more than the {MAX_IMAGE_BYTES} allowed"),
        ("/endless.png", f"more than the {MAX_IMAGE_BYTES} bytes allowed"),
        ("/drip.png", "did not answer within 1s"),
    ],
)
def test_an_image_url_that_cannot_be_used_gets_a_422_naming_the_field(fetching_client, image_server, path, words):
    _, client = fetching_client
    started = time.monotonic()

    response = submit(client, {**JOB, "init_image": url_of(image_server, path)})

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "init_image"
    assert words in response.json["error"]["message"]
    assert time.monotonic() - started < 5, "one deadline bounds the whole fetch"


def test_reference_images_take_urls_beside_data_uris_each_kept_as_an_upload(fetching_client, image_server):
    app, client = fetching_client
    inline = "data:image/png;base64," + __import__("base64").b64encode(image_bytes(64, 80, seed=4)).decode()
    listed = [url_of(image_server, "/cat.png"), inline, url_of(image_server, "/missing.png")]
    body = {**JOB, "model": "builtin:tiny-flux2", "reference_images": listed}

    refused = submit(client, body)
    created = submit(client, {**body, "reference_images": listed[:2]})

    assert refused.status_code == 422 and refused.json["error"]["field"] == "reference_images[2]", refused.json
    assert "answered HTTP 404" in refused.json["error"]["message"]
    assert created.status_code == 202, created.json
    assert (created.json["params"]["width"], created.json["params"]["height"]) == (96, 64), "the first one's, cropped"
    stored = stored_params(app, created.json["job_id"])["reference_images"]
    assert len(stored) == 2 and all(is_upload_id(upload_id) for upload_id in stored)


def test_without_allowed_hosts_no_url_is_fetched(client, image_server):
    before = len(image_server.paths_seen)

    response = submit(client, {**JOB, "init_image": data_uri_of_picture(), "mask_image": url_of(image_server, "/a")})

    assert response.status_code == 422
    assert response.json["error"]["field"] == "mask_image"
    assert "STEPWISE_IMAGE_URL_HOSTS" in response.json["error"]["message"]
    assert len(image_server.paths_seen) == before, "nothing was requested"


def data_uri_of_picture() -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(image_bytes()).decode()


def test_a_url_in_a_batch_job_is_named_with_its_index(fetching_client, image_server):
    _, client = fetching_client
    jobs = [{**JOB, "init_image": data_uri_of_picture(), "mask_image": mask_uri()}, {**JOB, "init_image": "http://x"}]

    response = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    results = response.json["results"]
    assert [result["status"] for result in results] == [202, 422], response.json
    assert results[1]["error"]["field"] == "jobs[1].init_image"


@pytest.fixture
def names(monkeypatch):
    """Faked name resolution: `slow.test` hangs (up to 60 s, released when the test ends), the names of
    `tests.support.names.REFUSED_AMONG` resolve to their addresses, any other name resolves to 127.0.0.1. Yields the
    names looked up, in order."""
    looked_up: list[str] = []
    release = threading.Event()

    def fake(host, port, *args, **kwargs):
        looked_up.append(host)
        if host == "slow.test":
            release.wait(60)
        if host in REFUSED_AMONG:
            return answer(REFUSED_AMONG[host], port)
        return resolving_to("127.0.0.1")(host, port)

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", fake)
    yield looked_up
    release.set()


def test_a_listed_name_is_looked_up_and_fetched_from_the_address_checked(fetching_client, image_server, names):
    _, client = fetching_client
    port = image_server.server_address[1]

    response = submit(client, {**JOB, "init_image": f"http://images.test:{port}/cat.png", "strength": 0.5})

    assert response.status_code == 202, response.json
    assert (response.json["params"]["width"], response.json["params"]["height"]) == (96, 72), "the image's size"
    assert names.count("images.test") == 1, "looked up once, then connected to the checked address"


@pytest.mark.parametrize("path", ["/cat.png", "/hop-to-slow-name"])
def test_a_name_lookup_that_hangs_gets_a_422_naming_the_field_by_the_deadline(
    fetching_client, image_server, names, path
):
    _, client = fetching_client
    port = image_server.server_address[1]
    host = "slow.test" if path == "/cat.png" else "127.0.0.1"  # or a redirect's target hangs
    started = time.monotonic()

    response = submit(client, {**JOB, "init_image": f"http://{host}:{port}{path}"})

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "init_image"
    assert "did not resolve within 1s" in response.json["error"]["message"]
    assert time.monotonic() - started < 6, "the 60 s lookup did not hold the request past the 1 s deadline"


@pytest.fixture
def silent_server():
    with silent_tcp_server() as listener:
        yield listener


def test_an_https_url_whose_tls_handshake_stalls_gets_a_422_by_the_deadline(fetching_client, silent_server):
    _, client = fetching_client
    started = time.monotonic()

    response = submit(client, {**JOB, "init_image": f"https://127.0.0.1:{silent_server.getsockname()[1]}/cat.png"})

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "init_image"
    assert "did not answer within 1s" in response.json["error"]["message"]
    assert time.monotonic() - started < 6


def test_a_batch_fetches_its_items_urls_together(fetching_client, image_server):
    _, client = fetching_client
    image_server.overlap.max_in_flight = 0
    url = url_of(image_server, "/together.png")
    jobs = [{**JOB, "seed": seed, "init_image": url, "strength": 0.5} for seed in range(4)]

    response = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    assert [result["status"] for result in response.json["results"]] == [202] * 4, response.json
    assert image_server.overlap.max_in_flight > 1, "the server saw the batch's requests overlap"


def test_a_batch_of_hanging_urls_answers_by_about_one_deadline_each_item_naming_its_field(
    fetching_client, image_server, names
):
    _, client = fetching_client
    port = image_server.server_address[1]
    num_jobs = MAX_CONCURRENT_FETCHES + 2
    jobs = [{**JOB, "init_image": f"http://slow.test:{port}/cat.png"} for _ in range(num_jobs)]
    jobs.append({**JOB, "init_image": data_uri_of_picture(), "strength": 0.5})  # no URL: unaffected
    started = time.monotonic()

    response = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    results = response.json["results"]
    assert [result["status"] for result in results] == [422] * num_jobs + [202], response.json
    assert [result["error"]["field"] for result in results[:num_jobs]] == [
        f"jobs[{index}].init_image" for index in range(num_jobs)
    ]
    assert time.monotonic() - started < 6, f"{num_jobs} hanging lookups cost about one 1 s deadline, not one each"
    assert names.count("slow.test") <= MAX_CONCURRENT_FETCHES, "URLs whose turn came after the deadline: not looked up"
    assert "was not fetched" in results[num_jobs - 1]["error"]["message"]


@pytest.mark.parametrize("name", sorted(REFUSED_AMONG))
def test_an_image_url_whose_listed_name_has_one_refused_address_is_refused_wherever_it_stands(
    fetching_client, image_server, names, name
):
    _, client = fetching_client
    port, num_seen = image_server.server_address[1], len(image_server.paths_seen)

    response = submit(client, {**JOB, "init_image": f"http://{name}:{port}/cat.png", "strength": 0.5})

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "init_image"
    assert "127.0.0.2" in response.json["error"]["message"]
    assert len(image_server.paths_seen) == num_seen, "nothing was fetched"


# The policy itself: no request is made (address literals, or names with faked resolution).

HOSTS = AllowList.parse("images.example.com, 127.0.0.1, 10.20.0.0/16")


def resolving_to(address: str):
    def fake(host, port, *args, **kwargs):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    return fake


def test_the_policy_fetches_nothing_when_no_host_is_allowed():
    with pytest.raises(ImageURLError, match="fetches none"):
        check_image_url("https://images.example.com/cat.png", AllowList())


@pytest.mark.parametrize(
    "url",
    [
        "https://elsewhere.example.com/cat.png",  # a name not listed
        "http://127.0.0.2/cat.png",  # an address outside the listed ones
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/cat.png",
        "http://localhost/cat.png",  # resolves to a listed address, but names are matched by name
        "ftp://images.example.com/cat.png",
        "https://user:pw@images.example.com/cat.png",
        "https://[::1/cat.png",  # urlsplit raises ValueError on it: the API answered 500
        "https://images.example.com/caf\u00e9.png",  # http.client cannot send it: percent-encode it
        "https://images.example.com/a cat.png",
        "https://images.example.com:0/cat.png",
    ],
)
def test_the_policy_refuses_hosts_not_listed_and_malformed_urls(monkeypatch, url):
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to("93.184.216.34"))

    with pytest.raises(ImageURLError):
        check_image_url(url, HOSTS)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "fd00:ec2::254", "::ffff:192.168.0.1"])
def test_a_listed_name_that_resolves_to_a_private_or_metadata_address_is_refused(monkeypatch, address):
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to(address))

    with pytest.raises(ImageURLError, match="not a globally routable unicast address"):
        check_image_url("https://images.example.com/cat.png", AllowList.parse("images.example.com"))


def test_the_policy_returns_the_addresses_it_checked_for_the_fetcher_to_connect_to(monkeypatch):
    monkeypatch.setattr(url_policy.socket, "getaddrinfo", resolving_to("93.184.216.34"))

    assert check_image_url("https://images.example.com/cat.png", HOSTS) == [ipaddress.ip_address("93.184.216.34")]
    assert check_image_url("http://10.20.3.4:8080/a.png", HOSTS) == [ipaddress.ip_address("10.20.3.4")]
