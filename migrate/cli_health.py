"""`migrate health RUN`: the health watch's account of a finished or running training run.

Argument parsing only; calls `migrate.train.health.summary.summarise`. The verb is declared at its
handler (`migrate.cli_verbs`).
"""
from __future__ import annotations

from migrate.cli_verbs import arguments, verb


@verb("health", "summarise a training run's health events (exit 0 healthy, 1 not)")
def _cmd_health(args) -> int:
    import json

    from migrate.train.health.summary import summarise

    code = 0
    for run in args.runs:
        summary = summarise(run)
        if args.json:
            print(json.dumps({"run": str(summary.run), "steps": summary.steps, "policy": summary.policy,
                              "healthy": summary.healthy, "first": summary.first, "counts": summary.counts,
                              "events": summary.events, "verdicts": summary.verdicts, "source": summary.source}))
        else:
            print("\n".join(summary.lines()))
        code = max(code, summary.exit_code)
    return code


@arguments("health")
def _health_arguments(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder(s): metrics.jsonl, health.jsonl")
    p.add_argument("--json", action="store_true", help="one JSON object per run instead of text")
