"""How generated tokens and their log-probabilities are written in API responses: each token's
text (`TokenText`, cached; `TokenIdText` writes "token_id:N", vLLM's
return_tokens_as_token_ids), chat logprobs (`content` entries with top_logprobs and bytes),
legacy-completions logprobs (tokens, token_logprobs, top_logprobs, text_offset) and an echoed
prompt's. A logprob of -inf or NaN is written as MIN_LOGPROB: JSON has no -Infinity.
"""

from __future__ import annotations

from functools import lru_cache

from localpaged.core.request import TokenLogprob

MIN_LOGPROB = -9999.0          # JSON has no -Infinity


class TokenText:
    """The text of single tokens, for logprobs (cached: the vocabulary is fixed)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._decode = lru_cache(maxsize=65536)(
            lambda tid: tokenizer.decode([tid], skip_special_tokens=False))

    def __call__(self, token_id: int) -> str:
        return self._decode(token_id)

    def decode(self, token_ids: list[int]) -> str:
        """The text of a whole token sequence (an echoed prompt given as token ids)."""
        return self._tokenizer.decode(token_ids, skip_special_tokens=False)


class TokenIdText(TokenText):
    """Logprobs' tokens written as "token_id:N" (vLLM's return_tokens_as_token_ids)."""

    def __call__(self, token_id: int) -> str:
        return f"token_id:{token_id}"


def _lp(value: float) -> float:
    return max(MIN_LOGPROB, float(value)) if value == value else MIN_LOGPROB


def chat_logprobs(text_of: TokenText, lps: list[TokenLogprob]) -> dict:
    def entry(tid: int, lp: float) -> dict:
        s = text_of(tid)
        return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode("utf-8"))}
    content = []
    for t in lps:
        item = entry(t.token_id, t.logprob)
        item["top_logprobs"] = [entry(i, v) for i, v in
                                sorted(t.top.items(), key=lambda kv: -kv[1])]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(text_of: TokenText, lps: list[TokenLogprob], offset: int) -> dict:
    tokens, token_lps, tops, offsets = [], [], [], []
    for t in lps:
        s = text_of(t.token_id)
        tokens.append(s)
        token_lps.append(_lp(t.logprob))
        top = {text_of(i): _lp(v) for i, v in sorted(t.top.items(), key=lambda kv: -kv[1])}
        top.setdefault(s, _lp(t.logprob))
        tops.append(top)
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def echo_logprobs(text_of: TokenText, prompt_ids: list[int],
                  prompt_lps: list[TokenLogprob | None], completion: dict | None) -> dict:
    """Legacy-completions logprobs of the prompt tokens (the first has none: null), followed
    by the completion's (`completion`, whose text offsets already follow the prompt's text)."""
    first = {"tokens": [text_of(prompt_ids[0])], "token_logprobs": [None],
             "top_logprobs": [None], "text_offset": [0]}
    rest = completion_logprobs(text_of, [lp for lp in prompt_lps[1:] if lp is not None],
                               len(first["tokens"][0]))
    parts = [first, rest] + ([completion] if completion else [])
    return {key: [v for part in parts for v in part[key]] for key in first}
