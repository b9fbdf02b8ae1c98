"""Issue 11, "verdicts that lie": NaN / Inf in `migrate diff`.

A tiny Llama is converted, then a NaN (or an Inf) is written into one element
of layer 1's down_proj -- in the converted MindSpore checkpoint, in the HF
source after conversion, or in the HF source before conversion (both sides
then compute NaN at the same positions: the case that printed
`PASS · logits max abs 0 · cosine 1`). `migrate diff` must exit 1 and name
the first tensor holding NaN / Inf, the count and the first positions, on the
console and in report.json, report.md and report.html.
"""
import json
import math
import shutil

import mindspore as ms
import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.judge import metrics as M
from migrate.judge.checks import judge
from migrate.judge.metrics import logits_metrics, tensor_metrics
from migrate.judge.report import Report

MS_DOWN = "model.layers.1.feed_forward.w2.weight"
HF_DOWN = "model.layers.1.mlp.down_proj.weight"
AT = (3, 5)


def poison_ms(src, dst, value):
    shutil.copytree(src, dst)
    params = ms.load_checkpoint(str(dst / "model.ckpt"))
    array = params[MS_DOWN].asnumpy().copy()
    array[AT] = value
    params[MS_DOWN].set_data(ms.Tensor(array))
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(dst / "model.ckpt"))
    return dst


def poison_hf(src, dst, value):
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors[HF_DOWN][AT] = value
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdict_nan")
    save_hf_model(build_hf_model("mha", seed=11), root / "hf")
    assert main(["convert", str(root / "hf"), str(root / "ms")]) == 0
    poison_hf(root / "hf", root / "hf_nan_src", math.nan)   # poisoned before conversion: both sides NaN
    assert main(["convert", str(root / "hf_nan_src"), str(root / "ms_from_nan")]) == 0
    return {
        "ms_nan": (root / "hf", poison_ms(root / "ms", root / "ms_nan", math.nan)),
        "hf_nan": (poison_hf(root / "hf", root / "hf_nan", math.nan), root / "ms"),
        "both_nan": (root / "hf_nan_src", root / "ms_from_nan"),
        "ms_inf": (root / "hf", poison_ms(root / "ms", root / "ms_inf", math.inf)),
    }


CASES = {  # case -> (words the verdict opens with, side holding it: ref / got / both)
    "ms_nan": ("NaN in MindSpore from layer 1 · output", "got"),
    "hf_nan": ("NaN in HF PyTorch from layer 1 · output", "ref"),
    "both_nan": ("NaN in HF PyTorch and MindSpore from layer 1 · output", "both"),
    "ms_inf": ("in MindSpore from layer 1 · output", "got"),
}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("case", list(CASES))
def test_diff_fails_and_names_nonfinite_values_everywhere(models, case, tmp_path, capsys):
    hf_dir, ms_dir = models[case]
    words, side = CASES[case]
    out = tmp_path / "report"
    code = main(["diff", str(hf_dir), str(ms_dir), "--report", str(out)])
    console = capsys.readouterr().out
    print(console)
    assert code == 1
    verdict = _flat(console.split("NaN/Inf first in", 1)[1])   # the lines after the table
    assert "PASS" not in verdict and "logits max abs 0 " not in verdict and "cosine 1 " not in verdict
    assert f"FAIL · {'Inf' if case == 'ms_inf' else ''}" in verdict and words in verdict
    assert "logits max abs nan · cosine nan" in verdict     # nothing finite was compared: no 0 / 1
    if case == "ms_inf":
        assert "Inf" in verdict.split("from layer 1")[0]
    assert "[0, 0, 3], [0, 1, 3], [0, 2, 3], …" in verdict   # column 3 of every token: the poisoned row
    assert "compared tensors hold NaN/Inf" in verdict

    data = json.loads((out / "report.json").read_text())
    nf = data["summary"]["nonfinite"]
    assert data["summary"]["passed"] is False and data["schema_version"] == 1
    assert nf["location"] == "layer 1 · output" and nf["direction"] == "forward"
    holders = [s for s in ("ref", "got") if nf[s]["nan"] + nf[s]["inf"]]
    assert holders == (["ref", "got"] if side == "both" else [side])
    assert nf[holders[0]]["at"][:3] == [[0, 0, 3], [0, 1, 3], [0, 2, 3]]
    logits = next(e for e in data["entries"] if e["kind"] == "logits")
    assert logits["passed"] is False and logits["reason"].startswith("NaN/Inf")
    assert logits["metrics"]["finite_compared"] == 0
    assert (logits["metrics"]["max_abs"], logits["metrics"]["cosine"]) == ("nan", "nan")

    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    for text in (md, page):
        assert words in text and "NaN / Inf" in text and "[0, 0, 3], [0, 1, 3]" in text
    assert md.startswith("# Alignment report: FAIL")


def test_clean_conversion_still_passes_and_says_nothing_of_nan(models, tmp_path, capsys):
    hf_dir = models["ms_nan"][0]
    assert main(["diff", str(hf_dir), str(hf_dir.parent / "ms"), "--report", str(tmp_path)]) == 0
    console = _flat(capsys.readouterr().out)
    assert "PASS · logits max abs" in console and "NaN" not in console
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["summary"]["nonfinite"] is None and "NaN / Inf" not in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_nan_in_gradients_and_parameters_after_the_step_is_named(models, tmp_path, capsys):
    hf_dir, ms_dir = models["ms_nan"]
    assert main(["diff", str(hf_dir), str(ms_dir), "--grads", "--report", str(tmp_path)]) == 1
    capsys.readouterr()
    data = json.loads((tmp_path / "report.json").read_text())
    back = [e for e in data["entries"] if e["direction"] == "backward"]
    bad = [e for e in back if e["metrics"]["nan_got"] + e["metrics"]["inf_got"]]
    assert {e["kind"] for e in bad} == {"grad", "param_after_step"}
    assert all(not e["passed"] and e["reason"].startswith("NaN/Inf") for e in bad)
    assert data["summary"]["first_grad_divergence"]["reason"].startswith("NaN/Inf")


# --------------------------------------------------------------------------- metrics

def test_all_nan_candidate_reads_nan_not_perfect():
    ref = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    got = np.full_like(ref, np.nan)
    m = tensor_metrics(ref, got)
    assert m["finite_compared"] == 0 and m["nan_got"] == 24 and m["nan_ref"] == 0
    assert all(math.isnan(m[k]) for k in ("max_abs", "max_rel", "mean_abs", "cosine"))
    assert m["nonfinite_got_at"] == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 1, 0]]
    assert m["nonfinite_ref_at"] == []
    passed, reason = judge(m, "logits", "fp32")
    assert not passed
    assert reason.startswith("NaN/Inf positions differ at 24 positions (ref: finite | got: 24 NaN of 24 at "
                             "[0, 0, 0], [0, 0, 1], [0, 0, 2], …)")


def test_nan_on_both_sides_at_the_same_positions_fails():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x[1, 2] = np.nan
    x[2, 0] = -np.inf
    m = logits_metrics(x, x.copy())
    assert m["nonfinite_match"] is True and m["finite_compared"] == 10
    assert m["nonfinite_ref_at"] == m["nonfinite_got_at"] == [[1, 2], [2, 0]]
    passed, reason = judge(m, "logits", "bf16")
    assert not passed and reason.startswith("NaN/Inf at the same positions on both sides")
    rep = Report()
    rep.add("logits", x, x.copy(), kind="logits")
    assert rep.finalize().passed is False
    assert rep.verdict_text().startswith("FAIL · NaN/Inf in reference and converted from logits (reference: 1 NaN, "
                                         "1 Inf of 12 at [1, 2], [2, 0] | converted: 1 NaN, 1 Inf of 12")
    assert "(over the 10 of 12 positions finite on both sides)" in rep.verdict_text()


def test_nonfinite_positions_are_the_same_when_chunked(monkeypatch):
    a = np.random.default_rng(1).standard_normal(50)
    b = a.copy()
    b[[3, 17, 18, 40, 41, 49]] = np.inf
    whole = tensor_metrics(a, b)
    monkeypatch.setattr(M, "CHUNK_ELEMENTS", 7)
    assert tensor_metrics(a, b)["nonfinite_got_at"] == whole["nonfinite_got_at"] == [[3], [17], [18], [40], [41]]


def test_first_nonfinite_tensor_is_forward_first_then_backward():
    rep = Report()
    ok = np.ones(4)
    rep.add("grad lm_head", ok, np.array([1.0, np.nan, 1.0, 1.0]), kind="grad")
    rep.add("embedding output", ok, ok, kind="hidden", block="embedding")
    rep.add("layer 0 output", ok, np.array([1.0, 1.0, np.inf, 1.0]), kind="hidden", layer=0, block="layer output")
    rep.finalize()
    nf = rep.summary["nonfinite"]
    assert (nf["location"], nf["tensors"], nf["got"]["inf"], nf["got"]["at"]) == ("layer 0 · output", 2, 1, [[2]])
    assert [e.location for e in rep.nonfinite_entries()] == ["layer 0 · output", "grad grad lm_head"]
