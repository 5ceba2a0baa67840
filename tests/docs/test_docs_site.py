"""The documentation site: built strictly, complete, failing on a broken link, and rendered by a real browser.

Slow tier: each strict build takes seconds and the browser check starts headless Chromium (Debian's ``chromium``).
Needs the ``docs`` extra and Debian's ``libjs-katex``, which ``.ci/run`` installs; without them these tests skip,
naming what to install.
"""

from __future__ import annotations

import functools
import http.server
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
# What a build reads besides docs/: the pages generated from top-level files, and the package for the API pages.
BUILD_INPUTS = ("mkdocs.yml", "docs", "README.md", "REPRODUCTION.md", "PROTOCOL.md", "ARCHITECTURE.md")
API_PAGES = {
    "lightning_fed": "lightning_fed",
    "lightning_fed.callbacks": "callbacks",
    "lightning_fed.aggregators": "aggregators",
    "lightning_fed.attacks": "attacks",
    "lightning_fed.datamodules": "datamodules",
    "lightning_fed.models": "models",
}
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason='the docs extra is not installed: pip install -e ".[docs]"')
    if not Path(os.environ.get("KATEX_DIR", "/usr/share/javascript/katex")).is_dir():
        pytest.skip("KaTeX is not installed: apt-get install libjs-katex")
    env = {**os.environ, "PYTHONPATH": str(root), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build(ROOT, out)
    assert result.returncode == 0, result.stderr
    return out


def test_the_api_reference_has_every_public_class_of_the_package_and_the_algorithm_packages(site):
    for package, page in API_PAGES.items():
        html = (site / "api" / page / "index.html").read_text()
        module = importlib.import_module(package)
        classes = [name for name in module.__all__ if inspect.isclass(getattr(module, name))]
        assert classes
        missing = [name for name in classes if f'id="{package}.{name}"' not in html]
        assert not missing, f"api/{page}.md renders no entry for {missing}"


def test_the_docstrings_math_becomes_katex_input(site):
    html = (site / "api" / "aggregators" / "index.html").read_text()
    assert '<span class="arithmatex">' in html and '<div class="arithmatex">' in html
    assert ":math:`" not in html and ".. math::" not in html


def _copy_sources(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in BUILD_INPUTS:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name)
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, root / name)
    (root / "configs" / "tuned_v2").mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "tuned_v2" / "TUNING.md", root / "configs" / "tuned_v2" / "TUNING.md")
    (root / "lightning_fed").symlink_to(ROOT / "lightning_fed")
    return root


@pytest.mark.parametrize(
    ("page", "broken", "reported"),
    [
        ("docs/data.md", "\nSee [the old page](partitions.md).\n", "partitions.md"),
        ("docs/data.md", "\nSee [labels](resume.md#labels).\n", "#labels"),
        ("docs/algorithms/client-drift.md", "\nAPI: [`FedProxy`][lightning_fed.callbacks.FedProxy].\n", "FedProxy"),
        ("README.md", "", "commands"),  # the commands section that "Get started" includes
    ],
    ids=["missing page", "missing anchor", "missing API object", "missing README section"],
)
def test_a_broken_reference_fails_the_strict_build(tmp_path, page, broken, reported):
    root = _copy_sources(tmp_path)
    path = root / page
    if broken:
        path.write_text(path.read_text() + broken)
    else:
        path.write_text(path.read_text().replace("[start:commands]", "[start:install]"))
    result = build(root, tmp_path / "site")
    assert result.returncode != 0
    assert reported in result.stderr + result.stdout


def _serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _chromium(args: list[str], profile: Path) -> str:
    binary = shutil.which("chromium") or pytest.skip("Chromium is not installed: apt-get install chromium")
    result = subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.parametrize(
    ("path", "title"),
    [("", "lightning_fed"), ("algorithms/client-drift/", "Client drift and fairness")],
    ids=["home", "algorithm page"],
)
def test_headless_chromium_renders_title_navigation_and_math(site, tmp_path, path, title):
    server, url = _serve(site)
    try:
        dom = _chromium(["--dump-dom", url + path], tmp_path / "profile")
        screenshot = tmp_path / "page.png"
        _chromium([f"--screenshot={screenshot}", "--window-size=1280,900", url + path], tmp_path / "profile-shot")
    finally:
        server.shutdown()
    assert f"<title>{title}" in dom
    assert 'class="md-nav' in dom and ">Get started<" in dom.replace("\n", "").replace("  ", "")
    # KaTeX ran in the browser: arithmatex's TeX became KaTeX's MathML and HTML (served by the site, offline).
    assert 'class="katex"' in dom and "<math" in dom
    assert screenshot.stat().st_size > 10_000
