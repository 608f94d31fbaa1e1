"""Refreshes the documentation's pictures from real runs, through the headless chromium the UI tests use:

- docs/assets/report.png: the report.html of a real run of the small ResNet-50 on this machine;
- docs/assets/prefect-form.png: the capacity deployment's "Custom run" form in the Prefect UI of a local stack.

    .venv/bin/python scripts/docs_screenshots.py      (from the repository root; needs Debian's chromium and
                                                       chromium-driver, which scripts/system_packages.sh installs)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "docs" / "assets"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
RUN = ["resnet50", "--size", "small", "--formats", "onnx", "--batch-sizes", "1,2,4,8", "--concurrency", "1,2,4"]


def browser(width: int, height: int) -> webdriver.Chrome:
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.binary_location = str(CHROMIUM)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def screenshot(url: str, size: tuple[int, int], ready, anchor: str, name: str, above_px: int = 0) -> Path:
    """docs/assets/NAME: the page at `url` once `ready(browser)` holds, scrolled to the element at XPath `anchor`
    (`above_px` of what precedes it left in view)."""
    b = browser(*size)
    try:
        b.get(url)
        WebDriverWait(b, 90).until(ready)
        b.execute_script(
            f"arguments[0].scrollIntoView(); window.scrollBy(0, {-above_px});", b.find_element(By.XPATH, anchor)
        )
        path = ASSETS / name
        b.save_screenshot(str(path))
    finally:
        b.quit()
    return path


def report_picture(work: Path) -> Path:
    """The summary and the first plots, rather than the configuration table at the top."""
    tbench = str(Path(sys.executable).with_name("tbench"))
    done = subprocess.run([tbench, "run", *RUN, "--output", str(work)], capture_output=True, text=True, check=True)
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    return screenshot(
        (run_dir / "report.html").as_uri(),
        (1100, 1500),
        lambda d: d.find_elements(By.TAG_NAME, "img"),
        "//h2[contains(., 'Summary')]",
        "report.png",
    )


def form_picture(work: Path) -> Path:
    """The capacity request's own fields, below the benchmark request's."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tbench.team.stack import Stack

    stack = Stack(root=work / "stack", pools=("cpu",)).up()
    try:
        with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
            deployment_id = client.read_deployment_by_name("triton-capacity/capacity-cpu").id
        return screenshot(
            f"{stack.api_url.removesuffix('/api')}/deployments/deployment/{deployment_id}/run",
            (1300, 1100),
            lambda d: "The latency SLO in ms" in d.find_element(By.TAG_NAME, "body").text,
            "//*[contains(text(), 'Slo Ms')]",
            "prefect-form.png",
            above_px=120,
        )
    finally:
        stack.down()


def main() -> int:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        print("needs Debian's chromium and chromium-driver (scripts/system_packages.sh installs them as root)")
        return 2
    ASSETS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tbench-screenshots-") as tmp:
        for path in (report_picture(Path(tmp)), form_picture(Path(tmp))):
            print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
