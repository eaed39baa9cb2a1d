"""Paged-attention kernels.

``reference`` holds the plain-torch versions (the CPU path and the ground truth); ``triton_ops``
holds the Triton versions with the same names and signatures. Nothing is imported here so that
the CPU path never needs Triton: import the submodule you want.

This folder is the package ``localpaged.kernels`` (pyproject's package-dir). Where the
repository's root is on sys.path (`python app.py`, `python -m pytest` or `python -c` run from
it) it is also found as a bare ``kernels``, a name that belongs to PyPI's `kernels` (Hugging
Face's kernel hub, which transformers >= 5.25 requires and imports). Imported under that name,
this module loads that package in its own place, so that both are what their importers expect.
Where PyPI's package is not installed (an older transformers), it leaves an empty module in its
place, with neither ``__file__`` nor ``__version__`` (nor a loader): what transformers' availability check reads
as a folder shadowing a package that is not installed, so it neither fails nor uses a hub kernel.
"""

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys
    import types

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _path)
    if _spec is None or _spec.loader is None:
        # The import system hands out what sys.modules holds; find_spec reads its __spec__.
        _empty = types.ModuleType("kernels", "PyPI's kernels is not installed")
        _empty.__spec__ = importlib.machinery.ModuleSpec("kernels", None)
        sys.modules["kernels"] = _empty
    else:
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _module
        _spec.loader.exec_module(_module)
