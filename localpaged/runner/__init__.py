"""From a scheduled batch to logits: model loading, KV tensors, the model runner and its fast
paths (CUDA graphs, the batch-1 CPU loop), the start-up self-check, prompt logprobs."""
