"""The judge: the dtype vocabulary, Check / Verdict, tolerance overrides and the renderers
shared by `migrate diff` and `migrate compare` (plain Python, no framework runs)."""
import math
import subprocess
import sys

import numpy as np
import pytest

from migrate.dtype_names import NAMES, PRECISIONS, SPELLINGS, canonical_dtype, spelled
from migrate.errors import MigrateError
from migrate.judge import Check, Column, Table, Verdict, fmt_figure, fmt_num, html, markdown, parse_spec, validated
from migrate.judge.table import FAIL, FIRST, NOT_JUDGED

# --------------------------------------------------------------------------- dtype vocabulary

def test_one_vocabulary_of_precisions():
    assert NAMES == ("fp32", "bf16", "fp16")
    assert [PRECISIONS[n].bytes for n in NAMES] == [4, 2, 2]
    assert [PRECISIONS[n].compute for n in NAMES] == ["float32", "bfloat16", "float16"]
    assert PRECISIONS["bf16"].unit_roundoff == 2.0 ** -8 and PRECISIONS["fp16"].unit_roundoff == 2.0 ** -11
    assert not PRECISIONS["fp32"].low and PRECISIONS["bf16"].low and PRECISIONS["fp16"].low
    for spelling in ("bfloat16", "torch.bfloat16", "mindspore.bfloat16", "BF16", " bf16 "):
        assert canonical_dtype(spelling) == "bf16"
    assert canonical_dtype(np.float16) == "fp16" and canonical_dtype(np.dtype("float32")) == "fp32"
    assert spelled("int8") is None
    with pytest.raises(MigrateError, match="unknown dtype 'int8'; expected fp32, bf16, fp16"):
        canonical_dtype("int8")


def test_other_dtype_tables_read_the_vocabulary():
    from migrate.checkpoints.dtypes import CLI_DTYPES, COMPUTE_DTYPE, short_name
    from migrate.compare import Tolerances
    from migrate.compare.effective_hparams import _dtype
    from migrate.memory_plan import DTYPE_BYTES

    assert DTYPE_BYTES == {s: PRECISIONS[n].bytes for s, n in SPELLINGS.items()}
    assert {short_name(dt): COMPUTE_DTYPE[dt] for dt in CLI_DTYPES.values()} == {
        n: PRECISIONS[n].compute for n in NAMES}
    assert Tolerances.for_dtype("fp16").band_floor == PRECISIONS["fp16"].unit_roundoff
    assert _dtype(["mindspore.float16", "torch.bfloat16", "Float32", "int8"]) == ["fp16", "bf16", "fp32", "int8"]


# --------------------------------------------------------------------------- Check / Verdict

def test_verdict_first_failure_is_the_earliest_step_then_the_rule_order():
    checks = [Check("mean", "mean", 2.0, 1.0, passed=False, step=30),
              Check("max", "max", 5.0, 1.0, passed=False, step=30),
              Check("lr", "lr", 0.0, 1.0, passed=True),
              Check("clip", "clip", math.nan, 1.0),                   # not judged
              Check("hparams", "knobs", 1, 0, passed=False)]          # no step: after every stepped one
    v = Verdict(checks, order=("hparams", "max", "mean"))
    assert not v.passed and v.exit_code == 1
    assert v.first_failure.key == "max"
    assert [c.key for c in v.judged] == ["mean", "max", "lr", "hparams"]
    assert v.check("clip").judged is False and v.check("nope") is None
    assert v.reasons() == "mean 2.00e+00 > 1.00e+00; max 5.00e+00 > 1.00e+00; knobs 1 > 0"
    assert v.line("a", "", "b") == "FAIL · a · b"
    ok = Verdict([Check("lr", passed=True), Check("clip")])
    assert ok.passed and ok.exit_code == 0 and ok.reasons() is None and ok.line("x") == "PASS · x"


def test_check_reason_and_json_fields():
    c = Check("first", "first-step loss rel diff", value=math.nan, limit=1e-6, passed=False, step=1)
    assert c.reason() == "first-step loss rel diff n/a > 1.00e-06"
    c.detail = "said otherwise"
    assert c.reason() == "said otherwise"
    assert list(c.to_dict()) == ["key", "label", "value", "limit", "passed", "step", "noise", "detail"]


def test_number_formats():
    assert fmt_num(None) == "—" and fmt_num(0.0) == "0" and fmt_num(3.2e-4) == "3.20e-04"
    assert fmt_num(np.int64(5)) == "5" and fmt_num(np.bool_(True)) == "True" and fmt_num(-math.inf) == "-inf"
    assert fmt_num(math.nan) == "nan" and fmt_figure(math.nan) == "n/a"


# --------------------------------------------------------------------------- tolerances

def test_overrides_are_validated_and_named():
    allowed = {"cosine": (-1.0, 1.0), "kl": (0.0, None)}
    assert validated("threshold", {"cosine": "0.5", "kl": None}, allowed) == {"cosine": 0.5}
    with pytest.raises(MigrateError, match="unknown threshold cos; expected one of cosine, kl"):
        validated("threshold", {"cos": 1}, allowed)
    with pytest.raises(MigrateError, match=r"threshold cosine must lie in \[-1, 1\], got 2.0"):
        validated("threshold", {"cosine": 2}, allowed)
    with pytest.raises(MigrateError, match="tolerance kl must be >= 0, got -1.0"):
        validated("tolerance", {"kl": -1}, allowed)
    with pytest.raises(MigrateError, match="kl: NaN is not a valid bound"):
        validated("threshold", {"kl": "nan"}, allowed)
    with pytest.raises(MigrateError, match="'x' is not a number"):
        validated("threshold", {"kl": "x"}, allowed)
    assert parse_spec("grad.max-abs=1e-6") == ("grad", "max_abs", "1e-6")
    assert parse_spec(" cosine = 0.9 ") == (None, "cosine", "0.9")
    with pytest.raises(MigrateError, match="expected NAME=VALUE or KIND.NAME=VALUE"):
        parse_spec("cosine")


# --------------------------------------------------------------------------- renderers

def _table():
    t = Table([Column("#"), Column("where", left=True), Column("status", left=True, wrap=True)], title="T")
    t.add([0, "a|b", "ok"])
    t.add([1, "c", "FAIL: x"], FAIL)
    t.add([2, "d", "FAIL: y"], FIRST)
    t.add([3, "e", "—"], NOT_JUDGED)
    return t


def test_markdown_bolds_failed_rows_and_escapes_pipes():
    lines = markdown.table(_table())
    assert lines[:2] == ["| # | where | status |", "|---|---|---|"]
    assert lines[2] == "| 0 | a\\|b | ok |"
    assert lines[3] == "| **1** | **c** | **FAIL: x** |" and lines[4].startswith("| **2** |")
    assert lines[5] == "| 3 | e | — |"
    assert markdown.key_values([("dtype", "fp32")]) == ["| | |", "|---|---|", "| dtype | fp32 |"]


def test_html_marks_rows_and_escapes():
    page = html.page("R <1>", html.table(_table()) + html.key_values([("k", "<v>")]))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<title>R &lt;1&gt;</title>" in page and "&lt;v&gt;" in page
    assert '<tr class="fail">' in page and '<tr class="first">' in page
    assert '<td class="status">FAIL: x</td>' in page and '<th class="l">where</th>' in page


def test_terminal_styles_rows_and_prints_the_verdict_last():
    import io

    from rich.console import Console

    from migrate.judge.terminal import NOTE_STYLE, print_judged

    buf = io.StringIO()
    print_judged(Console(file=buf, width=120), "heading", [_table()], [("note: n", NOTE_STYLE)], "FAIL · why", False)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    assert lines[0] == "heading" and lines[-2] == "note: n" and lines[-1] == "FAIL · why"
    assert any("FAIL: y" in ln for ln in lines)


def test_the_judge_and_its_clients_load_without_a_framework():
    code = ("import sys, migrate.judge.terminal, migrate.judge.html, migrate.judge.markdown, migrate.judge.plot, "
            "migrate.judge.jsonfile, migrate.judge.report, migrate.judge.checks, migrate.compare; "
            "print(sorted(m for m in ('torch', 'mindspore', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_diff_and_compare_decide_through_the_same_verdict(tmp_path):
    from migrate.compare import compare_runs
    from migrate.judge.report import Report

    empty = Report()
    assert isinstance(empty.verdict, Verdict) and empty.exit_code == 1
    assert empty.verdict.reasons() == "nothing compared" and empty.verdict_text() == "FAIL · nothing compared"
    rep = Report()
    rep.add("h", np.ones(4), np.ones(4))
    bad = rep.add("g", np.ones(4), np.array([1.0, np.nan, 1.0, 1.0]), kind="grad")
    assert [c.key for c in bad.checks if c.passed is False] == ["finite"]   # the rest is over finite positions
    assert rep.finalize().exit_code == 1 and rep.verdict.first_failure.label == "grad g"

    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(f'{{"step": {s}, "loss": 2.0, "lr": 1e-4, "grad_norm": 1.0}}\n' for s in range(1, 4)))
    result = compare_runs(log, log)
    assert isinstance(result.verdict, Verdict) and result.exit_code == 0
    assert result.verdict_text().startswith("PASS · 3 paired steps within fp32 tolerance")
