"""The engine's core: requests, KV block accounting, scheduling, beam search.

Block accounting here deals in block ids only (no tensors); bytes move in `runner/` and
`kernels/`. Nothing here imports from a folder above it (models, quant, runner, engine, chat, api).
"""
