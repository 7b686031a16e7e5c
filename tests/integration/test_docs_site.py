"""The site as a reader gets it: built strictly with nothing fetched, then opened in a real browser.

The build is MkDocs' own `--strict` (a broken link, a missing anchor, a page outside the navigation,
an unresolved docstring reference fail it). The browser test opens pages of the built site from
disk in headless Chromium (Debian's chromium and chromium-driver, driven by selenium) and checks
that every image loaded and that no page logged an error to its console; it skips, saying why,
where no Chromium is installed. With MPI_SGD_DOCS_SHOTS=DIR (make docs-shots) it also saves a
screenshot of each page there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pages import DOCS, ROOT

pytestmark = pytest.mark.timeout(600)
# The home page, one Learn page, one Measured page, and the page whose picture the build draws.
PAGES = ("index.html", "learn/04-ring-allreduce.html", "measured/allreduce.html", "contributing/architecture.html")


def newest_source() -> float:
    """When a page's source last changed. Not compiled files: a test importing a docs hook writes
    its __pycache__ after make docs built the site, and that changes no page."""
    sources = [ROOT / "mkdocs.yml", *DOCS.rglob("*"), *(ROOT / "mpi_sgd").rglob("*.py"), *(ROOT / "examples").glob("*")]
    return max(p.stat().st_mtime for p in sources if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site: make docs's own (make test builds it first) if newer than every source, else built here."""
    built = ROOT / "site" / "index.html"
    if built.exists() and built.stat().st_mtime > newest_source():
        return built.parent
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.skip("MkDocs is not installed: make docs installs the docs extra")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    return out


def test_the_site_builds_strictly_with_every_page(site):
    for page in DOCS.rglob("*.md"):
        if "hooks" not in page.parts:
            assert (site / page.relative_to(DOCS).with_suffix(".html")).exists(), page
    assert (site / "contributing" / "floors.svg").read_text().startswith("<svg")
    reference = (site / "reference" / "cli-sync-sgd.html").read_text()
    assert "--bucket-mb" in reference and "--stall-timeout" in reference  # rendered from the real parser


def test_nothing_is_fetched_from_the_network(site):
    # Scripts, styles, images and fonts are loaded by a browser; links (<a href>) are only followed.
    fetched = re.compile(
        r"""<(?:script|img|iframe|source)\b[^>]*\bsrc=["'](https?:)?//|<link\b[^>]*\bhref=["'](https?:)?//"""
    )
    imports = re.compile(r"""@import\s+url\(["']?https?:|url\(["']?https?://[^)]*\.(?:woff2?|ttf|otf)""")
    for path in site.rglob("*"):
        if path.suffix == ".html":
            found = fetched.search(path.read_text())
            assert not found, f"{path.relative_to(site)} loads {found.group(0)!r} from the network"
        elif path.suffix == ".css":
            found = imports.search(path.read_text())
            assert not found, f"{path.relative_to(site)} loads {found.group(0)!r} from the network"
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()


def chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no Chromium here: apt-get install chromium chromium-driver (Debian) to run the browser test")
    pytest.importorskip("selenium", reason="selenium comes with the docs extra (make docs)")
    return browser, driver


@pytest.mark.parametrize("page", PAGES)
def test_browser_shows_the_page_with_every_image_and_no_console_error(site, page):
    browser, driver_path = chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)  # no sandbox: the tests run as root; /dev/shm is shared with other jobs
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get((site / page).as_uri())
        driver.execute_script("return document.readyState")
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth])"
        )
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        if shots := os.environ.get("MPI_SGD_DOCS_SHOTS"):
            Path(shots).mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(Path(shots) / (page.replace("/", "-").removesuffix(".html") + ".png")))
    finally:
        driver.quit()
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    assert not broken, f"{page}: images that did not load: {broken}"
    assert not errors, f"{page}: console errors: {errors}"
    if page.startswith("contributing/"):
        assert any(src.endswith("floors.svg") for src, _, _ in images), images  # the drawn picture is there
