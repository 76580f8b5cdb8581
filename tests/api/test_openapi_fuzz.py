"""Property-based fuzz of the OpenAPI document with schemathesis: no generated request, valid or
not, makes any route answer 5xx, and every answer matches the documented status codes, content
types and schemas.

Strategies come from `operation.as_strategy()` under plain hypothesis (schemathesis' own pytest
plugin does not run under pytest 9 yet).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, reject, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.calls import auth
from tests.api.test_operations import ROUTES

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def api_schema(api):
    return schemathesis.openapi.from_url(f"{api.url}/openapi.json", timeout=10)


# Routes without parameters or a body have no invalid input to generate. A valid request to the OpenAI
# images routes waits for its job, which this API's queue (no worker) never runs: only invalid ones.
WAITING = {"/v1/images/generations", "/v1/images/edits"}
CASES = [
    (path, method, mode)
    for path, method in sorted(ROUTES)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if (mode is GenerationMode.POSITIVE or path.startswith("/v1/"))
    and not (mode is GenerationMode.POSITIVE and path in WAITING)
]


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=str)
def test_no_generated_request_gets_a_5xx_or_an_undocumented_answer(api, api_schema, http, path, method, mode):
    operation = api_schema[path][method.upper()]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
    def check(case):
        if case.headers:
            case.headers.pop("Prefer", None)  # a valid wait holds the answer for a worker this API has none of
        response = case.call(base_url=api.url, session=http, headers=auth(), timeout=15)
        if response.status_code == 400 and "Request Line is too large" in response.text:
            reject()  # gunicorn refuses request lines over 8190 bytes before the app sees them
        if path in WAITING and response.status_code == 504:
            reject()  # a mutation that left the request valid: its job waited for a worker there is none of
        case.validate_response(response, checks=CHECKS)

    check()
