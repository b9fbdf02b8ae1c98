"""`migrate compare` reading the field's logs: format detection, each format's fields and units, log
intervals, printed precision, and the one-line refusals. Synthetic curves, real file formats
(tests/foreign_logs.py); the fault suite on real runs is in tests/test_compare_faults.py."""
import json
import math

import numpy as np
import pytest

from foreign_logs import write_hf_trainer_state, write_megatron, write_mindformers, write_tensorboard
from migrate.cli import main
from migrate.compare import compare_runs
from migrate.compare.log_formats import printed_resolution
from migrate.compare.readers import detect_format, read_run
from migrate.errors import MigrateError
from test_compare import golden_curve, write_log

N = 40


def recs(n=N, scale=1.0):
    steps, loss, lr, grad = golden_curve(n)
    return [{"step": int(s), "loss": float(np.float32(l_ * scale)), "lr": float(r), "grad_norm": float(np.float32(g))}
            for s, l_, r, g in zip(steps, loss, lr, grad, strict=True)]


def dense(tmp_path, rows, name="ms"):
    return write_log(tmp_path / name / "metrics.jsonl", [r["step"] for r in rows], [r["loss"] for r in rows],
                     [r["lr"] for r in rows], [r["grad_norm"] for r in rows])


def next_lrs(rows):
    """What Megatron prints at iteration s: the lr of s + 1 (the last one's: the schedule continued)."""
    return [math.nan] + [r["lr"] for r in rows[1:]] + [rows[-1]["lr"]]


def test_printed_resolution_follows_how_each_producer_prints():
    assert printed_resolution("5.806", "fixed") == pytest.approx(5e-4)          # MindFormers '%5.3f'
    assert printed_resolution("5.806154E+00", "fixed") == pytest.approx(5e-7)   # Megatron '{:.6E}'
    assert printed_resolution("3.000E-04", "fixed") == pytest.approx(5e-8)      # Megatron before 2024
    assert printed_resolution("0.00075", "numpy") == pytest.approx(0.00075 * 2 ** -23)   # shortest float32 repr
    assert printed_resolution("[0.00012346]", "numpy") == pytest.approx(5e-9)   # numpy's 8 decimals cut it
    assert printed_resolution("0.001", "repr") == 0 and printed_resolution("nan", "fixed") == 0


def test_each_format_is_detected_and_read_with_its_fields(tmp_path):
    rows = recs()
    rows[6]["skipped"] = True
    paths = {"megatron": write_megatron(rows, tmp_path / "train.log", next_lrs(rows)),
             "mindformers": write_mindformers(rows, tmp_path / "mf.log", steps_per_epoch=8, sink=True),
             "hf_trainer": write_hf_trainer_state(rows, tmp_path / "hf"),
             "tensorboard": write_tensorboard(rows, tmp_path / "tb", {"loss": "loss", "lr": "learning-rate",
                                                                       "grad_norm": "grad-norm"})}
    for fmt, path in paths.items():
        got, where = detect_format(path)
        assert got == fmt
        run = read_run(path)
        assert list(run.steps) == list(range(1, N + 1)), fmt
    mg = read_run(paths["megatron"])
    assert mg.format == "megatron" and mg.skipped[6] and not mg.skipped[5]
    assert mg.lr[0] == pytest.approx(rows[1]["lr"], rel=1e-6)          # as printed: the next step's
    assert mg.grad_norm[3] == round(rows[3]["grad_norm"], 3) and mg.resolution["grad_norm"][3] == pytest.approx(5e-4)
    mf = read_run(paths["mindformers"])                                  # 5 epochs of 8: global steps
    assert mf.loss[17] == round(rows[17]["loss"], 3) and mf.skipped[6]
    assert np.float32(mf.lr[17]) == np.float32(rows[17]["lr"])  # the shortest repr of the float32 lr
    hf = read_run(paths["hf_trainer"])                                   # the eval entry and summary skipped
    assert hf.loss[9] == rows[9]["loss"] and not hf.resolution.get("loss", np.zeros(1)).any()
    tb = read_run(paths["tensorboard"])
    assert tb.format == "tensorboard:mindformers" and tb.loss[4] == np.float32(rows[4]["loss"])


def test_megatron_log_interval_is_judged_on_window_means(tmp_path):
    rows = recs()
    golden = write_megatron(rows, tmp_path / "golden.log", next_lrs(rows), interval=5, first_iteration=True)
    run = read_run(golden)
    assert list(run.steps) == [1, 5, 10, 15, 20, 25, 30, 35, 40]
    assert list(run.loss_window) == [1, 5, 5, 5, 5, 5, 5, 5, 5]  # iteration 1's line does not reset the window
    r = compare_runs(golden, dense(tmp_path, rows))
    assert r.passed, r.verdict_text()
    assert list(r.steps) == list(run.steps) and r.check("lr").passed and np.nanmax(r.lr_rel) < 1e-6
    assert any("averaged over the same steps" in n for n in r.notes)
    assert r.check("first").passed is True    # step 1 is logged alone: a first-step figure
    # The window mean is what is compared: a MindSpore run 1 % off at one step inside a window fails there.
    off = [dict(x) for x in rows]
    off[12]["loss"] *= 1.05
    r = compare_runs(golden, dense(tmp_path, off, "off"))
    assert not r.passed and r.check("max").step == 15 and r.check("max").value == pytest.approx(0.01, rel=0.1)


def test_hf_logging_steps_and_a_first_window_of_several_steps(tmp_path):
    rows = recs()
    golden = write_hf_trainer_state(rows, tmp_path / "hf", interval=4)
    r = compare_runs(golden, dense(tmp_path, rows))
    assert r.passed and list(r.steps) == list(range(4, N + 1, 4))
    assert r.to_dict()["runs"]["formats"] == {"golden": "hf_trainer", "ms": "metrics"}
    assert r.check("first").passed is None and "averages 4 steps" in r.check("first").detail
    r = compare_runs(golden, dense(tmp_path, recs(scale=1.002), "drifted"))
    assert not r.passed and r.check("mean").passed is False


def test_an_averaged_log_needs_every_step_of_its_windows_on_the_other_side(tmp_path):
    rows = recs()
    golden = write_megatron(rows, tmp_path / "golden.log", next_lrs(rows), interval=5)
    ms = write_mindformers(rows, tmp_path / "ms.log", interval=2)
    code = main(["compare", str(golden), str(ms), "--json", str(tmp_path / "out.json")])
    assert code == 2 and not (tmp_path / "out.json").exists()
    with pytest.raises(MigrateError, match=r"golden's loss at step 10 is the mean of steps 6..10 .* "
                                           r"MindSpore does not log step 7"):
        compare_runs(golden, ms)


def test_sparse_logs_with_no_common_step_are_refused(tmp_path):
    rows = recs()
    golden = write_mindformers(rows, tmp_path / "golden.log", interval=7)
    ms = write_mindformers(rows, tmp_path / "ms.log", interval=6)
    r = compare_runs(golden, write_mindformers(rows, tmp_path / "ms3.log", interval=3))
    assert r.passed and list(r.steps) == [21]          # 7, 14, ... against 3, 6, ...: judged where both log
    with pytest.raises(MigrateError, match="no step in common"):
        compare_runs(golden, ms)


def test_three_printed_decimals_widen_the_bounds_and_say_so(tmp_path):
    rows = recs()
    golden = write_mindformers(rows, tmp_path / "golden.log")
    r = compare_runs(golden, dense(tmp_path, rows))
    assert r.passed and r.check("first").limit > 1e-5     # '%5.3f' of a loss near 10: 5e-4 / 10
    assert any(n.startswith("printed precision of the logs") for n in r.notes)
    r = compare_runs(golden, dense(tmp_path, recs(scale=1.001), "off"))   # 1e-3 is 20x the loss resolution
    assert not r.passed and r.check("mean").passed is False


def test_a_log_without_lr_leaves_the_lr_rule_unjudged(tmp_path):
    rows = recs()
    golden = write_mindformers(rows, tmp_path / "golden.log", with_lr=False)
    r = compare_runs(golden, dense(tmp_path, rows))
    assert r.passed and r.check("lr").passed is None and "no step has an lr" in r.check("lr").detail
    r = compare_runs(golden, dense(tmp_path, recs(scale=1.001), "off"))
    assert not r.passed and r.check("mean").passed is False


def test_unknown_formats_are_refused_in_one_line(tmp_path, capsys):
    rows = recs()
    ms = dense(tmp_path, rows)
    (tmp_path / "notes.txt").write_text("epoch 1 loss 2.3\n")
    (tmp_path / "empty_tb").mkdir()
    (tmp_path / "empty_tb" / "events.out.tfevents.1.host").write_bytes(b"\x00" * 64)
    (tmp_path / "ts").mkdir()
    (tmp_path / "ts" / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    for bad, msg in ((tmp_path / "notes.txt", "unknown log format"),
                     (tmp_path / "empty_tb", "no TensorBoard scalars"),
                     (tmp_path / "ts", "no 'log_history' list")):
        assert main(["compare", str(bad), str(ms)]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err
    tb = write_tensorboard(rows, tmp_path / "other_tb", {"loss": "my/loss", "lr": "my/lr", "grad_norm": "my/g"})
    with pytest.raises(MigrateError, match=r"unknown producer \(tags: my/g, my/loss, my/lr\)"):
        compare_runs(tb, ms)


def test_a_format_is_one_declaration_beside_its_reader(tmp_path, monkeypatch):
    """docs/DESIGN.md "Registration": nanoGPT's train.py log, declared once; detection, reading and
    the refusal's list follow from the declaration alone."""
    import re

    from migrate.compare import log_formats, readers
    from migrate.compare.foreign_run import Rows, number
    from migrate.compare.log_formats import LogFormat, log_format

    monkeypatch.setattr(log_formats, "FORMATS", dict(log_formats.FORMATS))   # undone after the test
    monkeypatch.setattr(readers, "FORMATS", log_formats.FORMATS)
    line = re.compile(r"^iter (\d+): loss ([^,]+), time")

    @log_format(LogFormat(
        "nanogpt", "nanoGPT train.py log", "nanoGPT/train.py: print(f'iter {iter_num}: loss {lossf:.4f}, ...')",
        {"step": "iter + 1", "loss": "loss"}, loss_averaged=False, torch_clip=True, printed={"loss": "fixed"},
        sniff=lambda s: s.has_line(line), rank=45, known="nanoGPT iter lines"))
    def read_nanogpt(path, role):
        rows = Rows(path, "nanogpt")
        for lineno, text in enumerate(path.read_text().splitlines(), 1):
            if m := line.match(text):
                rows.add(int(m[1]) + 1, lineno, {"loss": number(m[2], f"{path}:{lineno}", "loss")},
                         {"loss": printed_resolution(m[2])})
        return rows.run(role, averaged=False)

    log = tmp_path / "train.log"
    log.write_text("".join(f"iter {i}: loss {4 - 0.1 * i:.4f}, time 12.34ms, mfu 1.00%\n" for i in range(5)))
    assert detect_format(log) == ("nanogpt", log)
    run = read_run(log)
    assert run.format == "nanogpt" and list(run.steps) == [1, 2, 3, 4, 5] and run.loss[0] == 4.0
    (tmp_path / "notes.txt").write_text("epoch 1 loss 2.3\n")
    with pytest.raises(MigrateError, match="nanoGPT iter lines"):
        detect_format(tmp_path / "notes.txt")
