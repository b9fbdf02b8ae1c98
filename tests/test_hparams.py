"""`migrate hparams`: both sides' knobs from the live objects; each injected fault is caught and named."""
import pytest

from migrate.errors import MigrateError
from migrate.train.config import LossScaleConfig
from migrate.train.hparams import format_report, hparams_report, probe_torch_clip_eps
from migrate.train.knob_faults import TRAIN_FAULTS
from train_setup import load_cfg, make_run_dir


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    # The "bias" variant has attention and MLP biases, so "biases decayed" has biases to decay.
    return load_cfg(make_run_dir(tmp_path_factory.mktemp("hparams"), variant="bias"))


def test_identical_configs_agree_on_every_knob(cfg):
    report = hparams_report(cfg)
    print("\n" + format_report(report))
    assert report.exit_status == 0 and report.first_difference is None
    knobs = [r.knob for r in report.rows]
    for knob in ("betas", "eps", "weight_decay", "bias_correction", "decayed_parameters", "not_decayed_parameters",
                 "clip_max_norm", "clip_eps", "grad_accum_steps", "loss_divisor", "num_warmup_steps", "lr"):
        assert knob in knobs
    assert report.row("bias_correction").golden is True and report.row("clip_eps").golden == 1e-6
    assert report.row("loss_divisor").mindspore == 2 and report.row("eps").mindspore == 1e-8
    kept = report.row("not_decayed_parameters")
    assert kept.golden == kept.mindspore and kept.same  # norms and biases, paired through the keymap
    assert format_report(report).endswith("all knobs agree")


@pytest.mark.parametrize("fault", sorted(TRAIN_FAULTS))
def test_each_injected_fault_is_caught_and_named(cfg, fault):
    report = hparams_report(cfg, faults=[fault])
    first = report.first_difference
    assert report.exit_status == 1 and first is not None
    assert first.knob == TRAIN_FAULTS[fault].knob, format_report(report)
    assert format_report(report).endswith(f"first difference: {first.knob}")
    if fault == "decay_biases":
        assert first.detail.startswith("only MindSpore (14 bias, 5 norm weight): ") and "wq.bias" in first.detail
    if fault == "warmup_off_by_one":
        lr = report.row("lr")
        assert not lr.same and lr.detail == "first differs at optimizer step 2"  # lr = step / warmup


def test_fp16_lists_the_loss_scale(cfg):
    report = hparams_report(cfg.replace(dtype="fp16", loss_scale=LossScaleConfig(init_scale=1024.0)))
    row = report.row("loss_scale")
    assert row.same and row.golden == (1024.0, 2.0, 0.5, 2000) and report.exit_status == 0


def test_probes_and_bad_fault_names(cfg):
    assert probe_torch_clip_eps() == 1e-6  # measured on torch's clip_grad_norm_, not assumed
    with pytest.raises(MigrateError, match="unknown training fault 'nope'"):
        hparams_report(cfg, faults=["nope"])


def test_hparams_reads_no_weights(cfg, tmp_path):
    """The golden side builds its model on torch's meta device from config.json alone (no
    weight read, no memory): a HF folder with config.json but no weight file compares the same."""
    import shutil

    hf = tmp_path / "hf_config_only"
    hf.mkdir()
    shutil.copy(cfg.hf_model / "config.json", hf / "config.json")
    report = hparams_report(cfg.replace(hf_model=hf))
    assert report.exit_status == 0, report.first_difference
