"""The web page at `GET /`: served by the API itself, and driven in headless Chromium against a live stack
(`stepwise api` over HTTP, a real Celery worker, real Redis). Its cards and its form against the API in the test's
own process: test_web_page_cards.py and test_web_page_form.py."""

from __future__ import annotations

import re

import pytest
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select

from api import create_app
from api.settings import ApiSettings
from tests.support.calls import auth
from tests.support.web_page import KEY, console_errors, page_state, script, text_of, wait_until

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

    errors = [message for message in console_errors(browser) if "/v1/uploads" not in message]
    assert errors == []  # the refused upload's 422, which the browser logs, aside
