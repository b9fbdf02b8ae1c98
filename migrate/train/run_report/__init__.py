"""`migrate report RUN [--golden RUN] [--noise RUN]`: one self-contained HTML page per training run.

`run_files` reads the run folder (metrics.jsonl, effective_hparams.json, health.jsonl), `timing`
breaks the step time down, `figures` draws the curves (matplotlib, embedded as base64 PNG), `page`
assembles the page from `migrate.judge.html`'s pieces and `migrate compare`'s rules table and plot
when a golden run is given. No asset is fetched: the page opens offline.
"""
from migrate.train.run_report.page import render_report, write_report

__all__ = ["render_report", "write_report"]
