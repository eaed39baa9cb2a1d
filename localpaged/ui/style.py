"""The look of the chat app: the Gradio theme, the page CSS and the brand header."""

from __future__ import annotations

import gradio as gr
from pygments.formatters import HtmlFormatter

from .markdown import HIGHLIGHT_PREFIX

THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="violet", neutral_hue="slate",
                       radius_size="md", text_size="md",
                       font=["ui-sans-serif", "system-ui", "Segoe UI", "sans-serif"],
                       font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])

BRAND = ("<div class='lp-brand'><span class='lp-logo'>▦</span> <b>localpaged</b>"
         "<span class='lp-tag'>PagedAttention chat workstation</span></div>")

CSS = """
.lp-gauge { display: flex; align-items: center; gap: 8px; font-size: .8rem; padding: 2px 4px;
  color: var(--body-text-color-subdued); }
.lp-gauge-bar { width: 120px; height: 6px; border-radius: 3px; overflow: hidden;
  background: var(--border-color-primary); flex: none; }
.lp-gauge-bar > span { display: block; height: 100%; background: var(--color-accent); }
.lp-gauge-near .lp-gauge-bar > span { background: #d97706; }
.lp-gauge-near .lp-gauge-text { color: #b45309; }
.lp-gauge-over .lp-gauge-bar > span { background: #dc2626; }
.lp-gauge-over .lp-gauge-text { color: #b91c1c; }
footer { display: none !important; }
.gradio-container { max-width: 100% !important; padding: 8px 14px !important; }
.lp-head { display: flex; align-items: center; justify-content: space-between;
  border-bottom: 1px solid var(--border-color-primary); padding: 4px 6px 10px; }
.lp-model { font-size: .85rem; color: var(--body-text-color-subdued); }
.lp-brand { font-size: 1.15rem; display: flex; align-items: baseline; gap: 6px; }
.lp-logo { color: var(--color-accent); font-size: 1.3rem; }
.lp-tag { color: var(--body-text-color-subdued); font-size: .85rem; margin-left: 8px; }
.lp-badge { background: var(--color-accent-soft); color: var(--color-accent); border-radius: 6px;
  padding: 1px 6px; font-size: .75rem; text-transform: uppercase; letter-spacing: .04em; }

#lp-sidebar { background: var(--background-fill-secondary); border-radius: 12px; padding: 10px;
  gap: 8px; }
#conv-list { max-height: 58vh; overflow-y: auto; }
#conv-list .wrap { display: flex; flex-direction: column; gap: 2px; }
#conv-list label { width: 100%; border: none !important; background: transparent !important;
  box-shadow: none !important; border-radius: 8px; padding: 7px 9px; cursor: pointer;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#conv-list label:hover { background: var(--background-fill-primary) !important; }
#conv-list label.selected { background: var(--color-accent-soft) !important;
  color: var(--color-accent); font-weight: 600; }
#conv-list input[type=radio] { display: none; }
.lp-tight { gap: 6px !important; }
.lp-confirm { border: 1px solid var(--error-border-color, #fca5a5) !important; }

.lp-chat .message { font-size: .95rem; }
.lp-images { display: flex; flex-wrap: wrap; gap: 6px; margin-bottom: 6px; }
.lp-thumb img { max-width: 160px; max-height: 160px; border-radius: 6px; display: block;
  border: 1px solid var(--border-color-primary); }
.lp-chat button[aria-label="Clear"] { display: none !important; }
.lp-chat sub { display: block; margin-top: 4px; color: var(--body-text-color-subdued);
  font-size: .75rem; vertical-align: baseline; line-height: 1.35; }
.lp-chat .lp-sib { cursor: pointer; user-select: none; border-radius: 4px; padding: 0 3px;
  color: var(--color-accent); }
.lp-chat .lp-sib:hover { background: var(--color-accent-soft); }
.lp-chat .lp-math { display: inline-block; max-width: 100%; overflow-x: auto;
  overflow-y: hidden; contain: paint; vertical-align: middle; }
.lp-chat .lp-math-display { display: block; text-align: center; margin: 4px 0; }
.lp-chat details.lp-think { border-left: 3px solid var(--border-color-primary);
  padding: 2px 0 2px 10px; margin: 2px 0 8px; color: var(--body-text-color-subdued); }
.lp-chat details.lp-think > summary { cursor: pointer; font-size: .85rem; }
.lp-ask { border: 1px solid #d97706 !important; border-radius: 10px; padding: 10px;
  background: var(--background-fill-secondary); }
.lp-help-btn { margin-top: 6px; width: 100%; font-size: .78rem; background: none;
  border: 1px dashed var(--border-color-primary); border-radius: 8px; padding: 4px;
  color: var(--body-text-color-subdued); cursor: pointer; }
.lp-help { display: none; position: fixed; inset: 0; z-index: 1000;
  background: rgba(15, 23, 42, .45); align-items: center; justify-content: center; }
.lp-help.lp-help-open { display: flex; }
.lp-help-card { background: var(--background-fill-primary); border-radius: 12px;
  padding: 16px 20px; max-width: 560px; box-shadow: 0 10px 30px rgba(0, 0, 0, .25); }
.lp-help-card table { margin: 10px 0; border-collapse: collapse; font-size: .88rem; }
.lp-help-card td { padding: 3px 10px 3px 0; vertical-align: top; }
.lp-help-card kbd { font-family: var(--font-mono); background: var(--background-fill-secondary);
  border: 1px solid var(--border-color-primary); border-radius: 4px; padding: 0 5px;
  white-space: nowrap; }
.lp-queued { display: none; position: fixed; bottom: 18px; left: 50%; transform: translateX(-50%);
  z-index: 900; background: #fef3c7; color: #92400e; border: 1px solid #f59e0b;
  border-radius: 8px; padding: 6px 12px; font-size: .85rem; }
.lp-queued.lp-queued-open { display: block; }
.lp-toolbar { align-items: center; gap: 6px !important; flex-wrap: wrap; }
.lp-toolbar .lp-sel { flex: 1 1 200px !important; color: var(--body-text-color-subdued);
  font-size: .85rem; }
.lp-toolbar .lp-sel p { margin: 0; }
.lp-composer { align-items: stretch; }
.lp-composer textarea { min-height: 44px; }
.lp-edit { border: 1px dashed var(--color-accent) !important; padding: 6px; }
.lp-tokens { border: 1px dashed var(--color-accent) !important; padding: 6px; }
.lp-tokhelp { margin: 0 0 4px; font-size: .8rem; color: var(--body-text-color-subdued); }
.lp-toktext { white-space: pre-wrap; line-height: 1.7; max-height: 40vh; overflow-y: auto;
  font-size: .92rem; }
.lp-tok { cursor: pointer; border-radius: 3px; }
.lp-tok:hover { outline: 1px solid var(--color-accent); }
.lp-tok.lp-p1 { background: rgba(245, 158, 11, .15); }
.lp-tok.lp-p2 { background: rgba(245, 158, 11, .32); }
.lp-tok.lp-p3 { background: rgba(239, 68, 68, .35); }
.lp-tok.lp-p4 { background: rgba(239, 68, 68, .55); }
.lp-tok.lp-picked { outline: 2px solid var(--color-accent); }

.lp-columns { gap: 10px; }
.lp-column { background: var(--background-fill-secondary); border-radius: 10px; padding: 8px; }
.lp-cmp-out { background: var(--background-fill-primary); border-radius: 8px; padding: 8px 10px;
  min-height: 120px; font-size: .92rem; overflow-wrap: anywhere; }
.lp-meta, .lp-meta p { color: var(--body-text-color-subdued); font-size: .78rem; }

#lp-right { gap: 10px; }
.lp-engine { font-size: .82rem; }
.lp-tiles { display: grid; grid-template-columns: repeat(4, 1fr); gap: 6px; margin-bottom: 6px; }
.lp-tile { background: var(--background-fill-secondary); border-radius: 8px; padding: 6px;
  display: flex; flex-direction: column; align-items: center; }
.lp-tile b { font-size: 1.05rem; }
.lp-tile span { font-size: .68rem; color: var(--body-text-color-subdued); text-align: center; }
.lp-muted { color: var(--body-text-color-subdued); font-size: .76rem; margin: 4px 0; }
.lp-caption { font-size: .72rem; color: var(--body-text-color-subdued); margin: 6px 0 2px; }
.lp-legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: .72rem; margin: 4px 0 8px; }
.lp-legend i { display: inline-block; width: 9px; height: 9px; border-radius: 2px;
  margin-right: 4px; vertical-align: -1px; }
.lp-rows { max-height: 36vh; overflow-y: auto; padding-right: 4px; }
.lp-conv { font-size: .8rem; font-weight: 600; margin-top: 8px; overflow: hidden;
  text-overflow: ellipsis; white-space: nowrap; }
.lp-row { margin: 2px 0 6px 8px; }
.lp-row-label { font-size: .78rem; margin-bottom: 2px; overflow: hidden; text-overflow: ellipsis;
  white-space: nowrap; }
.lp-pool, .lp-strip { display: block; max-width: 100%; }

.lp-chat pre, .lp-cmp-out pre { overflow-x: auto; padding: 8px 10px; border-radius: 6px;
  background: var(--background-fill-secondary); font-size: .85rem; line-height: 1.4; }
.lp-chat table, .lp-cmp-out table { border-collapse: collapse; margin: 6px 0; }
.lp-chat th, .lp-chat td, .lp-cmp-out th, .lp-cmp-out td {
  border: 1px solid var(--border-color-primary); padding: 3px 8px; }
.lp-chat blockquote, .lp-cmp-out blockquote { border-left: 3px solid var(--border-color-primary);
  margin: 6px 0; padding-left: 10px; color: var(--body-text-color-subdued); }
.lp-align-left { text-align: left; }
.lp-align-center { text-align: center; }
.lp-align-right { text-align: right; }
"""


def _highlight_css(style: str, scope: str) -> str:
    """Colours for the code spans markdown.render makes with Pygments."""
    formatter = HtmlFormatter(classprefix=HIGHLIGHT_PREFIX, style=style)
    return "\n".join(formatter.get_token_style_defs([f"{scope}.lp-chat pre",
                                                       f"{scope}.lp-cmp-out pre"]))


CSS += _highlight_css("default", "") + "\n" + _highlight_css("github-dark", ".dark ")
