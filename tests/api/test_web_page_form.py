"""The web page's job form in headless Chromium, against the API in this process with no worker: heartbeats the
test writes say which models are served and what each takes, and the form offers what the chosen model reads."""

from __future__ import annotations

import base64
import io
import re
import time

import pytest
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

from storage.heartbeats import Heartbeat
from storage.queue_names import generate_queue
from tests.support.web_page import open_page, page_app, page_state, serving, wait_until
from worker.heartbeat import family_defaults, family_limits


@pytest.mark.browser
def test_the_page_attaches_several_images_in_order_for_a_model_that_reads_a_list(browser, redis_url, tmp_path):
    app = page_app(redis_url, tmp_path, accept_unserved_models=False)
    store = app.extensions["stepwise.job_store"]
    for model, family in (("builtin:tiny", "sd"), ("builtin:tiny-flux2", "flux2")):
        limits, defaults = family_limits(family), family_defaults(family)
        store.beat(Heartbeat(f"w-{model}", model, generate_queue(model), family, 4, time.time(), True, False,
                             defaults=defaults, limits=limits))  # fmt: skip
    files = []
    for index, colour in enumerate([(200, 40, 40), (40, 200, 40)]):
        files.append(tmp_path / f"image-{index}.png")
        Image.new("RGB", (96, 64), colour).save(files[-1])
    with serving(app) as url:
        open_page(browser, url)
        wait_until(lambda: len(Select(browser.find_element(By.ID, "model")).options) == 2, 30, "the model list")
        Select(browser.find_element(By.ID, "model")).select_by_value("builtin:tiny")
        assert not browser.find_element(By.ID, "reference-images").is_displayed(), "SD takes no list"
        Select(browser.find_element(By.ID, "model")).select_by_value("builtin:tiny-flux2")
        wait_until(lambda: browser.find_element(By.ID, "reference-images").is_displayed(), 15, "the images field")
        assert "up to 10" in browser.find_element(By.ID, "reference-images-field").text
        browser.find_element(By.ID, "reference-images").send_keys("\n".join(str(path) for path in files))
        browser.find_element(By.ID, "prompt").send_keys("the fox in the room")
        browser.find_element(By.ID, "submit-job").click()
        status = wait_until(
            lambda: re.search(r"Submitted job (\S+) ", browser.find_element(By.ID, "job-status").text),
            30,
            "the page to say the job was submitted",
            seen=lambda: page_state(browser),
        )
    stored = store.get(status.group(1)).params["reference_images"]
    uploads = app.extensions["stepwise.upload_store"]
    sent = [uploads.get("alice", upload_id) for upload_id in stored]
    colours = [Image.open(io.BytesIO(base64.b64decode(uri.split(",")[1]))).getpixel((0, 0)) for uri in sent]
    assert colours == [(200, 40, 40), (40, 200, 40)], "both images, in the order chosen"
