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


# What a reader of the repository cannot follow: a citation of a specification that is not in it, a path beside the
# clone, the number of a ticket in someone's tracker, or words about who measured and which session had a machine.
# A measurement says what was run, on what, and when; a fact is stated where it is used or in docs/.
OUTSIDE = {
    "a citation of a specification outside the repository": re.compile(r"\bSPEC\b"),
    "a path beside the clone": re.compile(r"(\.\.|/work)/shared"),
    "a ticket number": re.compile(r"\b[Ii]ssues? ?#?\d+|\bPR ?#\d+"),
    "who measured, or which session had a machine": re.compile(r"\blent\b|\bGPU session\b|\bsession that\b"),
}
SCANNED = ("README.md", "mkdocs.yml", "pyproject.toml", ".ci/run", "docs", "pefusion", "sweeps", "scripts",
           "benchmarks", "tests")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ""}


def _scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = REPO / name
        files += [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()
                                                 and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts]
    return files


def test_nothing_points_outside_the_repository():
    """README, docs/ and the code (library, command lines, benchmarks, tests) hold no reference a reader of the
    repository cannot follow; each hit is listed as file:line."""
    files = _scanned_files()
    assert any(p.name == "theory.md" for p in files) and any(p.suffix == ".py" for p in files)
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            hits += [f"{path.relative_to(REPO)}:{number}: {what}: {line.strip()[:100]}"
                     for what, pattern in OUTSIDE.items() if pattern.search(line)]
    assert not hits, "\n".join(hits)


def _markdown_rows(text: str, header: str) -> dict[str, list[str]]:
    """The rows of the markdown table whose header line starts with `header`: first cell -> the other cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_published_tables_in_the_docs_equal_the_codes():
    """docs/model.md prints the paper's Table 3 and Table 1; the report compares with pefusion.analysis.published."""
    from pefusion.analysis import published as PB

    text = (REPO / "docs" / "model.md").read_text()
    fmt = "{:.2f} ± {:.2f}".format
    table3 = _markdown_rows(text, "| PE | add | concat | gate_scalar | mlp_gate |")
    pes = list(dict.fromkeys(pe for pe, _ in PB.TABLE3_ARXIV.cells))
    assert table3 == {pe: [fmt(*PB.TABLE3_ARXIV.cells[(pe, fu)]) for fu in ("add", "concat", "gate_scalar", "mlp_gate")]
                      for pe in pes}
    table1 = _markdown_rows(text, "| dataset | add | concat | gate |")
    assert table1 == {t.dataset: [fmt(*mean_sd) for mean_sd in t.cells.values()]
                      for t in (PB.TABLE1_AGNEWS, PB.TABLE1_IMDB, PB.TABLE1_ARXIV)}
