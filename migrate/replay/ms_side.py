"""The MindSpore side of a replay: the trainer's own recipe, resumed from its checkpoint and
stepped once (`MindSporeRecipe.setup` / `faults_from` / `step`), its split step graphs telling a
`StepRecording` what they computed. The run folder is not touched: the recipe's run log goes to
a temporary folder."""
from __future__ import annotations

import tempfile
from pathlib import Path

from migrate.models.mode import execution_mode
from migrate.replay.recording import StepRecording
from migrate.train.config import RunConfig
from migrate.train.trainer import MindSporeRecipe


class MSReplay:
    """The MindSpore run as it was after `checkpoint` (None: before its first step), ready to step."""

    def __init__(self, cfg: RunConfig, checkpoint: Path | None, faults=(), mode: str = "graph"):
        self.recording = StepRecording()
        self.mode = mode
        self._tmp = tempfile.TemporaryDirectory(prefix="migrate-replay-")
        # peak_flops given: the MFU figure is not wanted here, so no matmul benchmark runs
        self.recipe = MindSporeRecipe(cfg, Path(self._tmp.name) / "run", mode=mode, faults=faults, peak_flops=1.0,
                                      log=lambda line: None, observe=self.recording)
        with execution_mode(mode):
            self.recipe.setup(checkpoint)

    @property
    def training(self):
        return self.recipe.training

    def step(self, step: int) -> StepRecording:
        """Optimizer step `step` (1-based), as the trainer's loop runs it (a fault starting there included)."""
        with execution_mode(self.mode):
            self.recipe.faults_from(step)
            self.recipe.step(step - 1)
        return self.recording

    def close(self) -> None:
        self.recipe.run_log.close()
        self._tmp.cleanup()
