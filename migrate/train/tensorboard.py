"""TensorBoard event files, written by both trainers with the same tags into their run folder.

    board = RunBoard(out, start_step)     # None-safe: RunBoard.off() writes nothing
    board.step(record, extra={"memory/rss_gib": ...}, events=verdict.events)
    board.close()

`tensorboard --logdir runs/` then shows each run folder (runs/golden, runs/ms) as a run,
the same tags overlaid. Written through TensorBoard's own `EventFileWriter` and protos
(the writer torch.utils.tensorboard uses too), which import neither torch nor
TensorFlow: the MindSpore trainer stays torch-free (tensorboardX imports torch when it
is installed). Every run writes a SessionLog START at its first step, so TensorBoard
drops what the folder held from that step on: the steps an interrupted run logged after
the checkpoint a resume starts from, or an earlier run into the same folder (what
tensorboardX's purge_step does).

Tags (values are the metrics.jsonl record's, as float32 like every TensorBoard scalar):
  train/loss, train/lr, train/grad_norm, train/grad_norm_clipped   (absent where null)
  perf/tokens_per_s, perf/mfu, memory/rss_gib
  fp16/loss_scale, fp16/skipped_steps (running count of skipped steps)
  health/events (events at this step; 0 on a healthy step), health/<kind> (1 where it showed),
  and a text entry `health` with the event lines.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
           "grad_norm_clipped": "train/grad_norm_clipped", "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu",
           "loss_scale": "fp16/loss_scale"}


class RunBoard:
    def __init__(self, out: str | Path | None, start_step: int = 0):
        self._writer = None
        self.skipped = 0
        if out is None:
            return
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._pb = event_pb2
        self._writer = EventFileWriter(str(out), flush_secs=10)
        # TensorBoard drops the folder's earlier events from this step on: a resume's overlap with the
        # interrupted run, or a whole earlier run written to the same folder.
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=start_step + 1,
                                               session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    @classmethod
    def off(cls) -> RunBoard:
        return cls(None)

    def step(self, record: dict, extra: dict | None = None, events=()) -> None:
        """One optimizer step's scalars from its metrics record, plus `extra` tags and its health events."""
        if self._writer is None:
            return
        from tensorboard.compat.proto import summary_pb2

        step = int(record["step"])
        values = {tag: record[key] for key, tag in SCALARS.items() if key in record}
        if "skipped" in record:
            self.skipped += bool(record["skipped"])
            values["fp16/skipped_steps"] = self.skipped
        values["memory/rss_gib"] = rss_gib()
        values["health/events"] = len(events)
        for event in events:
            values[f"health/{event.kind}"] = 1.0
        values.update(extra or {})
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(v))
                                             for tag, v in values.items() if _finite(v)])
        if events:
            text = "\n\n".join(e.line() for e in events)
            summary.value.add(tag="health", metadata=_text_metadata(summary_pb2),
                              tensor=_text_tensor(text))
        self._writer.add_event(self._pb.Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def rss_gib() -> float:
    """This process's resident memory (Linux /proc), GiB; 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 30
    except (OSError, ValueError, IndexError):
        return 0.0


def _finite(v) -> bool:
    return v is not None and math.isfinite(float(v))  # TensorBoard has no null: a null value is left out


def _text_metadata(summary_pb2):
    return summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))


def _text_tensor(text: str):
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

    return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()],
                                  tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[]))
