"""The benchmark workload: 16 chat requests of mixed prompt lengths (docs/benchmarks.md,
'Throughput and KV memory')."""

from __future__ import annotations

TOPICS = ["the water cycle", "how a CPU cache works", "the French revolution", "photosynthesis",
          "why the sky is blue", "compound interest", "the rules of chess", "how vaccines work",
          "black holes", "the history of the printing press", "how to bake bread",
          "plate tectonics", "the immune system", "how airplanes fly", "the stock market",
          "machine learning"]

CONTEXT = ("Here are my notes so far. " + "The topic has a long history, many open questions, "
           "and several competing explanations that experts still debate today. ") 


def chats(num: int = 16) -> list[list[dict]]:
    """Short questions and long ones (with pasted notes), alternating: prompts of ~30-330 tokens."""
    out = []
    for i in range(num):
        topic = TOPICS[i % len(TOPICS)]
        notes = CONTEXT * (i % 4) * 3
        out.append([{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"{notes}Explain {topic} in detail."}])
    return out
