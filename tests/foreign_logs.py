"""Writers of the field's training logs from a metrics.jsonl run, in each producer's own format.

The formats follow the producers' sources (quoted in migrate/compare/foreign_text.py and
log_formats.py); where the producer's own code can write the file, it does: HF's
``TrainerState.save_to_json`` and ``TensorBoardCallback.on_log``, TensorBoard's ``SummaryWriter``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

_MF_PREFIX = "2026-12-01 18:00:00,000 - mindformers[mindformers/core/callback/callback.py:520] - INFO - "


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _windows(recs: list[dict], interval: int):
    """(last record of the window, the window's records), one per logged step, as the producers
    count: every `interval`-th step."""
    for end in range(interval, len(recs) + 1, interval):
        yield recs[end - 1], recs[end - interval:end]


def _mean_loss(window: list[dict]) -> float:
    kept = [r["loss"] for r in window if not r.get("skipped")]
    return float(np.mean(np.array(kept, dtype=np.float32), dtype=np.float32)) if kept else float("nan")


def write_megatron(recs: list[dict], path: Path, next_lr: list[float], interval: int = 1,
                   lr_format: str = "{:.6E}", first_iteration: bool = False) -> Path:
    """Megatron-LM training_log lines (2025 layout; ``lr_format='{:.3E}'`` for the pre-2024 one).
    ``next_lr[s]`` is the lr of step s + 1 (index 0 unused): what Megatron prints at iteration s.
    ``first_iteration``: also the line Megatron prints after iteration 1, which does not reset the
    window (should_reset = not is_first_iteration)."""
    total = len(recs)
    out = ["using world size: 1, data-parallel size: 1, context-parallel size: 1",
           "> building GPTModel ...", "[after dataloaders are built] datetime: 2026-12-01 18:00:00"]
    lines = list(_windows(recs, interval))
    if first_iteration and interval > 1:
        lines.insert(0, (recs[0], recs[:1]))
    for last, window in lines:
        i = last["step"]
        line = " [2026-12-01 18:00:00.000000]"
        line += f" iteration {i:8d}/{total:8d} |"
        line += f" consumed samples: {i * 8:12d} |"
        line += f" elapsed time per iteration (ms): {123.4:.1f} |"
        line += " learning rate: " + lr_format.format(next_lr[i]) + " |"
        line += f" global batch size: {8:5d} |"
        line += f" lm loss: {_mean_loss(window):.6E} |"
        line += " loss scale: {:.1f} |".format(last.get("loss_scale") or 1.0)
        line += " grad norm: {:.3f} |".format(last["grad_norm"])
        line += " number of skipped iterations: {:3d} |".format(sum(bool(r.get("skipped")) for r in window))
        line += f" number of nan iterations: {0:3d} |"
        out.append(line)
        if i == interval:
            out.append("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0")
    path.write_text("\n".join(out) + "\n")
    return path


def write_mindformers(recs: list[dict], path: Path, steps_per_epoch: int | None = None, sink: bool = False,
                      interval: int = 1, with_lr: bool = True) -> Path:
    """MFLossMonitor.print_output_info lines through its logger's prefix; lr / global_norm /
    loss_scale printed with %s of 0-d float32 numpy arrays (asnumpy() of scalar tensors).
    ``with_lr=False``: the line it prints when no learning rate is known (no 'lr: ...')."""
    n = len(recs)
    spe = steps_per_epoch or n
    epochs = (n + spe - 1) // spe
    out, seen = ["2026-12-01 18:00:00,000 - mindformers[mindformers/trainer/base_trainer.py:1] - INFO - .........."
                 " Starting Training Model .........."], []
    for k, r in enumerate(recs, 1):
        seen.append(r["loss"])
        if k % interval:
            continue
        epoch, step = (k - 1) // spe + 1, (k - 1) % spe + 1
        loss = f"loss: {r['loss']:5.3f}, " if sink else f"loss:[{r['loss']:5.3f}/{np.mean(seen):5.3f}], "
        lr = str(np.array(r["lr"], dtype=np.float32))
        norm = str(np.array(r["grad_norm"], dtype=np.float32))
        scale = str(np.array(r.get("loss_scale") or 1.0, dtype=np.float32))
        overflow = "True" if r.get("skipped") else "False"
        if with_lr:
            out.append(_MF_PREFIX + ("{ Epoch:[%3d/%3d], step:[%5d/%5d], " + loss + "per_step_time: %dms, lr: %s, "
                                     "overflow cond: %s, loss_scale: %s, global_norm: %s%s")
                       % (epoch, epochs, step, spe, 123, lr, overflow, scale, norm, ", train_throughput_per_npu: 1.2T"))
        else:
            out.append(_MF_PREFIX + ("{ Epoch:[%3d/%3d], step:[%5d/%5d], " + loss + "per_step_time: %dms, "
                                     "overflow cond: %s, loss_scale: %s, global_norm: %s%s")
                       % (epoch, epochs, step, spe, 123, overflow, scale, norm, ""))
        bar = "|" + "█" * 5 + " " * 45 + "|"
        out.append(_MF_PREFIX + f"  {100 * k / n:4.1f}% {bar} {12.3:.5f} samples/s/p  0:00:01 }}")
    path.write_text("\n".join(out) + "\n")
    return path


def _hf_entries(recs: list[dict], interval: int, steps_per_epoch: int) -> list[tuple[int, dict]]:
    """(global_step, logs) as Trainer._maybe_log_save_evaluate builds them every `interval` steps."""
    return [(last["step"], {"loss": _mean_loss(window), "grad_norm": last["grad_norm"],
                            "learning_rate": last["lr"], "epoch": last["step"] / steps_per_epoch})
            for last, window in _windows(recs, interval)]


def write_hf_trainer_state(recs: list[dict], folder: Path, interval: int = 1, steps_per_epoch: int = 100) -> Path:
    """trainer_state.json as transformers' own TrainerState.save_to_json writes it, log_history filled as
    Trainer.log fills it ({**logs, "step": global_step}), plus an evaluation entry and the final summary."""
    from transformers import TrainerState

    folder.mkdir(parents=True, exist_ok=True)
    state = TrainerState(global_step=len(recs), max_steps=len(recs), logging_steps=interval)
    for step, logs in _hf_entries(recs, interval, steps_per_epoch):
        state.log_history.append({**logs, "step": step})
        if step == len(recs) // 2:
            state.log_history.append({"eval_loss": logs["loss"] + 0.1, "eval_runtime": 0.5, "epoch": logs["epoch"],
                                      "step": step})
    state.log_history.append({"epoch": len(recs) / steps_per_epoch, "step": len(recs), "total_flos": 1.0,
                              "train_loss": float(np.mean([r["loss"] for r in recs])), "train_runtime": 3.2})
    state.save_to_json(str(folder / "trainer_state.json"))
    return folder / "trainer_state.json"


def write_hf_tensorboard(recs: list[dict], folder: Path, interval: int = 1, steps_per_epoch: int = 100) -> Path:
    """Event files from HF's own TensorBoardCallback.on_log over the same log entries."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    writer = SummaryWriter(log_dir=str(folder))
    callback = TensorBoardCallback(tb_writer=writer)
    args = TrainingArguments(output_dir=str(folder), report_to=[])
    state = TrainerState()
    for step, logs in _hf_entries(recs, interval, steps_per_epoch):
        state.global_step = step
        callback.on_log(args, state, TrainerControl(), logs=dict(logs))
    writer.close()
    return folder


def write_tensorboard(recs: list[dict], folder: Path, tags: dict[str, str], next_lr: list[float] | None = None) -> Path:
    """Megatron- or MindFormers-style event files: writer.add_scalar(tag, value, iteration) per step."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for r in recs:
        s = r["step"]
        writer.add_scalar(tags["loss"], r["loss"], s)
        writer.add_scalar(tags["lr"], next_lr[s] if next_lr else r["lr"], s)
        writer.add_scalar(tags["grad_norm"], r["grad_norm"], s)
    writer.close()
    return folder
