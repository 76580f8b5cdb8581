"""A job for a model family gets a 422 naming the field when it asks what the family cannot do."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.settings import ApiSettings
from api.submission import validate_job


@pytest.mark.parametrize("field, value", [("sampler", "dpmpp_2m"), ("width", 200), ("guidance_scale", 30.0),
                                          ("negative_prompt", "blurry")])
def test_a_flux_job_the_family_cannot_run_gets_422_naming_the_field(field, value):
    with pytest.raises(ApiError) as error:
        validate_job({"prompt": "a fox", "model": "builtin:tiny-flux", field: value}, ApiSettings(api_keys=()))

    assert (error.value.status, error.value.field) == (422, field)


def test_a_flux_job_without_size_or_guidance_gets_the_family_defaults():
    job = validate_job({"prompt": "a fox", "model": "builtin:tiny-flux"}, ApiSettings(api_keys=()))

    assert (job.params.guidance_scale, job.params.sampler, job.params.width % 16) == (3.5, "euler", 0)
