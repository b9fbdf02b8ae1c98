"""The generation loop, HF `generate`'s semantics over any step runner.

    runner = CachedRunner(model, batch=2, prefill_len=8, cache_len=136)   # or UncachedRunner, MindIRRunner
    result = generate(runner, make_batch(prompts, pad, vocab), 128, Sampling(), stop_ids=[2], pad_id=2)

A runner computes the next-token logits: `prefill(inputs)` for the padded prompts (the int32
arrays of `Batch.prefill`), then `decode(tokens, positions, start, key_mask)` for one token per
row. The loop chooses tokens (`Sampling`), pads rows that have stopped with `pad_id` and stops
when every row has met a stop token or after max_new_tokens, as HF does; it records every
step's raw logits (fp32, what HF's `output_logits` returns) when asked, and the times.

The times keep the graph compiles out of the decode rate: the first token (prefill and choice:
a cold GRAPH_MODE or MindIR run compiles the prefill graph there), the first decode step (where
the decode graph compiles), and the decode steps after it, whose rate is the steady one.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from migrate.errors import MigrateError
from migrate.infer.batch import Batch
from migrate.infer.sampling import Sampling


@dataclass
class Generation:
    tokens: np.ndarray                       # (b, steps) the new tokens; stopped rows padded with pad_id
    sequences: np.ndarray                    # (b, prompt + steps) prompts (left-padded) and new tokens
    logits: list[np.ndarray] = field(default_factory=list)  # per step (b, vocab) fp32, when recorded
    first_token_s: float = 0.0               # prompt in, first token chosen (prefill + choice)
    decode_s: float = 0.0                    # the decode steps after the first one (`decode_steps` of them)
    stopped: np.ndarray | None = None        # (b,) bool: the row met a stop token
    first_decode_s: float = 0.0              # the first decode call: a cold graph compiles there
    decode_steps: int | None = None          # decode calls timed in decode_s (None: steps - 1, all of them)

    @property
    def steps(self) -> int:
        return self.tokens.shape[1]

    def rows(self, n: int, stop_ids=()) -> Generation:
        """The first n rows only (the others filled a static batch), without the steps after
        all of them stopped, as HF would have ended there."""
        tokens = self.tokens[:n]
        steps = tokens.shape[1]
        hits = np.isin(tokens, np.asarray(list(stop_ids), np.int64))
        if len(stop_ids) and hits.any(1).all():
            steps = int(hits.argmax(1).max()) + 1
        width = self.sequences.shape[1] - self.tokens.shape[1] + steps
        return Generation(tokens[:, :steps], self.sequences[:n, :width], [x[:n] for x in self.logits[:steps]],
                          self.first_token_s, self.decode_s, None if self.stopped is None else self.stopped[:n],
                          self.first_decode_s, self.decode_steps)

    @property
    def timed_decode_steps(self) -> int:
        return self.steps - 1 if self.decode_steps is None else self.decode_steps

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens per second over the timed decode steps (after the first one), all rows counted."""
        tokens = self.timed_decode_steps * self.tokens.shape[0]
        return tokens / self.decode_s if tokens and self.decode_s > 0 else float("nan")

    @property
    def decode_compile_s(self) -> float | None:
        """The first decode step's time beyond a steady one: the decode graph's compile on a cold
        graph run (about 0 in PyNative or once compiled). None without a timed step to compare."""
        if not self.timed_decode_steps or self.decode_s <= 0:
            return None
        return max(0.0, self.first_decode_s - self.decode_s / self.timed_decode_steps)

    @property
    def total_s(self) -> float:
        return self.first_token_s + self.first_decode_s + self.decode_s

    def timing_line(self) -> str:
        """"first token 83 ms · first decode step 905 ms (compile ≈ 880 ms) · decode 36.5 tokens/s
        over 62 steps": the compiles stay out of the decode rate (module docstring)."""
        parts = [f"first token {self.first_token_s * 1000:.0f} ms"]
        if self.steps > 1:
            compile_s = self.decode_compile_s
            parts.append(f"first decode step {self.first_decode_s * 1000:.0f} ms"
                         + (f" (compile ≈ {compile_s * 1000:.0f} ms)" if compile_s is not None else ""))
        n = self.timed_decode_steps
        if self.steps > 2 and n:
            parts.append(f"decode {self.decode_tokens_per_s:.1f} tokens/s over {n} step{'s' if n != 1 else ''}")
        return " · ".join(parts)


def check_lengths(batch: Batch, max_new_tokens: int, cache_len: int, prefill_len: int | None = None,
                  max_positions: int | None = None) -> None:
    """One line for a request that does not fit: no new token asked, or prompt + new tokens past
    the cache (the prompt takes `prefill_len` slots: a static prefill pads it) or the positions."""
    used = max(batch.prompt_len, prefill_len or 0)
    padded = f", padded to the prefill length {used}" if used > batch.prompt_len else ""
    if max_new_tokens <= 0:
        raise MigrateError(f"--max-new-tokens must be positive, got {max_new_tokens}")
    if used >= cache_len:
        raise MigrateError(f"the prompt ({batch.prompt_len} tokens{padded}) is longer than the cache "
                           f"({cache_len} slots)")
    if used + max_new_tokens > cache_len:
        raise MigrateError(f"prompt ({batch.prompt_len} tokens{padded}) + max_new_tokens ({max_new_tokens}) "
                           f"exceeds the cache ({cache_len} slots)")
    if max_positions is not None and batch.prompt_len + max_new_tokens > max_positions:
        raise MigrateError(f"prompt ({batch.prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                           f"model's {max_positions} learned positions")


def generate(runner, batch: Batch, max_new_tokens: int, sampling: Sampling, *, stop_ids=(), pad_id: int | None = None,
             record_logits: bool = False, on_step: Callable[[int, np.ndarray], None] | None = None) -> Generation:
    """Generate up to `max_new_tokens` per row (see the module docstring). `on_step(step, tokens)`
    is called with each step's (b,) tokens as they are chosen (streaming)."""
    check_lengths(batch, max_new_tokens, runner.cache_len, runner.prefill_len, getattr(runner, "max_positions", None))
    if batch.size != runner.batch:
        raise MigrateError(f"{batch.size} prompts for a runner of batch {runner.batch}")
    stops = np.asarray(sorted(set(int(t) for t in stop_ids)), np.int64)
    pad = batch.pad_id if pad_id is None else pad_id
    choose = sampling.chooser()
    inputs = batch.prefill(runner.prefill_len, runner.cache_len)
    sequences = batch.sequences.copy()
    positions = inputs["positions"][:, -1:].copy()
    stopped = np.zeros(batch.size, bool)
    logits_seen, new = [], []
    start = time.perf_counter()
    logits = runner.prefill(inputs)
    first = first_decode = 0.0
    decode_start = None  # the decode timer starts when the first decode call has returned
    for step in range(max_new_tokens):
        if record_logits:
            logits_seen.append(logits)
        tokens = np.where(stopped, pad, choose(logits, sequences)).astype(np.int64)
        sequences = np.concatenate([sequences, tokens[:, None]], 1)
        new.append(tokens)
        if step == 0:
            first = time.perf_counter() - start
        if on_step is not None:
            on_step(step, tokens)
        stopped |= np.isin(tokens, stops)
        if stopped.all() or step == max_new_tokens - 1:
            break
        positions = positions + 1
        called = time.perf_counter()
        logits = runner.decode(tokens[:, None].astype(np.int32), positions.astype(np.int32),
                               runner.prefill_len + step, inputs["key_mask"])
        if decode_start is None:
            decode_start = time.perf_counter()
            first_decode = decode_start - called
    steps = len(new)
    return Generation(tokens=np.stack(new, 1), sequences=sequences, logits=logits_seen, first_token_s=first,
                      decode_s=time.perf_counter() - decode_start if decode_start is not None else 0.0,
                      stopped=stopped, first_decode_s=first_decode, decode_steps=max(steps - 2, 0))
