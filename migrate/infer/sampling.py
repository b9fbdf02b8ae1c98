"""Choosing the next token from a step's logits, as HF `generate` does, in numpy.

    settings = Sampling(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.1, seed=0)
    chooser = settings.chooser()
    tokens = chooser(logits, sequences)          # (b, vocab) fp32 logits, (b, t) ids so far -> (b,)

The processors follow transformers' `_get_logits_processor` in its order and arithmetic
(float32): repetition penalty over every id of the row so far, prompt and left padding included
(`RepetitionPenaltyLogitsProcessor`), then, when sampling, temperature, top-k (ties with the k-th
kept) and top-p (ascending sort, cumulative softmax <= 1 - top_p removed, the top token always
kept). Greedy is argmax of the processed logits (HF applies the penalty in greedy search too).

Sampling draws with numpy's `Generator(seed)`: argmax(probs / E) with E ~ Exp(1) per token,
which picks token i with probability probs[i] (torch.multinomial's one-sample path does the
same with torch's generator, so the two frameworks draw differently from the same seed: a
seeded run is reproducible run to run, not HF's draw). Temperature 0 means greedy (vLLM's
and llama.cpp's convention); HF itself refuses temperature 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from migrate.errors import MigrateError

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0        # 0: greedy
    top_k: int = 0                  # 0: off
    top_p: float = 1.0              # 1: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self):
        if not np.isfinite([self.temperature, self.top_p, self.repetition_penalty]).all():
            raise MigrateError("sampling values must be finite numbers")
        checks = (
            (self.temperature >= 0, f"--temperature must be >= 0 (0 is greedy), got {self.temperature:g}"),
            (self.top_k >= 0, f"--top-k must be >= 0 (0 is off), got {self.top_k}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1] (1 is off), got {self.top_p:g}"),
            (self.repetition_penalty > 0, f"--repetition-penalty must be > 0 (1 is off), "
                                          f"got {self.repetition_penalty:g}"),
            # numpy's Generator takes a non-negative seed (a negative one is a ValueError deep in the draw)
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
        )
        for ok, message in checks:
            if not ok:
                raise MigrateError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            parts = ["greedy"]
        else:
            parts = [f"sampling T={self.temperature:g}", f"seed {self.seed}"]
            parts += [f"top-k {self.top_k}"] if self.top_k else []
            parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"repetition penalty {self.repetition_penalty:g}"] if self.repetition_penalty != 1 else []
        return ", ".join(parts)

    def hf_kwargs(self) -> dict:
        """The same settings as keyword arguments of HF `generate` (every one explicit, so the
        model's generation_config.json cannot add its own)."""
        kwargs = dict(do_sample=not self.greedy, repetition_penalty=float(self.repetition_penalty))
        if not self.greedy:
            kwargs.update(temperature=float(self.temperature), top_k=int(self.top_k), top_p=float(self.top_p))
        return kwargs

    def process(self, logits: np.ndarray, sequences: np.ndarray) -> np.ndarray:
        """HF's processed scores (b, vocab) float32 for raw `logits` after `sequences` (b, t)."""
        scores = np.array(logits, dtype=np.float32, copy=True)
        if self.repetition_penalty != 1:
            scores = repetition_penalty(scores, sequences, self.repetition_penalty)
        if self.greedy:
            return scores
        if self.temperature != 1:
            scores = scores / np.float32(self.temperature)
        if self.top_k:
            scores = top_k(scores, self.top_k)
        if self.top_p < 1:
            scores = top_p(scores, self.top_p)
        return scores

    def chooser(self):
        """A function (logits, sequences) -> next ids, holding this run's random generator."""
        rng = np.random.default_rng(self.seed)

        def choose(logits: np.ndarray, sequences: np.ndarray) -> np.ndarray:
            scores = self.process(logits, sequences)
            if self.greedy:
                return scores.argmax(-1)
            probs = softmax(scores)
            noise = rng.exponential(1.0, size=probs.shape)
            with np.errstate(divide="ignore"):
                return (probs / noise).argmax(-1)

        return choose


def repetition_penalty(scores: np.ndarray, sequences: np.ndarray, penalty: float) -> np.ndarray:
    rows = np.arange(scores.shape[0])[:, None]
    ids = np.minimum(sequences, scores.shape[1] - 1)
    seen = scores[rows, ids]
    p = np.float32(penalty)
    scores[rows, ids] = np.where(seen < 0, seen * p, seen / p)
    return scores


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    k = min(k, scores.shape[-1])
    kth = -np.partition(-scores, k - 1, axis=-1)[:, k - 1:k]
    return np.where(scores < kth, NEG_INF, scores)


def top_p(scores: np.ndarray, p: float) -> np.ndarray:
    order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as HF sorts
    ordered = np.take_along_axis(scores, order, -1)
    cumulative = np.cumsum(softmax(ordered), axis=-1, dtype=np.float32)
    remove = cumulative <= np.float32(1 - p)
    remove[:, -1] = False  # min_tokens_to_keep = 1
    out = scores.copy()
    np.put_along_axis(out, order, np.where(remove, NEG_INF, ordered), -1)
    return out


def softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(-1, keepdims=True)
    e = np.exp(shifted, dtype=np.float32)
    return e / e.sum(-1, keepdims=True, dtype=np.float32)
