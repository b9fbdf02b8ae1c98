"""`migrate report RUN`: argument parsing only (see `migrate.train.run_report`). The verb is declared
at its handler (`migrate.cli_verbs`)."""
from __future__ import annotations

from migrate.checkpoints.output_guard import REPORT_SIGNATURE
from migrate.cli_verbs import Output, arguments, verb


def _default(args):
    from pathlib import Path

    return Path(args.run) / "report.html"  # migrate.train.run_report.page.REPORT_FILE (tested equal)


@verb("report", "one self-contained HTML page for a training run: curves, step time, "
                "health events, effective hyperparameters",
      writes=(Output("output", "file", overwrite=None, exempt=_default, signature=REPORT_SIGNATURE),),
      reads=("run", "golden", "noise"))
def _cmd_report(args) -> int:
    from migrate.train.run_report import write_report
    from migrate.ui import console

    path = write_report(args.run, args.output, golden_dir=args.golden, noise_dir=args.noise, dtype=args.dtype)
    console().print(f"[green]report[/] {path}", highlight=False)
    return 0


@arguments("report")
def _report_arguments(p) -> None:
    p.add_argument("run", help="a run folder (metrics.jsonl, effective_hparams.json, health.jsonl)")
    p.add_argument("--golden", metavar="RUN", help="the golden run: its curves beside, and migrate compare's verdict")
    p.add_argument("--noise", metavar="RUN", help="a second golden run (another data seed): the noise band")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="compare's tolerances (default: the run's)")
    p.add_argument("-o", "--output", metavar="FILE", help="the HTML file (default: RUN/report.html)")
