"""The report page: sections built from `migrate.judge.html`'s pieces, figures embedded as base64
PNG, written atomically. With a golden run, `migrate compare`'s rules table and plot (the noise
band when a noise run is given) are on the page too."""
from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import numpy as np

from migrate.checkpoints.atomic import atomic_write_text
from migrate.compare import compare_runs, render_plot
from migrate.compare.terminal import rules_table
from migrate.errors import MigrateError
from migrate.judge import html as h
from migrate.judge import short
from migrate.train.run_report.figures import curves_png, timing_png
from migrate.train.run_report.run_files import HEALTH_FILE, RunFiles, read_run
from migrate.train.run_report.timing import step_timing

REPORT_FILE = "report.html"
_HEALTH_COLUMNS = ("step", "kind", "value", "limit", "detail", "action", "micro", "samples", "batch")


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{h.esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _num(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "—" if x is None else str(x)
    return f"{x:,}" if isinstance(x, int) else (f"{x:.6g}" if math.isfinite(x) else str(x))


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def _summary(run: RunFiles) -> list[tuple[str, str]]:
    m = run.metrics
    finite = m.loss[np.isfinite(m.loss)]
    rows = [("run", str(run.folder)), ("side", run.side), ("steps", f"{len(m)} ({m.span()})"),
            ("precision", str(run.config("dtype", "—")))]
    if len(finite):
        rows += [("loss", f"first {finite[0]:.6g} · last {finite[-1]:.6g} · min {finite.min():.6g}")]
    if m.loss.size > finite.size:
        rows.append(("non-finite loss", f"{m.loss.size - finite.size} steps"))
    if m.tokens is not None:
        rows.append(("tokens", f"{int(m.tokens[-1]):,}"))
    if m.skipped is not None:
        rows.append(("skipped steps (fp16 overflow)", str(int(m.skipped.sum()))))
    return rows


def _health(run: RunFiles) -> list[str]:
    if not run.health_found:
        return [f"<p>No {HEALTH_FILE} in this run: it was trained without the health watch.</p>"]
    parts = [f"<p>{h.esc(v.get('line', ''))}</p>" for v in run.health_verdicts]
    if not run.health:
        return parts + ["<p>No health event.</p>"]
    out = ["<table><tr>", *(f'<th class="l">{c}</th>' for c in _HEALTH_COLUMNS), "</tr>"]
    for e in run.health:
        cells = [_num(e.get(c)) if c in ("value", "limit") else
                 short(e.get(c), 80) if c == "samples" else ("" if e.get(c) is None else str(e.get(c)))
                 for c in _HEALTH_COLUMNS]
        out.append('<tr class="fail">' + "".join(f'<td class="l">{h.esc(c)}</td>' for c in cells) + "</tr>")
    out.append("</table>")
    return parts + [f"<p>{len(run.health)} event(s); the saved batches are under the run folder.</p>", *out]


def _hparams(run: RunFiles, golden: RunFiles | None) -> list[str]:
    if run.hparams is None:
        return ["<p>No effective_hparams.json in this run.</p>"]
    mine = flatten(run.hparams)
    if golden is None or golden.hparams is None:
        return h.key_values((k, short(v, 160)) for k, v in mine.items())
    theirs = flatten(golden.hparams)
    out = ['<table><tr><th class="l">knob</th><th class="l">this run</th><th class="l">golden</th></tr>']
    for key in list(mine) + [k for k in theirs if k not in mine]:
        a, b = mine.get(key, "—"), theirs.get(key, "—")
        differ = key in mine and key in theirs and a != b and key.split(".")[0] not in ("side", "versions")
        out.append(f'<tr class="{"fail" if differ else ""}"><th class="l">{h.esc(key)}</th>'
                   f'<td class="l">{h.esc(short(a, 120))}</td><td class="l">{h.esc(short(b, 120))}</td></tr>')
    out.append("</table>")
    return ["<p>Rows in red differ between the two runs (the side and framework versions always do; "
            "<code>migrate compare</code> judges the knobs both sides record with the same meaning).</p>", *out]


def render_report(run_dir, golden_dir=None, noise_dir=None, dtype: str | None = None) -> str:
    """The whole page as text."""
    run = read_run(run_dir)
    golden = read_run(golden_dir) if golden_dir is not None else None
    if noise_dir is not None and golden is None:
        raise MigrateError("--noise needs --golden: the noise band is the golden's own spread")
    title = f"Training run report: {run.folder.name or run.folder}"
    parts = [f"<h1>{h.esc(title)}</h1>"]
    result = None
    if golden is not None:
        result = compare_runs(golden.folder, run.folder, noise_path=noise_dir,
                              dtype=dtype or run.config("dtype") or "fp32")
        verdict = "pass" if result.passed else "fail"
        parts = [f'<h1 class="{verdict}">{h.esc(title)}</h1>', f'<p class="verdict">{h.esc(result.verdict_text())}</p>']
    parts += [f"<p>{h.esc(v.get('line', ''))}</p>" for v in run.health_verdicts[-1:]]
    parts += ["<h2>Summary</h2>", *h.key_values(_summary(run))]
    parts += ["<h2>Curves</h2>", _img(curves_png(run, golden), "loss, lr and grad-norm curves")]
    if result is not None:
        parts += ["<h2>Against the golden run</h2>",
                  f"<p>{h.esc(str(golden.folder))} (golden) vs {h.esc(str(run.folder))}"
                  + (f"; noise run {h.esc(str(noise_dir))}" if noise_dir is not None else "") + "</p>",
                  *h.table(rules_table(result)),
                  *(f"<p>note: {h.esc(n)}</p>" for n in result.notes),
                  _img(render_plot(result), "loss against the golden, with the noise band")]
    timing = step_timing(run)
    parts.append("<h2>Step time</h2>")
    if timing is None:
        parts.append("<p>metrics.jsonl has no <code>time</code> field.</p>")
    else:
        parts += [*h.key_values(timing.rows), _img(timing_png(timing), "step time")]
    parts += ["<h2>Health events</h2>", *_health(run)]
    parts += ["<h2>Effective hyperparameters</h2>", *_hparams(run, golden)]
    return h.page(title, parts)


def write_report(run_dir, out=None, golden_dir=None, noise_dir=None, dtype: str | None = None) -> Path:
    """Render and write atomically; `out` defaults to RUN/report.html."""
    out = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    if out.is_dir():
        raise MigrateError(f"output {out} is a folder; name the HTML file to write")
    text = render_report(run_dir, golden_dir, noise_dir, dtype)
    return atomic_write_text(out, text)
