"""The MindSpore side of a replay: the trainer's own recipe, resumed from its checkpoint and
stepped once (`MindSporeRecipe.setup` / `faults_from` / `step`), its split step graphs telling a
`StepRecording` what they computed; a `--dp N` run's ranks run here one after the other
(`ranks.RanksInOneProcess`: the global batch on one process). The run folder is not touched: the
recipe's run log goes to a temporary folder."""
from __future__ import annotations

import tempfile
from pathlib import Path

from migrate.models.mode import execution_mode
from migrate.replay.ranks import RanksInOneProcess
from migrate.replay.recording import StepRecording
from migrate.train.config import RunConfig
from migrate.train.parallel_setup import run_layout_of
from migrate.train.trainer import MindSporeRecipe


class MSReplay:
    """The MindSpore run as it was after `checkpoint` (None: before its first step), ready to step."""

    def __init__(self, cfg: RunConfig, checkpoint: Path | None, faults=(), mode: str = "graph", dp: int = 1):
        self.recording = StepRecording()
        self.mode = mode
        self._tmp = tempfile.TemporaryDirectory(prefix="migrate-replay-")
        # dp ranks: run in this process, rank by rank (`ranks`)
        self.ranks = RanksInOneProcess(run_layout_of(cfg, dp=dp)) if dp > 1 else None
        # peak_flops given: the MFU figure is not wanted here, so no matmul benchmark runs
        self.recipe = MindSporeRecipe(cfg, Path(self._tmp.name) / "run", mode=mode, faults=faults, peak_flops=1.0,
                                      log=lambda line: None, observe=self.recording, parallel=self.ranks)
        if self.ranks is not None:
            self.ranks.attach(self.recipe)
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
        if self.ranks is None:
            return self.recording
        order = [p.name for p in self.training.optimizer.parameters]
        return self.recording.over_ranks(self.ranks.size, dict(zip(order, self.ranks.reduced, strict=True)))

    def close(self) -> None:
        self.recipe.run_log.close()
        self._tmp.cleanup()
