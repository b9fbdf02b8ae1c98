"""The alignment report of `migrate diff`: judged entries in order, the first divergence,
and the report in every format.

- `entries`: `Entry` (one compared tensor, judged) and `Generation`;
- `model`: `Report` (building, ranking, the verdict line, report.json's schema);
- `tables`: the rows every format lists; `terminal`, `markdown`, `html`, `plot`: one module
  per format, drawn through `migrate.judge`'s renderers; `files`: writing and reading them.
"""
from migrate.judge.report.entries import BLOCKS, DIRECTIONS, Entry, Generation, layer_of
from migrate.judge.report.files import REPORT_FILES, read_report, write_report
from migrate.judge.report.html import render_html
from migrate.judge.report.markdown import render_markdown
from migrate.judge.report.model import SCHEMA_VERSION, Report
from migrate.judge.report.plot import render_plot
from migrate.judge.report.terminal import print_table

__all__ = [
    "SCHEMA_VERSION",
    "BLOCKS",
    "DIRECTIONS",
    "Entry",
    "Generation",
    "Report",
    "layer_of",
    "print_table",
    "write_report",
    "read_report",
    "render_markdown",
    "render_html",
    "render_plot",
    "REPORT_FILES",
]
