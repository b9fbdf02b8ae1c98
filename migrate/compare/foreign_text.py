"""Text training logs: Megatron-LM's iteration lines and MindSpore Transformers' MFLossMonitor lines.

Line formats, from the projects' sources (each `LogFormat` below maps the fields; `log_formats`):

Megatron-LM, megatron/training/training.py ``training_log`` (2025)::

    log_string = f" [{datetime.now()...}]"
    log_string += ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
    log_string += ' consumed samples: {:12d} |' ...
    log_string += f' learning rate: {learning_rate:.6E} |'      # {:.3E} before 2024
    log_string += ' {}: {:.6E} |'.format(key, avg)               # 'lm loss', window mean
    log_string += f' loss scale: {loss_scale:.1f} |'
    log_string += f' grad norm: {grad_norm:.3f} |'
    log_string += ' number of skipped iterations: {:3d} |' ...
    log_string += ' number of nan iterations: {:3d} |' ...

MindSpore Transformers, mindformers/core/callback/callback.py ``MFLossMonitor.print_output_info``::

    loss = "loss: %5.3f, " % loss                                # dataset sink mode
    loss = "loss:[%5.3f/%5.3f], " % (loss, np.mean(self.loss_list))
    logger.info("{ Epoch:[%3d/%3d], step:[%5d/%5d], " + loss + separate_loss +
                "per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s, global_norm: %s%s", ...)

Lines are found anywhere in a file (the logger's own prefix, other output in between).
"""
from __future__ import annotations

import re
from pathlib import Path

from migrate.compare.foreign_run import Rows, number
from migrate.compare.log_formats import LogFormat, log_format, printed_resolution
from migrate.compare.metrics_log import Run
from migrate.errors import MigrateError

__all__ = ["MEGATRON", "MINDFORMERS", "MEGATRON_LINE", "MINDFORMERS_LINE", "read_megatron", "read_mindformers"]

MEGATRON_LINE = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
MINDFORMERS_LINE = re.compile(
    r"Epoch:\[\s*(\d+)/\s*(\d+)\],\s*step:\[\s*(\d+)/\s*(\d+)\],\s*loss:\s*\[?\s*([^,/\]\s]+)(.*)$")
_MF_FIELD = {"lr": re.compile(r"\blr: ([^,]+)"), "overflow": re.compile(r"overflow cond: ([^,]+)"),
             "loss_scale": re.compile(r"loss_scale: ([^,]+)"),
             "global_norm": re.compile(r"global_norm: (.+?)(?:, train_throughput_per_npu|$)")}


def _lines(path: Path, role: str):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from enumerate(f, 1)
    except OSError as e:
        raise MigrateError(f"{path}: cannot read ({e.strerror or e})") from None


MEGATRON = LogFormat(
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
         "2024), {:.3f} (grad norm), {:.1f} (loss scale).",
    sniff=lambda s: s.has_line(MEGATRON_LINE), rank=30, known="Megatron-LM iteration log lines")


@log_format(MEGATRON)
def read_megatron(path: Path, role: str) -> Run:
    fmt = MEGATRON
    names = {v: k for k, v in fmt.fields.items()}          # the log's field -> compare's column
    rows = Rows(path, fmt.key)
    for lineno, line in _lines(path, role):
        m = MEGATRON_LINE.search(line.rstrip("\n"))
        if not m:
            continue
        where = f"{path}:{lineno}"
        values, res, skipped = {}, {}, None
        for part in m.group(3).split("|"):
            key, sep, text = part.partition(":")
            key = key.strip()
            if not sep or key not in names:
                continue
            column = names[key]
            value = number(text, where, repr(key))
            if column == "skipped":
                skipped = value > 0
                continue
            values[column], res[column] = value, printed_resolution(text, fmt.printed.get(column, "fixed"))
        if "loss" not in values and not skipped:
            raise MigrateError(f"{where}: iteration {m.group(1)} has no 'lm loss' field "
                               "(Megatron-LM prints it unless every iteration of the window was skipped)")
        rows.add(int(m.group(1)), lineno, values, res, skipped)
    return rows.run(role, averaged=fmt.loss_averaged, interval=_log_interval(sorted(rows.values)))


def _log_interval(steps: list[int]) -> int | None:
    """Megatron's log_interval: the most common gap between logged iterations."""
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    return max(set(gaps), key=gaps.count) if gaps else None


MINDFORMERS = LogFormat(
    "mindformers", "MindSpore Transformers MFLossMonitor log",
    "mindformers/core/callback/callback.py: MFLossMonitor.print_output_info",
    {"step": "Epoch:[e/E], step:[s/S] -> (e - 1) * S + s", "loss": "loss", "lr": "lr",
     "grad_norm": "global_norm", "loss_scale": "loss_scale", "skipped": "overflow cond"},
    loss_averaged=False, torch_clip=False,
    printed={"loss": "fixed", "lr": "numpy", "grad_norm": "numpy", "loss_scale": "numpy"},
    note="'loss: %5.3f' (sink mode) or 'loss:[%5.3f/%5.3f]' (this step's / the epoch's running mean; "
         "the first is read): three decimals; lr (the step's own: MFTrainOneStepCell evaluates the schedule "
         "before calling the optimizer) and global_norm (pre-clip) are numpy values printed with %s; "
         "per_print_times > 1 logs every N-th step's own values (no averaging).",
    sniff=lambda s: s.has_line(MINDFORMERS_LINE), rank=40,
    known="MindSpore Transformers MFLossMonitor log lines")


@log_format(MINDFORMERS)
def read_mindformers(path: Path, role: str) -> Run:
    fmt = MINDFORMERS
    rows = Rows(path, fmt.key)
    for lineno, line in _lines(path, role):
        m = MINDFORMERS_LINE.search(line.rstrip("\n"))
        if not m:
            continue
        where = f"{path}:{lineno}"
        epoch, steps_per_epoch, step = int(m.group(1)), int(m.group(4)), int(m.group(3))
        values = {"loss": number(m.group(5), where, "loss")}
        res = {"loss": printed_resolution(m.group(5), fmt.printed["loss"])}
        rest = m.group(6)
        found = {k: rx.search(rest) for k, rx in _MF_FIELD.items()}
        for column, key in (("lr", "lr"), ("grad_norm", "global_norm"), ("loss_scale", "loss_scale")):
            f = found[key]
            if f is None or f.group(1).strip() in ("unavailable", "None"):
                continue
            values[column] = number(f.group(1), where, key)
            res[column] = printed_resolution(f.group(1), fmt.printed[column])
        overflow = found["overflow"]
        skipped = None if overflow is None else overflow.group(1).strip().strip("[]") == "True"
        rows.add((epoch - 1) * steps_per_epoch + step, lineno, values, res, skipped)
    return rows.run(role, averaged=fmt.loss_averaged)
