"""The report's files: report.json, report.md, per_layer_error.png and report.html, and
report.json read back."""
from __future__ import annotations

import json
from pathlib import Path

from migrate.checkpoints.atomic import atomic_write_text
from migrate.errors import MigrateError
from migrate.jsonsafe import load_json
from migrate.judge.jsonfile import write_json
from migrate.judge.plot import write_png
from migrate.judge.report.html import render_html
from migrate.judge.report.markdown import render_markdown
from migrate.judge.report.model import Report
from migrate.judge.report.plot import render_plot

__all__ = ["REPORT_FILES", "write_report", "read_report"]

REPORT_FILES = ("report.json", "report.md", "per_layer_error.png", "report.html")


def write_report(report: Report, out_dir: str | Path) -> dict[str, Path]:
    """Write report.json, report.md, per_layer_error.png and report.html into
    out_dir (created if missing), each atomically. Returns {"json", "md", "png",
    "html"} -> paths. An unwritable out_dir is a MigrateError."""
    out = Path(out_dir)
    report.finalize()
    if out.exists() and not out.is_dir():
        raise MigrateError(f"cannot write report: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": write_json(out / "report.json", report.to_dict())}
        png = render_plot(report)
        paths.update({
            "png": write_png(out / "per_layer_error.png", png),
            "md": atomic_write_text(out / "report.md", render_markdown(report)),
            "html": atomic_write_text(out / "report.html", render_html(report, png)),
        })
    except OSError as exc:
        raise MigrateError(f"cannot write report to {out}: {exc.strerror or exc}") from None
    return paths


def read_report(path: str | Path) -> Report:
    """Load a report.json (or the folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    try:
        data = load_json(p)
    except FileNotFoundError:
        raise MigrateError(f"no report at {p}") from None
    except json.JSONDecodeError as exc:
        raise MigrateError(f"{p} is not valid JSON: {exc}") from None
    return Report.from_dict(data)
