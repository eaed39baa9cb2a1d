"""Majority vote over parallel thinking's answers: each surviving branch's final answer, when it
is short (a number, a word, a choice), normalised; the answer most branches reached.

    vote(["... so the answer is **42**.", "42", "I think 41"]) -> Vote("42", count=2, ...)

A final answer is the content of the last `\\boxed{...}`, else what follows the last
"answer:" / "answer is", else the reply's last non-empty line without a list marker or an
"therefore" lead-in; markdown emphasis and closing punctuation taken off. Longer than
MAX_ANSWER_CHARS: not a short answer, no vote. Two answers are the same when their normal forms
are (case, spaces, thousands separators, a trailing ".0").
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

MAX_ANSWER_CHARS = 60
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER = re.compile(r"answer(?:\s+is|\s*:)\s*(.+)", re.IGNORECASE)
_LIST_MARK = re.compile(r"^(?:\d+[.)]|[-*+])\s+")
_LEAD = re.compile(r"^(?:final answer|answer|the answer is|so the answer is|therefore)\s*[:,]?\s*",
                   re.IGNORECASE)


@dataclass(frozen=True)
class Vote:
    answer: str                  # as the first branch that gave it wrote it
    count: int                   # branches that gave it
    voters: int                  # branches with a short answer
    columns: tuple[int, ...]     # 0-based indices of the branches that gave it


def final_answer(text: str) -> str | None:
    """The reply's short final answer, or None when it has none."""
    boxed = _BOXED.findall(text or "")
    said = _ANSWER.findall(text or "")
    if boxed:
        answer = boxed[-1]
    elif said:
        answer = said[-1]
    else:
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        if not lines:
            return None
        answer = _LEAD.sub("", _LIST_MARK.sub("", lines[-1].strip("*_`# >")))
    while (trimmed := answer.strip().strip("*_`$ ").rstrip(".!;:")) != answer:
        answer = trimmed
    return answer if 0 < len(answer) <= MAX_ANSWER_CHARS else None


def normal_form(answer: str) -> str:
    s = re.sub(r"\s+", " ", answer.casefold()).strip()
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    return re.sub(r"^(-?\d+)\.0+$", r"\1", s)


def vote(texts: list[str]) -> Vote | None:
    """The answer most branches gave (ties: the one given first); None without short answers."""
    answers = [final_answer(t) for t in texts]
    given = [(i, a) for i, a in enumerate(answers) if a is not None]
    if not given:
        return None
    counts = Counter(normal_form(a) for _, a in given)
    top = max(counts.values())
    winner = next(normal_form(a) for _, a in given if counts[normal_form(a)] == top)
    columns = tuple(i for i, a in given if normal_form(a) == winner)
    return Vote(answers[columns[0]], top, len(given), columns)
