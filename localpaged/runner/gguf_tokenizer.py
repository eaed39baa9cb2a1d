"""A GGUF file's tokenizer, built from its metadata with the `tokenizers` library.

    tokenizer_from_metadata(metadata) -> a transformers PreTrainedTokenizerFast
    UnsupportedVocabulary                the file's vocabulary is not one built here (why)

A GGUF holds its tokenizer as llama.cpp's metadata: `tokenizer.ggml.model` (the kind), `.pre` (the
pre-tokenizer), `.tokens`, `.token_type`, `.merges` or `.scores`, the special token ids and
`tokenizer.chat_template`. transformers' GGUF conversion (integrations/gguf/
gguf_tokenizer_mapping.py) is the reference: this builds the same backend tokenizer, step for step,
without what made it slow (gguf-py's reader and a config built only to pick a class), and wraps
it with the same settings (special tokens, add_bos_token, chat template), so encode, decode,
apply_chat_template and the added tokens are those of a transformers conversion of the file.

Built here: byte-level BPE (`gpt2`: SmolLM2, Qwen, Llama 3) with a pre-tokenizer transformers
knows or keeps GPT-2's split for, and Gemma's SentencePiece-style BPE (`llama` in a `gemma*` file,
merges recovered from the token order). Anything else raises UnsupportedVocabulary naming why;
the caller converts that file through transformers instead (runner/gguf_meta.py).
"""

from __future__ import annotations

import inspect

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES
from transformers.models.gemma.tokenization_gemma import GemmaTokenizer
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

CONTROL, USER_DEFINED = 3, 4                  # llama.cpp's token types
# Pre-tokenizer names transformers leaves on GPT-2's own split (it has no regex of theirs); the
# others it does not know get the same, but may want another split: those are not built here.
GPT2_SPLIT = frozenset({"default", "gpt2", "smollm"})
GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})
_WRAPPERS = {"GemmaTokenizer": GemmaTokenizer, "Qwen2Tokenizer": Qwen2Tokenizer}
_SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


class UnsupportedVocabulary(ValueError):
    """The file's tokenizer is not one this module builds; the message says why."""


def tokenizer_from_metadata(metadata: dict) -> PreTrainedTokenizerFast:
    """The tokenizer of a GGUF file from its metadata (runner/gguf_metadata.py read_metadata)."""
    kind = metadata.get("tokenizer.ggml.model")
    architecture = metadata.get("general.architecture")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise UnsupportedVocabulary("the file has no tokenizer.ggml.tokens")
    types = metadata.get("tokenizer.ggml.token_type") or []
    if kind == "gpt2":
        backend = _byte_level(metadata, tokens, types)
    elif kind == "llama" and architecture in GEMMA_ARCHITECTURES:
        backend = _gemma(tokens, types)
    else:
        raise UnsupportedVocabulary(f"tokenizer.ggml.model {kind!r} in a {architecture!r} file")
    return _wrap(backend, _settings(metadata, tokens, kind), architecture)


def _byte_level(metadata: dict, tokens: list[str], types: list[int]) -> Tokenizer:
    """transformers' byte_level_tokenizer: GPT2Tokenizer's BPE over the tokens (any not spelled
    in GPT-2's byte alphabet re-spelled in it), the file's merges, its split regex."""
    pre = metadata.get("tokenizer.ggml.pre")
    split = GGUF_PRE_TOKENIZER_SPLITS.get(pre)
    if split is None and pre not in GPT2_SPLIT:
        raise UnsupportedVocabulary(f"pre-tokenizer tokenizer.ggml.pre {pre!r} is not known")
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise UnsupportedVocabulary("a byte-level vocabulary without tokenizer.ggml.merges")
    spelling = bytes_to_unicode()
    alphabet = frozenset(spelling.values())
    vocab = {token if alphabet.issuperset(token)
             else "".join(spelling[b] for b in token.encode("utf-8")): index
             for index, token in enumerate(tokens)}
    backend = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                            dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                            fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a mislabel: adding it would grow
    # the vocabulary past the model's (transformers skips it too).
    _add_tokens(backend, vocab, ["<|endoftext|>"], tokens, types, alphabet.issuperset)
    if split is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return backend


def _gemma(tokens: list[str], types: list[int]) -> Tokenizer:
    """transformers' gemma_tokenizer: GemmaTokenizer's byte-fallback BPE over the tokens (a token
    of spaces alone spelled with '▁' as the model's own tokenizer has it), merges recovered from
    the vocabulary in the order the tokens stand in the file."""
    respelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(respelled)}
    backend = Tokenizer(BPE(vocab=vocab, merges=_merges_by_position(respelled, vocab),
                            fuse_unk=True, unk_token="<unk>", dropout=None, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                                 invert=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    _add_tokens(backend, vocab, ["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"], tokens, types,
                lambda _: True)
    return backend


def _merges_by_position(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """transformers' generate_merges(vocab, {token: -position}): every split of a token into two
    tokens of the vocabulary; tokens in file order (a repeated token at its last position), a
    token's splits longest left part first."""
    order = list(vocab) if len(vocab) == len(tokens) else sorted(vocab, key=vocab.__getitem__)
    has = vocab.__contains__
    return [(t[:cut], t[cut:]) for t in order for cut in range(len(t) - 1, 0, -1)
            if has(t[:cut]) and has(t[cut:])]


def _add_tokens(backend: Tokenizer, vocab: dict[str, int], named: list[str], tokens: list[str],
                types: list[int], keep) -> None:
    """The added tokens of transformers' conversion, in its order: `named`, the special tokens
    the vocabulary's transformers class registers by default (its bos/eos/unk/...); then, as
    add_gguf_special_tokens does, the file's control tokens that `keep` accepts as special
    tokens and its user-defined ones (like `<think>`) already in the vocabulary as plain added
    tokens, all matched whole in text. The file's own spellings are looked up, so a
    user-defined token the vocabulary spells otherwise (Gemma's runs of spaces) is not added."""
    backend.add_special_tokens([AddedToken(t, special=True) for t in named])
    control = [t for t, kind in zip(tokens, types) if kind == CONTROL and keep(t)]
    if control:
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                    for t in control])
    added = set(named).union(control)
    user = [AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, types)
            if kind == USER_DEFINED and (t in vocab or t in added)]
    if user:
        backend.add_tokens(user)


def _settings(metadata: dict, tokens: list[str], kind: str) -> dict:
    """transformers' get_gguf_tokenizer's tokenizer_config: the chat template, add_bos/eos_token
    as the file says (a SentencePiece vocabulary that does not say adds BOS, as llama.cpp does),
    and the special tokens by their ids."""
    settings = {}
    for key, name in (("tokenizer.chat_template", "chat_template"),
                      ("tokenizer.ggml.add_bos_token", "add_bos_token"),
                      ("tokenizer.ggml.add_eos_token", "add_eos_token")):
        if key in metadata:
            settings[name] = metadata[key]
    if kind == "llama":
        settings.setdefault("add_bos_token", True)
    for name, key in _SPECIAL_IDS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if token_id is not None and not 0 <= token_id < len(tokens):
            raise UnsupportedVocabulary(f"tokenizer.ggml.{key} {token_id} is outside the "
                                        f"vocabulary of {len(tokens)} tokens")
        settings[name] = tokens[token_id] if token_id is not None else None
    return settings


def _wrap(backend: Tokenizer, settings: dict, architecture: str) -> PreTrainedTokenizerFast:
    """The class transformers' AutoTokenizer gives a GGUF of this architecture around the
    backend, with that class's defaults for the tokens the file does not name.

    Built the way those classes build themselves (the backend set, then TokenizersBackend's
    __init__) rather than through `tokenizer_object=`, which deep-copies the backend: a round
    trip through its JSON, as long as the build itself for a large vocabulary."""
    cls = _WRAPPERS.get(TOKENIZER_MAPPING_NAMES.get(architecture), PreTrainedTokenizerFast)
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if name not in ("self", "vocab", "merges") and p.default is not p.empty}
    tokenizer = cls.__new__(cls)
    tokenizer._tokenizer = backend
    PreTrainedTokenizerFast.__init__(tokenizer, **{**defaults, **settings})
    if cls is Qwen2Tokenizer:             # what its __init__ does after TokenizersBackend's
        tokenizer.add_tokens([AddedToken(t, special=True) for t in tokenizer.all_special_tokens])
    return tokenizer
