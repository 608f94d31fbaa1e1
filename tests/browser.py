"""A real browser for the tests that look at pages as a user does: Debian's headless Chromium through selenium."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")

needs_chromium = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="Debian's chromium and chromium-driver are not installed (scripts/test.sh installs them as root)",
)


def headless_chromium(logs: bool = False, eager: bool = False):
    """A headless Chromium; with `logs`, it keeps the console and the network log for a failure's report; `eager`: a
    page counts as opened once its document is parsed (for open_until, which then waits for the text a user reads)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,2000"):
        options.add_argument(arg)
    options.binary_location = str(CHROMIUM)
    # in 4 of 5 suites a first load of the Prefect UI hung past PAGE_LOAD_S (125-199 s for a test that takes 5 s)
    # and showed its text only when loaded again: not waiting for every subresource, and retrying sooner
    if eager:
        options.page_load_strategy = "eager"
    if logs:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    browser.set_page_load_timeout(PAGE_LOAD_S)
    return browser


# below the driver's own HTTP timeout (120 s): a Prefect UI page that took longer to load on a busy core raised a bare
# TimeoutError past open_until's retries; now it is selenium's TimeoutException, and its text is waited for
PAGE_LOAD_S = 45


def page_text(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.TAG_NAME, "body").text


def open_until(browser, url: str, text: str, wait_s: float = 45, tries: int = 4) -> str:
    """Load `url` until `text` shows in the page, loading it again when it does not within `wait_s` (on a loaded
    machine, the Prefect UI can stay on an empty page when one of its API calls timed out); the page's text. Each load
    that did not show it is described (the server asked without the browser, the browser's console, its requests
    that never finished or failed): in the failure, or in a warning when a later load showed the text."""
    import warnings

    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    missed = []
    for attempt in range(1, tries + 1):
        started = time.monotonic()
        try:
            browser.get(url)
        except TimeoutException:
            pass  # still loading on a loaded machine: its text may yet show, waited for below
        try:
            WebDriverWait(browser, wait_s).until(lambda b: text in page_text(b))
        except TimeoutException:
            missed.append(
                f"load {attempt} ({time.monotonic() - started:.0f} s): the page said {page_text(browser)[:200]!r}; "
                f"the server, asked without the browser: {server_probe(url)}; the browser's console: "
                f"{console_log(browser)}; its requests unanswered or failed: {unfinished_requests(browser)}"
            )
            continue
        if missed:
            warnings.warn(f"{text!r} showed at {url} on load {attempt} only: " + " | ".join(missed), stacklevel=2)
        return page_text(browser)
    raise AssertionError(f"{text!r} did not show at {url} in {tries} loads: " + " | ".join(missed))


def unfinished_requests(browser) -> str:
    """The requests of the browser's performance log (headless_chromium(logs=True)) since it was last read that got no
    answer, or an error: which of a page's scripts or API calls it was waiting for."""
    try:
        entries = browser.get_log("performance")
    except Exception as err:
        return f"not kept ({type(err).__name__})"
    pending, failed = request_outcomes(entries)
    return repr({"pending": pending[-10:], "failed": failed[-10:]})


def request_outcomes(performance_log: list[dict]) -> tuple[list[str], list[str]]:
    """From chromium's performance (DevTools) log: the requests that got no answer yet (their URLs), and those that
    failed or were answered with an error status ("METHOD URL: why")."""
    import json

    urls, done, failed = {}, set(), []
    for entry in performance_log:
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = f"{params['request']['method']} {params['request']['url']}"
        elif message["method"] == "Network.responseReceived" and params["response"]["status"] >= 400:
            failed.append(f"{urls.get(params['requestId'], '?')}: {params['response']['status']}")
        elif message["method"] == "Network.loadingFinished":
            done.add(params["requestId"])
        elif message["method"] == "Network.loadingFailed":
            failed.append(f"{urls.get(params['requestId'], '?')}: {params.get('errorText')}")
            done.add(params["requestId"])
    return [url for request, url in urls.items() if request not in done], failed


def server_probe(url: str) -> str:
    """How the page's server answers the page itself and its API's health check now, each with its time: tells a
    server that stopped answering from a page that its browser could not render."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    said = []
    for probe in (url, f"{parts.scheme}://{parts.netloc}/api/health"):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(probe, timeout=20) as answer:
                outcome = f"{answer.status}, {len(answer.read())} bytes"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        said.append(f"{probe} -> {outcome} in {time.monotonic() - started:.1f} s")
    return "; ".join(said)


def console_log(browser) -> str:
    """The browser's console messages, where it keeps them (headless_chromium(logs=True))."""
    try:
        return repr([entry.get("message", "")[:300] for entry in browser.get_log("browser")][-10:])
    except Exception as err:
        return f"not kept ({type(err).__name__})"
