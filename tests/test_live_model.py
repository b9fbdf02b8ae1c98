"""effective_hparams.json's live records read the model that trains, not the run config.

MindSpore: `migrate.train.live_model` walks the bundled model's cells. Golden:
`live_facts` in golden/train_torch.py reads the torch model (a probe forward under
the run's autocast, the layers' gradient checkpointing flags). For the same setup
both write the same `live_shared`; each record changes when the model it reads does
(a cell out of autocast, a layer without recompute).
"""
import pytest
import torch

from hf_fixtures import build_hf_model
from migrate.models.base import F32, model_precision
from migrate.models.config import LlamaConfig
from migrate.models.llama import LlamaForCausalLM
from migrate.train.live_model import autocast_dtype, mindspore_only_record, shared_record
from migrate.train.precision import autocast_model
from train_setup import load_golden

golden = load_golden()


def ms_model(layers: int = 3, tied: bool = False, fused: bool = False, dtype: str = "float32"):
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=layers,
                                        num_heads=4, n_kv_heads=2, seq_length=16, qkv_concat=fused,
                                        tie_word_embeddings=tied, compute_dtype=dtype))


def linear_dtypes(layers: int, dtype: str) -> dict:
    return {"decoder_layers": [[dtype]] * layers, "lm_head": [dtype]}


def test_the_mindspore_record_follows_the_cells():
    model = ms_model()
    assert shared_record(model) == {"parameter_dtypes": ["float32"], "recompute_layers": [],
                                    "linear_compute_dtypes": linear_dtypes(3, "float32")}
    assert autocast_dtype(model) is None
    autocast_model(model, "bf16")
    model.model.layers[2].recompute()
    record = shared_record(model)
    assert record["linear_compute_dtypes"] == linear_dtypes(3, "bfloat16") and record["recompute_layers"] == [2]
    assert record["parameter_dtypes"] == ["float32"] and autocast_dtype(model) == "bfloat16"
    model.model.layers[1].feed_forward.w2.use_precision(model_precision(F32))  # one linear left out of autocast
    assert shared_record(model)["linear_compute_dtypes"]["decoder_layers"] == [
        ["bfloat16"], ["bfloat16", "float32"], ["bfloat16"]]
    cells = mindspore_only_record(model)["cells"]
    assert {(c["class"], c["computes_in"]) for c in cells if c["class"] == "Linear"} == {
        ("Linear", "bfloat16"), ("Linear", "float32")}


def test_autocast_without_rounding_is_not_recorded_as_autocast():
    model = autocast_model(ms_model(), "fp16", rounding=False)
    assert autocast_dtype(model) is None
    assert shared_record(model)["linear_compute_dtypes"] == linear_dtypes(3, "float32")


def test_an_emulated_bf16_model_records_bf16_everywhere():
    # `migrate diff`'s bf16 model: bf16 parameters, every cell rounding to bf16 (CPU emulation).
    model = ms_model(tied=True, dtype="bfloat16")
    record = shared_record(model)
    assert record["parameter_dtypes"] == ["bfloat16"]
    assert record["linear_compute_dtypes"] == linear_dtypes(3, "bfloat16")
    assert {c["computes_in"] for c in mindspore_only_record(model)["cells"]} == {"bfloat16"}


@pytest.mark.parametrize("tied,fused", [(False, False), (True, True)])
def test_the_golden_records_the_same_facts(tied, fused):
    hf = build_hf_model("tied" if tied else "gqa", num_hidden_layers=3).train()
    hf.activation_checkpointing_enable(every_n_layers=2)  # layers 0 and 2
    ms = autocast_model(ms_model(tied=tied, fused=fused), "bf16")
    for i in (0, 2):
        ms.model.layers[i].recompute()
    facts = golden.live_facts(hf, torch.bfloat16)
    assert facts == shared_record(ms)
    assert facts["recompute_layers"] == [0, 2] and facts["linear_compute_dtypes"] == linear_dtypes(3, "bfloat16")
    assert golden.live_facts(hf, None)["linear_compute_dtypes"] == linear_dtypes(3, "float32")


def test_the_golden_probe_leaves_the_run_alone():
    # Dropout on: a probe in training mode would draw from the generator and shift the run.
    hf = build_hf_model("gqa", attention_dropout=0.5).train()
    state = torch.get_rng_state()
    golden.live_facts(hf, torch.bfloat16)
    assert torch.equal(torch.get_rng_state(), state)
    assert hf.training and all(p.grad is None for p in hf.parameters())
