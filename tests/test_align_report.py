"""Alignment report: ordering, first divergence, console table and the written files."""
import base64
import io
import json
import math
import os
import re

import numpy as np
import pytest
from rich.console import Console

from migrate.checkpoints import atomic as _atomic
from migrate.errors import MigrateError
from migrate.judge.report import (
    REPORT_FILES,
    SCHEMA_VERSION,
    Entry,
    Report,
    layer_of,
    print_table,
    read_report,
    write_report,
)
from migrate.judge.thresholds import Thresholds

N_LAYERS = 5
PARAMS = (
    ["model.embed_tokens.weight"]
    + [f"model.layers.{i}.{p}" for i in range(N_LAYERS)
       for p in ("self_attn.q_proj.weight", "mlp.down_proj.weight")]
    + ["model.norm.weight", "lm_head.weight"]
)


def _pair(rng, shape=(2, 6, 8), err=0.0, scale=1.0):
    a = rng.standard_normal(shape) * scale
    return a, a + err * rng.standard_normal(shape) * scale


def build(fail_from=(3, "mlp"), grad_fail=("model.layers.2.mlp.down_proj.weight",
                                          "model.layers.0.self_attn.q_proj.weight"),
          gen_diff=None, nan_in_logits=False):
    """A fabricated forward sequence: tiny fp32 noise until `fail_from`, then broken."""
    rng = np.random.default_rng(0)
    rep = Report(dtype="fp32", inputs="2 x 6 random token ids", seed=0,
                 ref_dir="/models/hf", got_dir="/models/ms",
                 ref_label="HF PyTorch", got_label="MindSpore",
                 versions={"torch": "2.13.0", "mindspore": "2.10.0"})
    broken = False
    rep.add("embed_tokens", *_pair(rng, err=1e-8), block="embedding")
    for i in range(N_LAYERS):
        for blk in ("attention", "mlp", "layer output"):
            broken = broken or (fail_from is not None and (i, blk) == fail_from)
            rep.add(f"layers.{i}.{blk}", *_pair(rng, err=0.5 if broken else 1e-8), layer=i, block=blk)
    rep.add("norm", *_pair(rng, err=0.5 if broken else 1e-8), block="final norm")
    ref_logits, got_logits = _pair(rng, shape=(2, 6, 40), err=0.5 if broken else 1e-8)
    if nan_in_logits:
        got_logits[0, 0, 0] = np.nan
    rep.add("logits", ref_logits, got_logits, kind="logits")
    rep.add("loss", np.float32(3.5), np.float32(3.9 if broken else 3.5), kind="loss")
    for name in reversed(PARAMS):                      # backward order: lm_head first
        g, h = _pair(rng, shape=(4, 4), err=1e-9, scale=1e-3)
        if name in grad_fail:
            h = h + 1e-4
        rep.add(name, g, h, kind="grad")
    toks = [3, 1, 4, 1, 5, 9, 2, 6]
    other = list(toks) if gen_diff is None else toks[:gen_diff] + [7] * (len(toks) - gen_diff)
    rep.set_generation(toks, other, ref_text="a b c", got_text="a b d")
    return rep.finalize()


# --------------------------------------------------------------------------- localisation

def test_first_divergence_is_layer3_mlp():
    rep = build()
    assert rep.passed is False
    first = rep.first_divergence
    assert (first.layer, first.block, first.kind, first.direction) == (3, "mlp", "hidden", "forward")
    assert first.location == "layer 3 · mlp output"
    # everything downstream fails too, everything upstream passes
    fwd = rep.forward
    k = fwd.index(first)
    assert all(e.passed for e in fwd[:k])
    assert not any(e.passed for e in fwd[k:] if e.kind != "generation")
    text = first.describe(first=True)
    assert re.fullmatch(r"layer 3 · mlp output · cosine 0\.\d+ < 0\.99999 — first divergence", text)
    assert "max_abs" in first.reason                    # the full list stays in the reason
    assert rep.summary["first_divergence"]["name"] == "layers.3.mlp"
    assert rep.summary["first_divergence"]["index"] == rep.entries.index(first)


def test_backward_order_gradient_localisation():
    rep = build()
    # layers.2 and layers.0 gradients are wrong: the one nearest the output comes first
    g = rep.first_grad_divergence
    assert g.name == "model.layers.2.mlp.down_proj.weight"
    assert g.kind == "grad" and g.direction == "backward" and g.layer == 2
    assert g.location == "grad model.layers.2.mlp.down_proj.weight"
    assert rep.backward[0].name == "lm_head.weight"
    assert rep.summary["headline"]["grads"] == len(PARAMS)
    assert rep.summary["headline"]["grads_failed"] == 2
    assert g.describe(first=True, backward=True).endswith("— first gradient divergence")


def test_backward_order_can_be_given_explicitly():
    # gradients fed in forward (named_parameters) order, ranked with order=
    rep = Report(dtype="fp32")
    rng = np.random.default_rng(1)
    for i, name in enumerate(PARAMS):
        g = rng.standard_normal(8) * 1e-3
        h = g + (1e-4 if "layers.1." in name or "layers.3." in name else 0.0)
        rep.add(name, g, h, kind="grad", order=-i)
    rep.finalize()
    assert rep.first_grad_divergence.name == "model.layers.3.mlp.down_proj.weight"
    assert [e.name for e in rep.backward] == list(reversed(PARAMS))


def test_passing_report():
    rep = build(fail_from=None, grad_fail=())
    assert rep.passed is True
    assert rep.first_divergence is None and rep.first_grad_divergence is None
    verdict = rep.verdict_text()
    assert verdict.startswith("PASS · logits max abs ")
    for part in ("cosine", "top-1 100.00%", "KL", "loss rel diff 0"):
        assert part in verdict
    assert rep.generation.first_diff_step is None


def test_empty_report_does_not_pass():
    rep = Report().finalize()
    assert rep.passed is False and "nothing compared" in rep.verdict_text()


def test_generation_section():
    rep = build(fail_from=None, grad_fail=(), gen_diff=5)
    assert rep.generation.first_diff_step == 5
    assert rep.generation.ref_tokens == [[3, 1, 4, 1, 5, 9, 2, 6]]
    assert rep.passed is False                        # fp32: generation must be identical
    gen = [e for e in rep.entries if e.kind == "generation"][0]
    assert rep.first_divergence is gen
    assert "differs at step 5 of 8" in gen.reason
    # in bf16 a different continuation is reported, not judged
    bf = Report(dtype="bf16")
    bf.add("x", np.ones(4), np.ones(4))
    bf.set_generation([1, 2, 3], [1, 9, 9])
    bf.finalize()
    assert bf.passed is True and bf.generation.judged is False
    assert "not judged" in bf.generation.summary_text()
    # calling again replaces the earlier generation
    bf.set_generation([1, 2, 3], [1, 2, 3])
    assert sum(e.kind == "generation" for e in bf.entries) == 1


def test_add_validates_kind_and_direction_and_keeps_shape_errors():
    rep = Report()
    with pytest.raises(ValueError):
        rep.add("x", np.ones(2), np.ones(2), kind="weights")
    with pytest.raises(ValueError):
        rep.add("x", np.ones(2), np.ones(2), direction="sideways")
    e = rep.add("x", np.ones((2, 3)), np.ones((3, 2)), layer=0, block="mlp")
    assert not e.passed and e.reason.startswith("shape mismatch")
    with pytest.raises(ValueError):
        Report(dtype="bf16", thresholds=Thresholds("fp32"))


def test_layer_of_and_locations():
    assert layer_of("model.layers.12.mlp.up_proj.weight") == 12
    assert layer_of("transformer.h.3.attn.c_attn.weight") == 3
    assert layer_of("lm_head.weight") is None
    e = Entry(name="n", kind="hidden", block="embedding")
    assert e.location == "embedding output"
    assert Entry(name="n", kind="hidden", block="layer output", layer=4).location == "layer 4 · output"
    assert Entry(name="n", kind="hidden", block="final norm").location == "final norm output"
    assert Entry(name="w", kind="param_after_step", block="w").location == "param after step w"


def test_custom_thresholds_are_used():
    a = np.random.default_rng(2).standard_normal(100)
    b = a + 1e-3
    strict = Report(dtype="fp32")
    assert strict.add("h", a, b).passed is False
    loose = Report(thresholds=Thresholds("fp32").with_overrides(max_abs=1e-2, cosine=0.999))
    assert loose.dtype == "fp32"
    assert loose.add("h", a, b).passed is True


# --------------------------------------------------------------------------- console

def test_print_table_marks_failures_and_first_divergence():
    rep = build()
    buf = io.StringIO()
    print_table(rep, Console(file=buf, width=250, force_terminal=True, color_system="standard"))
    out = buf.getvalue()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "◀ first divergence" in plain and "◀ first gradient divergence" in plain
    assert "layer 3 · mlp output" in plain
    lines = [ln for ln in plain.splitlines() if ln.strip()]
    assert lines[-1].startswith("FAIL · logits max abs")
    assert "\x1b[31m" in out or "\x1b[1;31m" in out or ";41m" in out   # red highlighting
    # one table line per entry
    for e in rep.entries:
        assert e.location in plain


def test_print_table_pass_line():
    rep = build(fail_from=None, grad_fail=())
    buf = io.StringIO()
    print_table(rep, Console(file=buf, width=250))
    last = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-1]
    assert last.startswith("PASS · logits max abs") and "top-1 100.00%" in last


# --------------------------------------------------------------------------- files

def _strict_json(text):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=reject)


def test_write_report_files(tmp_path):
    rep = build(nan_in_logits=True)
    out = tmp_path / "nested" / "diff"
    paths = write_report(rep, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
    assert {k: p.name for k, p in paths.items()} == {
        "json": "report.json", "md": "report.md", "png": "per_layer_error.png", "html": "report.html"}

    with open(paths["json"], encoding="utf-8") as fh:
        data = json.load(fh)
    _strict_json(paths["json"].read_text(encoding="utf-8"))        # no NaN / Infinity literals
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["run"]["dtype"] == "fp32" and data["run"]["versions"]["mindspore"] == "2.10.0"
    assert data["summary"]["passed"] is False
    assert data["summary"]["first_divergence"]["location"] == "layer 3 · mlp output"
    assert data["summary"]["first_grad_divergence"]["name"] == "model.layers.2.mlp.down_proj.weight"
    logits = [e for e in data["entries"] if e["kind"] == "logits"][0]
    assert logits["metrics"]["nan_got"] == 1 and logits["metrics"]["nonfinite_match"] is False
    assert data["generation"]["ref_tokens"] == [[3, 1, 4, 1, 5, 9, 2, 6]]
    assert data["thresholds"]["hidden"]["cosine"] == 0.99999

    png = paths["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")

    md = paths["md"].read_text(encoding="utf-8")
    assert md.startswith("# Alignment report: FAIL")
    assert "![per-layer error](per_layer_error.png)" in md
    assert "first divergence" in md and "| layer 3 · mlp output |" not in md  # failing rows are bold
    assert "**layer 3 · mlp output**" in md

    page = paths["html"].read_text(encoding="utf-8")
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m, "PNG must be embedded"
    assert base64.b64decode(m.group(1)) == png
    assert page.lstrip().startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert 'class="first"' in page and "layer 3 · mlp output" in page

    # no temporary files left behind
    assert not [p for p in out.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]

    # round trip
    back = read_report(out)
    assert back.first_divergence.name == "layers.3.mlp"
    assert back.first_grad_divergence.name == rep.first_grad_divergence.name
    assert back.generation.got_tokens == rep.generation.got_tokens
    nan_metric = [e for e in back.entries if e.kind == "logits"][0].metrics
    assert nan_metric["nonfinite_match"] is False
    assert back.to_dict()["summary"] == data["summary"]


def test_nonfinite_metric_values_become_strings(tmp_path):
    rep = Report()
    rep.add_metrics("weird", {"max_abs": math.inf, "cosine": math.nan, "max_rel": -math.inf}, kind="hidden")
    paths = write_report(rep, tmp_path)
    data = _strict_json(paths["json"].read_text(encoding="utf-8"))
    m = data["entries"][0]["metrics"]
    assert (m["max_abs"], m["cosine"], m["max_rel"]) == ("inf", "nan", "-inf")
    back = read_report(paths["json"]).entries[0].metrics
    assert back["max_abs"] == math.inf and math.isnan(back["cosine"])


def test_write_report_overwrites_atomically(tmp_path, monkeypatch):
    rep = build(fail_from=None, grad_fail=())
    write_report(rep, tmp_path)
    before = (tmp_path / "report.json").read_bytes()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_atomic.os, "replace", boom)
    with pytest.raises(MigrateError, match="No space left on device"):
        write_report(build(), tmp_path)
    monkeypatch.undo()
    assert (tmp_path / "report.json").read_bytes() == before       # old file intact
    assert sorted(os.listdir(tmp_path)) == sorted(REPORT_FILES)    # no temp files


def test_atomic_write_helper(tmp_path):
    p = tmp_path / "a" / "b.txt"
    _atomic.atomic_write_text(p, "one")
    os.chmod(p, 0o640)
    _atomic.atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert os.stat(p).st_mode & 0o777 == 0o640                   # mode of the replaced file kept
    assert os.listdir(p.parent) == ["b.txt"]


def test_write_report_into_a_file_is_a_user_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(MigrateError, match="not a directory"):
        write_report(Report(), f)


def test_plot_handles_no_forward_entries(tmp_path):
    rep = Report()
    rep.add("lm_head.weight", np.ones(3), np.ones(3), kind="grad")
    paths = write_report(rep, tmp_path)
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
