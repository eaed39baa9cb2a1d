"""Continue: extend a reply that stopped early (Stop, length limit, full KV cache, crash) in place.

The continued request's prompt is the original prompt's token ids followed by the reply's token
ids, exactly as generated (re-tokenizing the reply's text could give other ids). Every full block
of that prefix is still in the prefix cache when nothing evicted it, so the engine skips their
prefill (`RequestMetrics.num_cached_tokens` says how many). For greedy decoding the continued
tokens are exactly the ones an uninterrupted reply would have had; with sampling they follow the
same distribution. Penalties that count only generated tokens (presence, frequency) then count
the continued part only.
"""

from __future__ import annotations

import dataclasses

from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.outputs import FINISH_DETAILS, CompletionOutput


@dataclasses.dataclass
class ContinueRequest:
    prompt_token_ids: list[int]       # prompt + the reply so far: what the engine is sent
    params: SamplingParams            # max_tokens lowered by what the reply already has
    num_reply_tokens: int             # tokens of the reply before continuing


def continue_request(prompt_token_ids: list[int], reply_token_ids: list[int],
                     params: SamplingParams, context_limit: int | None = None) -> ContinueRequest:
    """The request that resumes a reply from its stored token ids.

    `params` are the reply's original settings; a max_tokens already reached by the reply is
    an error (raise max_tokens to continue), as is an empty prompt or reply. With
    `context_limit` (LLMEngine.context_limit()), a prompt and reply that leave no room for one
    more token are an error too: such a reply (e.g. one stopped by a full KV cache) can only
    go on from a shorter prompt (ContextWindow.fit with continue_final_message=True).
    """
    if not prompt_token_ids:
        raise ValueError("prompt_token_ids must not be empty")
    if not reply_token_ids:
        raise ValueError("reply_token_ids must not be empty: there is nothing to continue "
                         "(send the prompt as a new request)")
    done = len(reply_token_ids)
    if context_limit is not None and len(prompt_token_ids) + done >= context_limit:
        raise ValueError(f"the prompt ({len(prompt_token_ids)} tokens) and the reply ({done}) "
                         f"fill the context limit of {context_limit} tokens: leave out older "
                         "messages to continue")
    max_tokens = params.max_tokens
    if max_tokens is not None:
        if max_tokens <= done:
            raise ValueError(f"max_tokens is {max_tokens} and the reply already has {done} "
                             "tokens: raise max_tokens to continue it")
        max_tokens -= done
    return ContinueRequest([*prompt_token_ids, *reply_token_ids],
                           dataclasses.replace(params, max_tokens=max_tokens), done)


def continued_text(tokenizer, reply_token_ids: list[int], new_token_ids: list[int]) -> str:
    """The whole reply's text after continuing. Decoded in one piece: a character whose bytes
    span the cut is whole here, where joining the two texts would break it."""
    return tokenizer.decode([*reply_token_ids, *new_token_ids], skip_special_tokens=True)


def stop_explanation(output: CompletionOutput) -> str | None:
    """A footer line for a reply that did not reach its natural end, or None when it did."""
    if not output.can_continue:
        return None
    detail = output.finish_detail or output.finish_reason or "abort"
    return f"stopped: {FINISH_DETAILS.get(detail, detail)}"
