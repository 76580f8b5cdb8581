"""The web page at `GET /`: served by the API itself, and driven in headless Chromium against a live
stack (`stepwise api` over HTTP, a real Celery worker, real Redis)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import threading
import time

import pytest
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select
from werkzeug.serving import make_server

from api import create_app
from api.settings import ApiSettings
from core.output_encoding import encode_video
from storage.heartbeats import Heartbeat
from storage.job_store import JobState
from storage.queue_names import generate_queue
from storage.settings import StorageSettings
from tests.support import tiers
from tests.support.calls import auth
from tests.support.job_factories import take_job
from tests.support.processes import TENANT_KEYS
from tests.support.waiting import wait_for
from worker.heartbeat import family_defaults, family_limits

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
KEY = TENANT_KEYS["alice"]


def test_the_page_and_its_files_are_served_without_a_key_and_load_nothing_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_API_KEYS", "alice:" + KEY)
    monkeypatch.setenv("STEPWISE_STORAGE_URL", tmp_path.as_uri())
    client = create_app({"TESTING": True, "API_SETTINGS": ApiSettings.from_env()}).test_client()

    page = client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    for url in re.findall(r'(?:src|href)="(/[^"]*|https?:[^"]*)"', html):
        assert url.startswith("/static/"), url
        assert client.get(url).status_code == 200, url
    assert client.get("/static/app.js").mimetype in ("text/javascript", "application/javascript")


@pytest.fixture
def browser():
    tiers.require(tiers.BROWSER, "Chromium")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("chromium and chromedriver are needed: `make chromium` or apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1200,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


CUT_OFF_SELECTS = """
const measure = document.createElement("canvas").getContext("2d");
return [...document.querySelectorAll("select")].filter((select) => select.offsetParent !== null).flatMap((select) => {
  const style = getComputedStyle(select);
  measure.font = style.font;
  const widest = Math.max(...[...select.options].map((option) => measure.measureText(option.text).width));
  const room = select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 20;  // the arrow
  return widest > room ? [`${select.id}: ${Math.round(widest)} px of text in ${Math.round(room)} px`] : [];
});
"""


def wait_until(condition, timeout: float, what: str, seen=lambda: ""):
    """`wait_for` on the page: a condition the browser cannot answer yet (WebDriverException) has not held."""

    def holds():
        try:
            return condition()
        except WebDriverException:
            return None

    return wait_for(holds, timeout, lambda: f"{what}; the page shows: {seen()}", interval=0.05)


def page_state(browser) -> str:
    status = browser.find_element(By.ID, "job-status").text
    paging = script(browser, "return [cursors.length, document.querySelector('#older-jobs').dataset.cursor]")
    return f"status {status!r}, pages {paging}, console {browser.get_log('browser')}"


def text_of(browser, selector: str) -> str:
    return script(browser, "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", selector)


def script(browser, code: str, *args):
    return browser.execute_script(code, *args)


@pytest.mark.browser
def test_a_multi_image_jobs_card_counts_its_own_steps_and_names_the_image_it_is_on(browser, redis_url, tmp_path):
    """The page against the API in this process (no worker: the store plays one), so it is quick."""
    settings = ApiSettings(
        api_keys=(("alice", KEY),),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        accept_unserved_models=True,
    )
    app = create_app({"API_SETTINGS": settings})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = app.extensions["stepwise.job_store"]
    client = app.test_client()
    body = {"prompt": "a red circle", "num_images": 2, "num_inference_steps": 8, "height": 64, "width": 64}
    canceled, running = (client.post("/v1/jobs", json=body, headers=auth()).json["job_id"] for _ in range(2))
    holders = {job_id: take_job(store, job_id, "fake-worker").holder for job_id in (canceled, running)}
    store.set_progress(running, 5, 8, current_image=2)  # as a worker running its images one after another
    store.finish(canceled, JobState.CANCELED, holder=holders[canceled], progress_step=3, progress_total=8)
    try:
        browser.get(f"http://127.0.0.1:{server.server_port}/")
        browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.ENTER)
        card = "li.job[data-job-id='{}'] .meta"
        wait_until(
            lambda: "step 5/8 · image 2 of 2" in text_of(browser, card.format(running)),
            30,
            "the running job's card to count its own steps and name its image",
            seen=lambda: text_of(browser, card.format(running)),
        )
        assert "canceled · step 3/8" in text_of(browser, card.format(canceled)), "its own count, not of 16"
    finally:
        server.shutdown()


@pytest.mark.browser
def test_a_followed_jobs_stream_that_ends_with_reconnect_is_followed_again_and_its_card_stays_whole(
    browser, redis_url, tmp_path
):
    """An API process that stops ends its streams with a `reconnect` event (api.event_stream), and the client
    follows the job on from another connection. Here the job's first connection answers only that event, as a
    stopping replica does; the page must keep the job's card as it was and follow it again."""
    settings = ApiSettings(
        api_keys=(("alice", KEY),),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        accept_unserved_models=True,
    )
    app = create_app({"API_SETTINGS": settings})
    client = app.test_client()
    body = {"prompt": "a green square", "num_inference_steps": 8, "height": 64, "width": 64}
    job_id = client.post("/v1/jobs", json=body, headers=auth()).json["job_id"]  # no worker: it stays queued
    connections: list[float] = []

    def stopping_once(environ, start_response):
        if environ["PATH_INFO"] == f"/v1/jobs/{job_id}/events":
            connections.append(time.monotonic())
            if len(connections) == 1:
                start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store")])
                reason = "this API process is shutting down: reconnect (with Last-Event-ID) to follow the job on"
                data = json.dumps({"job_id": job_id, "reason": reason})
                return [f"retry: 500\nevent: reconnect\ndata: {data}\n\n".encode()]
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, stopping_once, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    card = f"li.job[data-job-id='{job_id}']"
    try:
        browser.get(f"http://127.0.0.1:{server.server_port}/")
        browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.ENTER)
        wait_until(lambda: len(connections) >= 2, 30, "the page to follow the job again", seen=lambda: connections)
        assert text_of(browser, f"{card} .prompt") == "a green square", "the card as it was, not one of the event"
        assert "queued" in text_of(browser, f"{card} .state")
        errors = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
    finally:
        server.shutdown()


@pytest.mark.browser
def test_the_page_attaches_several_images_in_order_for_a_model_that_reads_a_list(browser, redis_url, tmp_path):
    """The page against the API in this process; heartbeats say which models are served and what they take."""
    settings = ApiSettings(
        api_keys=(("alice", KEY),),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
    )
    app = create_app({"API_SETTINGS": settings})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = app.extensions["stepwise.job_store"]
    for model, family in (("builtin:tiny", "sd"), ("builtin:tiny-flux2", "flux2")):
        limits, defaults = family_limits(family), family_defaults(family)
        store.beat(Heartbeat(f"w-{model}", model, generate_queue(model), family, 4, time.time(), True, False,
                             defaults=defaults, limits=limits))  # fmt: skip
    files = []
    for index, colour in enumerate([(200, 40, 40), (40, 200, 40)]):
        files.append(tmp_path / f"image-{index}.png")
        Image.new("RGB", (96, 64), colour).save(files[-1])
    try:
        browser.get(f"http://127.0.0.1:{server.server_port}/")
        browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.ENTER)
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
    finally:
        server.shutdown()


@pytest.mark.browser
@pytest.mark.workers
def test_a_job_from_the_page_streams_its_progress_then_opens_full_size_and_the_list_pages_and_cancels(
    api, worker, browser, tmp_path, http
):
    """Also: sizes from GET /v1/models and a typed one, the zoomed full-size view, "Reuse seed", a prompt's
    warning and "Delete" on a job's card."""
    browser.get(f"{api.url}/")
    key_field = browser.find_element(By.ID, "api-key")
    key_field.send_keys(KEY, Keys.ENTER)  # the keyboard alone: Enter submits the key form
    wait_until(lambda: "accepted" in browser.find_element(By.ID, "key-status").text, 15, "the key to be accepted")
    assert browser.execute_script("return localStorage.getItem('stepwise.apiKey')") == KEY
    assert KEY not in browser.current_url

    # the model list comes from GET /v1/models, with the model's recommended sizes, and any other may be typed
    wait_until(
        lambda: script(browser, "return document.querySelector('#model').value") == "builtin:tiny",
        60,
        "the model list",
        seen=lambda: browser.find_element(By.ID, "engine-panel").text,
    )
    browser.set_window_size(1280, 1000)  # a laptop: every select shows its longest choice whole
    wait_until(lambda: browser.execute_script("return window.innerWidth") <= 1280, 10, "the 1280 px window")
    assert script(browser, CUT_OFF_SELECTS) == []
    served = http.get(f"{api.url}/v1/models", headers=auth(), timeout=10).json()["models"]
    recommended = next(model for model in served if model["model"] == "builtin:tiny")["sizes"]
    sizes = script(browser, "return [...document.querySelectorAll('#size option')].map(o => o.value)")
    assert sizes == [f"{size}x{size}" for size in recommended] + ["other"]
    assert not browser.find_element(By.ID, "width").is_displayed()
    Select(browser.find_element(By.ID, "size")).select_by_value("other")
    for field, value in (("width", "96"), ("height", "64")):
        wait_until(lambda field=field: browser.find_element(By.ID, field).is_displayed(), 15, f"the {field} field")
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    # a typed size past the model's advertised pixel limit is refused on the page, naming that limit
    max_pixels = next(model for model in served if model["model"] == "builtin:tiny")["limits"]["max_pixels"]
    browser.find_element(By.ID, "width").send_keys("0")  # 960 x 64 fits
    assert script(browser, "return document.querySelector('#width').validationMessage") == ""
    browser.find_element(By.ID, "height").send_keys("0")  # 960 x 640 does not (the CPU limit: 512 x 512)
    message = script(browser, "return document.querySelector('#height').validationMessage")
    assert message == f"width × height = 614400 is over this model's limit of {max_pixels} pixels"
    for field, value in (("width", "96"), ("height", "64")):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    assert script(browser, "return document.querySelector('#height').validationMessage") == ""

    # an upload the API refuses: the message says why; the next submit's message replaces it
    (tmp_path / "not-an-image.png").write_text("plain text")
    browser.find_element(By.ID, "init-image").send_keys(str(tmp_path / "not-an-image.png"))
    browser.find_element(By.ID, "submit-job").click()
    wait_until(lambda: "Not submitted" in browser.find_element(By.ID, "job-status").text, 15, "the upload error")
    assert "file" in browser.find_element(By.ID, "job-status").text

    Image.new("RGB", (160, 160), (30, 60, 200)).save(tmp_path / "start.png")  # scaled and cropped to the size
    browser.find_element(By.ID, "init-image").send_keys(str(tmp_path / "start.png"))
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("a red circle on a blue background")
    browser.find_element(By.ID, "negative-prompt").send_keys("blurry")
    Select(browser.find_element(By.ID, "sampler")).select_by_value("euler_ancestral")
    # 100 steps (80 from the image, at strength 0.8), one row each (guidance 1): a second or two idle, so the
    # stream (progress every 0.5 s) is seen mid-job; minutes when other work loads the machine
    steps = browser.find_element(By.ID, "steps")
    steps.clear()
    steps.send_keys("100")
    guidance = browser.find_element(By.ID, "guidance")
    guidance.clear()
    guidance.send_keys("1")
    browser.find_element(By.ID, "seed").send_keys("5")
    # the live previews the page shows (the "Live previews" box is ticked by default) are recorded as they come:
    # the job's card, and its preview with it, is replaced when the job ends
    script(
        browser,
        "window.previewsShown = [];"
        "new MutationObserver(() => document.querySelectorAll('img.preview').forEach(img => {"
        "  if (img.src && !window.previewsShown.includes(img.src)) window.previewsShown.push(img.src); }))"
        ".observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['src']});",
    )
    prompt.send_keys(Keys.ENTER)

    status = wait_until(
        lambda: re.search(r"Submitted job (\S+) ", browser.find_element(By.ID, "job-status").text),
        30,
        "the page to say the job was submitted",
    )
    job_id = status.group(1)
    assert "Not submitted" not in browser.find_element(By.ID, "job-status").text
    job = http.get(f"{api.url}/v1/jobs/{job_id}", headers=auth(), timeout=10).json()
    assert job["params"]["negative_prompt"] == "blurry" and job["params"]["sampler"] == "euler_ancestral"
    assert job["params"]["init_image"].startswith("upl_") and job["progress"]["total"] == 80
    assert (job["params"]["width"], job["params"]["height"]) == (96, 64)  # the typed size

    card = f"li.job[data-job-id='{job_id}']"
    mid_job = wait_until(
        lambda: script(
            browser,
            "const bar = document.querySelector(arguments[0] + ' progress');"
            "return bar && bar.value > 0 && bar.value < bar.max ? [bar.value, bar.max] : null;",
            card,
        ),
        120,
        "the job's progress bar (fed by its event stream) to show a step between the first and the last",
    )
    assert mid_job[1] == 80
    image_src = wait_until(
        lambda: script(
            browser,
            "const img = document.querySelector(arguments[0] + ' .thumbs button img');"
            "return img && img.complete && img.naturalWidth > 0 ? img.src : null;",
            card,
        ),
        240,  # idle: seconds; a machine loaded by other work made the tiny model's steps 100x slower
        "the job's image",
        seen=lambda: (
            f"{browser.find_element(By.CSS_SELECTOR, card).text}; the API says "
            f"{http.get(f'{api.url}/v1/jobs/{job_id}', headers=auth(), timeout=10).json()['progress']}"
        ),
    )
    assert image_src.startswith("blob:")  # fetched with the key in a header, not put in the URL
    previews = script(browser, "return window.previewsShown")
    assert previews and all(src.startswith("data:image/jpeg;base64,") for src in previews), previews[:1]
    shown = text_of(browser, card)  # read in one go: the card is replaced as the job's events arrive
    assert "succeeded" in shown and "not: blurry" in shown

    script(browser, "document.querySelector(arguments[0] + ' .thumbs button').click()", card)  # the card as it is now
    full = wait_until(
        lambda: script(
            browser,
            "const d = document.querySelector('#viewer'), img = document.querySelector('#viewer-image'),"
            " a = document.querySelector('#viewer-download');"
            "return d.open && img.naturalWidth && img.classList.contains('zoomed') ? [img.naturalWidth, a.href,"
            " a.download, img.getBoundingClientRect().width, getComputedStyle(img).imageRendering] : null;",
        ),
        30,
        "the full-size image, zoomed",
    )
    # the card may be drawn anew (and fetch its image to a new blob URL) between the two reads: a blob either way
    assert full[0] == 96 and full[1].startswith("blob:") and full[2] == f"stepwise-{job_id}-1.png"
    zoom = full[3] / full[0]
    assert zoom == int(zoom) and zoom >= 4 and full[4] == "pixelated", full  # whole pixels, sharp, filling the view
    browser.save_screenshot(str(tmp_path / "page-viewer.png"))
    browser.find_element(By.ID, "viewer-close").click()

    # "Reuse seed" puts the job's settings and seed back in the form
    for field in ("prompt", "negative-prompt", "seed", "steps", "guidance"):
        browser.find_element(By.ID, field).clear()
    script(browser, "document.querySelector(arguments[0] + ' button.reuse').click()", card)
    form = script(
        browser,
        "return ['prompt', 'negative-prompt', 'seed', 'steps', 'guidance', 'sampler', 'size', 'width', 'height']"
        ".map(id => document.getElementById(id).value)",
    )
    assert form == [
        "a red circle on a blue background",
        "blurry",
        "5",
        "100",
        "1",
        "euler_ancestral",
        "other",
        "96",
        "64",
    ]
    assert browser.find_element(By.ID, "width").is_displayed()

    # eight newer jobs for a model no worker serves (they stay queued): the job is on the second page
    queued = [{"prompt": f"waiting {i}", "model": "builtin:small", "num_inference_steps": 2} for i in range(8)]
    batch = http.post(f"{api.url}/v1/jobs/batch", json={"jobs": queued}, headers=auth(), timeout=30).json()
    assert batch["num_accepted"] == 8
    browser.refresh()
    newest = batch["results"][-1]["job"]["job_id"]
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f"li.job[data-job-id='{newest}']"), 20, "the new jobs")
    assert not browser.find_elements(By.CSS_SELECTOR, card)
    wait_until(lambda: browser.find_element(By.ID, "older-jobs").is_enabled(), 20, "an older page")
    browser.find_element(By.ID, "older-jobs").click()
    wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, card),
        20,
        "the job on the older page",
        seen=lambda: page_state(browser),
    )
    browser.find_element(By.ID, "newer-jobs").click()
    queued_card = f"li.job[data-job-id='{newest}']"
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f"{queued_card} button.cancel"), 20, "a cancel button")
    script(browser, "document.querySelector(arguments[0] + ' button.cancel').click()", queued_card)
    wait_until(  # its event stream delivers the end state, which replaces the card
        lambda: "canceled" in text_of(browser, f"{queued_card} .state"),
        20,
        "the canceled job's card",
    )
    # a job the page follows, deleted elsewhere: its stream's error event ends it, and the page does not follow it
    # again (that would get 404s, which the browser logs: checked below), its card going at the next reread
    queued_ids = [result["job"]["job_id"] for result in batch["results"][:-1]]
    followed = wait_until(lambda: set(queued_ids) & set(script(browser, "return [...streams.keys()]")), 20, "a stream")
    followed = followed.pop()
    assert http.delete(f"{api.url}/v1/jobs/{followed}", headers=auth(), timeout=10).status_code == 204
    gone = f"li.job[data-job-id='{followed}']"
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, gone), 20, "the job deleted elsewhere to go")
    for job_id in queued_ids:  # leave nothing queued behind
        http.post(f"{api.url}/v1/jobs/{job_id}/cancel", headers=auth(), timeout=10)

    # a prompt builtin:shapes does not know is accepted, and its card says so; "Delete" removes the job
    unknown = {"prompt": "a watercolor of a fox", "model": "builtin:shapes", "num_inference_steps": 2}
    shapes_job = http.post(f"{api.url}/v1/jobs", json=unknown, headers=auth(), timeout=10).json()  # no worker: queued
    shapes_card = f"li.job[data-job-id='{shapes_job['job_id']}']"
    warning = wait_until(lambda: text_of(browser, f"{shapes_card} .warning"), 60, "the job's warning")  # next reread
    assert "outside what builtin:shapes knows" in warning and "a <colour> <shape>" in warning
    script(browser, "document.querySelector(arguments[0] + ' button.delete').click()", shapes_card)
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, shapes_card), 60, "the deleted job's card to go")
    assert "Deleted job" in browser.find_element(By.ID, "job-status").text
    gone = http.get(f"{api.url}/v1/jobs/{shapes_job['job_id']}", headers=auth(), timeout=10)
    assert gone.status_code == 404, gone.text
    engine_text = browser.find_element(By.ID, "engine-panel").text
    assert "steps/s" in engine_text
    browser.save_screenshot(str(tmp_path / "page-desktop.png"))

    browser.set_window_size(390, 844)  # a phone: nothing may need sideways scrolling
    wait_until(lambda: browser.execute_script("return window.innerWidth") <= 400, 10, "the phone-sized window")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.save_screenshot(str(tmp_path / "page-phone.png"))
    assert (tmp_path / "page-desktop.png").stat().st_size > 0 and (tmp_path / "page-phone.png").stat().st_size > 0

    errors = [
        entry["message"]
        for entry in browser.get_log("browser")
        if entry["level"] == "SEVERE" and "/v1/uploads" not in entry["message"]
    ]  # the refused upload's 422 is logged by the browser
    assert errors == []


@pytest.mark.browser
def test_a_video_jobs_card_plays_its_mp4(browser, redis_url, tmp_path):
    """A succeeded video job (the store plays the worker, with an MP4 encoded as the worker encodes one) shows in a
    <video> element that the browser decodes to the video's size."""
    settings = ApiSettings(
        api_keys=(("alice", KEY),),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        accept_unserved_models=True,
    )
    app = create_app({"API_SETTINGS": settings})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store, images = app.extensions["stepwise.job_store"], app.extensions["stepwise.image_store"]
    body = {"model": "builtin:tiny-wan", "prompt": "a red circle", "num_frames": 9, "height": 64, "width": 96}
    job_id = app.test_client().post("/v1/jobs", json=body, headers=auth()).json["job_id"]
    holder = take_job(store, job_id, "fake-worker").holder
    key = images.key_for(job_id, 0, "mp4")
    frames = [Image.new("RGB", (96, 64), (30 * index, 80, 160)) for index in range(9)]
    images.put_image(key, encode_video(frames, "mp4", fps=16), {"job_id": job_id})
    store.finish(job_id, JobState.SUCCEEDED, holder=holder, image_keys=[key])
    try:
        browser.get(f"http://127.0.0.1:{server.server_port}/")
        browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.ENTER)
        video = f"li.job[data-job-id='{job_id}'] video"
        size = wait_until(
            lambda: script(
                browser,
                "const v = document.querySelector(arguments[0]); return v && v.readyState >= 1 && [v.videoWidth, "
                "v.videoHeight]",
                video,
            ),
            30,
            "the video job's card to load its MP4",
            seen=lambda: text_of(browser, f"li.job[data-job-id='{job_id}']"),
        )
        assert size == [96, 64]
        assert "9 frames at 16 fps" in text_of(browser, f"li.job[data-job-id='{job_id}']")
    finally:
        server.shutdown()
