"""Inference after conversion: KV-cache generation, HF `generate` parity, MindIR export.

`batch` (prompts as HF pads them), `sampling` (HF's processors, numpy), `generate` (the loop over a
step runner), `runners` (the bundled model with and without its KV cache), `mindir` (export and run
the prefill and decode graphs), `compare_hf` (HF `generate` with the same settings, judged).
"""
