"""The training logs `migrate compare` reads, and how each maps onto a `Run`: data, one entry a format.

Every line format here is copied from the producing project's own source, named in ``source``;
nothing is guessed. Each `LogFormat` says which of the log's fields fills which of compare's
columns (``fields``); whether the logged lr is the next step's (``lr_of_next_step``: Megatron-LM
steps its scheduler inside train_step, before training_log reads the lr); whether the logged
loss is a mean over the steps since the previous log line (``loss_averaged``: compare then
averages the other side's loss over the same steps); and whether the producer clips like
torch's ``clip_grad_norm_`` (``torch_clip``: then, with no post-clip norm in the log, compare
may derive the golden's from torch's formula).

Printed precision: a text log keeps only the digits it prints (MindSpore Transformers prints
the loss with 3 decimals), so every value carries its resolution -- half a unit in its last
printed digit (`printed_resolution`); TensorBoard stores float32 (half an fp32 ulp). Compare adds
that resolution to each bound a rounded value enters, and says so in its notes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["LogFormat", "FORMATS", "TB_DIALECTS", "printed_resolution", "FP32_HALF_ULP"]

FP32_HALF_ULP = 2.0 ** -24  # relative: TensorBoard scalars are float32 (simple_value)


@dataclass(frozen=True)
class LogFormat:
    key: str
    title: str
    source: str                      # the project file (and function) the format is read from
    fields: dict[str, str]           # compare's column <- the log's field name
    loss_averaged: bool              # loss at step s = mean over the steps since the previous log line
    torch_clip: bool                 # the producer clips as torch: max_norm / (norm + 1e-6)
    note: str = ""
    lr_of_next_step: bool = False    # the logged lr is the next step's (the scheduler stepped before the log)
    printed: dict[str, str] = field(default_factory=dict)  # column -> how it is printed (`printed_resolution`)


FORMATS: dict[str, LogFormat] = {
    "metrics": LogFormat(
        "metrics", "metrics.jsonl", "golden/train_torch.py, migrate train",
        {"step": "step", "loss": "loss", "lr": "lr", "grad_norm": "grad_norm",
         "grad_norm_clipped": "grad_norm_clipped", "skipped": "skipped", "loss_scale": "loss_scale",
         "tokens": "tokens"},
        loss_averaged=False, torch_clip=True),
    "hf_trainer": LogFormat(
        "hf_trainer", "HF Trainer trainer_state.json",
        "transformers/trainer.py: Trainer._maybe_log_save_evaluate and Trainer.log (state.log_history)",
        {"step": "step", "loss": "loss", "lr": "learning_rate", "grad_norm": "grad_norm",
         "tokens": "num_input_tokens_seen"},
        loss_averaged=True, torch_clip=True,
        printed={"loss": "repr", "lr": "repr", "grad_norm": "repr"},
        note="loss = tr_loss / (global_step - last logged step): the mean since the previous entry; "
             "learning_rate is read before lr_scheduler.step() (transformers 5; 4.x releases logged the next "
             "step's lr, which the lr rule names as a schedule off by one step); grad_norm is "
             "clip_grad_norm_'s pre-clip total norm. Numbers are Python reprs (exact); transformers 4.x rounded "
             "the loss to 4 decimals, which is read from the file (every loss with <= 4 decimals). Entries "
             "without 'loss' (evaluation, the final train_runtime summary) are skipped."),
    "megatron": LogFormat(
        "megatron", "Megatron-LM iteration log",
        "megatron/training/training.py: training_log (print_rank_last(log_string))",
        {"step": "iteration", "loss": "lm loss", "lr": "learning rate", "grad_norm": "grad norm",
         "loss_scale": "loss scale", "skipped": "number of skipped iterations"},
        loss_averaged=True, torch_clip=True, lr_of_next_step=True,
        printed={"loss": "fixed", "lr": "fixed", "grad_norm": "fixed", "loss_scale": "fixed"},
        note="'lm loss' is the mean over the advanced (not skipped) iterations since the previous line "
             "(log_interval); 'learning rate' is the next iteration's (train_step runs opt_param_scheduler.step "
             "before training_log); 'grad norm' (pre-clip, clip_grad_by_total_norm_fp32: max_norm / "
             "(norm + 1e-6)) and 'loss scale' are the logged iteration's; 'number of skipped "
             "iterations' counts the window's. Printed as {:.6E} (lm loss, lr; {:.3E} in releases before "
             "2024), {:.3f} (grad norm), {:.1f} (loss scale)."),
    "mindformers": LogFormat(
        "mindformers", "MindSpore Transformers MFLossMonitor log",
        "mindformers/core/callback/callback.py: MFLossMonitor.print_output_info",
        {"step": "Epoch:[e/E], step:[s/S] -> (e - 1) * S + s", "loss": "loss", "lr": "lr",
         "grad_norm": "global_norm", "loss_scale": "loss_scale", "skipped": "overflow cond"},
        loss_averaged=False, torch_clip=False,
        printed={"loss": "fixed", "lr": "numpy", "grad_norm": "numpy", "loss_scale": "numpy"},
        note="'loss: %5.3f' (sink mode) or 'loss:[%5.3f/%5.3f]' (this step's / the epoch's running mean; "
             "the first is read): three decimals; lr (the step's own: MFTrainOneStepCell evaluates the schedule "
             "before calling the optimizer) and global_norm (pre-clip) are numpy values printed with %s; "
             "per_print_times > 1 logs every N-th step's own values (no averaging)."),
    "tensorboard": LogFormat(
        "tensorboard", "TensorBoard event file",
        "read with tensorboard.backend.event_processing.event_accumulator.EventAccumulator",
        {}, loss_averaged=False, torch_clip=False,
        note="scalar tags per producer below (TB_DIALECTS); values are float32"),
}

# TensorBoard tags per producer: compare's column <- tag; the dialect is the first whose loss and
# lr tags the file has. Sources: transformers/integrations/integration_utils.py TensorBoardCallback.on_log
# (rewrite_logs adds "train/"), Megatron-LM training_log (writer.add_scalar(key, loss_dict[key]) is
# the iteration's own loss, not the printed window mean), MindFormers MFLossMonitor.print_output_info.
TB_DIALECTS: dict[str, tuple[LogFormat, dict[str, str]]] = {
    # migrate's own trainers (migrate/train/tensorboard.py SCALARS): the step's own values
    "migrate": (
        LogFormat("migrate_tb", "migrate TensorBoard", "migrate/train/tensorboard.py", {},
                  loss_averaged=False, torch_clip=True),
        {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
         "grad_norm_clipped": "train/grad_norm_clipped", "loss_scale": "fp16/loss_scale"}),
    "hf_trainer": (
        LogFormat("hf_trainer_tb", "HF Trainer TensorBoard (TensorBoardCallback)",
                  "transformers/integrations/integration_utils.py: TensorBoardCallback.on_log", {},
                  loss_averaged=True, torch_clip=True),   # the same logs as log_history
        {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm"}),
    "megatron": (
        LogFormat("megatron_tb", "Megatron-LM TensorBoard", FORMATS["megatron"].source, {},
                  loss_averaged=False, torch_clip=True, lr_of_next_step=True),
        {"loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm", "loss_scale": "loss-scale"}),
    "mindformers": (
        LogFormat("mindformers_tb", "MindSpore Transformers TensorBoard", FORMATS["mindformers"].source, {},
                  loss_averaged=False, torch_clip=False),
        {"loss": "loss", "lr": "learning-rate", "grad_norm": "grad-norm", "loss_scale": "loss-scale"}),
}


def printed_resolution(text: str, style: str = "fixed") -> float:
    """The absolute resolution of a printed number, by how it was printed:

    ``fixed``   a format with a fixed number of digits ('%5.3f', '{:.6E}'): half a unit in the
                last digit -- '5.806' -> 5e-4, '5.806154E+00' -> 5e-7;
    ``numpy``   str() of a numpy float32 value: the shortest repr that reads back the same float32
                (within half an fp32 ulp of it, itself within half an ulp of the value: one ulp), except
                where numpy's 8 fixed decimals cut it ('0.00012346');
    ``float32`` a float32 value (TensorBoard): half an fp32 ulp;
    ``repr``    Python's repr of a float: exact (0).
    A non-number ('nan', 'inf') has resolution 0."""
    t = text.strip().strip("[]").strip().lower().lstrip("+-")
    mantissa, _, exp = t.partition("e")
    try:
        value = float(t)
        e = int(exp) if exp else 0
    except ValueError:
        return 0.0
    if not math.isfinite(value) or style == "repr":
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    digits = 0.5 * 10.0 ** (e - decimals)
    ulp = abs(value) * FP32_HALF_ULP
    if style == "fixed":
        return digits
    if style == "numpy":   # float32 rounding, then a decimal anywhere in that float32's rounding interval
        return max(2 * ulp, digits if not exp and decimals >= 8 else 0.0)
    return ulp
