"""The training health watch: one decision per optimizer step, the same code on both sides.

    watch = HealthWatch.for_run(cfg)                 # golden/train_torch.py and `migrate train` alike
    verdict = watch.check(StepFacts(step, loss, grad_norm, lr, loss_scale))
    verdict.events, verdict.action                   # [HealthEvent], "continue" | "skip" | "stop"

Framework-free: it sees only the figures both sides log (the step's mean loss,
the pre-clip gradient norm, the lr the step used, the fp16 loss scale), and is
asked before the optimizer step, so `skip` and `stop` act on the step that
showed the problem. Both sides log those figures to ~1e-7 of each other, far from
any threshold an injected fault reaches, so they take the same decisions.

Rules (thresholds in run.yaml's `health:` section, `migrate.train.config.HealthConfig`):
  nonfinite_loss       the loss is NaN or Inf
  nonfinite_grad       the gradient norm is NaN or Inf (fp32/bf16; in fp16 an
                       overflow is the loss scaler's to skip, see the next two)
  skipped_run          fp16: max_skipped_run overflow-skipped steps in a row
  loss_scale_collapse  fp16: an overflow backs the scale off below min_loss_scale
  loss_spike           loss > mean + loss_spike_sigma * std of the last `window`
                       healthy steps' losses, and > mean * (1 + loss_spike_min_rel)
  grad_blowup          grad norm > grad_blowup_factor * their median
  lr_anomaly           lr not finite or negative, above the configured peak, or,
                       in warmup, above the linear ramp peak * step / warmup_steps
The spike and blow-up rules act once min_history healthy steps are in the window;
a step with an event does not enter the running statistics.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field

from migrate.train.config import HealthConfig, RunConfig

KINDS = ("nonfinite_loss", "nonfinite_grad", "skipped_run", "loss_scale_collapse", "loss_spike", "grad_blowup",
         "lr_anomaly")
LR_SLACK = 1e-9  # relative: the schedule is evaluated in Python floats on both sides
EXIT_CODE = 3    # `stop`: the run ends with this code (1 is compare's verdict, 2 bad input)


@dataclass(frozen=True)
class StepFacts:
    step: int                          # optimizer step, 1-based
    loss: float | None                 # the step's mean micro-batch loss (None: not finite)
    grad_norm: float | None            # total norm before clipping (None: not finite)
    lr: float                          # the lr this step uses
    loss_scale: float | None = None    # fp16: the scale this step's backward used


@dataclass
class HealthEvent:
    step: int
    kind: str
    value: float | None
    limit: float | None
    detail: str

    def line(self) -> str:
        return f"health: step {self.step} {self.kind}: {self.detail}"


@dataclass
class StepVerdict:
    step: int
    events: list[HealthEvent] = field(default_factory=list)
    action: str = "continue"           # continue | skip | stop


class HealthWatch:
    """Running statistics and the rules; `check` once per optimizer step, in order."""

    def __init__(self, config: HealthConfig, *, peak_lr: float, warmup_steps: int, dtype: str,
                 backoff_factor: float = 0.5, total_steps: int | None = None):
        self.config = config
        self.peak_lr = float(peak_lr)
        self.warmup_steps = int(warmup_steps)
        self.fp16 = dtype == "fp16"
        self.backoff_factor = float(backoff_factor)
        self.total_steps = total_steps
        self.losses: deque[float] = deque(maxlen=config.window)
        self.grad_norms: deque[float] = deque(maxlen=config.window)
        self.skipped_in_a_row = 0
        self.steps_seen = 0
        self.first: dict[str, int] = {}    # kind -> first step it showed
        self.counts: dict[str, int] = {}

    @classmethod
    def for_run(cls, cfg: RunConfig) -> HealthWatch:
        return cls(cfg.health, peak_lr=cfg.optimizer.lr, warmup_steps=cfg.schedule.num_warmup_steps(cfg.total_steps),
                   dtype=cfg.dtype, backoff_factor=cfg.loss_scale.backoff_factor, total_steps=cfg.total_steps)

    def describe(self) -> dict:
        """The policy and every threshold, as both sides record it in effective_hparams.json."""
        return {**asdict(self.config), "rules": list(KINDS), "peak_lr": self.peak_lr,
                "warmup_steps": self.warmup_steps, "fp16_rules": self.fp16}

    # ---------- the decision ----------
    def check(self, facts: StepFacts) -> StepVerdict:
        c = self.config
        events: list[HealthEvent] = []
        loss_ok = facts.loss is not None and math.isfinite(facts.loss)
        grad_ok = facts.grad_norm is not None and math.isfinite(facts.grad_norm)
        add = lambda *a: events.append(HealthEvent(facts.step, *a))  # noqa: E731
        if not loss_ok:
            add("nonfinite_loss", None, None, "the loss is not finite")
        if not grad_ok and not self.fp16:
            add("nonfinite_grad", None, None, "the gradient norm is not finite (NaN or Inf in a gradient)")
        if self.fp16:
            self._fp16_rules(facts, grad_ok, add)
        if loss_ok and len(self.losses) >= c.min_history:
            mean, std = statistics.fmean(self.losses), statistics.pstdev(self.losses)
            limit = max(mean + c.loss_spike_sigma * std, mean * (1 + c.loss_spike_min_rel))
            if facts.loss > limit:
                add("loss_spike", facts.loss, limit,
                    f"loss {facts.loss:.4g} > {limit:.4g} (mean {mean:.4g} + {c.loss_spike_sigma:g} x std {std:.3g} "
                    f"of the last {len(self.losses)} healthy steps)")
        if grad_ok and len(self.grad_norms) >= c.min_history:
            median = statistics.median(self.grad_norms)
            limit = c.grad_blowup_factor * median
            if facts.grad_norm > limit:
                add("grad_blowup", facts.grad_norm, limit,
                    f"grad norm {facts.grad_norm:.4g} > {c.grad_blowup_factor:g} x median {median:.4g} "
                    f"of the last {len(self.grad_norms)} healthy steps")
        self._lr_rule(facts, add)
        self.steps_seen = facts.step
        for event in events:
            self.first.setdefault(event.kind, event.step)
            self.counts[event.kind] = self.counts.get(event.kind, 0) + 1
        if not events:  # only healthy steps feed the running statistics
            if loss_ok:
                self.losses.append(facts.loss)
            if grad_ok:
                self.grad_norms.append(facts.grad_norm)
        return StepVerdict(facts.step, events, _action(c.policy, events))

    def _fp16_rules(self, facts: StepFacts, grad_ok: bool, add) -> None:
        c = self.config
        self.skipped_in_a_row = 0 if grad_ok else self.skipped_in_a_row + 1
        if self.skipped_in_a_row == c.max_skipped_run:
            add("skipped_run", float(self.skipped_in_a_row), float(c.max_skipped_run),
                f"{self.skipped_in_a_row} steps in a row skipped for inf/NaN gradients")
        scale = facts.loss_scale
        if not grad_ok and scale is not None:  # the scaler backs off after this step
            after = scale * self.backoff_factor
            if after < c.min_loss_scale <= scale:
                add("loss_scale_collapse", after, c.min_loss_scale,
                    f"the loss scale backs off from {scale:g} to {after:g}, below {c.min_loss_scale:g}")

    def _lr_rule(self, facts: StepFacts, add) -> None:
        lr, peak = facts.lr, self.peak_lr
        if not math.isfinite(lr) or lr < 0:
            add("lr_anomaly", lr if math.isfinite(lr) else None, None, f"lr {lr} is not a finite number >= 0")
            return
        in_warmup = facts.step <= self.warmup_steps
        ramp = peak * min(1.0, facts.step / self.warmup_steps) if in_warmup else peak
        if lr > ramp * (1 + LR_SLACK):
            where = (f"in warmup (step {facts.step} of {self.warmup_steps}: at most {ramp:.4g})" if in_warmup
                     else f"above the peak lr {peak:.4g}")
            add("lr_anomaly", lr, ramp, f"lr {lr:.4g} {where}")

    # ---------- summaries ----------
    @property
    def healthy(self) -> bool:
        return not self.first

    def verdict_line(self) -> str:
        return verdict_line(self.steps_seen, self.first, self.counts)

    def verdict_due(self, step: int) -> bool:
        """The verdict is printed after verdict_step, or after the last step of a shorter run."""
        due = self.config.verdict_step
        if self.total_steps is not None:
            due = min(due, self.total_steps)
        return step == due


def verdict_line(steps: int, first: dict[str, int], counts: dict[str, int]) -> str:
    """`health after step N: healthy`, or what looks wrong and the first step it showed, first first."""
    if not first:
        return f"health after step {steps}: healthy (no event)"
    parts = [f"{kind} from step {step} ({counts.get(kind, 1)}x)"
             for kind, step in sorted(first.items(), key=lambda kv: (kv[1], KINDS.index(kv[0])
                                                                       if kv[0] in KINDS else len(KINDS)))]
    return f"health after step {steps}: NOT healthy · " + " · ".join(parts)


def _action(policy: str, events: list[HealthEvent]) -> str:
    if not events or policy == "warn":
        return "continue"
    return "skip" if policy == "skip" else "stop"
