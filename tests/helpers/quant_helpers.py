"""Logits of every position of a token sequence from an engine's model (one fresh prefill).

Used for teacher-forced comparisons (perplexity goes through prompt logprobs:
localpaged.runner.prompt_logprobs.perplexity); needs an engine with no request running
(the prefill writes blocks 0.. of its KV cache).
"""

from __future__ import annotations

import torch

from localpaged.models.attention import AttentionMetadata


@torch.inference_mode()
def sequence_logits(llm, ids: list[int]) -> torch.Tensor:
    eng = llm.engine
    T, B = len(ids), eng.config.block_size
    nb = -(-T // B)
    assert nb <= eng.kv_cache.num_blocks if hasattr(eng.kv_cache, "num_blocks") else True
    i32 = dict(dtype=torch.int32, device=eng.device)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(T, dtype=torch.long, device=eng.device), num_decode_tokens=0,
        decode_block_tables=torch.zeros((0, 0), **i32), decode_seq_lens=torch.zeros(0, **i32),
        prefill_block_tables=torch.arange(nb, **i32).view(1, nb),
        prefill_query_start_loc=torch.tensor([0, T], **i32), prefill_seq_lens=torch.tensor([T], **i32))
    hidden = eng.model(torch.tensor(ids, device=eng.device), torch.arange(T, device=eng.device),
                       eng.kv_cache.layers, meta, eng.backend)
    return eng.model.compute_logits(hidden).float().cpu()


def compare_where_margins_allow(ref_llm, llm, prompt: list[int], ref_ids: list[int], got: list[int],
                                margin: float) -> int:
    """`margin_rule` with both engines' teacher-forced logits over prompt + the reference's
    greedy `ref_ids`. Returns how many generated tokens were compared."""
    lf, lq = sequence_logits(ref_llm, prompt + ref_ids), sequence_logits(llm, prompt + ref_ids)
    return margin_rule(lf, lq, len(prompt), ref_ids, got, margin)


def margin_rule(lf: torch.Tensor, lq: torch.Tensor, prompt_len: int, ref_ids: list[int],
                got: list[int], margin: float) -> int:
    """The greedy-margin rule. `lf` (reference) and `lq` are teacher-forced logits over prompt +
    `ref_ids` (the reference's greedy tokens); they differ by < margin / 2, so a winner can change
    only where the reference's top-2 margin is below `margin`. Greedy `got` equals `ref_ids` up to
    their first difference, which must fall at such a near-tie (the contexts differ after it);
    teacher-forced over prompt + reply, every clear reference winner stays the winner. Returns how
    many generated tokens were compared (equal before the first difference), so that a caller can
    check the rule left real ones."""
    worst = float((lf - lq).abs().max())
    assert worst < margin / 2, f"logits differ by {worst:.4g} from the reference's (< {margin / 2})"
    top2 = lf[prompt_len - 1:-1].topk(2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1]).tolist()
    same = next((i for i, (a, b) in enumerate(zip(got, ref_ids)) if a != b), len(ref_ids))
    if same < len(ref_ids):
        assert gaps[same] < margin, (f"greedy token {same} differs ({got[same]} vs {ref_ids[same]}) "
                                     f"where the reference's top-2 margin is {gaps[same]:.4g}")
    top2 = lf.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) >= margin
    assert torch.equal(lf.argmax(-1)[clear], lq.argmax(-1)[clear]), "a clear winner changed"
    return same


@torch.inference_mode()
def hf_sequence_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits of every position of `ids` from a transformers model (one forward pass), float32."""
    return model(torch.tensor([ids])).logits[0].float()


def dequantized_hf_model(llm, path: str):
    """transformers' model of `path` holding the weights `llm` (a quantized engine) holds, each
    dequantized to float32 from the form it is stored in (q/k/v and gate/up split back out of
    the fused rows). Norms and biases stay the checkpoint's floats, as the engine keeps them."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = llm.engine.model
    weights = {}
    for name, module in ours.named_modules():
        if hasattr(module, "packed"):
            weights[name] = module.packed.dequantize().float()
        elif isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2:
            weights[name] = module.weight.detach().float()
    state = model.state_dict()
    for name, w in weights.items():
        prefix, last = name.rsplit(".", 1) if "." in name else ("", name)
        parts = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                 "gate_up_proj": ["gate_proj", "up_proj"]}.get(last, [last])
        keys = [f"{prefix}.{part}.weight" if prefix else f"{part}.weight" for part in parts]
        sizes = [state[k].shape[0] for k in keys]
        assert sum(sizes) == w.shape[0], (name, sizes, w.shape)
        for k, rows in zip(keys, w.split(sizes)):
            assert state[k].shape == rows.shape, (k, state[k].shape, rows.shape)
            state[k] = rows
    model.load_state_dict(state)
    return model
