"""A training checkpoint's run state (trainer_state.json) by key, and the checks a resume makes.

The MindSpore trainer writes `state` with these keys (`migrate.train.checkpoint.folder.save_checkpoint` adds
the format, the version and OPTIMIZER_STEP); a resume reads them back through `check_resumable`
and `Position.from_state`.
"""
from __future__ import annotations

from dataclasses import dataclass

from migrate.checkpoints.integrity import STATE_FILE
from migrate.errors import MigrateError

RNG_FILE = "rng_state.json"  # the generator states, beside trainer_state.json

STEP = "step"                      # optimizer steps done (1-based number of the last)
SCHEDULER_STEP = "scheduler_step"  # the schedule's position: steps taken (an fp16 skip does not advance it)
OPTIMIZER_STEP = "optimizer_step"  # AdamW's own step count (written by save_checkpoint)
TOKENS = "tokens"                  # target tokens so far
ELAPSED = "elapsed"                # seconds of training so far (metrics' `time` goes on from it)
LOSS_SCALE = "loss_scale"          # the fp16 loss scaler's state (None in other precisions)
DATA_POSITION = "data_position"    # {"next_step", "draws_done"}: where the data order goes on
RNG = "rng"                        # Python, numpy and MindSpore generator states (RNG_FILE)
FAULTS = "faults"                  # the injected faults the run trains with
KEYMAP = "keymap"                  # the keymap's name
MODE = "mode"                      # graph or pynative
CONFIG = "config"                  # the run config, as RunConfig.to_dict()
PARALLEL = "parallel"              # the layout: dp, mp, pp, micro_batches, optimizer_shard, global_batch

# What a resume reads: refused when trainer_state.json lacks one.
RESUME_STATE = (STEP, SCHEDULER_STEP, OPTIMIZER_STEP, TOKENS, ELAPSED, CONFIG)
# Keys of the resumed run's config that may differ from the checkpoint's.
RESUME_FREE = frozenset({"checkpoint_interval", "keep_checkpoints", "out_dir", "eval_data", "eval_interval",
                         "eval_samples", "peak_flops", "health", "tensorboard"})
# ... and the split of the global batch, which may change (its size may not)
BATCH_SPLIT = frozenset({"micro_batch_size", "grad_accum_steps"})


@dataclass
class Position:
    """Where a run stands after `step` optimizer steps: what the next step goes on from."""

    step: int = 0
    scheduler_step: int = 0
    tokens: int = 0
    elapsed: float = 0.0

    @classmethod
    def from_state(cls, state: dict) -> Position:
        return cls(int(state[STEP]), int(state[SCHEDULER_STEP]), int(state[TOKENS]), float(state[ELAPSED]))


def parallel_state(layout) -> dict:
    """The PARALLEL entry of a layout (`migrate.parallel.layout.Layout`)."""
    return {"dp": layout.dp, "mp": layout.mp, "pp": layout.pp, "micro_batches": layout.micro_batches,
            "optimizer_shard": layout.optimizer_shard, "global_batch": layout.global_batch}


def run_state(position: Position, *, elapsed: float, loss_scale, global_batch: int, rng: dict, faults,
              keymap: str, mode: str, config: dict, layout) -> dict:
    """trainer_state.json's run state after `position.step` steps (the keys above, in their order)."""
    return {STEP: position.step, SCHEDULER_STEP: position.scheduler_step, TOKENS: position.tokens,
            ELAPSED: elapsed, LOSS_SCALE: loss_scale,
            DATA_POSITION: {"next_step": position.step, "draws_done": position.step * global_batch},
            RNG: rng, FAULTS: list(faults), KEYMAP: keymap, MODE: mode, CONFIG: config,
            PARALLEL: parallel_state(layout)}


def check_resumable(checkpoint, config: dict, faults, layout, total_steps: int) -> None:
    """Refuse a resume that would not continue the same curve (one MigrateError line).

    checkpoint: an opened checkpoint (`path`, `step`, `state`); config: this run's
    RunConfig.to_dict(); layout: this run's. The split of the global batch may change (dp,
    micro batch size, accumulation): the run order, the loss and the gradient are functions of
    the global batch alone.
    """
    check_resume_state(checkpoint)
    state = checkpoint.state
    saved = state.get(CONFIG, {})
    saved_parallel = state.get(PARALLEL) or {"global_batch": saved.get("micro_batch_size", 0)
                                             * saved.get("grad_accum_steps", 0)}
    if saved_parallel["global_batch"] != layout.global_batch:
        raise MigrateError(f"cannot resume from {checkpoint.path}: its global batch is "
                           f"{saved_parallel['global_batch']} samples per step, this run's is {layout.batch_line()}")
    free = RESUME_FREE | BATCH_SPLIT
    differ = sorted(k for k in set(saved) | set(config) if k not in free and saved.get(k) != config.get(k))
    if differ:
        raise MigrateError(f"cannot resume from {checkpoint.path}: the run config differs in "
                           + ", ".join(f"{k} ({saved.get(k)!r} -> {config.get(k)!r})" for k in differ[:4]))
    if list(state.get(FAULTS, [])) != list(faults):
        raise MigrateError(f"cannot resume from {checkpoint.path}: it was trained with faults "
                           f"{state.get(FAULTS)}, this run has {list(faults)}")
    if checkpoint.step > total_steps:
        raise MigrateError(f"checkpoint {checkpoint.path} is at step {checkpoint.step}, past total_steps")


def check_resume_state(checkpoint) -> None:
    """What a resume reads from trainer_state.json and rng_state.json is there and well-formed
    (a checkpoint too old for a manifest can still be damaged): one line naming the file."""
    lacking = [k for k in RESUME_STATE if k not in checkpoint.state]
    if lacking:
        raise MigrateError(f"cannot resume from {checkpoint.path}: {STATE_FILE} lacks {', '.join(lacking)}")
    rng = checkpoint.state.get(RNG)
    try:
        version, internal, _ = rng["python"]
        _, keys, pos, _, _ = rng["numpy"]
        ok = (isinstance(version, int) and len(internal) == 625 and len(keys) == 624 and isinstance(pos, int)
              and isinstance(rng["mindspore"]["state"], list))
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise MigrateError(f"cannot resume from {checkpoint.path}: {RNG_FILE} does not hold the Python, numpy and "
                           f"MindSpore generator states")
