"""The one rule mapping handler results to Gradio outputs.

Each feature has a components dataclass (its `...UI`) and a values dataclass (its `...Values`)
whose field names are names of components in the UI. `outputs(ui, Values)` lists the components
and `flatten(ui, values)` the values to return, both walking the values' fields in one order, so
adding an output is adding a field (and its component) in the feature's own module; there are
no positional lists or counts to keep in step elsewhere.

A field left at KEEP is not updated (`gr.skip()`). A component field that is a list (the sampling
fields of a tab) takes a list of values of the same length, or KEEP; a list of nested UIs (the
chat tabs of the page) takes a list of nested values (default: one all-KEEP value per UI).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import gradio as gr


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()
"""A value that leaves its component as it is."""


def _walk(ui: Any, values: Any) -> Iterator[tuple[Any, Any]]:
    """(component, value) pairs in output order."""
    for f in dataclasses.fields(values):
        comp, value = getattr(ui, f.name), getattr(values, f.name)
        if not isinstance(comp, list):
            yield comp, value
        elif value is KEEP:
            if any(dataclasses.is_dataclass(c) for c in comp):
                raise TypeError(f"{type(values).__name__}.{f.name}: nested values cannot be "
                                "KEEP (leave the default: one all-KEEP value per UI)")
            yield from ((c, KEEP) for c in comp)
        else:
            if len(value) != len(comp):
                raise ValueError(f"{type(values).__name__}.{f.name}: {len(value)} values for "
                                 f"{len(comp)} components")
            for c, v in zip(comp, value):
                yield from _walk(c, v) if dataclasses.is_dataclass(v) else [(c, v)]


def outputs(ui: Any, values_type: type) -> list:
    """The components a handler returning `values_type` updates, in order."""
    return [c for c, _ in _walk(ui, values_type())]


def flatten(ui: Any, values: Any) -> list:
    """The list Gradio expects for `outputs(ui, type(values))`."""
    return [gr.skip() if v is KEEP else v for _, v in _walk(ui, values)]


def _same(a: Any, b: Any) -> bool:
    """Whether two values would show the same: a component update by its arguments."""
    if isinstance(a, gr.blocks.Block) or isinstance(b, gr.blocks.Block):
        return type(a) is type(b) and a.constructor_args == b.constructor_args
    return type(a) is type(b) and a == b


def changes(before: Any, after: Any) -> Any:
    """`after` with every field that `before` (values of the same type, or None) already set
    to the same value left at KEEP: a stream of updates sends only what changed, so the page
    redraws nothing twice (an unchanged tab label, for one, re-renders the whole tab)."""
    if before is None:
        return after
    return dataclasses.replace(after, **{
        f.name: KEEP for f in dataclasses.fields(after)
        if getattr(after, f.name) is not KEEP and _same(getattr(before, f.name),
                                                        getattr(after, f.name))})
