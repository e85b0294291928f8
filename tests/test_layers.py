"""The imports of `pefusion/data` point one way: no module imports, at run time, inside a
function or under `TYPE_CHECKING`, a module that imports it back, directly or through others. Read from the
source with `ast`, so a type-only import counts like any other."""
from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = "pefusion.data"


def data_imports() -> dict[str, set[str]]:
    """module -> the modules of `pefusion.data` it imports anywhere in its source."""
    folder = REPO / "pefusion" / "data"
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from pefusion.data import readers` imports the module readers
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            found |= {t.rsplit(".", 1)[-1] for t in targets
                      if t.startswith(PACKAGE + ".") and t.rsplit(".", 1)[-1] in modules}
        graph[name] = found - {name}
    return graph


def a_circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (its modules in order, the first repeated at the end), or []."""
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str]:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return [*path[path.index(target):], target]
            if target not in state:
                circle = visit(target, [*path, target])
                if circle:
                    return circle
        state[name] = "done"
        return []

    for start in sorted(graph):
        if start not in state:
            circle = visit(start, [start])
            if circle:
                return circle
    return []


def test_the_modules_of_pefusion_data_import_one_way():
    graph = data_imports()
    assert graph["corpus"] >= {"cache", "config", "sources"}  # the parse sees imports at all
    circle = a_circle(graph)
    assert not circle, " -> ".join(circle)


def test_a_circle_is_found_through_a_type_only_import():
    """The rule's own check, on the shape the issue found: a back edge under TYPE_CHECKING."""
    assert a_circle({"config": {"sources"}, "sources": {"readers", "config"}, "readers": set()}) == \
        ["config", "sources", "config"]
    assert a_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert a_circle({"a": {"b"}, "b": set()}) == []


# --- the layers of the library: recording, the engine, the studies, the command lines ---------------------------

STUDIES = ("pefusion.data", "pefusion.fusion", "pefusion.student")
# package (or folder) -> the packages none of its modules may import, anywhere in their source
FORBIDDEN = {
    "pefusion/tracking": (*STUDIES, "pefusion.sweep", "pefusion.analysis", "pefusion.cli"),
    "pefusion/sweep": (*STUDIES, "pefusion.analysis", "pefusion.cli"),
    # the analysis reads MLflow (`pefusion.tracking.store`); the sweep's writes are not its
    "pefusion/analysis": ("pefusion.cli", "pefusion.tracking.recorder", "pefusion.tracking.writer",
                          "pefusion.tracking.callbacks"),
    "pefusion/fusion": ("pefusion.cli",),
    "pefusion/student": ("pefusion.cli",),
    "pefusion/data": ("pefusion.cli",),
    # a benchmark is a command line (it may share the flags' helpers), but a study's sweep is the study's own
    "benchmarks": ("pefusion.cli.fusion", "pefusion.cli.student", "pefusion.cli.commands"),
}


def imported(path) -> set[str]:
    """Every module `path` imports, anywhere in its source (inside functions and under TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def layer_breaches(root) -> list[str]:
    """`file: module` for each import under `root` that FORBIDDEN rules out."""
    breaches = []
    for folder, banned in FORBIDDEN.items():
        for path in sorted((root / folder).rglob("*.py")):
            for module in sorted(imported(path)):
                if any(module == b or module.startswith(b + ".") for b in banned):
                    breaches.append(f"{path.relative_to(root)}: {module}")
    return breaches


def test_recording_the_engine_and_the_studies_import_no_layer_above_them():
    assert imported(REPO / "pefusion" / "sweep" / "driver.py") >= {"pefusion.tracking.recorder"}  # the parse works
    assert layer_breaches(REPO) == []


def test_a_breach_is_found_inside_a_function(tmp_path):
    """The rule's own check: a study's import made lazily, inside a function of the engine."""
    (tmp_path / "pefusion" / "sweep").mkdir(parents=True)
    (tmp_path / "pefusion" / "sweep" / "engine.py").write_text(
        "def folder():\n    from pefusion.data.cache import cache_root\n    return cache_root\n")
    assert layer_breaches(tmp_path) == ["pefusion/sweep/engine.py: pefusion.data.cache",
                                        "pefusion/sweep/engine.py: pefusion.data.cache.cache_root"]
