"""Which hyperparameter explains the first quantity that parts? Checked, not guessed.

When a replayed step parts in the optimizer's stages (gradients, clip, lr, moments, parameters), the
hyperparameters both sides' live objects hold are compared -- AdamW's beta1, beta2, eps, weight decay
and which tensors it decays, the lr of the step, the clip epsilon, the accumulation divisor -- and
each one that differs is tried: the golden's own step (`optimizer_step`) re-run from the same
checkpoint with the MindSpore side's value of that one knob, judged against the MindSpore
recording with the replay's own bounds (`judging.judge_step`). A knob "reproduces it" only when that
re-run agrees with MindSpore at every stage. The clip epsilon and the divisor are checked on the
recordings themselves: the epsilon MindSpore's clip factor implies against its clipper's, the
golden's gradients rescaled by the divisors' ratio against MindSpore's.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from migrate.judge import fmt_num
from migrate.judge.report import Report
from migrate.judge.thresholds import Thresholds
from migrate.replay.golden_side import golden_state, golden_step
from migrate.replay.judging import CLIP_EPS_FLOOR, FP32_ULP, judge_step
from migrate.train.optim import TORCH_CLIP_EPS

EXPLAINED = ("gradients", "clip", "lr", "moments", "parameters")


@dataclass
class Candidate:
    words: str                    # "beta2 0.999 vs 0.95" (golden vs MindSpore)
    check: Callable[[], bool]     # True: the MindSpore side's value reproduces its numbers


def explain(cfg, plan, names: list, training, g_optimizer, g_rec, m_rec, first, inv_scales) -> str | None:
    """The clause that ends the replay's line: "<knob> <golden> vs <MindSpore> reproduces it", "none of
    the checked hyperparameters (...) reproduces it", or None when nothing parts in the stages above.
    g_optimizer: the golden's replayed optimizer (its groups' knobs; the lr is read from the recording)."""
    if first is None or first.stage not in EXPLAINED:
        return None
    candidates = _candidates(cfg, plan, names, training, g_optimizer, g_rec, m_rec, inv_scales)
    if not candidates:
        return "the two sides' hyperparameters (betas, eps, weight decay and its tensors, lr, clip epsilon, " \
               "accumulation divisor) all agree"
    for c in candidates:
        if c.check():
            return f"{c.words} reproduces it"
    return f"none of the differing hyperparameters ({'; '.join(c.words for c in candidates)}) reproduces it"


def _candidates(cfg, plan, names, training, g_opt, g_rec, m_rec, inv_scales) -> list[Candidate]:
    golden_ckpt, step = plan.golden_checkpoint, plan.step
    opt = training.optimizer
    conversion = training.plan
    group = g_opt.param_groups[0]
    out: list[Candidate] = []

    def rerun(adjust) -> Callable[[], bool]:
        def check() -> bool:
            state = golden_state(cfg, golden_ckpt)
            state = adjust(state) or state
            before = {n: p.detach().float().numpy().copy() for n, p in state[1].named_parameters() if p.requires_grad}
            rec = golden_step(cfg, state, step)
            rec.params_before = before
            _, items = judge_step(cfg.dtype, conversion, names, rec, m_rec, [], cfg.max_grad_norm, inv_scales)
            return all(it.passed for it in items)
        return check

    def set_groups(key, value):
        def adjust(state):
            for g in state[2].param_groups:
                g[key] = value
        return adjust

    (b1, b2), (mb1, mb2) = tuple(group["betas"]), opt.betas
    if b1 != mb1:
        out.append(Candidate(f"beta1 {b1:g} vs {mb1:g}", rerun(set_groups("betas", (mb1, b2)))))
    if b2 != mb2:
        out.append(Candidate(f"beta2 {b2:g} vs {mb2:g}", rerun(set_groups("betas", (b1, mb2)))))
    if group["eps"] != opt.eps:
        out.append(Candidate(f"AdamW eps {group['eps']:g} vs {opt.eps:g}", rerun(set_groups("eps", opt.eps))))
    out += _decay_candidates(g_opt, opt, conversion, rerun)
    if g_rec.lr is not None and m_rec.lr is not None and not math.isclose(g_rec.lr, m_rec.lr, rel_tol=1e-12):
        out.append(Candidate(f"lr of step {step} {fmt_num(g_rec.lr)} vs {fmt_num(m_rec.lr)}",
                             rerun(set_groups("lr", m_rec.lr))))
    if cfg.max_grad_norm and training.clipper.eps != TORCH_CLIP_EPS:
        out.append(Candidate(f"clip epsilon {TORCH_CLIP_EPS:g} vs {training.clipper.eps:g}",
                             lambda: _implied_eps(m_rec, cfg.max_grad_norm, inv_scales[1], training.clipper.eps)))
    divisor = training.micro.loss_divisor
    if divisor != cfg.grad_accum_steps:
        out.append(Candidate(f"accumulation divisor {cfg.grad_accum_steps} vs {divisor}",
                             lambda: _rescaled(cfg.dtype, conversion, names, g_rec, m_rec,
                                               cfg.grad_accum_steps / divisor)))
    return out


def _decay_candidates(g_opt, opt, conversion, rerun) -> list[Candidate]:
    """Weight decay: its value, and which tensors it applies to (MindSpore's names carried to the HF ones)."""
    g_decayed = {n for g in g_opt.param_groups if g["weight_decay"] for n in g["param_names"]}
    g_wd = next((g["weight_decay"] for g in g_opt.param_groups if g["weight_decay"]), 0.0)
    m_wd = next((g["weight_decay"] for g in opt.param_groups if g["weight_decay"]), 0.0)
    m_decayed = {hf for g in opt.param_groups if g["weight_decay"] for n in g["names"]
                 for hf in conversion.sources.get(n, (n,))}
    out = []
    if g_wd != m_wd and g_decayed:
        def value(state):
            for g in state[2].param_groups:
                if g["weight_decay"]:
                    g["weight_decay"] = m_wd
        out.append(Candidate(f"weight decay {g_wd:g} vs {m_wd:g}", rerun(value)))
    if g_decayed != m_decayed and m_wd:
        more, fewer = sorted(m_decayed - g_decayed), sorted(g_decayed - m_decayed)
        words = "weight decay applied to " + "; ".join(
            part for part in (f"{_some(more)} on MindSpore's side only" if more else "",
                              f"{_some(fewer)} on the golden's only" if fewer else "") if part)
        out.append(Candidate(words, rerun(lambda state: _regroup(state, m_decayed, m_wd))))
    return out


def _some(names: list[str]) -> str:
    return ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")


def _regroup(state, decayed: set, wd: float):
    """The golden's state with AdamW's groups split as MindSpore decays: a new AdamW of the golden's own
    class over the same parameters, their moments and step counts carried over."""
    golden, model, old, scheduler, scaler = state
    named = [(n, p) for g in old.param_groups for n, p in zip(g["param_names"], g["params"], strict=True)]
    first = old.param_groups[0]
    groups = [{"params": [(n, p) for n, p in named if n in decayed], "weight_decay": wd},
              {"params": [(n, p) for n, p in named if n not in decayed], "weight_decay": 0.0}]
    new = type(old)([g for g in groups if g["params"]], lr=first["lr"], betas=first["betas"],
                            eps=first["eps"])
    for _, p in named:
        if p in old.state:
            new.state[p] = old.state[p]
    return golden, model, new, scheduler, scaler


def _implied_eps(rec, max_norm: float, inv_scale: float, eps: float) -> bool:
    """Does the epsilon MindSpore's measured clip factor implies equal its clipper's (`judging._clip`'s bound)?"""
    factor = rec.clip_factor(inv_scale)
    if factor is None or rec.grad_norm is None or factor >= 1.0 - 1e-6:
        return False
    implied = max_norm / factor - rec.grad_norm
    return abs(implied - eps) <= max(CLIP_EPS_FLOOR, 2 * FP32_ULP * rec.grad_norm)


def _rescaled(dtype: str, conversion, names: list, g_rec, m_rec, ratio: float) -> bool:
    """The golden's gradients after each micro-batch times `ratio` (the divisors' ratio: the gradient is
    linear in it) against MindSpore's, held to the replay's gradient bounds."""
    report = Report(dtype=dtype, thresholds=Thresholds(dtype))
    for ga, gb in zip(g_rec.grads, m_rec.grads, strict=True):
        ref = conversion.in_model_names(ga)
        for n in names:
            report.add(f"gradient of {n}", np.asarray(ref[n], np.float64) * ratio, gb[n], kind="grad")
    report.finalize()
    return bool(report.passed)
