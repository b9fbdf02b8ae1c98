"""Knob faults that start at a step (`NAME@STEP`): parsing, which act at a step, bad specs refused."""
import pytest

from migrate.errors import MigrateError
from migrate.train.knob_faults import TRAIN_FAULTS, apply_faults, check_faults, faults_at, parse_fault
from migrate.train.knobs import TrainingKnobs


def test_a_fault_acts_from_its_step_on():
    specs = check_faults(["beta2@3", "adam_eps", "beta2@3"])
    assert specs == ("beta2@3", "adam_eps")  # each once, as given
    assert parse_fault("beta2@3") == ("beta2", 3) and parse_fault("adam_eps") == ("adam_eps", 1)
    assert faults_at(specs, 1) == faults_at(specs, 2) == ("adam_eps",)
    assert faults_at(specs, 3) == faults_at(specs, 40) == ("beta2", "adam_eps")


def test_the_new_faults_adjust_their_knobs():
    knobs = TrainingKnobs(eps=1e-8, bias_correction=True, decay_rule="hf", loss_divisor=2, clip_eps=1e-6,
                          warmup_shift=0, betas=(0.9, 0.999))
    assert apply_faults(knobs, ["beta2@5"]).betas == (0.9, 0.95)  # the start step is the caller's to read
    assert apply_faults(knobs, ["lr_late"]).lr_lag == 1
    assert apply_faults(knobs, ["head_grad_scale"]).head_grad_factor == 1.01
    assert {"beta2", "lr_late", "head_grad_scale"} <= set(TRAIN_FAULTS)


@pytest.mark.parametrize("spec, words", [("nope@3", "unknown training fault 'nope'"),
                                         ("beta2@0", "steps are 1-based"),
                                         ("beta2@x", "unknown training fault 'beta2@x'")])
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(MigrateError, match=words):
        check_faults([spec])
