"""Grammar-constrained decoding: the compiled grammars of an engine and the matcher of each
sequence, on xgrammar (bench/grammar.py compares it with llguidance on our tokenizers and
schemas: docs/benchmarks.md has why xgrammar).

Owns:
- `GrammarCompiler`: one per engine. The tokenizer's vocabulary as xgrammar reads it (built on
  the first constrained request) and a cache of compiled grammars keyed by
  `GuidedDecoding.key`, so a schema sent many times compiles once. A spec the library refuses
  raises `GrammarError` (a ValueError naming the constraint) before any engine state is
  touched: `LLMEngine.make_group` compiles.
- `SequenceGrammar`: the matcher state of one sequence. It is forked with the sequence
  (parallel samples, beams, branches: `Sequence.fork`), advanced by every token the sequence
  keeps (`sampler.record`), and nothing else. Preemption keeps it as it is: a recomputed or
  swapped-in sequence has the same tokens, so the same state.
- Token masks: xgrammar's packed bitmasks, int32 [rows, ceil(V / 32)] (bit j of word w allows
  token 32 w + j). `allowed_rows` fills those of a batch of sequences, `apply_mask` puts the
  refused tokens' logits at -inf in place (kernels/token_mask.py); `step_masks`: the masks
  of a step's sampling sequences, computed while the model runs (the engine calls it on a
  worker thread during the forward: matchers change only after sampling).
- Drafts (`check_draft`, `draft_masks`, `jump_forward`): speculation's drafts are cut at the
  first token the grammar refuses before they are verified, the verification samples each
  position under that position's mask, and where the grammar forces a run of text (a fixed key,
  a closing brace) its tokens become a draft of their own (jump-forward), verified in one step.

Invariant: a sequence's matcher has accepted exactly its output tokens (drafts are checked and
rolled back, never left accepted); so the masks of a step depend only on kept tokens.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

import torch
import xgrammar as xgr

from localpaged.core.guided import GuidedDecoding
from localpaged.kernels import token_mask

CACHE_SIZE = 64                     # compiled grammars kept per engine (LRU)
MAX_JUMP_TOKENS = 32                # tokens a jump-forward draft holds at most


class GrammarError(ValueError):
    """A constraint the grammar library cannot compile; the message names it."""


class GrammarCompiler:
    """Compiles GuidedDecoding specs for one tokenizer; thread-safe (make_group runs on callers'
    threads)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0               # grammars compiled (cache misses), for tests and stats

    def compile(self, spec: GuidedDecoding) -> "CompiledGrammar":
        with self._lock:
            compiled = self._cache.get(spec.key)
            if compiled is None:
                compiled = self._compile(spec)
                self.compiles += 1
                self._cache[spec.key] = compiled
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(spec.key)
        return CompiledGrammar(spec, compiled, self.vocab_size, tuple(self.stop_token_ids))

    def _compile(self, spec: GuidedDecoding) -> xgr.CompiledGrammar:
        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info)
        c = self._compiler
        compiled = self._compile_with(c, spec)
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask)
        if not bool(live_rows(bitmask, self.vocab_size)[0]):
            raise GrammarError(f"{spec.label} allows no text this model's vocabulary can write")
        return compiled

    @staticmethod
    def _compile_with(c: xgr.GrammarCompiler, spec: GuidedDecoding) -> xgr.CompiledGrammar:
        try:
            if spec.kind in ("json_object", "json_schema"):
                schema = spec.value if spec.kind == "json_schema" else '{"type": "object"}'
                return c.compile_grammar(json_grammar(schema))
            if spec.kind == "regex":
                return c.compile_regex(spec.value)
            if spec.kind == "grammar":
                return c.compile_grammar(spec.value)
            if spec.kind == "choice":
                options = json.loads(spec.value)
                return c.compile_grammar("root ::= " + " | ".join(json.dumps(o) for o in options))
            return c.compile_grammar(_json_chars_fixed(str(xgr.Grammar.from_structural_tag(spec.value))))
        except Exception as e:          # the library raises RuntimeError, ValueError and its own
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise GrammarError(f"{spec.label} cannot be compiled: {first}") from None


# xgrammar writes the characters of a length-limited JSON string (minLength/maxLength) as this
# class, which lets raw control characters through (JSON forbids them: the reply would not
# parse); they are excluded, in schemas and in a structural tag's JSON parts alike
# (tests/grammar: test_length_limited_strings_parse).
_COUNTED_CHARS = r'[^\"\\\r\n]'
_JSON_CHARS = r'[^\"\\\x00-\x1f]'


def json_grammar(schema: str) -> str:
    """The EBNF of replies matching a JSON schema: compact separators (", " and ": ", no free
    whitespace: a model cannot pad its reply without end, and forced keys jump forward), in the
    schema's key order."""
    return _json_chars_fixed(str(xgr.Grammar.from_json_schema(schema, any_whitespace=False)))


def _json_chars_fixed(ebnf: str) -> str:
    return ebnf.replace(_COUNTED_CHARS, _JSON_CHARS)


class CompiledGrammar:
    """A compiled spec: what a new sequence's matcher starts from."""

    def __init__(self, spec: GuidedDecoding, compiled: xgr.CompiledGrammar, vocab_size: int,
                 stop_ids: tuple[int, ...]) -> None:
        self.spec = spec
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.stop_ids = stop_ids

    def matcher(self) -> "SequenceGrammar":
        return SequenceGrammar(xgr.GrammarMatcher(self.compiled), self.vocab_size, self.stop_ids)


class SequenceGrammar:
    """The grammar state of one sequence (see the module's invariant)."""

    def __init__(self, matcher: xgr.GrammarMatcher, vocab_size: int,
                 stop_ids: tuple[int, ...]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.stop_ids = stop_ids
        self.dead_end = False       # the grammar allowed no token the vocabulary has: ended

    def fork(self) -> "SequenceGrammar":
        child = SequenceGrammar(self.matcher.fork(), self.vocab_size, self.stop_ids)
        child.dead_end = self.dead_end
        return child

    def accept(self, token: int) -> None:
        """Advance by a kept token. A token the mask allowed is always accepted, but for a stop
        token at a dead end (`masks` opens the stop tokens where the grammar allows nothing, so
        the reply ends instead of the step failing). Any other refusal is a bug (a caller
        bypassing the sampler), raised here rather than decoded wrong."""
        if self.matcher.accept_token(token):
            return
        if token in self.stop_ids:
            self.dead_end = True
            return
        raise RuntimeError(f"token {token} is not allowed by the sequence's grammar")

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted (or it reached a dead end):
        nothing more may follow."""
        return self.dead_end or self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def check_draft(self, draft: list[int]) -> int:
        """How many of draft's leading tokens the grammar accepts (the state is unchanged)."""
        n = 0
        for token in draft:
            if self.matcher.is_terminated() or not self.matcher.accept_token(token):
                break
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def draft_masks(self, draft: list[int]) -> torch.Tensor:
        """The packed masks at the sequence's next position and after each draft token,
        [len(draft) + 1, W]; draft must be one check_draft accepted whole."""
        bitmask = xgr.allocate_token_bitmask(len(draft) + 1, self.vocab_size)
        for j, token in enumerate(draft):
            self.matcher.fill_next_token_bitmask(bitmask, j)
            self.accept(token)
        self.matcher.fill_next_token_bitmask(bitmask, len(draft))
        if draft:
            self.matcher.rollback(len(draft))
        return _open_dead_ends(bitmask, self.vocab_size, self.stop_ids)

    def jump_forward(self, limit: int) -> list[int]:
        """Tokens of the text the grammar forces next (a fixed key, closing brackets), at most
        `limit`; [] where the next token is free. They are only a draft: the model verifies
        them under the masks, so the output is exactly what decoding one by one gives."""
        if limit <= 0 or self.matcher.is_terminated():
            return []
        tokens = self.matcher.find_jump_forward_tokens()[:min(limit, MAX_JUMP_TOKENS)]
        return tokens[:self.check_draft(tokens)]


def allowed_rows(grammars: list[SequenceGrammar | None], vocab_size: int) -> torch.Tensor | None:
    """The packed masks [S, W] of a batch: the tokens each row may take (all of them for a row
    without a grammar); None when no row has one."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return None
    bitmask = all_allowed(len(grammars), vocab_size)
    for i in rows:
        grammars[i].fill(bitmask, i)
    dead = ~live_rows(bitmask, vocab_size)
    if bool(dead.any()):                        # rare: one check for the whole batch
        for i in dead.nonzero()[:, 0].tolist():
            _open_dead_ends(bitmask[i:i + 1], vocab_size, grammars[i].stop_ids)
    return bitmask


def all_allowed(rows: int, vocab_size: int) -> torch.Tensor:
    """Packed masks that allow every token."""
    return xgr.allocate_token_bitmask(rows, vocab_size)


def apply_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [S, V] (float32) with the tokens bitmask [S, W] refuses set to -inf, in place (the
    sampler's rows are the step's own: nothing reads them unmasked after their logprobs are
    taken); returned."""
    return token_mask.mask_logits_(logits, bitmask)


def live_rows(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [S]: which rows allow at least one token below vocab_size."""
    full, rest = divmod(vocab_size, 32)
    live = bitmask[:, :full].ne(0).any(dim=1)
    if rest:
        live |= (bitmask[:, full] & ((1 << rest) - 1)).ne(0)
    return live


def force_token(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Row `row` allows `token` alone (a token the engine writes itself: the closing marker of a
    spent thinking budget, core/reasoning_budget.py); in place."""
    word, bit = divmod(token, 32)
    bitmask[row].zero_()
    bitmask[row, word] = _bit(bit)


def allows(bitmask: torch.Tensor, row: int, token: int) -> bool:
    word, bit = divmod(token, 32)
    return bool(int(bitmask[row, word]) >> bit & 1)


def _open_dead_ends(bitmask: torch.Tensor, vocab_size: int, stop_ids: tuple[int, ...]) -> torch.Tensor:
    """Rows that allow no token (the grammar wants text no token of this vocabulary writes)
    allow the stop tokens instead, so the sequence ends there; in place, returned."""
    for i in (~live_rows(bitmask, vocab_size)).nonzero()[:, 0].tolist():
        for token in stop_ids:
            word, bit = divmod(token, 32)
            bitmask[i, word] |= _bit(bit)
    return bitmask


def _bit(bit: int) -> int:
    """Bit `bit` of an int32 word as a Python int of the same sign (bit 31 is the sign)."""
    return (1 << bit) - (1 << 32) * (bit == 31)


def step_masks(scheduled: list) -> dict[int, torch.Tensor]:
    """Per seq_id of each scheduled sequence (core.scheduler.ScheduledSeq) that samples this step
    under a grammar: its packed masks [1 + d, W] at its next position and after each of its d draft
    tokens (d = 0 without a draft). Reads the matchers and leaves them as they were."""
    masks = {}
    for item in scheduled:
        seq = item.seq
        if seq.grammar is not None and item.samples:
            draft = seq.token_ids[len(seq.token_ids) - seq.num_draft_tokens:] \
                if seq.num_draft_tokens else []
            masks[seq.seq_id] = seq.grammar.draft_masks(draft)
    return masks
