"""LLM: the offline API (modelled on vLLM's): generate, chat, beam_search, stats."""

from __future__ import annotations

from dataclasses import fields

from tqdm.auto import tqdm

from localpaged.core.config import EngineConfig
from localpaged.core.request import BeamParams
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.llm_engine import LLMEngine
from localpaged.engine.multimodal import ImagePrompt
from localpaged.engine.outputs import EngineStats, RequestOutput
from localpaged.runner.model_source import DEFAULT_MODEL

Prompt = str | list[int] | ImagePrompt
Messages = list[dict]


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, **kwargs) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown LLM arguments: {sorted(unknown)}; known: {sorted(known - {'model'})}")
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        prompts = _as_prompt_list(prompts)
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        else:
            params = [params or SamplingParams()] * len(prompts)
        groups = [self.engine.make_group(p, sp) for p, sp in zip(prompts, params)]
        return self._run(groups, use_tqdm)

    def chat(self, messages: Messages | list[Messages], params: SamplingParams | None = None,
             use_tqdm: bool = False, add_generation_prompt: bool = True) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.apply_chat_template(c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, params, use_tqdm)

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        return apply_chat_template(self.tokenizer, messages, add_generation_prompt)

    def image_prompt(self, prompt: str | Messages, images: list) -> ImagePrompt:
        """A prompt with images (PIL images, in order) for generate: `prompt` is text holding the
        processor's image marker once per image ("<image>" for Idefics3), or chat messages
        whose content parts include {"type": "image"} once per image. A ValueError for a
        model without a vision tower, or markers unlike the images."""
        if self.engine.images is None:
            raise ValueError("this model takes no images" + (
                " (its image processor could not be loaded: see the log)"
                if self.engine.encoder is not None else " (it has no vision tower)"))
        if isinstance(prompt, str):
            return self.engine.images.prompt(prompt, images)
        return self.engine.images.chat(prompt, images)

    def beam_search(self, prompts: Prompt | list[Prompt], beam_width: int, max_tokens: int,
                    length_penalty: float = 1.0, early_stopping: bool | str = False,
                    ignore_eos: bool = False) -> list[RequestOutput]:
        """Beam search in the engine: beams fork from their parents and share blocks."""
        if beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got {beam_width}")
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
        beam = BeamParams(beam_width, length_penalty, early_stopping)
        groups = [self.engine.make_group(p, params, beam=beam) for p in _as_prompt_list(prompts)]
        return self._run(groups, False)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (held blocks stay); benchmarks start cold with it."""
        self.engine.block_manager.reset_prefix_cache()

    def stats(self, with_block_tables: bool = False) -> EngineStats:
        return self.engine.stats(with_block_tables)

    def _run(self, groups, use_tqdm: bool) -> list[RequestOutput]:
        for g in groups:
            self.engine.add_group(g)
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(groups), desc="generating", disable=not use_tqdm)
        while len(done) < len(groups):
            for out in self.engine.step():
                if out.finished and out.request_id not in done:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[g.request_id] for g in groups]


def apply_chat_template(tokenizer, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True, return_dict=False)
    return list(ids)


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, (str, ImagePrompt)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)
