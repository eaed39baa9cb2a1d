"""The engine panel's component (an accordion holding one HTML block, whose inner `LIVE_CLASS`
element the server's push fills, events.py) and its drawing: `render_panel` turns a `KvSnapshot` (logic.py) into HTML +
SVG built from numbers only; titles are the one piece of user text and are escaped.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from .logic import BranchRow, KvSnapshot

POLL_S = 0.5              # the server looks for a change this often
MIN_GAP_S = 1.0           # and the page redraws it at most this often
LIVE_CLASS = "lp-engine-live"
MAX_ROW_CELLS = 96        # per branch row
POOL_CELLS = 256
COLORS = {"shared": "#8b5cf6", "live": "#10b981", "held": "#3b82f6", "none": "#e5e7eb"}


@dataclass
class EnginePanelUI:
    html: gr.HTML


def build_engine_panel() -> EnginePanelUI:
    with gr.Accordion("Engine", open=True, elem_id="engine-acc"):
        panel = gr.HTML(f'<div class="{LIVE_CLASS}"><p class="lp-muted">Reading the engine…</p>'
                        '</div>', elem_id="engine-panel", js_on_load=None)
    return EnginePanelUI(panel)


def render_panel(snap: KvSnapshot) -> str:
    if not snap.available:
        return f'<div class="lp-engine"><p class="lp-muted">{snap.note}</p></div>'
    s = snap.stats
    saved = max(0, s.blocks_without_sharing - s.blocks_in_use)
    tiles = [("In use", s.blocks_in_use), ("Cached", s.blocks_cached), ("Free", s.blocks_free),
             ("Shared", s.blocks_shared), ("Prefix hits", f"{100 * s.prefix_hit_rate:.0f}%"),
             ("Preemptions", s.num_preemptions),
             ("Running / waiting", f"{s.num_running} / {s.num_waiting}"),
             ("Saved by sharing", saved)]
    if getattr(s, "draft_tokens", 0):         # speculative decoding is on and has drafted
        tiles.append(("Drafts accepted", f"{100 * s.draft_acceptance:.0f}%"))
    parts = ['<div class="lp-engine">', '<div class="lp-tiles">']
    parts += [f'<div class="lp-tile"><b>{v}</b><span>{k}</span></div>' for k, v in tiles]
    parts.append("</div>")
    held = (f" · {s.blocks_without_sharing} block references held in {s.blocks_in_use} blocks"
            if s.blocks_in_use else "")
    parts.append(f'<p class="lp-muted">{s.num_blocks} blocks of {s.block_size} tokens{held}</p>')
    parts += _kernel_lines(s)
    parts += _sliding_lines(s)
    parts += _disk_lines(s)
    parts += _image_lines(s)
    sharing = snap.sharing()
    live = {b for r in snap.rows if r.live for b in r.blocks}
    parts.append(_pool_svg(s.num_blocks, sharing, live))
    parts.append(_legend())
    parts.append(_rows_html(snap.rows, sharing))
    parts.append("</div>")
    return "".join(parts)


def _kernel_lines(s) -> list[str]:
    """Which kernels multiply the weights, and the weights' formats (a local engine's only)."""
    kernels = getattr(s, "kernels", "")
    if not kernels:
        return []
    return [f'<p class="lp-muted lp-kernels">Kernels: {html.escape(kernels)} · weights: '
            f'{html.escape(s.formats_text)}</p>']


def _sliding_lines(s) -> list[str]:
    """One line per sliding-window KV-cache group (the map above is group 0's blocks)."""
    groups = [g for g in getattr(s, "kv_groups", ()) if g.window]
    lines = [f'<p class="lp-muted">Sliding window {g.window} ({g.num_layers} layers): '
             f'{g.blocks_in_use} of {g.num_blocks} blocks in use, {g.tokens_held} tokens per '
             f'layer held</p>' for g in groups]
    if groups and s.window_bytes_saved:
        lines.append(f'<p class="lp-muted">The windows save {s.window_bytes_saved / 2**20:.1f} MiB '
                     f'of KV now</p>')
    return lines


def _disk_lines(s) -> list[str]:
    """The KV disk tier's line (runner.kv_disk.DiskStats), when it is on."""
    d = getattr(s, "kv_disk", None)
    if d is None:
        return []
    share = 100 * s.prefix_cache_disk_hits / max(1, s.prefix_cache_queries)
    dropped = f" · {d.dropped} writes dropped" if d.dropped else ""
    return [f'<p class="lp-muted lp-disk">Disk tier: {d.num_blocks} blocks, '
            f'{d.num_bytes / 2**20:.1f} MiB of {d.max_bytes / 2**30:.1f} GiB · {d.hits} read '
            f'back, {share:.0f}% of prompt tokens from disk{dropped}</p>']


def _image_lines(s) -> list[str]:
    """The vision encoder's line (a vision-language model that has seen an image): how often
    it ran and how often an image's embeddings came from its cache instead."""
    runs, hits = getattr(s, "encoder_runs", 0), getattr(s, "encoder_cache_hits", 0)
    if not runs and not hits:
        return []
    return [f'<p class="lp-muted lp-images">Images: the vision encoder ran {runs} '
            f'time{"s" if runs != 1 else ""} · {hits} image{"s" if hits != 1 else ""} from the '
            'encoder cache; a regenerate whose images the prefix cache holds runs neither '
            '(its reply says "image from cache")</p>']


def _state(block: int, sharing: dict[int, int], live: set[int]) -> str:
    if sharing.get(block, 0) > 1:
        return "shared"
    if block in live:
        return "live"
    return "held" if block in sharing else "none"


def _pool_svg(num_blocks: int, sharing: dict[int, int], live: set[int]) -> str:
    """Every block of the pool (grouped when there are many), coloured by its busiest state."""
    cells = min(num_blocks, POOL_CELLS)
    group = -(-num_blocks // cells)
    rank = {"none": 0, "held": 1, "live": 2, "shared": 3}
    state = ["none"] * cells
    for b in set(sharing) | live:
        c = min(b // group, cells - 1)
        st = _state(b, sharing, live)
        if rank[st] > rank[state[c]]:
            state[c] = st
    per_row, size = 32, 9
    rects = [f'<rect x="{(i % per_row) * (size + 2)}" y="{(i // per_row) * (size + 2)}" '
             f'width="{size}" height="{size}" rx="2" fill="{COLORS[st]}"><title>blocks '
             f'{i * group}-{min(num_blocks, (i + 1) * group) - 1}: {st}</title></rect>'
             for i, st in enumerate(state)]
    h = -(-cells // per_row) * (size + 2)
    caption = "the block pool" + (f" ({group} blocks per cell)" if group > 1 else "")
    return (f'<div class="lp-caption">{caption}</div>{_svg(per_row * (size + 2), h, rects, "lp-pool")}')


def _legend() -> str:
    names = {"shared": "shared by branches", "live": "generating", "held": "one branch",
             "none": "free / other"}
    return '<div class="lp-legend">' + "".join(
        f'<span><i style="background:{COLORS[k]}"></i>{v}</span>' for k, v in names.items()) + "</div>"


def _rows_html(rows: list[BranchRow], sharing: dict[int, int]) -> str:
    if not rows:
        return '<p class="lp-muted">Open a conversation to see its blocks.</p>'
    out, conv = ['<div class="lp-rows">'], None
    for r in rows:
        if r.conversation_id != conv:
            conv = r.conversation_id
            out.append(f'<div class="lp-conv">{html.escape(r.title)}</div>')
        shared = sum(1 for b in r.blocks if sharing.get(b, 0) > 1)
        mark = ("● " if r.live else "") + ("★ " if r.active else "")
        detail = (f"{len(r.blocks)} blocks: {shared} shared, {len(r.blocks) - shared} its own"
                  if r.blocks else html.escape(r.ended) if r.ended
                  else "not in the cache (its prefill would run again)")
        out.append(f'<div class="lp-row" data-conv="{r.conversation_id}" data-shared="{shared}">'
                   f'<div class="lp-row-label">{mark}branch {r.branch}/{r.branches} '
                   f'<span class="lp-muted">· {detail}</span></div>')
        if r.blocks:
            out.append(_strip_svg(r, sharing))
        out.append("</div>")
    out.append('<p class="lp-muted">★ the branch shown · ● generating now</p></div>')
    return "".join(out)


def _strip_svg(row: BranchRow, sharing: dict[int, int]) -> str:
    blocks, size, per_line = row.blocks[:MAX_ROW_CELLS], 9, 32
    live = set(row.blocks) if row.live else set()
    rects = []
    for i, b in enumerate(blocks):
        st, n = _state(b, sharing, live), sharing.get(b, 0)
        rects.append(f'<rect x="{(i % per_line) * (size + 2)}" y="{(i // per_line) * (size + 2)}" '
                     f'width="{size}" height="{size}" rx="2" fill="{COLORS[st]}">'
                     f'<title>block {b}: {n} branch{"es" if n != 1 else ""}</title></rect>')
    more = len(row.blocks) - len(blocks)
    h = max(1, -(-len(blocks) // per_line)) * (size + 2)
    tail = f'<span class="lp-muted"> +{more} more</span>' if more > 0 else ""
    return _svg(per_line * (size + 2), h, rects, "lp-strip") + tail


def _svg(w: int, h: int, rects: list[str], cls: str) -> str:
    """An SVG that shrinks to the panel's width (viewBox), never grows past its own size."""
    return (f'<svg class="{cls}" viewBox="0 0 {w} {h}" width="100%" style="max-width:{w}px" '
            f'role="img">{"".join(rects)}</svg>')
