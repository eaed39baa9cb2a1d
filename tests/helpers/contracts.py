"""Whether a class or an object implements a Protocol's contract as the Protocol states it."""

from __future__ import annotations

import inspect


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def unmet(protocol: type, impl: object) -> list[str]:
    """The members of `protocol` that `impl` (a class, or an object) lacks, or whose methods it
    states with other parameters (names and defaults): empty when it implements them all.
    The Protocol's annotated attributes are set on instances: they are checked only when `impl`
    is an object."""
    cls = impl if isinstance(impl, type) else type(impl)
    names = {n: m for n, m in vars(protocol).items() if not n.startswith("_")}
    if impl is not cls:
        names.update({n: None for n in protocol.__annotations__})
    missing = []
    for name, member in sorted(names.items()):
        if not hasattr(impl, name):
            missing.append(f"{cls.__name__} lacks {name}")
        elif inspect.isfunction(member) and _params(getattr(cls, name)) != _params(member):
            missing.append(f"{cls.__name__}.{name}{inspect.signature(getattr(cls, name))}")
    return missing
