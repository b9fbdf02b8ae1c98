"""Which step to replay and from which checkpoints: the two run folders read, nothing written.

The step defaults to the first one `migrate compare` flags on the two runs (`first_flagged`). The
state before step N is each side's checkpoint of step N - 1 (golden: GOLDEN_RUN/checkpoint-<N-1>,
MindSpore: MS_RUN/checkpoints/checkpoint-<N-1>); step 1 starts from the models themselves. Without
such a checkpoint the replay is refused in one line naming the checkpoint_interval that would
have written one.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from migrate.compare import compare_runs
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.run_protocol import state as run_state
from migrate.train.config import RunConfig

HPARAMS = "effective_hparams.json"


@dataclass
class ReplayPlan:
    cfg: RunConfig
    golden_run: Path
    ms_run: Path
    step: int                       # the optimizer step replayed (1-based)
    why: str                        # how the step was chosen
    golden_checkpoint: Path | None  # None: step 1, from the models
    ms_checkpoint: Path | None
    faults: tuple = ()              # the MindSpore run's injected faults (NAME@STEP)
    mode: str = "graph"
    dp: int = 1                     # the MindSpore run's data-parallel ranks (`migrate train --dp`)

    @property
    def golden_cfg(self) -> RunConfig:
        """The config the golden trains the same global batch with: one process, micro batch x dp."""
        cfg = self.cfg
        return cfg if self.dp == 1 else cfg.replace(micro_batch_size=cfg.micro_batch_size * self.dp)


def plan_replay(golden_run, ms_run, step: int | None = None, config=None) -> ReplayPlan:
    golden_run, ms_run = Path(golden_run), Path(ms_run)
    for run, side in ((golden_run, "golden"), (ms_run, "MindSpore")):
        if not (run / "metrics.jsonl").is_file():
            raise MigrateError(f"{run} is not a {side} run folder (no metrics.jsonl)")
    hparams = load_json(ms_run / HPARAMS, "MindSpore effective hyperparameters", expect=dict) \
        if (ms_run / HPARAMS).is_file() else {}
    if config is not None:
        cfg = RunConfig.load(config)
    elif isinstance(hparams.get("config"), dict):
        cfg = RunConfig.from_dict(hparams["config"], base=ms_run, source=ms_run / HPARAMS)
    else:
        raise MigrateError(f"{ms_run} has no {HPARAMS} with the run config: give --config run.yaml")
    dp = _data_parallel(hparams.get("parallel"), ms_run)
    why = f"step {step}, as asked"
    if step is None:
        step, why = first_flagged(golden_run, ms_run, cfg.dtype)
    if not 1 <= step <= cfg.total_steps:
        raise MigrateError(f"step {step} is outside the run's steps 1..{cfg.total_steps}")
    return at_step(ReplayPlan(cfg, golden_run, ms_run, step, why, None, None, tuple(hparams.get("faults") or ()),
                              dp=dp), step)


def _data_parallel(parallel, ms_run: Path) -> int:
    """The run's dp (1: one process); a tensor/pipeline-parallel run is refused in one line."""
    if not isinstance(parallel, dict):
        return 1
    mp, pp = parallel.get("mp", 1), parallel.get("pp", 1)
    if mp != 1 or pp != 1 or parallel.get("optimizer_shard"):
        raise MigrateError(f"{ms_run} trained with mp {mp} x pp {pp}"
                           + (" and optimizer sharding" if parallel.get("optimizer_shard") else "")
                           + ": migrate replay replays one process or pure data parallel (--dp) runs")
    dp = parallel.get("dp", 1)
    if not isinstance(dp, int) or dp < 1:
        raise MigrateError(f"{ms_run}/{HPARAMS}: parallel.dp is {dp!r}, not a positive integer")
    return dp


def at_step(plan: ReplayPlan, step: int, why: str | None = None) -> ReplayPlan:
    """`plan` moved to replay `step`: the checkpoints of step - 1 on both sides."""
    cfg, golden_run, ms_run = plan.cfg, plan.golden_run, plan.ms_run
    golden_ckpt = ms_ckpt = None
    faults, mode = plan.faults, "graph"
    if step > 1:
        golden_ckpt = _checkpoint(golden_run / f"checkpoint-{step - 1}", "golden", golden_run, step, cfg)
        ms_ckpt = _checkpoint(ms_run / "checkpoints" / f"checkpoint-{step - 1}", "MindSpore", ms_run, step, cfg)
        state = load_json(ms_ckpt / "trainer_state.json", "MindSpore checkpoint state", expect=dict)
        faults = tuple(state.get(run_state.FAULTS) or ())
        mode = state.get(run_state.MODE) or mode
    return ReplayPlan(cfg, golden_run, ms_run, step, why or plan.why, golden_ckpt, ms_ckpt, faults, mode, plan.dp)


def first_flagged(golden_run: Path, ms_run: Path, dtype: str = "fp32") -> tuple[int, str]:
    """(step, why): the first step `migrate compare` finds out of tolerance on the two runs, with the run's
    dtype's default bounds (no noise run: in bf16 / fp16 give --step where compare needed --noise)."""
    result = compare_runs(golden_run, ms_run, dtype=dtype)
    if result.passed:
        raise MigrateError(f"migrate compare passes {golden_run} against {ms_run}: no step to replay "
                           "(give --step N to replay one anyway)")
    steps = [c.step for c in result.failed if c.step is not None]  # each rule's first step out
    if not steps:  # a rule over the whole run (mean): the first step it lists
        steps = [min(s) for s in result.fail_steps.values() if s]
    if not steps:
        raise MigrateError(f"migrate compare fails ({result.first_failure.key}) but names no step: give --step N")
    step = min(steps)
    rules = sorted({c.key for c in result.failed if c.step == step})
    return step, f"step {step}, the first migrate compare flags ({', '.join(rules) or result.first_failure.key})"


def _checkpoint(folder: Path, side: str, run: Path, step: int, cfg: RunConfig) -> Path:
    if folder.is_dir():
        return folder
    saved = sorted(int(p.name.split("-")[1]) for p in (folder.parent.glob("checkpoint-*"))
                   if p.name.split("-")[1].isdigit())
    have = f"its checkpoints are at steps {', '.join(map(str, saved))}" if saved else "it has no checkpoint"
    every = cfg.checkpoint_interval
    if every and (step - 1) % every == 0:
        why = f"checkpoint_interval {every} writes one there: keep_checkpoints {cfg.keep_checkpoints} pruned it, " \
              f"or it was removed"
    else:
        why = f"checkpoint_interval is {every or 'off'}: a checkpoint_interval that divides {step - 1} (1 does) " \
              f"would have written it"
    raise MigrateError(f"replaying step {step} needs the {side} state after step {step - 1} and {run} has none "
                       f"({have}); {why}")


def replay_command(golden, ms) -> str | None:
    """The `migrate replay` command for two runs `compare` failed, or None when either run folder has no
    checkpoint to replay from (a metrics.jsonl given stands for the folder holding it)."""
    folders = [Path(p).parent if Path(p).is_file() else Path(p) for p in (golden, ms)]
    golden_dir, ms_dir = folders
    if not (any(golden_dir.glob("checkpoint-*")) and any((ms_dir / "checkpoints").glob("checkpoint-*"))):
        return None
    return f"migrate replay {shlex.quote(str(golden_dir))} {shlex.quote(str(ms_dir))}"
