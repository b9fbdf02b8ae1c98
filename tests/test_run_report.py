"""`migrate report`: one self-contained HTML page per run, offline (no network asset), with its
figures, the golden comparison and noise band, the step-time breakdown, the health events and
the effective hyperparameters. Runs are synthetic metrics.jsonl files shaped as both trainers
write them."""
from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from migrate.cli import main
from migrate.train.run_report import render_report

STEPS = 40
_NETWORK = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def network_refs(page: str) -> list[str]:
    """Anything the page would fetch: http(s) or protocol-relative src/href, scripts, stylesheets, @import."""
    found = [m.group(0) for m in _NETWORK.finditer(page)]
    found += re.findall(r"<script|<link|@import|url\(", page, re.I)
    return found


def write_run(folder, side: str, loss_factor: float = 1.0, seed: int = 0, dtype: str = "fp32",
              health: list[dict] | None = None, decay: float = 0.1) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    t = 0.0
    lines = []
    for step in range(1, STEPS + 1):
        dt = 4.0 if step == 1 else (0.35 if step % 10 == 0 else 0.1)  # compile; checkpoint saves
        t += dt
        loss = (6.0 * np.exp(-step / 30) + 1.0 + 0.01 * rng.standard_normal()) * loss_factor
        rec = {"step": step, "loss": loss, "lr": 1e-3 * min(1.0, step / 5), "grad_norm": 2.0 / step ** 0.5,
               "grad_norm_clipped": min(1.0, 2.0 / step ** 0.5), "tokens": 512 * step, "time": round(t, 4)}
        if side == "mindspore":
            rec.update(tokens_per_s=512 / dt, mfu=0.1)
        lines.append(json.dumps(rec))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    hparams = {"side": side, "config": {"dtype": dtype, "checkpoint_interval": 10, "seq_length": 64,
                                        "optimizer": {"lr": 1e-3, "weight_decay": decay}}}
    (folder / "effective_hparams.json").write_text(json.dumps(hparams))
    if health is not None:
        (folder / "health.jsonl").write_text("".join(json.dumps(e) + "\n" for e in health))


HEALTH = [{"step": 17, "kind": "loss_spike", "value": 9.5, "limit": 4.2, "detail": "loss 9.5 is 6.1 sigma above the "
           "running mean", "action": "skip", "policy": "skip", "micro": 1, "samples": [40, 41, 42, 43],
           "batch": "health_batches/step-000017.json"},
          {"step": 40, "kind": "verdict", "healthy": False, "first": {"loss_spike": 17}, "counts": {"loss_spike": 1},
           "line": "health after 40 steps: loss_spike from step 17 (1 step)"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    write_run(root / "ms", "mindspore", health=HEALTH)
    write_run(root / "golden", "golden")
    write_run(root / "noise", "golden", seed=1)
    write_run(root / "ms_bad", "mindspore", loss_factor=1.01, decay=0.0)
    return root


def images(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)]


def test_alone_the_page_is_offline_and_holds_its_figures(runs):
    page = render_report(runs / "ms")
    assert network_refs(page) == []
    pngs = images(page)
    assert len(pngs) == 2 and all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 10_000 for p in pngs)
    assert page.count("<img ") == 2  # every image is embedded
    # step time: the compile step, the later steps, the checkpoint steps' extra time
    assert "first step (compile, warm-up)</th><td class=\"l\">4.000 s" in page
    assert "median 0.1000 s" in page and "checkpoint steps (every 10)" in page and "+0.2500 s vs median" in page
    # health: the event row and the verdict line
    assert "loss_spike" in page and "6.1 sigma" in page and "health_batches/step-000017.json" in page
    assert "health after 40 steps: loss_spike from step 17" in page
    # effective hyperparameters
    assert "config.optimizer.weight_decay" in page


def test_network_check_catches_a_fetched_asset():
    """The offline check itself fails on pages that would fetch something."""
    for bad in ('<img src="https://example.org/a.png">', "<link rel=stylesheet href='//cdn.example/x.css'>",
                '<script>1</script>', "<div style=\"background:url(x.png)\"></div>"):
        assert network_refs(f"<html><body>{bad}</body></html>"), bad


def test_with_golden_and_noise_band(runs):
    page = render_report(runs / "ms", runs / "golden", runs / "noise", dtype="bf16")
    assert network_refs(page) == []
    assert len(images(page)) == 3  # curves, compare's plot with the noise band, step time
    assert '<h1 class="pass">' in page and "PASS" in page
    assert f"noise run {runs / 'noise'}" in page and "noise band" in page


def test_a_drifting_run_fails_on_the_page(runs):
    page = render_report(runs / "ms_bad", runs / "golden")
    assert '<h1 class="fail">' in page and "FAIL" in page
    assert '<tr class="fail"><th class="l">config.optimizer.weight_decay</th>' in page  # the knob that differs


def test_cli_writes_the_file_atomically_and_refuses_bad_input(runs, tmp_path, capsys):
    assert main(["report", str(runs / "ms"), "--golden", str(runs / "golden")]) == 0
    assert (runs / "ms" / "report.html").is_file()
    out = tmp_path / "r.html"
    assert main(["report", str(runs / "ms"), "-o", str(out)]) == 0 and out.read_text().startswith("<!DOCTYPE html>")
    capsys.readouterr()
    for argv, message in ((["report", str(tmp_path / "missing")], "run folder not found"),
                          (["report", str(runs / "ms"), "-o", str(tmp_path)], "is a folder"),
                          (["report", str(runs / "ms"), "--noise", str(runs / "noise")], "--noise needs --golden")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
