"""The documentation builds as a site with no broken link, and the README's links into it land on real pages and
headings: `mkdocs build --strict` (mkdocs.yml turns missing pages, unknown links and anchors into warnings, which
strict mode makes fatal)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

DOC_LINK = re.compile(r"\]\((docs/[^)#\s]*)(?:#([^)\s]+))?\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    return out


def test_the_docs_build_strictly(site):
    """Every page of the nav is built (a page left out of the nav, a link to a missing page or heading fails the
    build above)."""
    for page in ("model", "cli", "gpus", "operations", "analysis", "student", "theory", "benchmarks", "architecture"):
        assert (site / page / "index.html").is_file(), page


def test_the_readmes_links_into_docs_resolve(site):
    """A link `docs/<page>.md#<anchor>` in README.md names a page of the site and a heading id on it; a link to a
    file under docs/ (a figure) names a file that exists."""
    links = DOC_LINK.findall((REPO / "README.md").read_text())
    assert links, "README.md links to no page of docs/"
    for target, anchor in links:
        assert (REPO / target).exists(), target
        if target.endswith(".md") and anchor:
            page = Path(target).relative_to("docs").with_suffix("")
            html = site / ("index.html" if page.name == "index" else page / "index.html")
            assert f'id="{anchor}"' in html.read_text(), f"{target}#{anchor}: no such heading"
