r"""Where a chat message holds math: a markdown-it inline rule (`math_rule`, installed by
`markdown.py` before the escape rule, so `\(` keeps its backslash) that makes a `math` token of
  $...$  and  \(...\)     inline      (meta display False)
  $$...$$ and \[...\]     displayed   (meta display True)
Its content is the TeX between the delimiters; `markdown.render` writes it out escaped.

Dollars follow Pandoc's rule, so prices stay text: an opening `$` has a non-space character
right after it, a closing `$` a non-space character right before it and no digit right after
(`$5 and $10` is not math); `\$` is a dollar sign. Math spans no blank line (the paragraph
ends there), and holds neither `\)` nor `\]` (those would end it early in the browser).
"""

from __future__ import annotations

MAX_MATH_CHARS = 4000             # a longer span is left as text


def _end_of_dollars(src: str, start: int, end: int, double: bool) -> int:
    """Index of the closing `$` / `$$` of math whose TeX starts at `start`, or -1."""
    i = start
    while i < end:
        c = src[i]
        if c == "\\":
            i += 2                                   # an escaped character, `\$` included
            continue
        if c == "$":
            if double:
                return i if src.startswith("$$", i) else -1
            before, after = src[i - 1], src[i + 1] if i + 1 < end else ""
            if before.isspace() or after.isdigit():
                return -1                            # Pandoc: not a closing dollar
            return i
        i += 1
    return -1


def _find(src: str, pos: int, end: int) -> tuple[str, int, bool] | None:
    """(tex, position after the closing delimiter, display) of math opening at pos, or None."""
    if src.startswith("\\(", pos) or src.startswith("\\[", pos):
        display = src[pos + 1] == "["
        close = src.find("\\]" if display else "\\)", pos + 2, end)
        return (src[pos + 2:close], close + 2, display) if close > pos + 2 else None
    if src.startswith("$$", pos):
        close = _end_of_dollars(src, pos + 2, end, double=True)
        return (src[pos + 2:close], close + 2, True) if close > pos + 2 else None
    if src[pos] == "$" and pos + 1 < end and not src[pos + 1].isspace():
        close = _end_of_dollars(src, pos + 1, end, double=False)
        return (src[pos + 1:close], close + 1, False) if close > pos + 1 else None
    return None


def math_rule(state, silent: bool) -> bool:
    """markdown-it inline rule: a `math` token at state.pos, if math opens there."""
    src, pos = state.src, state.pos
    if src[pos] not in "$\\":
        return False
    found = _find(src, pos, state.posMax)
    if found is None:
        return False
    tex, after, display = found
    if (not tex.strip() or len(tex) > MAX_MATH_CHARS or "\\)" in tex or "\\]" in tex
            or "\n\n" in tex):
        return False
    if not silent:
        token = state.push("math", "", 0)
        token.content, token.meta = tex, {"display": display}
    state.pos = after
    return True
