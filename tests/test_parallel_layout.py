"""Layout rules: each rule's message, the first-failure MigrateError, the global-batch line."""
import pytest

from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig
from migrate.parallel.layout import Layout, check, kv_replicated, validate


def _cfg(**kw):
    base = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32)
    base.update(kw)
    return LlamaConfig(**base)


LLAMA7B = _cfg()


def test_valid_layout_passes():
    lay = Layout(dp=2, mp=4, pp=1, micro_batch_size=1, grad_accum_steps=8, world_size=8)
    assert validate(lay, LLAMA7B) == []
    assert check(lay, LLAMA7B) is lay


@pytest.mark.parametrize("layout, config, message", [
    (Layout(dp=2, mp=2, pp=1, world_size=8), LLAMA7B,
     "dp × mp × pp = 2 × 2 × 1 = 4, but the world size is 8"),
    (Layout(pp=3, micro_batches=3), LLAMA7B,
     "num_layers (32) is not divisible by pp (3): every pipeline stage needs the same number of layers"),
    (Layout(mp=3), _cfg(num_heads=32, n_kv_heads=1, vocab_size=32001 * 3, intermediate_size=11007 * 3),
     "num_heads (32) is not divisible by mp (3): attention heads are split across mp"),
    (Layout(mp=4), _cfg(num_heads=12, hidden_size=768, n_kv_heads=6, vocab_size=32000, intermediate_size=3072),
     "n_kv_heads (6) and mp (4): kv heads are split when n_kv_heads % mp == 0 "
     "or replicated when mp % n_kv_heads == 0, and neither holds"),
    (Layout(mp=8), _cfg(n_kv_heads=4, qkv_concat=True),
     "n_kv_heads (4) is not divisible by mp (8) with qkv_concat: the fused w_qkv keeps each kv group's q, k "
     "and v rows together, so k/v cannot be replicated apart from q; use an mp that divides n_kv_heads, "
     "or convert without --qkv-concat"),
    (Layout(mp=2), _cfg(vocab_size=32001),
     "vocab_size (32001) is not divisible by mp (2): the embedding and lm_head are split over the vocabulary; "
     "pad it with `migrate vocab resize MS_DIR OUT --pad-to-multiple 2`"),
    (Layout(mp=8), _cfg(intermediate_size=11004),
     "intermediate_size (11004) is not divisible by mp (8): gate/up/down projections are split over it"),
    (Layout(pp=4, micro_batches=2), LLAMA7B,
     "micro_batches (2) must be >= pp (4) so that every pipeline stage has work"),
    (Layout(pp=1, micro_batches=4), LLAMA7B,
     "micro_batches (4) applies only with pp > 1; use grad_accum_steps to accumulate without a pipeline"),
    (Layout(dp=0), LLAMA7B, "dp must be a positive integer, got 0"),
])
def test_each_rule_message(layout, config, message):
    errors = validate(layout, config)
    assert errors == [message]
    with pytest.raises(MigrateError) as info:
        check(layout, config)
    assert str(info.value) == f"parallel layout {layout.describe()}: {message}"
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_check_reports_the_first_failure_only():
    cfg = _cfg(vocab_size=32001, num_layers=30)
    lay = Layout(dp=1, mp=2, pp=4, micro_batches=1, world_size=16)
    errors = validate(lay, cfg)
    assert [e.split(",")[0].split(":")[0] for e in errors] == [
        "dp × mp × pp = 1 × 2 × 4 = 8", "num_layers (30) is not divisible by pp (4)",
        "vocab_size (32001) is not divisible by mp (2)", "micro_batches (1) must be >= pp (4) so that every "
        "pipeline stage has work"]
    with pytest.raises(MigrateError, match=r"^parallel layout dp1 mp2 pp4: dp × mp × pp = 1 × 2 × 4 = 8, "
                                           r"but the world size is 16$"):
        check(lay, cfg)


@pytest.mark.parametrize("n_kv, mp, replicated", [(8, 2, False), (8, 8, False), (2, 4, True), (1, 8, True)])
def test_kv_heads_split_or_replicated(n_kv, mp, replicated):
    cfg = _cfg(n_kv_heads=n_kv)
    lay = Layout(mp=mp)
    assert validate(lay, cfg) == []
    assert kv_replicated(lay, cfg) is replicated


@pytest.mark.parametrize("n_kv, mp", [(8, 2), (8, 8), (4, 4)])
def test_fused_qkv_splits_whole_kv_groups(n_kv, mp):
    cfg = _cfg(n_kv_heads=n_kv, qkv_concat=True)
    assert validate(Layout(mp=mp), cfg) == []
    assert not kv_replicated(Layout(mp=mp), cfg)


def test_global_batch_and_line():
    lay = Layout(dp=4, mp=2, micro_batch_size=2, grad_accum_steps=8, optimizer_shard=True)
    assert lay.global_batch == 2 * 4 * 8
    assert lay.batch_line() == ("global batch 64 = micro batch 2 × dp 4 × grad accum 8; "
                                "layout dp 4 × mp 2 × pp 1 on 8 devices, optimizer sharded over dp")
    piped = Layout(dp=2, mp=1, pp=4, micro_batches=16, micro_batch_size=1)
    assert piped.global_batch == 1 * 2 * 1 * 16
    assert piped.batch_line(seq_length=4096) == (
        "global batch 32 = micro batch 1 × dp 2 × micro-batches 16 × grad accum 1 (131,072 tokens of 4096); "
        "layout dp 2 × mp 1 × pp 4 on 8 devices")
