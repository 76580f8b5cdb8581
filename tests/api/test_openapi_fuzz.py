"""Property-based fuzz of the OpenAPI document with schemathesis and every check it has (`--checks all`):
no generated request, valid or not, makes a route answer 5xx or anything the document does not say;
a request the document forbids is refused, and one it allows is accepted.

What no schema can say is left to the API: the bytes of an image or an adapter file, whether an upload,
an adapter or a job exists, a webhook or image URL's host, a deadline already past, a job over its
model's cost limits, a strength that runs no step of the job's steps (a product of two fields), an OpenAI
`size` in its model family's multiples and pixel limits (the pattern holds its form: WIDTHxHEIGHT, or auto), the
fields the document gives every family's loosest rules and the model's own family narrows (a video's
`num_frames`, `fps`, `guidance_scale_2`, `output_format`, `sampler`, and `seconds`, which becomes frames at the
family's rate), and whether the served model draws videos at all (`/v1/videos`, code `model_not_video`; the images
routes, `model_not_image`). A request the document allows may get a 4xx naming one of those fields
(`CONTENT_FIELDS`); any other refusal of an allowed request fails the test.

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
import schemathesis.specs.openapi.negative as negative_generation
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, Failure, not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from api.errors import ApiError
from api.waiting import prefer_wait
from tests.support.calls import auth
from tests.support.processes import ApiProcess
from tests.support.routes import ROUTES

pytestmark = pytest.mark.e2e

OFFLINE_SITE = Path(__file__).with_name("offline_site")
MAX_EXAMPLES = 40
# Fields whose acceptable values depend on content or state no schema holds (see the module docstring).
CONTENT_FIELDS = re.compile(
    r"^(jobs\[\d+\]\.)?"
    r"(init_image|mask_image|reference_images\[\d+\]|image|mask|file|body|lora|webhook_url|deadline|complete_by|name"
    r"|strength|size"
    r"|num_frames|fps|guidance_scale_2|output_format|sampler|seconds|input_reference)$"
)
CONTENT_CODES = {"limit_exceeded", "not_found", "model_not_video", "model_not_image"}


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


def taken_but_not_done(case, response) -> bool:
    """An OpenAI images call whose job was taken and queued, then not done within the fuzzed API's 0.2 s wait
    (it has no worker): `504 timeout`, which names the job. The request was accepted."""
    if case.path not in WAITING or response.status_code != 504:
        return False
    try:
        return response.json()["error"]["code"] == "timeout"
    except (ValueError, KeyError, TypeError):
        return False


@schemathesis.check
def accepts_what_the_document_allows(ctx, response, case):
    """positive_data_acceptance, except for refusals of content no schema can describe."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if refused_for_content(response) or taken_but_not_done(case, response):
            return None
        raise


@schemathesis.check
def no_server_error_but_a_documented_wait_timeout(ctx, response, case):
    """not_a_server_error, except the OpenAI routes' documented 504 for a job still queued (taken_but_not_done)."""
    if taken_but_not_done(case, response):
        return None
    return not_a_server_error(ctx, response, case)


ALL_CHECKS = [
    *(check for check in CHECKS.get_all() if check not in (positive_data_acceptance, not_a_server_error)),
    accepts_what_the_document_allows,
    no_server_error_but_a_documented_wait_timeout,
]


# A valid request to the OpenAI images routes waits for its job, which this API's queue (no worker) never runs:
# it answers 504 after the fuzzed API's short wait (taken_but_not_done). Routes without parameters or a body
# have no invalid input to generate.
WAITING = {"/v1/images/generations", "/v1/images/edits"}
CASES = [
    (path, method, mode)
    for path, method in sorted(ROUTES)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or path.startswith("/v1/")
]


def holds_a_valid_wait(headers: dict | None) -> bool:
    if not headers or "Prefer" not in headers:
        return False
    try:
        return prefer_wait([headers["Prefer"]]) is not None
    except ApiError:
        return False


# schemathesis 4.32's negative "value channel" cannot copy a body holding a file part (ValueError: Unsupported
# type: 'Binary'): the multipart routes' invalid bodies come from its schema mutations alone.
WITH_FILE_PARTS = {"/v1/images/edits", "/v1/uploads"}


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=str)
def test_no_generated_request_breaks_any_check(fuzz_api, api_schema, http, monkeypatch, path, method, mode):
    operation = api_schema[path][method.upper()]
    if mode is GenerationMode.NEGATIVE and path in WITH_FILE_PARTS:
        monkeypatch.setattr(negative_generation, "VALUE_CHANNEL_PROBABILITY", 0.0)

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
        case.validate_response(response, checks=ALL_CHECKS)

    check()
