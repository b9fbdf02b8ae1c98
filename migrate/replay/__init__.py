"""`migrate replay`: one optimizer step of the golden and the MindSpore run, replayed from their
checkpoints with recording hooks, compared in the order the step computes it.

- `runs`: the two run folders, the step to replay (default: the first `migrate compare` flags) and
  the checkpoint of step N - 1 on each side;
- `recording`: `StepRecording`, what each trainer's own step tells it at its seams;
- `golden_side` / `ms_side`: load a side's state and run ITS step code once (golden/train_torch.py's
  `optimizer_step`, the MindSpore trainer's `MindSporeRecipe.step`), recorded;
- `judging`: the two recordings paired through the keymap and judged, stage by stage, into a
  `migrate diff` report, and the line naming the first quantity that parts;
- `replaying`: `replay(golden_run, ms_run, step=None)`, the whole of it.

Nothing is imported here: `migrate compare` reads `runs.replay_command` without loading a framework.
"""
