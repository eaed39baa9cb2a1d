"""The house rules of the source tree: no import circles, and no import from a layer above.

The layers, lowest first, are tests/helpers/import_graph.py's LAYERS (docs/architecture.md §1 draws them).
"""

from pathlib import Path

from helpers.import_graph import LAYERS, find_cycle, graph, upward_imports

REPO = Path(__file__).resolve().parent.parent


def test_no_import_circle():
    assert find_cycle(graph(REPO)) is None


def test_no_upward_import():
    assert upward_imports(graph(REPO)) == []


def test_kernels_import_nothing_of_the_engine():
    """kernels/ owns the compiled code and its build; it stands on torch alone."""
    edges = graph(REPO)
    outside = {f"{m} -> {d}" for m, deps in edges.items() if m.startswith("localpaged.kernels")
               for d in deps if not d.startswith("localpaged.kernels")}
    assert outside == set()


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_circle_made_on_purpose_is_found(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "",
                      "pkg/core/__init__.py": "",
                      "pkg/core/a.py": "from pkg.core import b\n",
                      "pkg/core/b.py": "def f():\n    from pkg.core.c import g\n",
                      "pkg/core/c.py": "from typing import TYPE_CHECKING\n"
                                       "if TYPE_CHECKING:\n    from pkg.core.a import x\n"})
    cycle = find_cycle(graph(tmp_path, {"pkg": "pkg"}))
    assert cycle is not None and set(cycle) == {"pkg.core.a", "pkg.core.b", "pkg.core.c"}
    assert cycle[0] == cycle[-1]


def test_an_upward_import_made_on_purpose_is_found(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "",
                      "pkg/core/__init__.py": "", "pkg/core/blocks.py": "from ..engine import run\n",
                      "pkg/engine/__init__.py": "", "pkg/engine/run.py": "from pkg.core import blocks\n"})
    edges = graph(tmp_path, {"pkg": "pkg"})
    assert upward_imports(edges, ["pkg.core", "pkg.engine", "pkg"]) == ["pkg.core.blocks -> pkg.engine.run"]


def test_the_layers_name_every_folder():
    """A new folder under localpaged/ takes its place in LAYERS, so the rule covers it."""
    folders = {f"localpaged.{p.name}" for p in (REPO / "localpaged").iterdir()
               if (p / "__init__.py").exists()}
    assert folders <= set(LAYERS)


def test_every_source_folder_is_a_package():
    """pyproject finds the packages under localpaged/ by their __init__.py: a folder of sources
    without one would be left out of a (non-editable) install."""
    folders = {p.parent for p in (REPO / "localpaged").rglob("*.py")}
    assert sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()) == []
