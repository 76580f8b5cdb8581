"""Property-based fuzz of the OpenAPI document with schemathesis and every check it has (`--checks all`):
no generated request, valid or not, makes a route answer 5xx or anything the document does not say;
a request the document forbids is refused, and one it allows is accepted.

What no schema can say is left to the API: the bytes of an image or an adapter file, whether an upload,
an adapter or a job exists, a webhook or image URL's host, a deadline already past, a job over its
model's cost limits, a strength that runs no step of the job's steps (a product of two fields). A
request the document allows may get a 4xx naming one of those fields (`CONTENT_FIELDS`); any other
refusal of an allowed request fails the test.

The fuzzed API runs with a resolver that never leaves this machine (tests/api/offline_site): the
webhook and image URLs the fuzzer writes name any host. Strategies come from `operation.as_strategy()`
under plain hypothesis (schemathesis' own pytest plugin does not run under pytest 9 yet), derandomized
and bounded, so each run sends the same requests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, reject, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, Failure
from schemathesis.specs.openapi.checks import positive_data_acceptance

from api.errors import ApiError
from api.waiting import prefer_wait
from tests.support.calls import auth
from tests.support.processes import ApiProcess
from tests.support.routes import ROUTES

OFFLINE_SITE = Path(__file__).with_name("offline_site")
MAX_EXAMPLES = 40
# Fields whose acceptable values depend on content or state no schema holds (see the module docstring).
CONTENT_FIELDS = re.compile(
    r"^(jobs\[\d+\]\.)?(init_image|mask_image|image|mask|file|body|lora|webhook_url|deadline|complete_by|name|strength)$"
)
CONTENT_CODES = {"limit_exceeded", "not_found"}


@pytest.fixture(scope="module")
def fuzz_api(module_redis, storage_url, tmp_path_factory):
    """`stepwise api` whose name lookups stay on this machine (no worker: jobs stay queued, and the images
    routes give up waiting for theirs at once)."""
    server = ApiProcess(
        tmp_path_factory.mktemp("fuzz-api"),
        module_redis.url,
        storage_url,
        PYTHONPATH=str(OFFLINE_SITE),
        STEPWISE_IMAGES_WAIT_SECONDS="0.2",  # a valid images request answers 504 at once, not after 300 s
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_api):
    return schemathesis.openapi.from_url(f"{fuzz_api.url}/openapi.json", timeout=10)


def refused_for_content(response) -> bool:
    """A 4xx that names a field whose acceptable values no schema can say (or a cost limit)."""
    if not 400 <= response.status_code < 500:
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    field = error.get("field") or error.get("param") or ""
    return bool(CONTENT_FIELDS.match(field)) or error.get("code") in CONTENT_CODES


@schemathesis.check
def accepts_what_the_document_allows(ctx, response, case):
    """positive_data_acceptance, except for refusals of content no schema can describe."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if refused_for_content(response):
            return None
        raise


ALL_CHECKS = [
    *(check for check in CHECKS.get_all() if check is not positive_data_acceptance),
    accepts_what_the_document_allows,
]


# A valid request to the OpenAI images routes waits for its job, which this API's queue (no worker)
# never runs: only invalid ones. Routes without parameters or a body have no invalid input to generate.
WAITING = {"/v1/images/generations", "/v1/images/edits"}
CASES = [
    (path, method, mode)
    for path, method in sorted(ROUTES)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if (mode is GenerationMode.POSITIVE or path.startswith("/v1/"))
    and not (mode is GenerationMode.POSITIVE and path in WAITING)
]


def holds_a_valid_wait(headers: dict | None) -> bool:
    if not headers or "Prefer" not in headers:
        return False
    try:
        return prefer_wait([headers["Prefer"]]) is not None
    except ApiError:
        return False


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=str)
def test_no_generated_request_breaks_any_check(fuzz_api, api_schema, http, path, method, mode):
    operation = api_schema[path][method.upper()]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case):
        if holds_a_valid_wait(case.headers):
            case.headers.pop("Prefer")  # a valid wait holds the answer for a worker this API has none of
        response = case.call(base_url=fuzz_api.url, session=http, headers=auth(), timeout=15)
        if response.status_code == 400 and "Request Line is too large" in response.text:
            reject()  # gunicorn refuses request lines over 8190 bytes before the app sees them
        if path in WAITING and response.status_code == 504:
            reject()  # a mutation that left the request valid: its job waited for a worker there is none of
        case.validate_response(response, checks=ALL_CHECKS)

    check()
