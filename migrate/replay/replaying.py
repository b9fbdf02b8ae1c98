"""`replay(golden_run, ms_run, step=None)`: load both sides' state from the checkpoint before the
step, record micro-batch 1's forward on both (probe hooks), run the step once on each side with its
own step code, judge everything in step order. See the package docstring."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mindspore import Tensor

from migrate.compare.metrics_log import read_metrics
from migrate.errors import MigrateError
from migrate.judge.report import Report
from migrate.probe.inputs import Inputs
from migrate.probe.live import paired_forward
from migrate.probe.sides import Side, bundled_align
from migrate.replay.explain import explain
from migrate.replay.golden_side import golden_rows, golden_state, golden_step
from migrate.replay.judging import Item, judge_step, summary_line
from migrate.replay.ms_side import MSReplay
from migrate.replay.ranks import HOW
from migrate.replay.runs import ReplayPlan, at_step, plan_replay
from migrate.replay.states import first_parting_state

OWN_LOG_REL = 1e-6  # a replay from the run's own checkpoint gives its logged loss (graph vs split: rounding)


@dataclass
class ReplayResult:
    plan: ReplayPlan
    report: Report
    items: list[Item]
    line: str                                  # the first quantity that parts, or that all agree
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> Item | None:
        return next((it for it in self.items if not it.passed), None)

    @property
    def exit_code(self) -> int:
        return 0 if self.first is None else 1


def replay(golden_run, ms_run, step: int | None = None, config=None, mode: str | None = None) -> ReplayResult:
    """mode: MindSpore's execution mode for the replayed step (None: the one the run trained in)."""
    plan = plan_replay(golden_run, ms_run, step, config)
    if mode is not None:
        plan.mode = mode
    cfg = plan.cfg
    if cfg.lora is not None:
        raise MigrateError("migrate replay does not replay LoRA runs yet")
    plan, walked = _first_parting_step(plan, walk=step is None)
    g_cfg = plan.golden_cfg  # a --dp run's global batch: the golden's micro batch is the ranks' together
    golden = golden_state(g_cfg, plan.golden_checkpoint)
    _, g_model, _, _, g_scaler = golden
    ms = MSReplay(cfg, plan.ms_checkpoint, plan.faults, plan.mode, plan.dp)
    try:
        training = ms.training
        inv_scales = (1.0 / g_scaler.get_scale() if g_scaler is not None else 1.0,
                      1.0 / training.scaler.scale if training.scaler is not None else 1.0)
        g_before = {n: p.detach().float().numpy().copy() for n, p in g_model.named_parameters() if p.requires_grad}
        m_before = {p.name: p.asnumpy().astype(np.float32) for p in training.optimizer.parameters}
        with _golden_weights(training, g_before):
            forward = _forward(cfg, golden, training, golden_rows(g_cfg, plan.step))
        g_rec = golden_step(g_cfg, golden, plan.step)
        m_rec = ms.step(plan.step)
        g_rec.params_before, m_rec.params_before = g_before, m_before
        trained = {p.name for p in training.optimizer.parameters}
        names = [p.name for p in training.model.trainable_params() if p.name in trained]  # the model's order
        report, items = judge_step(cfg.dtype, training.plan, names, g_rec, m_rec, forward, cfg.max_grad_norm,
                                   inv_scales)
        first = next((it for it in items if not it.passed), None)
        # the step's own objects: a fault starting at this step rebuilt them (`faults_from`)
        why = explain(g_cfg, plan, names, ms.training, golden[2], g_rec, m_rec, first, inv_scales)
    finally:
        ms.close()
    report.ref_dir, report.got_dir = str(plan.golden_run), str(plan.ms_run)
    report.extra.update(step=plan.step, why=plan.why, faults=list(plan.faults), dp=plan.dp,
                        checkpoints={"golden": str(plan.golden_checkpoint), "ms": str(plan.ms_checkpoint)})
    notes = [f"replayed {plan.why}, from "
             + (f"{plan.golden_checkpoint} and {plan.ms_checkpoint}" if plan.step > 1 else "the models (step 1)")]
    if plan.dp > 1:
        notes.append(f"the MindSpore run trained with --dp {plan.dp}: replayed {HOW}")
    notes += walked
    notes += _own_log(plan, "golden", plan.golden_run, g_rec) + _own_log(plan, "MindSpore", plan.ms_run, m_rec)
    line = summary_line(plan.step, items) + (f"; {why}" if why else "")
    # the replay's own verdict, in words (the report's verdict holds the same checks: entries and `checks`)
    report.extra.update(notes=notes, verdict={"passed": first is None, "line": line, "first": None if first is None
                                              else {"stage": first.stage, "what": first.what, "figure": first.figure}})
    return ReplayResult(plan, report, items, line, notes)


def _first_parting_step(plan: ReplayPlan, walk: bool) -> tuple[ReplayPlan, list[str]]:
    """An optimizer fault at step k shows in the loss at step k + 1, from states that already part. With
    `walk` (the step is compare's), go back while the states saved before the step part, to the first step
    that starts from agreeing states; without, only say so. Returns the plan and notes."""
    notes = []
    while plan.step > 1:
        before = plan.step - 1
        parting = first_parting_state(plan.golden_checkpoint, plan.ms_checkpoint)
        if parting is None:
            break
        if not walk:
            notes.append(f"the states saved after step {before} already part ({parting}): "
                         f"replay step {before} or earlier to see where")
            break
        try:
            earlier = at_step(plan, before, f"step {before} (walked back from step {plan.step})")
        except MigrateError as exc:
            raise MigrateError(f"the states saved after step {before} already part ({parting}), and "
                               f"step {before} cannot be replayed: {exc}") from None
        notes.append(f"compare flags step {plan.step}, but the states saved after step {before} already part "
                     f"({parting}): replaying step {before}")
        plan = earlier
    return plan, notes


@contextlib.contextmanager
def _golden_weights(training, golden: dict):
    """The MindSpore model holding the golden's loaded weights (through the run's conversion plan), its own
    put back after. The forward stage asks whether the two forwards compute the same function: from step 2
    on the loaded states differ by each side's own rounding (bf16: 8e-5 in the test model's embedding after
    two steps), which no float64 twin of one side measures, and an embedding output -- a gather, exact --
    parted by exactly that. Whether the states agree is the state diff's question (the walk back)."""
    ref = training.plan.in_model_names(golden)
    params = [p for p in training.optimizer.parameters if p.name in ref]
    own = [p.asnumpy().copy() for p in params]
    try:
        for p in params:
            p.set_data(Tensor(np.asarray(ref[p.name], dtype=own[0].dtype if own else np.float32)))
        yield
    finally:
        for p, value in zip(params, own, strict=True):
            p.set_data(Tensor(value))


def _forward(cfg, golden, training, rows: np.ndarray) -> list:
    """Micro-batch 1's forward on the golden's loaded weights, on both sides (`_golden_weights`), recorded by
    the probe's hooks and paired by their block tables (the golden under its autocast, as its step runs it)."""
    module, model = golden[0], golden[1]
    ids = np.ascontiguousarray(rows[:, :-1])
    inputs = Inputs(ids=ids, mask=None, labels=ids, description="micro-batch 1 of the replayed step")
    ref = Side("golden", "hf", str(cfg.hf_model), "torch", model, dict(training.keymap.align) or None,
               model.config.vocab_size)
    got = Side("MindSpore", "converted", str(cfg.ms_model), "mindspore", training.model,
               bundled_align(type(training.model)), training.model_config.vocab_size)
    autocast = module.AUTOCAST[cfg.dtype]
    # bf16 / fp16: the golden's own rounding against its float64 twin widens the bounds, as `migrate diff` does
    return list(paired_forward(ref, got, inputs, num_layers=training.model_config.num_layers, detail=True,
                               twin=autocast is not None, ref_context=lambda: module._autocast(autocast)))


def _own_log(plan: ReplayPlan, side: str, run: Path, rec) -> list[str]:
    """Does the replayed step reproduce the loss the run logged at that step? (It must: same state, same rows.)"""
    log = read_metrics(run)
    at = np.flatnonzero(log.steps == plan.step)
    if not len(at) or not math.isfinite(log.loss[at[0]]) or not rec.losses:
        return [f"{side}: no logged loss at step {plan.step} to hold the replay to"]
    logged, loss = float(log.loss[at[0]]), sum(rec.losses) / len(rec.losses)
    rel = abs(loss - logged) / abs(logged) if logged else abs(loss)
    word = "reproduces" if rel <= OWN_LOG_REL else "does NOT reproduce"
    return [f"{side} replay {word} its logged step-{plan.step} loss ({loss:.9g} vs {logged:.9g}, rel {rel:.1e})"]
