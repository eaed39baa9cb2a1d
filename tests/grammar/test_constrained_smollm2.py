"""Constrained decoding on the real bundled SmolLM2-135M-Instruct (its GGUF, its chat template):
replies at temperature 1.0 over many seeds parse and validate, with parallel samples, n-gram
speculation on, and jump-forward; and a schema's forced text is drafted and kept."""

from __future__ import annotations

import json

import jsonschema
import pytest

from localpaged import LLM, SamplingParams
from localpaged.core.guided import GuidedDecoding

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 40},
                         "country": {"type": "string", "maxLength": 40},
                         "population_millions": {"type": "number"},
                         "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 60},
                                       "maxItems": 3},
                         "capital": {"type": "boolean"}},
          "required": ["city", "country", "population_millions", "landmarks", "capital"],
          "additionalProperties": False}


def test_replies_validate_over_many_seeds(smollm2_gguf):
    llm = LLM(smollm2_gguf, speculation="ngram")
    prompt = llm.apply_chat_template([{"role": "user", "content":
                                       "Describe Paris as JSON with its landmarks."}])
    guided = GuidedDecoding.json_schema(SCHEMA)
    params = [SamplingParams(temperature=1.0, seed=seed, n=2, max_tokens=200, guided=guided)
              for seed in range(5)]
    outs = llm.generate([prompt] * len(params), params)
    replies = [c for o in outs for c in o.outputs]
    for c in replies:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert llm.engine.jump_forward_tokens > 0       # keys and separators were drafted
    assert len({c.text for c in replies}) > len(replies) // 2
