"""Training state that MindFormers (and MindSpore's own wrappers) save beside the model
parameters in one checkpoint: recognised by name, so `migrate export`, `load_model` and
`migrate inspect` skip it explicitly instead of calling it unexpected.

Names, from MindFormers 2.0.0's source and a checkpoint its trainer wrote here:
- per-parameter states `<prefix>.<parameter>`: adam_m / adam_v (core/optim/adamw.py, and
  mindspore.nn.AdamWeightDecay), exp_avg / exp_avg_sq / max_exp_avg_sq (fused_adamw.py,
  came.py), accu_grads (MFPipelineWithLossScaleCell's gradient accumulators);
- Came's factored states `<prefix>_<parameter>`: exp_avg_sq_row, exp_avg_sq_col,
  exp_avg_insta_row, exp_avg_insta_col, exp_avg_sq;
- scalars: global_step (the optimizer's), scale_sense (the wrapper's loss scale), and the
  CheckpointMonitor's append_info epoch_num, step_num, loss_scale, global_batch_size;
  current_iterator_step / last_overflow_iterator_step (adaptive loss scale),
  learning_rate, beta1_power / beta2_power (mindspore.nn.Adam), seq_chunk (sequence pipe).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

STATE_PREFIXES = ("adam_m.", "adam_v.", "exp_avg.", "exp_avg_sq.", "max_exp_avg_sq.", "accu_grads.")
FACTORED_PREFIXES = ("exp_avg_sq_row_", "exp_avg_sq_col_", "exp_avg_insta_row_", "exp_avg_insta_col_",
                     "exp_avg_sq_")
SCALARS = frozenset({"global_step", "scale_sense", "epoch_num", "step_num", "loss_scale", "global_batch_size",
                     "current_iterator_step", "last_overflow_iterator_step", "learning_rate", "beta1_power",
                     "beta2_power", "seq_chunk"})


def is_training_state(name: str) -> bool:
    return name in SCALARS or name.startswith(STATE_PREFIXES) or name.startswith(FACTORED_PREFIXES)


def split_training_state(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(model tensor names, training-state names), each in the given order."""
    model, state = [], []
    for name in names:
        (state if is_training_state(name) else model).append(name)
    return model, state


def summary(state: Iterable[str]) -> str:
    """'adam_m.* ×38, adam_v.* ×38, global_step, scale_sense' for a list of training-state names."""
    kinds: Counter = Counter()
    for name in state:
        if name in SCALARS:
            kinds[name] += 1
            continue
        prefix = next(p for p in (*STATE_PREFIXES, *FACTORED_PREFIXES) if name.startswith(p))
        kinds[prefix + "*"] += 1
    return ", ".join(k if n == 1 and k in SCALARS else f"{k} ×{n}" for k, n in kinds.items())
