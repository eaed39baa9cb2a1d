"""Beam search (placeholder until part 2)."""


def step(engine, group, seq, logits):
    raise NotImplementedError("beam search is not implemented yet")
