"""`migrate diff`: correct conversions pass with the promised figures, every
injected fault fails and is located at the right layer and sub-block."""
import json

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.align import run_diff
from migrate.align.model_faults import FAULTS
from migrate.cli import main
from migrate.convert import convert
from migrate.judge.twin import float64_in_place


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """variant -> (hf_dir, ms_dir), converted once for the module."""
    root = tmp_path_factory.mktemp("diff")
    out = {}
    for variant in ("mha", "gqa", "tied"):
        hf = build_hf_model(variant, seed=11)
        save_hf_model(hf, root / variant / "hf")
        convert(root / variant / "hf", root / variant / "ms")
        out[variant] = (root / variant / "hf", root / variant / "ms")
    return out


@pytest.mark.parametrize("variant", ["mha", "gqa", "tied"])
def test_correct_conversion_passes_fp32_and_bf16(converted, variant):
    hf_dir, ms_dir = converted[variant]
    fp32 = run_diff(hf_dir, ms_dir, detail=True, padded=True)
    h = fp32.summary["headline"]
    print(f"\n[{variant} fp32] logits max abs {h['logits_max_abs']:.2e} · loss rel {h['loss_rel_diff']:.2e}")
    assert fp32.passed, fp32.first_divergence
    assert h["logits_max_abs"] <= 1e-5

    bf16 = run_diff(hf_dir, ms_dir, dtype="bf16")
    h = bf16.summary["headline"]
    print(f"[{variant} bf16] logits cosine {h['logits_cosine']:.6f} · top-1 {h['top1']:.2%}")
    assert bf16.passed, bf16.first_divergence
    assert h["logits_cosine"] >= 0.999 and h["top1"] >= 0.99


def test_gradients_pair_up_and_pass_fp32(converted):
    hf_dir, ms_dir = converted["tied"]
    report = run_diff(hf_dir, ms_dir, grads=True)
    grads = [e for e in report.entries if e.kind == "grad"]
    after = [e for e in report.entries if e.kind == "param_after_step"]
    # 2 layers x 9 tensors + embedding + final norm; lm_head is tied to the embedding.
    assert len(grads) == len(after) == 20
    assert grads[0].name == "model.norm_out.weight"  # backward order starts at the head
    assert report.passed, report.first_grad_divergence


def test_hf_model_is_cast_back_from_its_twin_only_where_generate_runs_it_again(converted, monkeypatch):
    import migrate.probe.live as live

    casts = []

    def recorded(model, restore=True):
        casts.append(restore)
        return float64_in_place(model, restore=restore)

    monkeypatch.setattr(live, "float64_in_place", recorded)
    hf_dir, ms_dir = converted["tied"]
    report = run_diff(hf_dir, ms_dir, grads=True, generate=4)
    assert casts == [True] and report.passed and report.generation.ref_tokens == report.generation.got_tokens
    assert run_diff(hf_dir, ms_dir, grads=True).passed and casts == [True, False]


def test_the_optimizer_step_leaves_the_parameters_it_was_handed_as_they_were(converted):
    """`MSSide.adamw_steps` steps a master the step writes in place: the `before` it hands torch's reference
    is the model's parameter, unchanged by that write, and the model's own parameter is not stepped."""
    from migrate.align.ms_side import MSSide
    from migrate.probe.inputs import seeded_inputs

    side = MSSide(converted["tied"][1], "fp32", 0)
    side.gradients(seeded_inputs(side.config.vocab_size, 2, 8, 0, False))
    names = side.parameter_names()  # tensors of one shape share a master: writing it must not reach the model
    model = {p.name: p.asnumpy().copy() for p in side.model.trainable_params()}
    for name, before, grad, after in side.adamw_steps(names, lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                                      weight_decay=0.1):
        assert before.tobytes() == model[name].tobytes(), name
        assert not (after == before).all() and grad.shape == before.shape
    assert all(p.asnumpy().tobytes() == model[p.name].tobytes() for p in side.model.trainable_params())


@pytest.mark.parametrize("writes", ["numpy", "copy_"])
def test_a_tensor_stepped_after_others_of_its_shape_takes_the_step_it_takes_alone(converted, monkeypatch, writes):
    """`MSSide.adamw_steps` steps the tensors of one shape through one master and optimizer, restarted
    for each: every tensor's result is the bytes a fresh optimizer gives it (moments left from the tensor
    before, or its step count, would change them); so too where the master and moments cannot be
    written through numpy (`optim.host_view` None, as on a device) and `Tensor.copy_` writes them."""
    import migrate.train.optim as optim
    from migrate.align.ms_side import MSSide
    from migrate.probe.inputs import seeded_inputs

    if writes == "copy_":
        monkeypatch.setattr(optim, "host_view", lambda tensor: None)

    side = MSSide(converted["tied"][1], "fp32", 0)
    side.gradients(seeded_inputs(side.config.vocab_size, 2, 8, 0, False))
    names = side.parameter_names()
    shapes = [p.shape for p in side.model.trainable_params()]
    assert len(set(map(tuple, shapes))) < len(shapes)  # some shape is shared
    hyper = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}
    together = {name: after.copy() for name, _, _, after in side.adamw_steps(names, **hyper)}
    for name in names:
        (_, _, _, alone), = side.adamw_steps([name], **hyper)
        assert alone.tobytes() == together[name].tobytes(), name


@pytest.mark.slow
def test_greedy_generation_is_identical_for_32_tokens(converted):
    hf_dir, ms_dir = converted["gqa"]
    report = run_diff(hf_dir, ms_dir, batch=1, seq_len=6, generate=32)
    assert report.generation.first_diff_step is None
    assert report.generation.ref_tokens == report.generation.got_tokens
    assert len(report.generation.ref_tokens[0]) == 32
    assert report.passed


EXPECTED = {  # fault -> (variant, dtype, padded, block, layer)
    "qk_swap": ("mha", "fp32", False, "attention", 1),
    "rope_interleaved": ("mha", "fp32", False, "attention", 0),
    "rms_eps": ("gqa", "fp32", False, "attention", 0),
    "untied_head": ("tied", "fp32", False, "logits", None),
    "gqa_repeat": ("gqa", "fp32", False, "attention", 0),
    "gate_up_swap": ("gqa", "fp32", False, "mlp", 1),
    "mask_fill": ("mha", "fp32", True, "attention", 0),
    "rmsnorm_no_upcast": ("gqa", "bf16", False, "attention", 0),
    "loss_no_shift": ("mha", "fp32", False, "loss", None),
    "rope_theta": ("mha", "fp32", False, "attention", 0),
}


def test_every_registered_fault_has_an_expectation():
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize("fault", list(EXPECTED))
def test_injected_fault_fails_at_the_right_place(converted, fault):
    variant, dtype, padded, block, layer = EXPECTED[fault]
    hf_dir, ms_dir = converted[variant]
    report = run_diff(hf_dir, ms_dir, inject=fault, dtype=dtype, padded=padded)
    first = report.first_divergence
    print(f"\n[{fault}] {first.describe(first=True) if first else 'no divergence'}")
    assert not report.passed
    assert (first.block, first.layer) == (block, layer)


def test_fault_that_needs_padding_says_so(converted, capsys):
    hf_dir, ms_dir = converted["mha"]
    assert main(["diff", str(hf_dir), str(ms_dir), "--inject", "mask_fill"]) == 2
    assert "add --padded" in capsys.readouterr().err


def test_cli_exit_codes_and_report_files(converted, tmp_path, capsys):
    hf_dir, ms_dir = converted["tied"]
    out = tmp_path / "report"
    assert main(["diff", str(hf_dir), str(ms_dir), "--grads", "--report", str(out)]) == 0
    assert main(["diff", str(hf_dir), str(ms_dir), "--inject", "untied_head"]) == 1
    assert main(["diff", str(hf_dir), str(tmp_path / "missing")]) == 2
    data = json.loads((out / "report.json").read_text())
    assert data["schema_version"] == 1 and data["summary"]["passed"] is True
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["per_layer_error.png", "report.html", "report.json", "report.md"]


def test_text_input_goes_through_the_folder_tokenizer(tmp_path):
    from migrate.data.corpus import train_bpe_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The capital of France is Paris. The capital of Italy is Rome.\n" * 20)
    hf = build_hf_model("gqa", seed=12, vocab_size=320)
    save_hf_model(hf, tmp_path / "hf")
    train_bpe_tokenizer([corpus], 320, tmp_path / "tok")
    for f in (tmp_path / "tok").iterdir():
        (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    convert(tmp_path / "hf", tmp_path / "ms")
    assert (tmp_path / "ms" / "tokenizer.json").is_file()  # travels with the conversion
    report = run_diff(tmp_path / "hf", tmp_path / "ms", text="The capital of France is", generate=4)
    assert report.passed
    assert "The capital of France is" in report.inputs
    assert report.generation.prompt == "The capital of France is"
    assert report.generation.ref_text == report.generation.got_text


def test_text_without_tokenizer_is_a_clear_error(converted, capsys):
    hf_dir, ms_dir = converted["mha"]
    assert main(["diff", str(hf_dir), str(ms_dir), "--text", "hello"]) == 2
    assert "--text needs a tokenizer" in capsys.readouterr().err


def test_the_callers_mindspore_mode_is_back_after_a_diff_and_a_dump(converted, tmp_path):
    """`--mode graph` and the hooks' PyNative are scoped to the run (`models.mode.execution_mode`)."""
    import mindspore as ms

    from migrate.probe import dump

    hf_dir, ms_dir = converted["tied"]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    assert run_diff(hf_dir, ms_dir, batch=1, seq_len=4, mode="graph", reference="none").passed
    assert ms.get_context("mode") == ms.PYNATIVE_MODE
    ms.set_context(mode=ms.GRAPH_MODE)
    dump(str(ms_dir), tmp_path / "dump", batch=1, seq_len=4)
    assert ms.get_context("mode") == ms.GRAPH_MODE
