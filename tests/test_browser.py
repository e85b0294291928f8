"""What a person looks at, looked at in a real browser (Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver; nothing downloaded): the demo sweep's HTML report (every image loads, every link resolves,
nothing in the console), `mlflow ui` opened at the link the sweep printed (the page lists the sweep's runs), and
the Ray dashboard of a `ray start --head` cluster still up after a sweep joined it and ended.

Marked `system`: they need the chromium and chromium-driver packages and several minutes; run with
`pytest -m system`. With PEFUSION_SCREENSHOTS=DIR the report's and MLflow's screenshots are kept in DIR (the
docs' images are made so: `PEFUSION_SCREENSHOTS=docs pytest -m system tests/test_browser.py`).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, free_port, start_ray_head, stop_process_group, stop_process_tree, subprocess_env
from pefusion import record as R

pytestmark = [pytest.mark.system, pytest.mark.subprocess_ray]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# A small demo sweep: the demo preset's model and corpus, 2 PEs × 2 fusions × 2 seeds.
DEMO = ["--preset", "demo", "--pe-types", "sinusoidal,learned", "--fusions", "add,concat", "--seeds", "0,1",
        "--num-cpus", "2", "--no-dashboard"]
SCREENSHOT_WIDTH = 1000  # px: the docs' images stay a few hundred KB


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium as root needs no sandbox; no network, no first-run or background traffic, a profile of
    its own; the console's messages are kept (goog:loggingPrefs)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("these tests need Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never look for a browser or driver online
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _run(cwd: Path, script: str, *args: str, env: dict[str, str] | None = None,
         timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd, env=env or subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo sweep and its report, as the README's quick start runs them (in a folder of their own): what the
    sweep printed, the report's path, and the tracking URI."""
    where = tmp_path_factory.mktemp("demo")
    db = f"sqlite:///{where / 'mlflow.db'}"
    sweep = _run(where, "sweeps/arxiv_grid.py", *DEMO, "--tracking-uri", db,
                 "--cache-dir", str(where / "cache"))
    report = _run(where, "scripts/report.py", "--tracking-uri", db)
    page = Path(re.search(r"^report: (.+)$", report.stdout, re.M).group(1).strip())
    link = re.search(r"^MLflow UI: (\S+)", sweep.stdout, re.M).group(1)
    return {"dir": where, "uri": db, "page": page if page.is_absolute() else where / page, "link": link,
            "stdout": sweep.stdout}


def page_problems(driver, url: str, served: dict[str, str] | None = None) -> list[str]:
    """What is wrong with the page at `url` as a browser shows it: images that did not load, links that lead
    nowhere (a `#fragment` without its element, a file that is not there, a local server that does not answer;
    `served` maps a host:port the page names to where the test serves it), and console messages at WARNING or
    above. Links to other sites are not followed (no network here) but must be absolute http(s) URLs."""
    driver.get_log("browser")  # drop what earlier pages left
    driver.get(url)
    problems = []
    broken = driver.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => (i.getAttribute('src') || '').slice(0, 80))")
    problems += [f"image does not load: {src}" for src in broken]
    if not driver.execute_script("return document.images.length"):
        problems.append("no image on the page")
    links = driver.execute_script(
        "return Array.from(document.querySelectorAll('a[href]')).map(a => [a.getAttribute('href'), a.href])")
    for raw, absolute in links:
        parsed = urllib.parse.urlparse(absolute)
        if raw.startswith("#"):
            if not driver.execute_script("return document.getElementById(arguments[0]) !== null", raw[1:]):
                problems.append(f"link to a missing anchor: {raw}")
        elif parsed.scheme == "file":
            if not Path(urllib.parse.unquote(parsed.path)).exists():
                problems.append(f"link to a missing file: {raw}")
        elif parsed.scheme in ("http", "https") and parsed.hostname in ("127.0.0.1", "localhost"):
            where = (served or {}).get(parsed.netloc, parsed.netloc)
            try:
                with urllib.request.urlopen(f"{parsed.scheme}://{where}{parsed.path or '/'}", timeout=30) as r:
                    if r.status != 200:
                        problems.append(f"link answers {r.status}: {raw}")
            except OSError as e:
                problems.append(f"link does not answer ({e}): {raw}")
        elif not (parsed.scheme in ("http", "https") and parsed.netloc):
            problems.append(f"link is no URL: {raw}")
    problems += [f"console {e['level']}: {e['message'][:200]}" for e in driver.get_log("browser")
                 if e["level"] in ("WARNING", "SEVERE")]
    return problems


def _screenshot(driver, name: str, tmp_path: Path) -> Path:
    """A PNG of the window, scaled to SCREENSHOT_WIDTH; in $PEFUSION_SCREENSHOTS when set."""
    from PIL import Image

    folder = Path(os.environ.get("PEFUSION_SCREENSHOTS") or tmp_path)
    raw = tmp_path / f"{name}-raw.png"
    driver.save_screenshot(str(raw))
    image = Image.open(raw)
    image = image.resize((SCREENSHOT_WIDTH, round(image.height * SCREENSHOT_WIDTH / image.width)), Image.LANCZOS)
    path = folder / f"{name}.png"
    image.convert("RGB").quantize(colors=256).save(path, optimize=True)
    return path


@pytest.fixture(scope="module")
def mlflow_ui(demo):
    """`mlflow ui` over the sweep's store as the sweep's line says to start it, on a free port (5000 may be
    taken); returns the port."""
    port = free_port()
    log = open(demo["dir"] / "mlflow_ui.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", demo["uri"],
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=log, start_new_session=True,
                            env=subprocess_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (demo["dir"] / "mlflow_ui.log").read_text()[-3000:]
                assert time.time() < deadline, "mlflow ui did not start"
                time.sleep(0.5)
        yield port
    finally:
        stop_process_group(proc, port)


def test_the_demo_report_in_a_browser_every_image_loads_every_link_resolves_nothing_in_the_console(
        browser, demo, mlflow_ui, tmp_path):
    served = {"127.0.0.1:5000": f"127.0.0.1:{mlflow_ui}"}  # the report's MLflow link names the default port
    page = demo["page"].as_uri()
    assert page_problems(browser, page, served) == []
    assert browser.execute_script("return document.images.length") >= 3  # the report's figures, inline
    links = browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    assert demo["link"] in links  # the report links the sweep's runs at the URL the sweep printed
    _screenshot(browser, "browser_report", tmp_path)

    # The same check fails on the page with one image's source broken.
    html = demo["page"].read_text()
    first = re.search(r"<img[^>]*src=['\"]([^'\"]+)['\"]", html).group(1)
    planted = demo["page"].with_name("planted_broken_image.html")
    planted.write_text(html.replace(first, "figures/no_such_figure.png", 1))
    found = page_problems(browser, planted.as_uri(), served)
    assert any(p.startswith("image does not load: figures/no_such_figure.png") for p in found), found
    assert any(p.startswith("console SEVERE") for p in found), found


def test_mlflow_ui_at_the_printed_link_lists_the_sweeps_runs(browser, demo, mlflow_ui, tmp_path):
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.support.ui import WebDriverWait

    client = MlflowClient(demo["uri"])
    experiment = client.get_experiment_by_name(R.PEFUSION_EXPERIMENT)
    (parent,) = client.search_runs([experiment.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    names = {r.info.run_name for r in client.search_runs(
        [experiment.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")}
    assert len(names) == 8
    printed = demo["link"]
    assert printed.startswith("http://127.0.0.1:5000/") and parent.info.run_id in urllib.parse.unquote(printed)
    browser.get(printed.replace("127.0.0.1:5000", f"127.0.0.1:{mlflow_ui}", 1))
    # MLflow's UI is a React app: the names appear once its requests have answered. It lists the sweep's parent run
    # with its trials nested under it, folded: the "+" beside the parent's name unfolds them, as a user clicks it.
    body = lambda d: d.find_element("tag name", "body").text  # noqa: E731
    WebDriverWait(browser, 120).until(lambda d: parent.info.run_name in body(d) and "matching runs" in body(d))
    assert not any(n in body(browser) for n in names)  # folded
    assert f"{len(names) + 1} matching runs" in body(browser)  # the parent and its trials, no other run
    row = browser.find_element("xpath", f"//a[.//span[text()='{parent.info.run_name}']]/ancestor::*[@role='row'][1]")
    row.find_element("css selector", "button[data-component-id*='runnamecellrenderer']").click()
    WebDriverWait(browser, 60).until(lambda d: all(n in body(d) for n in names))
    _screenshot(browser, "browser_mlflow_runs", tmp_path)


def test_a_sweep_joins_a_running_ray_start_head_and_its_dashboard_is_still_up_after(browser, tmp_path):
    """docs/operations.md's persistent local cluster: `ray start --head` (here on free ports, in a temp dir of its
    own), a sweep with `--address auto` (RAY_ADDRESS names this head, so `auto` cannot find a user's cluster), and
    the dashboard still serving once the sweep has ended. Stopped by its own handle, never `ray stop`."""
    temp_dir = Path(tempfile.mkdtemp(prefix="pfdash-"))  # short: Ray's socket paths must fit in 107 bytes
    port, dashboard = free_port(), free_port()
    env = subprocess_env(RAY_AUTH_MODE="token")
    head = start_ray_head(temp_dir, port, env, "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
                          "--dashboard-port", str(dashboard))
    try:
        db = f"sqlite:///{tmp_path / 'mlflow.db'}"
        sweep = _run(tmp_path, "sweeps/arxiv_grid.py", "--preset", "demo", "--pe-types", "sinusoidal", "--fusions",
                     "add", "--seeds", "0", "--epochs", "1", "--address", "auto", "--tracking-uri", db,
                     "--cache-dir", str(tmp_path / "cache"), env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"})
        assert "1 trial, 1 ok, 0 failed" in sweep.stdout
        assert f"Ray dashboard: http://127.0.0.1:{dashboard}" in sweep.stdout, sweep.stdout[-2000:]
        assert list(temp_dir.glob("session_*/logs/python-core-driver-*.log")), "the sweep ran elsewhere"
        # The sweep has ended; the cluster it joined, and so its dashboard, has not.
        with urllib.request.urlopen(f"http://127.0.0.1:{dashboard}/", timeout=30) as r:
            assert r.status == 200
        browser.get(f"http://127.0.0.1:{dashboard}/")
        assert "Ray" in browser.title, browser.title
    finally:
        stop_process_tree(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
