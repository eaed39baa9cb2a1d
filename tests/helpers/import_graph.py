"""The project's import graph, read from the source with `ast` (nothing is imported).

Every `import` counts: at module level, inside functions, and under `if TYPE_CHECKING`, since
each is a dependency a reader has to follow. A package's `__init__` is a node of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

# The installed package: top-level folder -> import name.
ROOTS = {"localpaged": "localpaged"}

# The layers, lowest first: a module may import from its own layer and the layers below it.
LAYERS = ["localpaged.kernels", "localpaged.core", "localpaged.models", "localpaged.quant",
          "localpaged.runner", "localpaged.engine", "localpaged.chat", "localpaged.api",
          "localpaged.ui", "localpaged"]   # the last: the package's face and composition root


def modules(repo: Path, roots: dict[str, str] = ROOTS) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under the roots."""
    found = {}
    for folder, package in roots.items():
        for path in sorted((repo / folder).rglob("*.py")):
            parts = list(path.relative_to(repo / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _targets(name: str, path: Path, node: ast.AST, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:                                   # relative: from its own package
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        package = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
        base = f"{package}.{base}" if base else package
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def graph(repo: Path, roots: dict[str, str] = ROOTS) -> dict[str, set[str]]:
    """Module -> the project modules it imports (the longest known prefix of each import)."""
    known = modules(repo, roots)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, path, node, known):
                    while target not in known and "." in target:
                        target = target.rsplit(".", 1)[0]
                    if target in known and target != name:
                        deps.add(target)
        edges[name] = deps
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (a list of modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}                       # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def layer(module: str, layers: list[str] = LAYERS) -> int:
    """The index of the module's layer: its longest matching prefix in `layers`."""
    best = max((p for p in layers if module == p or module.startswith(p + ".")), key=len)
    return layers.index(best)


def upward_imports(edges: dict[str, set[str]], layers: list[str] = LAYERS) -> list[str]:
    """Every import of a module from a layer above its own, as 'importer -> imported'."""
    return [f"{m} -> {d}" for m, deps in sorted(edges.items()) for d in sorted(deps)
            if layer(d, layers) > layer(m, layers)]
