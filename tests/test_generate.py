"""KV-cache generation (`migrate generate`, `migrate.infer`): token for token HF `generate`.

Every bundled decoder family, batched with left padding, greedy 128 tokens through the static
cache in GRAPH_MODE, judged by `compare_with_hf` (tokens identical, every step's logits within
1e-5). RoPE types whose frequencies depend on the length follow HF's per-call rule with a cache.
Each judged property is also shown to fail on a deliberately broken case. Run with -s for figures.
"""
import mindspore as ms
import numpy as np
import pytest

from family_fixtures import build_family_model
from hf_fixtures import build_hf_model, save_hf_model
from migrate.convert import convert
from migrate.infer.batch import make_batch
from migrate.infer.compare_hf import compare_with_hf, load_hf_model
from migrate.infer.generate import generate
from migrate.infer.runners import CachedRunner, UncachedRunner
from migrate.infer.sampling import Sampling
from migrate.models.loading import load_model
from test_rope_types import ROPE

STEPS = 128
# Left padding: row 1 is 3 tokens shorter. Seeds picked so that no near-tie (< 1e-4) flips a token.
PROMPTS = [[5, 9, 17, 33, 3, 8, 100, 7], [11, 12, 13, 40, 41]]
CASES = {
    "gqa_tied": lambda: build_hf_model("tied", seed=3, initializer_range=0.1),
    "llama3_rope_bias": lambda: build_hf_model("llama3_rope", seed=3, initializer_range=0.1, attention_bias=True,
                                               mlp_bias=True, num_key_value_heads=2),
    "head_dim": lambda: build_hf_model("gqa", seed=3, initializer_range=0.1, head_dim=16),
    # A window of 8 over 136 positions; only layer 1 slides (max_window_layers=1).
    "qwen2_window": lambda: build_family_model("hf_qwen2", seed=3, initializer_range=0.1, use_sliding_window=True,
                                               sliding_window=8, max_window_layers=1),
    "mistral_window": lambda: build_family_model("hf_mistral", seed=3, initializer_range=0.1, sliding_window=8),
    "gemma": lambda: build_family_model("hf_gemma", seed=3, initializer_range=0.1),
    "gpt2": lambda: build_family_model("hf_gpt2", seed=3, initializer_range=0.1, n_positions=160),
}
# Frequencies that change past max_position_embeddings (16) / the original length (8).
LENGTH_ROPE = {name: (lambda name=name: build_hf_model("gqa", seed=3, initializer_range=0.1, **ROPE[name]))
               for name in ("dynamic", "longrope")}
KEYMAP = {"qwen2_window": "hf_qwen2", "mistral_window": "hf_mistral", "gemma": "hf_gemma", "gpt2": "hf_gpt2"}


def converted(root, case):
    hf = {**CASES, **LENGTH_ROPE}[case]()
    save_hf_model(hf, root / "hf")
    convert(root / "hf", root / "ms", keymap=KEYMAP.get(case, "hf_llama"))
    return hf, root / "ms"


def runner_for(ms_dir, prompts=PROMPTS, steps=STEPS):
    """The converted model as a cache step in GRAPH_MODE (compiled on first use, reused after)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    model, config = load_model(ms_dir)
    batch = make_batch(prompts, 0, config.vocab_size)
    return CachedRunner(model, batch.size, batch.prompt_len, batch.prompt_len + steps), batch, model


def run(runner, batch, steps=STEPS, sampling=Sampling()):
    if isinstance(runner, CachedRunner):
        ms.set_context(mode=ms.GRAPH_MODE)  # its compiled graphs (each test starts in PyNative)
    return generate(runner, batch, steps, sampling, stop_ids=[], pad_id=0, record_logits=True)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """GQA + tied Llama, converted, with its compiled runner: (hf model, runner, batch)."""
    hf, ms_dir = converted(tmp_path_factory.mktemp("llama"), "gqa_tied")
    runner, batch, _ = runner_for(ms_dir)
    yield hf, runner, batch
    ms.set_context(mode=ms.PYNATIVE_MODE)


def judged(case, hf, runner, batch):
    ours = run(runner, batch)
    result = compare_with_hf(None, ours, batch, Sampling(), [], 0, model=hf)
    print(f"\n[{case}] {result.line()}")
    assert result.verdict.passed, result.verdict.reasons()
    assert ours.tokens.shape == (2, STEPS) and (result.hf_tokens == ours.tokens).all()
    assert max(result.logits_max_abs) <= 1e-5 and result.steps_compared == STEPS


@pytest.mark.slow
def test_greedy_128_tokens_equal_hf_generate_gqa_tied(llama):
    judged("gqa_tied", *llama)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(set(CASES) - {"gqa_tied"}))
def test_greedy_128_tokens_equal_hf_generate(tmp_path, case):
    hf, ms_dir = converted(tmp_path, case)
    runner, batch, _ = runner_for(ms_dir)
    judged(case, hf, runner, batch)


def test_the_judge_fails_when_pads_are_attended(llama, monkeypatch):
    hf, runner, batch = llama
    real = type(batch).prefill

    def pads_kept(self, length, cache_len):  # the padding-aware key mask left out
        inputs = real(self, length, cache_len)
        inputs["key_mask"][:] = 1
        return inputs

    monkeypatch.setattr(type(batch), "prefill", pads_kept)
    result = compare_with_hf(None, run(runner, batch, 8), batch, Sampling(), [], 0, model=hf)
    print(f"\n[pads attended] {result.line()}")
    assert not result.verdict.passed and result.verdict.first_failure.step == 0


@pytest.mark.slow
@pytest.mark.parametrize("rope", sorted(LENGTH_ROPE))
def test_length_dependent_rope_with_a_cache_follows_hf(tmp_path, rope):
    # HF with a cache chooses the set per call from its longest position, and cached keys keep the
    # set they were rotated with; the full forward re-rotates every key with the current length's
    # set. The cached run must equal HF generate; for dynamic NTK the full forward must differ,
    # past max_position_embeddings only (so the rule is visible here).
    hf, ms_dir = converted(tmp_path, rope)
    runner, batch, model = runner_for(ms_dir, [PROMPTS[0]], 24)
    ours = run(runner, batch, 24)
    result = compare_with_hf(None, ours, batch, Sampling(), [], 0, model=hf)
    print(f"\n[{rope}, KV cache] {result.line()}")
    assert result.verdict.passed, result.verdict.reasons()
    if rope == "dynamic":
        ms.set_context(mode=ms.PYNATIVE_MODE)
        full = run(UncachedRunner(model, 1, batch.prompt_len, batch.prompt_len + 24), batch, 24)
        uncached = compare_with_hf(None, full, batch, Sampling(), [], 0, model=hf)
        print(f"[dynamic, full forward each step] {uncached.line()}")
        assert not uncached.verdict.passed
        assert uncached.verdict.first_failure.step >= 16 - len(PROMPTS[0])


def test_sampling_is_seeded_and_tends_to_greedy(llama):
    hf, runner, batch = llama
    greedy = run(runner, batch, 24)
    settings = dict(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.2)
    a, b, c = (run(runner, batch, 24, Sampling(**settings, seed=seed)) for seed in (7, 7, 8))
    assert (a.tokens == b.tokens).all() and not (a.tokens == c.tokens).all()
    assert not (a.tokens == greedy.tokens).all()
    cold = run(runner, batch, 24, Sampling(temperature=1e-4, seed=3))
    assert (cold.tokens == greedy.tokens).all()
    # Runs of any length and settings reuse the prefill and decode graphs: compiled once each (the
    # decode graph is the decode kernels' step where they run, tests/test_kernel_decode.py).
    steps = (runner.step, runner.kernel_prefill, runner.kernels)
    graphs = [key for step in steps if step is not None for key in step.compile_cache]
    assert len(graphs) == 2
    # HF's own processors on HF's logits along our draws give our distributions.
    result = compare_with_hf(None, a, batch, Sampling(**settings, seed=7), [], 0, model=hf)
    print(f"\n[sampling] {result.line()}")
    assert result.verdict.passed, result.verdict.reasons()


def test_processors_equal_transformers_and_a_wrong_one_fails():
    import torch
    from transformers import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (4, 64)).astype(np.float32)
    seqs = rng.integers(0, 64, (4, 10))
    settings = Sampling(temperature=0.7, top_k=12, top_p=0.8, repetition_penalty=1.3)
    want = torch.from_numpy(logits.copy())
    for proc in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(12),
                 TopPLogitsWarper(0.8)):
        want = proc(torch.from_numpy(seqs), want)
    got = settings.process(logits, seqs)
    assert np.array_equal(np.isinf(got), np.isinf(want.numpy()))
    np.testing.assert_allclose(got[np.isfinite(got)], want.numpy()[np.isfinite(got)], rtol=0, atol=1e-6)
    without_top_p = Sampling(temperature=0.7, top_k=12, repetition_penalty=1.3)  # a processor left out
    assert not np.array_equal(np.isinf(without_top_p.process(logits, seqs)), np.isinf(want.numpy()))


def test_sampling_judge_fails_a_missing_processor(llama, monkeypatch):
    hf, runner, batch = llama
    settings = Sampling(temperature=0.8, top_k=5, seed=1)
    ours = run(runner, batch, 12, settings)
    real = Sampling.process
    monkeypatch.setattr(Sampling, "process", lambda self, lg, sq: real(Sampling(0.8, seed=1), lg, sq))  # no top-k
    result = compare_with_hf(None, ours, batch, settings, [], 0, model=hf)
    print(f"\n[sampling without top-k on our side] {result.line()}")
    assert not result.verdict.passed and result.verdict.first_failure.key == "probs"


def test_load_hf_model_names_a_missing_folder(tmp_path):
    from migrate.errors import MigrateError

    with pytest.raises(MigrateError, match="not found"):
        load_hf_model(tmp_path / "nope")


class _Clock:
    """A clock that moves only when the fake runner works: the times are exact, no wall clock read."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _TimedRunner:
    """prefill costs 5 s, the first decode call 100 s (the decode graph's compile) + 1, later ones 1 s."""

    batch, prefill_len, cache_len, vocab = 2, 4, 32, 16

    def __init__(self, clock):
        self.clock, self.decodes = clock, 0

    def _logits(self, step):
        logits = np.zeros((self.batch, self.vocab), np.float32)
        logits[:, 3 + step % 5] = 1.0  # never the stop id 2
        return logits

    def prefill(self, inputs):
        self.clock.now += 5.0
        return self._logits(0)

    def decode(self, tokens, positions, start, key_mask):
        self.decodes += 1
        self.clock.now += 101.0 if self.decodes == 1 else 1.0
        return self._logits(self.decodes)


def test_the_decode_rate_excludes_the_compile_of_the_first_decode_step(monkeypatch):
    import migrate.infer.generate as gen_module

    clock = _Clock()
    monkeypatch.setattr(gen_module, "time", clock)
    runner = _TimedRunner(clock)
    batch = make_batch([[5, 6, 7, 8], [9, 10, 11, 12]], 0, runner.vocab)
    gen = generate(runner, batch, 12, Sampling(), stop_ids=[2])
    assert gen.steps == 12 and runner.decodes == 11  # the first token comes from the prefill
    assert gen.first_token_s == 5.0 and gen.first_decode_s == 101.0
    # The decode timer starts when the first decode call has returned: 10 calls timed, 1 s each.
    assert gen.decode_steps == 10 and gen.decode_s == 10.0
    assert gen.decode_tokens_per_s == 2.0 and gen.decode_compile_s == 100.0 and gen.total_s == 116.0
    assert gen.timing_line() == ("first token 5000 ms · first decode step 101000 ms (compile ≈ 100000 ms) · "
                                 "decode 2.0 tokens/s over 10 steps")
    # The rows a static batch padded out keep the timing; 2 tokens have no timed decode step; 1 no decode.
    assert gen.rows(1).timing_line() == gen.timing_line().replace("2.0 tokens/s", "1.0 tokens/s")
    for n, line in ((2, "first token 5000 ms · first decode step 101000 ms"), (1, "first token 5000 ms")):
        clock.now = 0.0
        assert generate(_TimedRunner(clock), batch, n, Sampling()).timing_line() == line
