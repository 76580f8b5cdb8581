"""Driving the web page (`GET /`, api/static) in headless Chromium: the browser, reading the page, and the API in
the test's own process served over loopback HTTP, where a test plays the worker through the store."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from werkzeug.serving import make_server

from api import create_app
from api.settings import ApiSettings
from storage.settings import StorageSettings
from tests.support import tiers
from tests.support.processes import TENANT_KEYS
from tests.support.waiting import wait_for

KEY = TENANT_KEYS["alice"]


def headless_chromium() -> Iterator[webdriver.Chrome]:
    """The `browser` fixture's body: Chromium without a window, its console kept for the tests to read."""
    tiers.require(tiers.BROWSER, "Chromium")
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("chromium and chromedriver are needed: `make chromium` or apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
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
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def page_app(redis_url: str, folder: Path, accept_unserved_models: bool = True) -> Flask:
    """The API with alice's key, its images in `folder`: no worker, so a test plays one through the store."""
    storage = StorageSettings(redis_url=redis_url, storage_url=(folder / "images").as_uri())
    settings = ApiSettings(api_keys=(("alice", KEY),), storage=storage, accept_unserved_models=accept_unserved_models)
    return create_app({"API_SETTINGS": settings})


@contextlib.contextmanager
def serving(wsgi_app) -> Iterator[str]:
    """`wsgi_app` over HTTP on a free loopback port, on threads of this process; yields its base URL."""
    server = make_server("127.0.0.1", 0, wsgi_app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def open_page(browser, base_url: str) -> None:
    """The page at `base_url`, with alice's key typed and sent with Enter."""
    browser.get(f"{base_url}/")
    browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.ENTER)


def wait_until(condition, timeout: float, what: str, seen=lambda: ""):
    """`wait_for` on the page: a condition the browser cannot answer yet (WebDriverException) has not held."""

    def holds():
        try:
            return condition()
        except WebDriverException:
            return None

    return wait_for(holds, timeout, lambda: f"{what}; the page shows: {seen()}", interval=0.05)


def script(browser, code: str, *args):
    return browser.execute_script(code, *args)


def text_of(browser, selector: str) -> str:
    return script(browser, "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", selector)


def page_state(browser) -> str:
    status = browser.find_element(By.ID, "job-status").text
    paging = script(browser, "return [cursors.length, document.querySelector('#older-jobs').dataset.cursor]")
    return f"status {status!r}, pages {paging}, console {browser.get_log('browser')}"


def console_errors(browser) -> list[str]:
    """What the browser logged as errors (a failed request included)."""
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
