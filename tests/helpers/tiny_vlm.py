"""Tiny random vision-language models (Idefics3, SmolVLM, Gemma 3) with their processor, saved
in a temp dir, and seeded random images: for engine-vs-transformers tests of prompts with images.

The tokenizer has one token per printable ASCII character plus the processor's special tokens
(<image>, <fake_token_around_image>, <global-img>, <row_i_col_j>, <end_of_utterance>) and a
newline (the processor writes one after each row of crops); the vision tower sees 32x32 crops
in 8x8 patches (16 patches, 4 image tokens per crop after the pixel shuffle); images up to 64
pixels are split into a grid of up to 2x2 crops plus the global view. The SmolVLM model is
saved with the files SmolVLM's repos have (SmolVLMImageProcessor's preprocessor_config.json,
processor_config.json naming SmolVLMProcessor, chat_template.json); transformers builds
SmolVLMProcessor only with torchvision and num2words (its videos), so `hf_processor` gives
one made without its __init__ for its images path (`smolvlm_processor`).
`write_idefics3_gguf`: the Idefics3 model as llama.cpp's text GGUF and mmproj file.

Gemma 3 (`build_gemma3`): its own character tokenizer (newline included, BOS added as Gemma's
is, so a chat template that writes <bos> itself must not get a second one) with
<start_of_image>, <end_of_image>, <image_soft_token> and the turn markers; images resized to
32x32, 8x8 patches pooled to 16 image tokens (a span of 20 tokens with the markers); a text
model of 4 layers, three of them sliding over 8 tokens, so that an image's span is longer than
the window (transformers limits its two-way attention to the window there too).
"""

from __future__ import annotations

import functools
import json
import os

import gguf
import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (AutoModelForImageTextToText, AutoProcessor, AutoTokenizer, Gemma3Config,
                          Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil, Gemma3Processor, Idefics3Config,
                          Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil, Idefics3Processor,
                          PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMForConditionalGeneration,
                          SmolVLMImageProcessorPil, SmolVLMProcessor)

SPECIAL = (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
           + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])
VOCAB = 160                # 3 control ids, 95 printable characters, the 40 specials, newline, room
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% else %}<image>"
    "{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")

IMAGE_SIZES = dict(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              image_size=32, patch_size=8)
TEXT = dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {"idefics3": (Idefics3Config, Idefics3ForConditionalGeneration),
            "smolvlm": (SmolVLMConfig, SmolVLMForConditionalGeneration)}


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"<{i}>": i for i in range(3)}
    vocab.update({chr(c): c - 29 for c in range(32, 127)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                                   pad_token="<0>", unk_token="<0>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    fast.add_tokens(["\n"])                                     # id 138
    return fast


def _random_model(model_class, config, seed: int):
    """model_class(config) with weights drawn N(0, 0.08) from `seed`: sharper than the default
    init, so that images matter."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
        for p in model.parameters():
            p.data.normal_(0, 0.08)
    return model


def build(root: str, family: str = "idefics3", seed: int = 0) -> str:
    """A random model of `family` saved to root/tiny-<family> (once); returns the path."""
    path = os.path.join(root, f"tiny-{family}")
    if os.path.isdir(path):
        return path
    tok = tokenizer()
    config_class, model_class = FAMILIES[family]
    config = config_class(vision_config=VISION, text_config=TEXT, scale_factor=2,
                          image_token_id=tok.convert_tokens_to_ids("<image>"))
    _random_model(model_class, config, seed).save_pretrained(path)
    if family == "idefics3":
        image_processor = Idefics3ImageProcessorPil(**IMAGE_SIZES)
        Idefics3Processor(image_processor, tok, image_seq_len=4,
                          chat_template=CHAT_TEMPLATE).save_pretrained(path)
    else:
        tok.save_pretrained(path)
        SmolVLMImageProcessorPil(**IMAGE_SIZES).save_pretrained(path)
        for name, content in (("processor_config.json", {"image_seq_len": 4,
                                                          "processor_class": "SmolVLMProcessor"}),
                              ("chat_template.json", {"chat_template": CHAT_TEMPLATE})):
            with open(os.path.join(path, name), "w") as f:
                json.dump(content, f)
    return path


def smolvlm_processor(path: str) -> SmolVLMProcessor:
    """transformers' SmolVLMProcessor of the SmolVLM model at `path`, for images: made without
    its __init__, which builds the video processor (torchvision) and checks for num2words (the
    videos' frame count), and given the attributes that __init__ and from_pretrained give it."""
    with open(os.path.join(path, "processor_config.json")) as f:
        seq_len = json.load(f)["image_seq_len"]
    processor = SmolVLMProcessor.__new__(SmolVLMProcessor)
    processor.tokenizer = AutoTokenizer.from_pretrained(path)
    processor.image_processor = SmolVLMImageProcessorPil.from_pretrained(path)
    processor.chat_template = CHAT_TEMPLATE
    processor.image_seq_len = seq_len
    processor.fake_image_token, processor.image_token = "<fake_token_around_image>", "<image>"
    processor.global_image_token, processor.video_token = "<global-img>", "<video>"
    processor.end_of_utterance_token = "<end_of_utterance>"
    processor.image_token_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    return processor


GEMMA_SPECIAL = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                 "image_token": "<image_soft_token>"}
GEMMA_VOCAB = 128          # 3 control ids, newline, 95 printable characters, 5 specials, room
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% else %}"
    "<start_of_image>{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
GEMMA_TEXT = dict(vocab_size=GEMMA_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
                  sliding_window=8, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, layer_types=["sliding_attention", "sliding_attention",
                                               "full_attention", "sliding_attention"])
GEMMA_VISION = dict(VISION, vision_use_head=False)


def gemma3_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"<{i}>": i for i in range(3)}
    vocab["\n"] = 3
    vocab.update({chr(c): c - 28 for c in range(32, 127)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<1> $A", special_tokens=[("<1>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                                   pad_token="<0>", unk_token="<0>", extra_special_tokens=GEMMA_SPECIAL)
    fast.add_special_tokens({"additional_special_tokens": list(GEMMA_SPECIAL.values())
                             + ["<start_of_turn>", "<end_of_turn>"]})
    return fast


def build_gemma3(root: str, seed: int = 0, llamacpp: bool = False) -> str:
    """A random Gemma3ForConditionalGeneration with its processor, saved to root/tiny-gemma3;
    `llamacpp`: one a GGUF holds as it is (root/tiny-gemma3-llamacpp): llama.cpp's attention
    scale 1/sqrt(head_dim) and its layer pattern (every sixth layer full: 6 layers)."""
    path = os.path.join(root, "tiny-gemma3" + ("-llamacpp" if llamacpp else ""))
    if os.path.isdir(path):
        return path
    tok = gemma3_tokenizer()
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in GEMMA_SPECIAL.items()}
    text = GEMMA_TEXT
    if llamacpp:
        text = {k: v for k, v in GEMMA_TEXT.items() if k != "layer_types"}
        text.update(query_pre_attn_scalar=GEMMA_TEXT["head_dim"], num_hidden_layers=6)
    config = Gemma3Config(text_config=text, vision_config=GEMMA_VISION, mm_tokens_per_image=16,
                          image_token_index=ids["image_token"], boi_token_index=ids["boi_token"],
                          eoi_token_index=ids["eoi_token"])
    _random_model(Gemma3ForConditionalGeneration, config, seed).save_pretrained(path)
    Gemma3Processor(Gemma3ImageProcessorPil(size={"height": 32, "width": 32}), tok,
                    image_seq_length=16, chat_template=GEMMA_TEMPLATE).save_pretrained(path)
    return path


def write_gemma3_gguf(root: str) -> tuple[str, str]:
    """(build_gemma3(root, llamacpp=True), a folder holding it as llama.cpp's two files:
    model-F32.gguf, the text model with the character vocabulary as a byte-level one, and
    mmproj-model-f32.gguf)."""
    from helpers import gemma3_gguf

    def write(folder: str, config, text: dict, vision: dict) -> None:
        gemma3_gguf.write_text(os.path.join(folder, "model-F32.gguf"), config.text_config, text,
                               byte_level(gemma3_tokenizer(), GEMMA_VOCAB), (1, 2),
                               chat_template=GEMMA_TEMPLATE, pre="default")
        gemma3_gguf.write_mmproj(os.path.join(folder, "mmproj-model-f32.gguf"), config, vision)
    return _gguf_folder(build_gemma3(root, llamacpp=True), os.path.join(root, "tiny-gemma3-gguf"),
                        "model.language_model.", ("model.vision_tower.", "model.multi_modal_projector."),
                        write)


def write_idefics3_gguf(root: str) -> tuple[str, str]:
    """(build(root, "idefics3"), a folder holding it as llama.cpp's two files: model-F32.gguf,
    the Llama text model with the character vocabulary as a byte-level one and the chat
    template, and mmproj-model-f32.gguf)."""
    from helpers import idefics3_gguf

    def write(folder: str, config, text: dict, vision: dict) -> None:
        idefics3_gguf.write_text(os.path.join(folder, "model-F32.gguf"), config.text_config, text,
                                 byte_level(tokenizer(), VOCAB), (1, 2), chat_template=CHAT_TEMPLATE)
        idefics3_gguf.write_mmproj(os.path.join(folder, "mmproj-model-f32.gguf"), config, vision,
                                   longest_edge=IMAGE_SIZES["size"]["longest_edge"])
    return _gguf_folder(build(root, "idefics3"), os.path.join(root, "tiny-idefics3-gguf"),
                        "model.text_model.", ("model.vision_model.", "model.connector."), write)


def _gguf_folder(path: str, folder: str, text_prefix: str, vision_prefixes: tuple[str, ...],
                 write) -> tuple[str, str]:
    """(path, folder), the model at `path` written into `folder` once by write(folder, config,
    the text model's weights under model.* and lm_head.*, the tower's without `model.`)."""
    if not os.path.isdir(folder):
        os.makedirs(folder)
        model = hf_model(path)
        state = model.state_dict()
        text = {k.replace(text_prefix, "model."): v for k, v in state.items()
                if k.startswith((text_prefix, "lm_head."))}
        vision = {k.removeprefix("model."): v for k, v in state.items()
                  if k.startswith(vision_prefixes)}
        write(folder, model.config, text, vision)
    return path, folder


def byte_level(tok: PreTrainedTokenizerFast, size: int) -> tuple[list, list, list]:
    """A character tokenizer's vocabulary as a GGUF's byte-level one of `size` tokens, the
    same ids for every text the tests write: its tokens (the added ones CONTROL, "<...>"),
    [PAD] tokens up to size - 1, and "zq", the one merge ("z q", never met in the tests'
    text), as a byte-level vocabulary needs merges. (tokens, types, merges)"""
    tokens = [tok.convert_ids_to_tokens(i) or f"[PAD{i}]" for i in range(size - 1)] + ["zq"]
    types = [int(gguf.TokenType.CONTROL) if t.startswith("<") and len(t) > 1 else
             int(gguf.TokenType.UNUSED) if t.startswith("[PAD") else int(gguf.TokenType.NORMAL)
             for t in tokens]
    return tokens, types, ["z q"]


def image(seed: int, height: int = 40, width: int = 70) -> Image.Image:
    """A random RGB image from `seed`."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@functools.lru_cache(maxsize=4)
def hf_model(path: str):
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=2)
def hf_processor(path: str):
    """transformers' processor of the model at `path` (SmolVLM's: smolvlm_processor)."""
    if os.path.basename(path).startswith("tiny-smolvlm"):
        return smolvlm_processor(path)
    return AutoProcessor.from_pretrained(path)


def hf_inputs(path: str, text: str, images: list) -> dict:
    """transformers' processor output for text with image markers (ids, pixels, masks)."""
    return dict(hf_processor(path)(text=[text], images=[images] if images else None,
                                   return_tensors="pt"))


def hf_greedy(path: str, inputs: dict, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `inputs` (EOS ignored) and each chosen token's
    logprob (log_softmax of the float32 logits)."""
    with torch.inference_mode():
        out = hf_model(path).generate(**inputs, max_new_tokens=max_new_tokens,
                                      min_new_tokens=max_new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0, output_scores=True,
                                      return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, tokens)]
    return tokens, logprobs


LOGPROB_TOL = 1e-4


def check_greedy(path: str, inputs: dict, out, max_tokens: int) -> None:
    """The engine's output `out` equals transformers' greedy tokens on `inputs`, and its chosen
    tokens' logprobs are within LOGPROB_TOL of transformers'."""
    tokens, logprobs = hf_greedy(path, inputs, max_tokens)
    comp = out.outputs[0]
    assert comp.token_ids == tokens
    engine_lps = [lp.logprob for lp in comp.logprobs]
    assert len(engine_lps) == len(logprobs) == max_tokens
    assert max(abs(a - b) for a, b in zip(engine_lps, logprobs)) < LOGPROB_TOL


def chat(*turns) -> list[dict]:
    """(role, parts) turns; a part is text, or an int: an image marker."""
    return [{"role": role, "content": [{"type": "image"} if isinstance(p, int) else
                                       {"type": "text", "text": p} for p in parts]}
            for role, parts in turns]


def conversation(question: str, reply_role: str = "assistant") -> list[dict]:
    """An image in the middle of a conversation: text turns before it and text after it."""
    return chat(("user", ["Hello there."]), (reply_role, ["Hi! How can I help?"]),
                ("user", ["Look at this: ", 0, f" {question}"]))
