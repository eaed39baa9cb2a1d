"""Names a package exports but imports on first use (PEP 562), so importing the package, or a
light module inside it, does not import the heavy modules behind those names.

    __getattr__, __dir__ = lazy_exports(__name__, globals(), {"LLM": "localpaged.engine.llm"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, namespace: dict,
                 exports: dict[str, str]) -> tuple[Callable, Callable]:
    """`__getattr__` and `__dir__` for `package`: `exports` maps a name to the module it comes
    from; a name, once imported, stays in the package's `namespace`."""
    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
