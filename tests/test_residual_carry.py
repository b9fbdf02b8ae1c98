"""A residual stream's max-abs limit carries from one layer's output to the next
(`judge.bounds.carried_limit`): an error a layer inherited, accepted one layer up, does not make
that layer the first divergence where its own peak falls (a later layer cancelling a massive
activation, as SmolLM2's layers 28-29 do); an error a layer adds above the carried limit still
fails; sub-blocks and the first layer carry nothing."""
import numpy as np

from migrate.judge.report import Report


def _massive(peak: float, error: float, seed: int = 0):
    """A (2, 8, 32) hidden state with one massive element of size `peak` carrying `error`."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((2, 8, 32)).astype(np.float32)
    ref[1, 1, 7] = peak
    got = ref.copy()
    got[1, 1, 7] += error
    return ref, got


def test_an_inherited_error_passes_where_the_layer_s_own_peak_fell():
    report = Report(dtype="fp32")
    ref, got = _massive(2.3e4, 0.15)          # 1e-5 x 2.3e4 = 0.23: accepted
    first = report.add("layer 0 output", ref, got, layer=0, block="layer output")
    assert first.passed, first.reason
    ref, got = _massive(3.7e3, 0.13)          # the same error, the peak now 3.7e3: 0.037 on its own
    alone = Report(dtype="fp32").add("layer 1 output", ref, got, layer=1, block="layer output")
    assert not alone.passed and "max_abs" in alone.reason
    carried = report.add("layer 1 output", ref, got, layer=1, block="layer output")
    assert carried.passed, carried.reason
    limit = next(c.limit for c in first.checks if c.key == "max_abs")
    assert carried.metrics["carried"] == {"max_abs": limit, "from": "layer 0 · output"}
    assert report.finalize().passed


def test_an_error_the_layer_adds_above_the_carried_limit_fails_and_names_it():
    report = Report(dtype="fp32")
    report.add("layer 0 output", *_massive(2.3e4, 0.15), layer=0, block="layer output")
    entry = report.add("layer 1 output", *_massive(3.7e3, 0.5), layer=1, block="layer output")
    assert not entry.passed
    assert "carried from layer 0 · output" in entry.reason
    report.finalize()
    assert report.first_divergence is entry


def test_the_limit_carries_on_through_every_later_layer_but_never_across_a_gap():
    report = Report(dtype="fp32")
    report.add("layer 0 output", *_massive(2.3e4, 0.15), layer=0, block="layer output")
    for layer in (1, 2, 3):
        entry = report.add(f"layer {layer} output", *_massive(3.7e3, 0.13), layer=layer, block="layer output")
        assert entry.passed, (layer, entry.reason)
    assert entry.metrics["carried"]["from"] == "layer 2 · output"
    # Layer 5 follows no layer 4: nothing to inherit from.
    gap = report.add("layer 5 output", *_massive(3.7e3, 0.13), layer=5, block="layer output")
    assert "carried" not in gap.metrics and not gap.passed


def test_sub_blocks_and_other_kinds_carry_nothing():
    report = Report(dtype="fp32")
    report.add("layer 0 output", *_massive(2.3e4, 0.15), layer=0, block="layer output")
    mlp = report.add("layer 1 mlp", *_massive(3.7e3, 0.13), layer=1, block="mlp")
    assert "carried" not in mlp.metrics and not mlp.passed
    norm = report.add("final norm", *_massive(3.7e3, 0.13), block="final norm")
    assert "carried" not in norm.metrics and not norm.passed


def test_a_report_read_back_judges_the_carried_limit_the_same():
    report = Report(dtype="fp32")
    report.add("layer 0 output", *_massive(2.3e4, 0.15), layer=0, block="layer output")
    entry = report.add("layer 1 output", *_massive(3.7e3, 0.13), layer=1, block="layer output")
    again = Report(dtype="fp32").add_metrics("layer 1 output", entry.metrics, layer=1, block="layer output")
    assert again.passed and again.metrics["carried"] == entry.metrics["carried"]


def test_a_max_abs_bound_the_user_set_is_used_as_given_and_not_carried():
    from migrate.judge.thresholds import Thresholds

    user = Thresholds("fp32").with_overrides("hidden", max_abs_rel=1e-5)
    report = Report(dtype="fp32", thresholds=user)
    report.add("layer 0 output", *_massive(2.3e4, 0.15), layer=0, block="layer output")
    entry = report.add("layer 1 output", *_massive(3.7e3, 0.13), layer=1, block="layer output")
    assert not entry.passed and "carried" not in entry.reason
    assert "1e-05 × max|ref|" in entry.reason
