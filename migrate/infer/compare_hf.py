"""`migrate generate --compare-hf HF_DIR`: HF `generate` with the same settings beside ours, judged.

Greedy: HF's `generate` (its own KV cache, eager attention) on the same left-padded prompts with
the same stop, pad and repetition-penalty settings. Judged through `migrate.judge`: the tokens
must be identical (`match`: the first differing step, row and ids otherwise) and every step's raw
logits (HF's `output_logits`) must agree within `migrate diff`'s logits bounds (fp32: max abs
1e-5 in units of the peak beyond 1, cosine, top-1, KL), widened to K x HF's own error against its
float64 twin run along the same tokens (`judge.noise`), up to the first differing token, after
which the two runs read different sequences.

Sampling: both frameworks draw from their own random generator, so HF cannot draw our tokens by
itself. HF `generate` is made to follow our tokens (a last logits processor keeps only our
token), which runs HF's forward and cache over exactly our sequence; HF's own processors
(`RepetitionPenaltyLogitsProcessor`, `TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, in `generate`'s order) are then applied to HF's logits, and the processed
distributions are judged (`probs`: max abs difference of the probabilities, the same bound),
as is every drawn token lying inside HF's distribution (`support`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.hf_config import dtype_kwargs
from migrate.hf_loading import from_pretrained
from migrate.infer.batch import Batch
from migrate.infer.generate import Generation
from migrate.infer.sampling import Sampling, softmax
from migrate.judge.checks import tensor_checks
from migrate.judge.fmt import fmt_num
from migrate.judge.metrics import generation_metrics, logits_metrics
from migrate.judge.noise import noise_figures, tie_margin
from migrate.judge.thresholds import Thresholds
from migrate.judge.twin import float64_in_place, twin_refused
from migrate.judge.verdict import Check, Verdict

ORDER = ("error", "match", "finite", "support", "max_abs", "cosine", "top1", "kl", "probs")


@dataclass
class HFComparison:
    verdict: Verdict
    hf_tokens: np.ndarray
    steps_compared: int
    logits_max_abs: list[float] = field(default_factory=list)   # per compared step
    mode: str = "greedy"
    noise_reference: bool = False   # bounds widened to HF's own error against its float64 twin

    def line(self) -> str:
        worst = max(self.logits_max_abs) if self.logits_max_abs else float("nan")
        at = int(np.argmax(self.logits_max_abs)) if self.logits_max_abs else None
        ref = "bounds from the float64 noise reference" if self.noise_reference else ""
        if self.verdict.passed:
            tokens = f"{self.hf_tokens.shape[1]} steps × {self.hf_tokens.shape[0]} rows identical"
            if self.mode == "sampling":
                tokens = f"{self.hf_tokens.shape[1]} sampled steps inside HF's distribution"
            return self.verdict.line(tokens, f"logits max abs {fmt_num(worst)} (step {at})", ref)
        return self.verdict.line(self.verdict.first_failure.reason(),
                                 f"logits max abs {fmt_num(worst)} over {self.steps_compared} steps", ref)


def load_hf_model(hf_dir, dtype: str = "fp32"):
    from transformers import AutoModelForCausalLM

    if not Path(hf_dir).is_dir():
        raise MigrateError(f"HF model folder not found: {hf_dir}")
    compute = getattr(torch, PRECISIONS[dtype].compute)
    return from_pretrained(AutoModelForCausalLM, hf_dir, **dtype_kwargs(compute), attn_implementation="eager").eval()


class _Follow:
    """The last logits processor: only the token our run chose at this step survives."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = torch.from_numpy(tokens)
        self.step = 0

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -float("inf"))
        forced.scatter_(1, self.tokens[:, self.step:self.step + 1], 0.0)
        self.step += 1
        return forced


def hf_generate(model, batch: Batch, steps: int, sampling: Sampling, stop_ids, pad_id, follow=None,
                exact: bool = False):
    """HF `generate` on the batch: (new tokens (b, t), raw logits per step (b, vocab) fp32, float64
    with `exact`)."""
    from transformers import LogitsProcessorList

    kwargs = sampling.hf_kwargs() if follow is None else dict(do_sample=False)
    extra = LogitsProcessorList([_Follow(follow)]) if follow is not None else None
    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(batch.sequences), attention_mask=torch.from_numpy(batch.mask),
            max_new_tokens=steps, min_new_tokens=0, eos_token_id=list(stop_ids) or None, pad_token_id=pad_id,
            output_logits=True, return_dict_in_generate=True, logits_processor=extra,
            no_repeat_ngram_size=0, num_beams=1, **kwargs)
    tokens = out.sequences[:, batch.prompt_len:].numpy()
    return tokens, [(x.double() if exact else x.float()).numpy() for x in out.logits]


def hf_processed(hf_logits: list[np.ndarray], sequences: np.ndarray, prompt_len: int, sampling: Sampling):
    """HF's processors (its classes, generate's order) on HF's logits along `sequences`."""
    from transformers import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    procs = []
    if sampling.repetition_penalty != 1:
        procs.append(RepetitionPenaltyLogitsProcessor(float(sampling.repetition_penalty)))
    if sampling.temperature != 1:
        procs.append(TemperatureLogitsWarper(float(sampling.temperature)))
    if sampling.top_k:
        procs.append(TopKLogitsWarper(int(sampling.top_k)))
    if sampling.top_p < 1:
        procs.append(TopPLogitsWarper(float(sampling.top_p)))
    out = []
    for step, logits in enumerate(hf_logits):
        ids = torch.from_numpy(sequences[:, :prompt_len + step])
        scores = torch.from_numpy(logits.copy())
        for proc in procs:
            scores = proc(ids, scores)
        out.append(scores.numpy())
    return out


def _first_failures(per_step: list[list[Check]]) -> list[Check]:
    """Per rule: the check of the first step that failed it (its step set), else the worst step's."""
    by_key: dict[str, Check] = {}
    for step, checks in enumerate(per_step):
        for check in checks:
            check.step = step
            kept = by_key.get(check.key)
            if kept is None or (check.passed is False and kept.passed is not False):
                by_key[check.key] = check
            elif kept.passed is not False and check.passed is not False and _worse(check, kept):
                by_key[check.key] = check
    return list(by_key.values())


def _worse(a: Check, b: Check) -> bool:
    try:
        return (a.value < b.value) if a.key in ("cosine", "top1") else (a.value > b.value)
    except TypeError:
        return False


def _twin_logits(model, batch: Batch, steps: int, sampling: Sampling, stop_ids, pad_id, along: np.ndarray,
                 reference: str) -> list[np.ndarray] | None:
    """HF's model in float64 following the sequence `along` (HF's own tokens, or ours when sampling):
    each step's exact logits, the noise reference of every step (`judge.noise`); None where the
    float64 copy does not fit or is not wanted."""
    if not steps or twin_refused(model, reference, in_place=True):
        return None
    with float64_in_place(model) as twin:
        _, logits = hf_generate(twin, batch, steps, sampling, stop_ids, pad_id, follow=along[:, :steps], exact=True)
    return logits


def compare_with_hf(hf_dir, ours: Generation, batch: Batch, sampling: Sampling, stop_ids, pad_id,
                    dtype: str = "fp32", model=None, reference: str = "fp64") -> HFComparison:
    """Run HF beside `ours` (recorded with record_logits=True) and judge (see the module docstring).
    `reference` "fp64": every step's logits bounds widen to HF's own error against its float64 twin."""
    model = model if model is not None else load_hf_model(hf_dir, dtype)
    vocab = ours.logits[0].shape[-1]
    if model.config.get_text_config().vocab_size != vocab:
        raise MigrateError(f"{hf_dir} is another model: vocabulary {model.config.get_text_config().vocab_size}, "
                           f"the MindSpore side's {vocab}")
    thresholds = Thresholds.for_dtype(dtype)
    steps = ours.steps
    if sampling.greedy:
        hf_tokens, hf_logits = hf_generate(model, batch, steps, sampling, stop_ids, pad_id)
    else:
        hf_tokens, hf_logits = hf_generate(model, batch, steps, sampling, stop_ids, pad_id, follow=ours.tokens)
    tokens = generation_metrics(hf_tokens, ours.tokens)
    first = tokens["first_diff_step"]
    compared = len(hf_logits) if first is None else first + 1
    compared = min(compared, len(hf_logits), len(ours.logits))
    exact = _twin_logits(model, batch, compared, sampling, stop_ids, pad_id,
                         hf_tokens if sampling.greedy else ours.tokens, reference)
    per_step, max_abs = [], []
    k = thresholds.bounds("logits").widens("top1")
    for step in range(compared):
        noise = noise_figures(hf_logits[step], exact[step], logits=True) if exact else None
        margin = tie_margin(noise, k, dtype, float(np.abs(hf_logits[step]).max())) if noise else None
        metrics = logits_metrics(hf_logits[step], ours.logits[step], tie_margin=margin)
        if noise:
            metrics["noise"] = noise
        max_abs.append(float(metrics.get("max_abs") or 0.0))
        per_step.append(tensor_checks(metrics, "logits", thresholds))
    checks = _first_failures(per_step)
    match = Check("match", "tokens identical", value=tokens["matching_prefix"], limit=tokens["steps"],
                  passed=first is None, step=first)
    if first is not None:
        match.detail = (f"first differing token at step {first} (row {tokens['diff_row']}): HF "
                        f"{tokens['ref_token']}, MindSpore {tokens['got_token']}")
    checks.insert(0, match)
    if not sampling.greedy:
        checks += _sampling_checks(hf_logits, ours, batch, sampling, thresholds)
    return HFComparison(Verdict(checks, ORDER), hf_tokens, compared, max_abs,
                        "greedy" if sampling.greedy else "sampling", noise_reference=bool(exact))


def _sampling_checks(hf_logits, ours: Generation, batch: Batch, sampling: Sampling, thresholds) -> list[Check]:
    hf_scores = hf_processed(hf_logits, ours.sequences, batch.prompt_len, sampling)
    bound = thresholds.bounds("logits").max_abs
    worst, worst_step, outside = 0.0, None, None
    for step, scores in enumerate(hf_scores):
        ref = softmax(scores)
        got = softmax(sampling.process(ours.logits[step], ours.sequences[:, :batch.prompt_len + step]))
        diff = float(np.abs(ref - got).max())
        if diff > worst:
            worst, worst_step = diff, step
        rows = np.arange(ref.shape[0])
        if outside is None and (ref[rows, ours.tokens[:, step]] <= 0).any():
            outside = step
    return [
        Check("probs", "processed probabilities max abs", value=worst, limit=bound, passed=worst <= bound,
              step=worst_step if worst > bound else None),
        Check("support", "drawn tokens inside HF's processed distribution", value=outside, limit=None,
              passed=outside is None, step=outside,
              detail="" if outside is None else f"step {outside} drew a token HF's processors remove"),
    ]
