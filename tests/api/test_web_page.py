"""The web page at `GET /`: served by the API itself, and driven in headless Chromium against a live
stack (`stepwise api` over HTTP, a real Celery worker, real Redis)."""

from __future__ import annotations

import re
import shutil
import time

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select

from api import create_app
from api.settings import ApiSettings
from tests.api.processes import TENANT_KEYS

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
KEY = TENANT_KEYS["alice"]


def test_the_page_and_its_files_are_served_without_a_key_and_load_nothing_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_API_KEYS", "alice:" + KEY)
    monkeypatch.setenv("STEPWISE_STORAGE_URL", tmp_path.as_uri())
    client = create_app({"TESTING": True, "STEPWISE_SETTINGS": ApiSettings.from_env()}).test_client()

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


def wait_until(condition, timeout: float, what: str, seen=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except WebDriverException:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; the page shows: {seen()}")


def test_a_job_submitted_from_the_page_shows_its_progress_then_its_image(api, worker, browser, tmp_path):
    browser.get(f"{api.url}/")
    key_field = browser.find_element(By.ID, "api-key")
    key_field.send_keys(KEY, Keys.ENTER)  # the keyboard alone: Enter submits the key form
    wait_until(lambda: "accepted" in browser.find_element(By.ID, "key-status").text, 15, "the key to be accepted")
    assert browser.execute_script("return localStorage.getItem('stepwise.apiKey')") == KEY
    assert KEY not in browser.current_url

    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("a red circle on a blue background")
    # 200 steps at 256x256 take several seconds on the tiny model even on an idle machine, so the page's
    # once-a-second poll lands mid-job (60 steps at 128x128 could finish between two polls)
    Select(browser.find_element(By.ID, "size")).select_by_value("256")
    steps = browser.find_element(By.ID, "steps")
    steps.clear()
    steps.send_keys("200")
    browser.find_element(By.ID, "seed").send_keys("5")
    prompt.send_keys(Keys.ENTER)

    job_id = wait_until(
        lambda: re.search(r"Submitted job (\S+) ", browser.find_element(By.ID, "job-status").text),
        15,
        "the page to say the job was submitted",
    ).group(1)
    card = f"li.job[data-job-id='{job_id}']"
    mid_job = wait_until(
        lambda: browser.execute_script(
            "const bar = document.querySelector(arguments[0] + ' progress');"
            "return bar && bar.value > 0 && bar.value < bar.max ? [bar.value, bar.max] : null;",
            card,
        ),
        120,
        "the job's progress bar to show a step between the first and the last",
    )
    assert mid_job[1] == 200

    image_src = wait_until(
        lambda: browser.execute_script(
            "const img = document.querySelector(arguments[0] + ' .thumbs img');"
            "return img && img.complete && img.naturalWidth > 0 ? img.src : null;",
            card,
        ),
        120,
        "the job's image",
        seen=lambda: browser.find_element(By.CSS_SELECTOR, card).text,
    )
    assert image_src.startswith("blob:")  # fetched with the key in a header, not put in the URL
    assert browser.find_element(By.CSS_SELECTOR, f"{card} .state").text == "succeeded"
    engine_text = browser.find_element(By.ID, "engine-panel").text
    assert "engine stats unavailable" in engine_text or "steps/s" in engine_text
    browser.save_screenshot(str(tmp_path / "page-desktop.png"))

    browser.set_window_size(390, 844)  # a phone: nothing may need sideways scrolling
    wait_until(lambda: browser.execute_script("return window.innerWidth") <= 400, 10, "the phone-sized window")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.save_screenshot(str(tmp_path / "page-phone.png"))
    assert (tmp_path / "page-desktop.png").stat().st_size > 0 and (tmp_path / "page-phone.png").stat().st_size > 0

    errors = [
        entry["message"]
        for entry in browser.get_log("browser")
        if entry["level"] == "SEVERE" and "/v1/models" not in entry["message"]
    ]  # a 404 there is expected until GET /v1/models exists
    assert errors == []
