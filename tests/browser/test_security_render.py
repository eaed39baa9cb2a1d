"""Untrusted text, rendered: `markdown.render` emits only allow-listed elements and attributes
(no raw HTML, no style, no event handler, no src, http(s) links only) whatever Markdown it is
fed, and `markdown.literal` makes text that no Markdown renderer turns into markup. The oracle
is Python's html.parser over the output, checked against an allow-list written here; hostile
Markdown comes from a grammar of the fragments that got HTML onto the page of a Markdown
escaper (backtick fences and code spans, fences indented in lists, `\\]` labels, reference
definitions) mixed with raw tags, entities and every URL form.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from localpaged.ui import markdown, render

EVIL = "https://evil.example"
URLS = ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "java&#115;cript:alert(1)",
        "java\\script:x", "data:text/html;base64,PHNjcmlwdD4=", "vbscript:msgbox(1)",
        "/gradio_api/file=https://evil.example/x", "//evil.example/p", "file:///etc/passwd",
        " javascript:alert(1)", "<javascript:alert(1)>", "https://ok.example/a_(b)?x=1&y=2",
        "http://ok.example/<x>", "https://ok.example/\"onmouseover=alert(1)"]
TAGS = ['<b style="position:fixed;inset:0;background:red">', "</b>", "<img src=x onerror=alert(1)>",
        "<script>alert(1)</script>", "<svg onload=alert(1)><circle/></svg>",
        "<iframe src=https://evil.example></iframe>", '<a href="javascript:x">', "</a>",
        '<div onclick="x">', "</div>", "<!-- comment -->", "<![CDATA[<b>x</b>]]>", "<?php x ?>",
        "<!DOCTYPE html>", "<style>*{display:none}</style>", "<math><mi>x</mi></math>",
        "&lt;b&gt;", "&#60;img src=x&#62;", "&amp;", "&#x3C;script&#x3E;"]
FRAGMENTS = ["$", "$$", "\\(", "\\)", "<think>", "</think>", "\\href{javascript:alert(1)}{x}",
             "```", "````", "~~~", "```x`", "```js", "``", "`", " `", "` ", "``x`", "\\]", "\\[",
             "[", "]", "(", ")", "![", "*", "**", "_", "~~", "|", "|-|", "> ", "- ", "1. ", "3) ",
             "    ", "  ", "\\", "#", "---", "x", "text", ":", "<", ">", '"', "'", "=", "&"]
SEPARATORS = ["", " ", "\n", "\n\n", "\n  ", "\n   ", "\n    ", "\n- ", "\n  - ", "\n1. "]


def _link(url: str) -> st.SearchStrategy[str]:
    label = st.sampled_from(["x", "a\\]", "`c`", "![i](u)", "[", ""])
    return st.one_of(
        st.builds(lambda lb: f"[{lb}]({url})", label),
        st.builds(lambda lb: f"![{lb}]({url})", label),
        st.builds(lambda lb: f"[{lb}]({url} \"t\")", label),
        st.just(f"<{url}>"),
        st.builds(lambda lb: f"[{lb}]\n\n[{lb}]: {url}\n", label),
        st.builds(lambda lb: f"![{lb}][{lb}]\n\n  [{lb}]: {url}\n", label))


PIECE = st.one_of(st.sampled_from(TAGS), st.sampled_from(FRAGMENTS),
                  st.sampled_from(URLS).flatmap(_link), st.sampled_from(SEPARATORS),
                  st.text(alphabet="`*_[]()<>!\\:/ \n-#|~&;=\"'xy1.", max_size=12))
HOSTILE = st.lists(PIECE, max_size=24).map("".join)

# What `render` may emit: per element, the attributes and (a pattern of) their values.
ALLOWED = {tag: {} for tag in markdown.ELEMENTS - {"sub", "div"}}     # those two: render.py
ALLOWED["a"] = {"href": r"https?://.*", "target": "_blank", "rel": "noopener noreferrer"}
ALLOWED["ol"] = {"start": r"\d+"}
ALLOWED["code"] = {"class": r"language-[A-Za-z0-9_+-]+"}
ALLOWED["span"] = {"class": r"hl-[A-Za-z0-9]+|lp-math|lp-math lp-math-display"}
ALLOWED["details"] = {"class": "lp-think", "open": ""}
ALLOWED["th"] = ALLOWED["td"] = {"class": r"lp-align-(left|center|right)"}


class Elements(HTMLParser):
    """Every start tag with its attributes; anything else markup-like is an error."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.other: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def handle_comment(self, data):
        self.other.append(f"comment {data}")

    def handle_decl(self, decl):
        self.other.append(f"decl {decl}")

    def handle_pi(self, data):
        self.other.append(f"pi {data}")

    def unknown_decl(self, data):
        self.other.append(f"decl {data}")


def parsed(out: str) -> Elements:
    parser = Elements()
    parser.feed(out)
    parser.close()
    return parser


def assert_allowed(out: str) -> None:
    doc = parsed(out)
    assert not doc.other, (doc.other, out)
    for tag, attrs in doc.tags:
        assert tag in ALLOWED, (tag, out)
        for name, value in attrs.items():
            assert name in ALLOWED[tag], (tag, name, out)
            assert value is not None and re.fullmatch(ALLOWED[tag][name], value), (tag, name, out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE)
def test_hostile_markdown_renders_only_allowed_elements_and_attributes(text):
    assert_allowed(markdown.render(text))


@pytest.mark.parametrize("text", [
    '```x`\n<b style="position:fixed;inset:0;background:red">overlay</b>\n```',
    "``x`<img src=x onerror=alert(1)>`` `<b style=color:red>`",
    "- item\n\n      ```\n  <b style=position:fixed>x</b>\n  ```\n<img src=https://evil.example/i>",
    "[a\\]]: javascript:alert(1)\n\n[a\\]]",
    "[x\\]y]: /gradio_api/file=https://evil.example/p.png\n\n![x\\]y] [x\\]y]",
    "<https://ok.example> <javascript:alert(1)> <mailto:a@b.c> a@b.c",
])
def test_the_escaper_breaking_cases_give_no_markup(text):
    out = markdown.render(text)
    assert_allowed(out)
    assert "style" not in {a for _, attrs in parsed(out).tags for a in attrs}
    assert all(a.get("href", "https://").startswith("https://") for _, a in parsed(out).tags)


def test_raw_html_shows_as_text():
    out = markdown.render('<b style="position:fixed">hi</b> <img src=x>')
    assert parsed(out).tags == [("p", {})]
    assert '<b style="position:fixed">hi</b> <img src=x>' in "".join(parsed(out).text)


def test_links_are_http_only_and_open_in_a_new_tab():
    out = markdown.render("[docs](https://docs.example/a_(b)?x=1&y=2) [bad](javascript:alert(1)) "
                          "[rel](/gradio_api/file=https://evil.example/x)")
    assert parsed(out).tags == [("p", {}), ("a", {"href": "https://docs.example/a_(b)?x=1&y=2",
                                                 "target": "_blank",
                                                 "rel": "noopener noreferrer"})]
    assert "[bad](javascript:alert(1))" in out          # not a link to markdown-it: text
    assert out.endswith(" rel</p>\n")                  # a link it rejected here: its label


def test_images_become_link_text_naming_the_host():
    out = markdown.render("see ![a *cat*](https://evil.example/cat.png?q=1) there")
    assert [t for t, _ in parsed(out).tags] == ["p", "a"]
    assert parsed(out).tags[1][1]["href"] == "https://evil.example/cat.png?q=1"
    assert "🖼 image: a cat (evil.example, not loaded)" in out
    assert markdown.render("![x](data:image/png;base64,AAAA)") == "<p>🖼 image: x (not loaded)</p>\n"
    nested = markdown.render("[![n](https://i.example/a.png)](https://ok.example/)")
    assert [t for t, _ in parsed(nested).tags] == ["p", "a"]          # no link in a link


def test_ordinary_markdown_keeps_its_meaning():
    out = markdown.render("# Title\n\n**bold** *em* ~~gone~~ `x<y`\nnext line\n\n"
                          "3. three\n4. four\n\n- a\n  - b\n\n> quoted\n\n"
                          "| a | b |\n|:--|--:|\n| 1 | 2 |\n\n---\n\n```python\nprint('<x>')\n```\n")
    for piece in ("<h1>Title</h1>", "<strong>bold</strong>", "<em>em</em>", "<s>gone</s>",
                  "<code>x&lt;y</code>", "<br>\nnext line", '<ol start="3">', "<li>four</li>",
                  "<ul>", "<blockquote>", "<table>", '<th class="lp-align-left">a</th>',
                  '<td class="lp-align-right">2</td>', "<hr>", '<code class="language-python">'):
        assert piece in out, piece
    code = out[out.index('<code class="language-python">'):]
    assert '<span class="hl-' in code                            # highlighted by Pygments
    assert html.unescape(re.sub(r"<[^>]+>", "", code)).startswith("print('<x>')\n")


def test_code_keeps_its_text_and_an_unknown_language_is_cut_to_safe_characters():
    out = markdown.render('```"><b onclick=x>\n  a <b>\n\n  b\n```')
    assert out == '<pre><code class="language-b">  a &lt;b&gt;\n\n  b\n</code></pre>\n'


def test_an_unclosed_fence_runs_to_the_end():
    out = markdown.render("Here:\n\n```python\ndef f():\n    return 1 ▌")
    assert out.startswith("<p>Here:</p>\n<pre><code class=\"language-python\">")
    assert out.endswith("</code></pre>\n") and "▌" in out


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
               max_size=40).filter(lambda t: "\n" not in t and "\r" not in t))
def test_literal_text_renders_as_that_text(text):
    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    doc = parsed(md.render(markdown.literal(text)))
    assert [t for t, _ in doc.tags] in ([], ["p"], ["pre", "code"]), (text, doc.tags)
    assert "".join(doc.text).strip() == text.strip(), text      # 4 spaces first: code, as text


def test_literal_escapes_every_ascii_punctuation_character():
    punct = "".join(c for c in map(chr, range(33, 127)) if not c.isalnum())
    assert markdown.literal(punct) == "".join("\\" + c for c in punct)
    assert markdown.literal("Qwen2.5 é") == "Qwen2\\.5 é"


def test_an_error_in_a_reply_footer_is_text():
    from localpaged.ui.store import Message
    msg = Message(id=1, conversation_id=1, parent_id=None, role="assistant", content="",
                  created=0.0, sampling={}, active_child_id=None, status="stopped",
                  stats={"error": "server said ![x](https://evil.example/e.png) <img src=y>"})
    note = render.footer(msg, (1, 1))
    assert parsed(note).tags == [] and "&lt;img src=y&gt;" in note


HOSTILE_TEX = [r"\href{javascript:alert(1)}{click}", r"\url{javascript:alert(2)}",
               r"\htmlClass{lp-x}{y}", r"\includegraphics{https://evil.example/i.png}",
               r"\htmlStyle{position:fixed}{z}", "</span><img src=x onerror=alert(1)>",
               r"x \) <b>y</b>"]


@pytest.mark.parametrize("tex", HOSTILE_TEX)
@pytest.mark.parametrize("form", ["${}$", "$${}$$", "\\({}\\)", "\\[{}\\]"])
def test_math_is_escaped_text_between_delimiters(tex, form):
    """Math goes to the browser's KaTeX as text (trust off there): no markup of its own, and
    TeX that would close the delimiters early is not math at all."""
    out = markdown.render("see " + form.format(tex) + " end")
    assert_allowed(out)
    assert [t for t, _ in parsed(out).tags if t not in ("p", "span")] == []
    assert "<img" not in out and "<b>" not in out
    spans = [a for t, a in parsed(out).tags if t == "span"]
    assert len(spans) <= 1 and all(a["class"].startswith("lp-math") for a in spans)
    for math in re.findall(r'<span class="lp-math[^"]*">(.*?)</span>', out):
        inner = html.unescape(math)[2:-2]                  # within its \\( \\) or \\[ \\]
        assert "\\)" not in inner and "\\]" not in inner and inner.strip(), out
    if "\\)" not in tex:
        assert len(spans) == 1, out


def test_prices_code_and_escapes_are_not_math():
    for text in ("costs $5 and $10", "a $5-$10 range", "`$x$`\n\n```\n$y$\n```", "\\$x\\$"):
        assert "lp-math" not in markdown.render(text), text
    assert 'class="lp-math"' in markdown.render("$x$ and \\(y\\)")


def test_reasoning_is_a_details_block_of_markdown():
    done = markdown.render("<think>plan <img src=x> *a*</think>**Answer**")
    assert_allowed(done)
    tags = [t for t, _ in parsed(done).tags]
    assert tags[:3] == ["details", "summary", "p"] and "strong" in tags
    assert parsed(done).tags[0][1] == {"class": "lp-think"}          # closed: collapsed
    assert "&lt;img src=x&gt;" in done
    going = markdown.render("  <think>still thinking")
    assert parsed(going).tags[0][1] == {"class": "lp-think", "open": ""}
    assert "lp-think" not in markdown.render("not first <think>x</think>")
