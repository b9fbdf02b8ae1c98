"""Continued pretraining of SmolLM2-135M: 6 fp32 steps of the golden PyTorch script and of
`migrate train` from one run.yaml, judged by `migrate compare` (its first-step bound from the
golden's own float64 reference, which the output names); a one-sided fault must fail it, by name.
The commands are bench/real_tier/steps.py's."""
from real_tier.steps import STEPS

CLEAN_RUN = ["training-tokenize", "training-golden", "training-train", "training-compare"]
FAULTED_RUN = ["training-train-wd0", "training-compare-wd0"]


def test_continued_pretraining_matches_the_golden_run(tier):
    for step in CLEAN_RUN:
        outcome = tier.run(step)
        assert outcome.ok, outcome.explain()


def test_one_sided_weight_decay_fails_compare_by_name(tier):
    assert STEPS["training-compare-wd0"].exit == 1  # compare's hparams rule: weight_decay 0.1 vs 0
    for step in FAULTED_RUN:
        outcome = tier.run(step)
        assert outcome.ok, outcome.explain()


def test_every_training_step_is_covered():
    assert sorted(CLEAN_RUN + FAULTED_RUN) == sorted(n for n, s in STEPS.items() if s.group == "training")
