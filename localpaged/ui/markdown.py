r"""Untrusted text (model replies, user messages, titles, server errors) made safe to show:
`render` turns Markdown into HTML for components that show HTML (the Chatbot, the compare
columns), `literal` turns any text into Markdown that shows exactly that text (for gr.Markdown).

Safety rule: the browser never parses Markdown we were given, and the HTML we emit is built from
an allow-list. markdown-it-py (CommonMark, raw HTML off, GFM tables and strikethrough on) parses
the text into tokens, and this module writes the HTML itself, token by token: only the elements
of ELEMENTS, every text and attribute value html-escaped, and no attribute but
- href on <a>, only an http(s) URL (anything else makes the link plain text), with
  target="_blank" rel="noopener noreferrer";
- start on <ol> (a number);
- class with values built here: `language-<name>` (name cut to [A-Za-z0-9_+-]), the `hl-*`
  classes of Pygments' highlighting, `lp-align-left|center|right` on table cells, `lp-math`,
  `lp-math-display` (math), `lp-think` (reasoning);
- open on <details> (a reasoning block still being written).
No style, no event handler, no src: an image becomes link text naming its host (never loaded).
A token this module does not know shows as escaped text. The Chatbot's own sanitizer and the
page's Content-Security-Policy stay on as further lines of defence.

Math (`math_rule.py` finds it): `$...$` and `\(...\)` inline, `$$...$$` and `\[...\]` displayed,
written out as escaped text between `\(` `\)` (or `\[` `\]`) in a `<span class="lp-math">`;
the browser's KaTeX (the Chatbot's `latex_delimiters`, `MATH_DELIMITERS`) typesets them with
`trust` off, so \href, \url, \includegraphics, \htmlClass and the like show as error text.
A reasoning block (`think_block`: a reply's reasoning kept apart, or a text that starts with
`<think>`) becomes `<details class="lp-think">` with an escaped `<summary>`, open while it is
being written.
"""

from __future__ import annotations

import functools
import html
import re
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from localpaged.chat.reasoning import THINK_CLOSE, THINK_OPEN

from .math_rule import math_rule

# Elements `render` may emit (`span` only from Pygments and math, `details` and `summary` only
# for reasoning, `sub` and `div` only from the chat layout: ui/render.py).
ELEMENTS = frozenset({"p", "em", "strong", "s", "code", "pre", "blockquote", "ul", "ol", "li",
                      "h1", "h2", "h3", "h4", "h5", "h6", "hr", "br", "a", "table", "thead",
                      "tbody", "tr", "th", "td", "span", "sub", "div", "details", "summary"})
# What the Chatbot's KaTeX looks for (its `latex_delimiters`): only what `_math` writes.
MATH_DELIMITERS = [{"left": "\\(", "right": "\\)", "display": False},
                   {"left": "\\[", "right": "\\]", "display": True}]
VOID = frozenset({"hr", "br"})
LINK_ATTRS = ' target="_blank" rel="noopener noreferrer"'
HIGHLIGHT_PREFIX = "hl-"
# Languages Pygments highlights (a fixed set: a lexer is a pile of regexes fed untrusted text).
HIGHLIGHTED = frozenset({"python", "py", "javascript", "js", "typescript", "ts", "json", "bash",
                         "sh", "shell", "c", "cpp", "c++", "rust", "go", "java", "html", "css",
                         "sql", "yaml", "toml", "diff", "ruby", "kotlin", "swift", "php"})
HIGHLIGHT_MAX_CHARS = 20_000

_PARSER = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_PARSER.inline.ruler.before("escape", "math", math_rule)      # before `\(` loses its backslash
_HTTP = re.compile(r"https?://", re.IGNORECASE)
_LANG_CHARS = re.compile(r"[^A-Za-z0-9_+-]")
_ALIGN = re.compile(r"text-align:(left|center|right)")
_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")         # every ASCII punctuation character
_FORMATTER = HtmlFormatter(nowrap=True, classprefix=HIGHLIGHT_PREFIX)


def literal(text: str) -> str:
    """Markdown that shows `text` as it is: every ASCII punctuation character backslash-escaped
    (CommonMark and marked both honour that), so no Markdown or HTML construct can form."""
    return _PUNCT.sub(r"\\\1", text)


@functools.lru_cache(maxsize=1024)      # a streamed update re-renders every message of the path
def render(text: str) -> str:
    """Markdown -> HTML from the allow-list above. An unclosed fence (a reply still streaming)
    runs to the end of the text. A text that starts with `<think>` shows its reasoning as a
    collapsible block (open while its `</think>` has not come yet), then the answer."""
    head = text.lstrip()
    if not head.startswith(THINK_OPEN):
        return _markdown(text)
    reasoning, closed, answer = head[len(THINK_OPEN):].partition(THINK_CLOSE)
    return (think_block(reasoning, "Reasoning" if closed else "Thinking…", not closed)
            + "\n" + _markdown(answer))


def think_block(reasoning: str, summary: str, opened: bool) -> str:
    """A reasoning block: `reasoning` (Markdown, rendered) folded under `summary` (plain text,
    escaped); unfolded while `opened` (the reasoning still being written)."""
    attr = ' open=""' if opened else ""
    return (f'<details class="lp-think"{attr}><summary>{html.escape(summary)}</summary>'
            f"{_markdown(reasoning)}</details>")


def _markdown(text: str) -> str:
    """Markdown -> HTML, token by token (see the module's docstring)."""
    out: list[str] = []
    for token in _PARSER.parse(text):
        if token.type == "inline":
            out.append(_inline(token.children or []))
        elif token.type in ("fence", "code_block"):
            out.append(_code_block(token))
        elif token.type.endswith(("_open", "_close")) or token.type == "hr":
            out.append(_tag(token))
        else:
            out.append(_esc(token.content))
    return "".join(out)


def _esc(text: str) -> str:
    """Text for an element's content or a double-quoted attribute value."""
    return html.escape(text, quote=True).replace("&#x27;", "'")


def _tag(token: Token) -> str:
    """An open, close or void tag of the allow-list; a hidden one (a tight list's paragraph)
    and one outside the list give nothing."""
    if token.hidden or token.tag not in ELEMENTS:
        return ""
    if token.nesting == -1:
        return f"</{token.tag}>" + ("\n" if token.block else "")
    return f"<{token.tag}{_attrs(token)}>" + ("\n" if token.tag in VOID else "")


def _attrs(token: Token) -> str:
    """The attributes kept: an ordered list's start, a table cell's alignment (as a class)."""
    if token.tag == "ol" and str(token.attrGet("start") or "").isdigit():
        return f' start="{int(token.attrGet("start"))}"'
    align = _ALIGN.fullmatch(str(token.attrGet("style") or ""))
    return f' class="lp-align-{align.group(1)}"' if align and token.tag in ("th", "td") else ""


def _code_block(token: Token) -> str:
    lang = _LANG_CHARS.sub("", token.info.split()[0])[:40] if token.info.strip() else ""
    cls = f' class="language-{lang}"' if lang else ""
    return f"<pre><code{cls}>{_highlighted(token.content, lang.lower())}</code></pre>\n"


def _highlighted(code: str, lang: str) -> str:
    """Code as HTML: Pygments' class-based spans for a language of HIGHLIGHTED, else escaped."""
    if lang not in HIGHLIGHTED or len(code) > HIGHLIGHT_MAX_CHARS:
        return _esc(code)
    try:
        lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return _esc(code)
    return highlight(code, lexer, _FORMATTER)


def _inline(tokens: list[Token]) -> str:
    out: list[str] = []
    in_link = False                    # inside a link we emit (links do not nest)
    for t in tokens:
        if t.type == "link_open":
            href = _safe_href(t.attrGet("href"))
            in_link = href is not None
            out.append(f'<a href="{_esc(href)}"{LINK_ATTRS}>' if href else "")   # else text
        elif t.type == "link_close":
            out.append("</a>" if in_link else "")
            in_link = False
        elif t.type == "image":
            out.append(_image(t, in_link))
        elif t.type == "code_inline":
            out.append(f"<code>{_esc(t.content)}</code>")
        elif t.type == "math":
            out.append(_math(t.content, bool(t.meta.get("display"))))
        elif t.type in ("softbreak", "hardbreak"):
            out.append("<br>\n")       # a chat keeps the lines it was written in
        elif t.type.endswith(("_open", "_close")):
            out.append(_tag(t))
        else:
            out.append(_esc(t.content))
    return "".join(out)


def _math(tex: str, display: bool) -> str:
    """TeX between the delimiters KaTeX looks for, escaped (it is text to the browser)."""
    left, right = ("\\[", "\\]") if display else ("\\(", "\\)")
    cls = "lp-math lp-math-display" if display else "lp-math"
    return f'<span class="{cls}">{left}{_esc(tex)}{right}</span>'


def _safe_href(href: object) -> str | None:
    """The link's URL when it is http(s) (as markdown-it normalized it), else None."""
    return href if isinstance(href, str) and _HTTP.match(href) else None


def _image(token: Token, in_link: bool) -> str:
    """`🖼 image: alt (host, not loaded)`, linking to the image when its URL is http(s) and the
    image is not already inside a link; text only otherwise. Never an <img>."""
    alt = "".join(c.content for c in token.children or [] if c.type != "image").strip()
    src = _safe_href(token.attrGet("src"))
    host = urlsplit(src).hostname if src else None
    label = f"🖼 image: {alt or 'image'} ({host + ', ' if host else ''}not loaded)"
    if src and not in_link:
        return f'<a href="{_esc(src)}"{LINK_ATTRS}>{_esc(label)}</a>'
    return _esc(label)
