"""Which layers attend to what: full attention or a sliding window, grouped for the KV cache.

A model's layers split into KV-cache groups by the window they attend over (vLLM V1's "KV cache
groups"): Gemma 3 has a full-attention group and a sliding-window group (window 512), a Mistral
config with `sliding_window` has one sliding group, Llama one full group. Each group has its own
block tables and its own cache tensors (runner.kv_cache), since a sliding group gives back the
blocks that fall wholly out of its window while a full group keeps them.

Semantics follow transformers: a layer with window W lets the query at position p attend to the
keys at positions p - W < k <= p (`masking_utils.sliding_window_overlay`).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class KVGroups:
    """windows[g]: the window of group g (0: full attention); layer_group[i]: layer i's group.
    Groups are ordered full first, then by window; every group has at least one layer."""
    windows: tuple[int, ...]
    layer_group: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def layers(self, group: int) -> list[int]:
        return [i for i, g in enumerate(self.layer_group) if g == group]

    @property
    def has_window(self) -> bool:
        return any(self.windows)


def layer_windows(config: PretrainedConfig) -> list[int]:
    """Per layer, the window it attends over (0: full attention), from the config's
    `layer_types` when it has them (Gemma 2/3, Qwen2, Ministral), else `sliding_window` for
    every layer (Mistral) when the config turns it on."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or 0
    if getattr(config, "use_sliding_window", True) is False:
        window = 0
    types = getattr(config, "layer_types", None)
    if types is None:
        return [window] * n
    if len(types) != n or not set(types) <= {FULL, SLIDING}:
        raise ValueError(f"unsupported layer_types {sorted(set(types))} for {n} layers; "
                         f"supported: {FULL}, {SLIDING}")
    return [window if t == SLIDING else 0 for t in types]


def kv_groups(config: PretrainedConfig) -> KVGroups:
    windows = layer_windows(config)
    distinct = tuple(sorted(set(windows)))          # 0 (full) sorts first
    return KVGroups(distinct, tuple(distinct.index(w) for w in windows))
