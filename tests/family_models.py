"""Tiny HF models of each bundled family and their MindSpore twins, built here from a
config and torch.manual_seed (no downloads).

The HF weights reach the MindSpore model through the family's keymap (renames, and
GPT-2's fused c_attn through its layout), and the MindSpore model class is the one
the keymap targets, built through the family registry: nothing below names a
MindSpore parameter. `tests/test_model_parity.py` runs every family through the
same checks; each family's own tests (`test_<family>_model.py`) use these too.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import mindspore as ms
import numpy as np
import torch
import transformers

from hf_fixtures import randomise_norms_and_biases
from migrate.keymap import Keymap
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.registry import build_model

BATCH, SEQ = 2, 16
MODES = {"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}


@dataclass(frozen=True)
class Backward:
    """The gradient check: HF config fields over the base, the mode, and whether both
    models are put in training mode (only where no dropout is configured)."""

    fields: dict
    mode: str
    train: bool = False


@dataclass(frozen=True)
class LowPrecision:
    """The bf16/fp16 check: (dtype, mode) cases and the bounds measured for this family."""

    fields: dict
    cases: tuple[tuple[str, str], ...]
    loss_rel: float
    bit_equal: float
    fp32_buffers: tuple[str, ...] = ()   # kept in fp32, as from_pretrained(dtype=...) keeps them


@dataclass(frozen=True)
class Family:
    name: str
    keymap: str
    hf_class: type
    hf_config: type
    base: dict                            # HF config fields of every case
    configs: dict[str, dict]              # case name -> fields over the base
    batch: Callable[..., dict]            # (seed, padded) -> inputs by HF argument name, in construct order
    is_norm: Callable[[str], bool]        # parameters that start at ones (randomised like biases)
    unused_hf: Callable[[object], set]    # HF tensors the bundled model has no parameter for, per config
    graph_cases: tuple[str, ...]          # cases the forward check also runs in GRAPH_MODE
    hidden_case: str                      # the case of the hidden-state check
    backward: Backward | None = None
    low_precision: LowPrecision | None = None
    causal: bool = True                   # padded query rows attend to nothing: left out of comparisons

    def keymap_for(self) -> Keymap:
        """The keymap's variant for this HF architecture (BERT's MLM head is a variant)."""
        return Keymap.load(self.keymap).for_source({"architectures": [self.hf_class.__name__]})


def causal_batch(vocab: int, low: int):
    def batch(seed: int = 0, padded: bool = False) -> dict:
        rng = np.random.default_rng(seed)
        ids = rng.integers(low, vocab, size=(BATCH, SEQ), dtype=np.int64)
        mask = np.ones((BATCH, SEQ), dtype=np.int64)
        if padded:
            mask[0, :4] = 0   # left padding: rows 0..3 of sample 0 attend to nothing
            mask[1, -3:] = 0  # right padding
            ids[mask == 0] = 0
        labels = np.where(mask == 1, ids, -100)
        if padded:
            # HF's output at a fully-masked row is ill-defined: keep it out of the loss.
            labels[0, :5] = -100
        return {"input_ids": ids, "attention_mask": mask if padded else None, "labels": labels}
    return batch


def bert_batch(seed: int = 0, padded: bool = True) -> dict:
    """Ids, a padded attention mask, token types and MLM labels (-100 except some unpadded spots)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, BERT_VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    mask = np.ones((BATCH, SEQ), dtype=np.int64)
    mask[0, -5:] = 0  # right padding
    mask[1, :2] = 0   # left padding
    ids[mask == 0] = 0
    types = np.zeros((BATCH, SEQ), dtype=np.int64)
    types[:, SEQ // 2:] = 1
    labels = np.where((rng.random((BATCH, SEQ)) < 0.4) & (mask == 1), ids, -100)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels}


def _tied_head(cfg) -> set[str]:
    return {"lm_head.weight"} if cfg.tie_word_embeddings else set()


def _mlm_head(cfg) -> set[str]:
    # Tied: decoder.weight is the word-embedding table, decoder.bias is cls.predictions.bias.
    # Untied (transformers 5): the decoder has its own weight and bias, and cls.predictions.bias
    # is left unused by HF's forward.
    if cfg.tie_word_embeddings:
        return {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    return {"cls.predictions.bias"}


BERT_VOCAB = 96
BERT_BASE = dict(vocab_size=BERT_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, initializer_range=0.1,
                 pad_token_id=0)
BERT_CONFIGS = {
    "base": {},
    "gelu_new": dict(hidden_act="gelu_new", layer_norm_eps=1e-5),
    "relu_untied": dict(hidden_act="relu", tie_word_embeddings=False),
}

LLAMA = Family(
    "llama", "hf_llama", transformers.LlamaForCausalLM, transformers.LlamaConfig,
    base=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
              rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.1),
    configs={
        "mha": {},
        "gqa": dict(num_key_value_heads=2),
        "tied": dict(tie_word_embeddings=True),
        # original_max_position_embeddings=64 puts head_dim 16's frequencies in all
        # three llama3 bands (kept, smoothed, divided by factor).
        "llama3_rope": dict(hidden_size=64, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "linear_rope": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
        "attention_bias": dict(attention_bias=True, num_key_value_heads=2),
        "mlp_bias": dict(mlp_bias=True),
        "head_dim": dict(head_dim=16),  # 4 heads x 16 = 64 != hidden 32
        "padded": dict(pad_token_id=0),
    },
    batch=causal_batch(128, low=1),
    is_norm=lambda name: name.endswith("norm.weight"),
    unused_hf=_tied_head,
    graph_cases=("mha", "gqa", "tied", "llama3_rope", "linear_rope", "attention_bias", "mlp_bias", "head_dim",
                 "padded"),
    hidden_case="gqa",
    # Pad id 0 occurs: its row gets no lookup gradient.
    backward=Backward(dict(num_key_value_heads=2, attention_bias=True, tie_word_embeddings=True, pad_token_id=0),
                      "graph", train=True),
    # Measured: loss rel 1.7e-5 (bf16, both modes), 1.2e-5 (fp16), at most 1.7e-5 over seeds 0-3;
    # bit-equal 90.7 % / 72.1 %. Skipping the per-op rounding drops bit-equal to 22-23 %.
    # The RoPE inv_freq buffer stays fp32, as from_pretrained(dtype=...) leaves it (a bare
    # .to(dtype) would round it too).
    low_precision=LowPrecision(dict(num_key_value_heads=2),
                               (("bfloat16", "pynative"), ("bfloat16", "graph"), ("float16", "pynative")),
                               loss_rel=5e-5, bit_equal=0.5, fp32_buffers=("model.rotary_emb.inv_freq",)),
)

# Gemma is the bundled Llama with two flags (keymaps/hf_gemma.yaml): the embedding scaled by
# √hidden_size and RMSNorm by (1 + weight). HF's defaults otherwise: tied embeddings,
# gelu_pytorch_tanh, pad id 0; head_dim 16 is given explicitly (4 heads × 16 != hidden 32).
GEMMA = Family(
    "gemma", "hf_gemma", transformers.GemmaForCausalLM, transformers.GemmaConfig,
    base=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=64,
              initializer_range=0.1),
    configs={
        "base": {},
        "gqa_untied": dict(num_key_value_heads=2, tie_word_embeddings=False),
        "padded": {},
    },
    batch=causal_batch(128, low=1),
    is_norm=lambda name: name.endswith("norm.weight"),  # zeros in HF (the unit offset): randomised too
    unused_hf=_tied_head,
    graph_cases=("base", "padded"),
    hidden_case="gqa_untied",
    # Tied, pad id 0 in the batch: the scaled lookup keeps its gradient off row 0.
    backward=Backward(dict(num_key_value_heads=2, attention_bias=True), "graph", train=True),
    # Measured over seeds 2-5: bf16 bit-identical logits (loss rel <= 2.8e-7), fp16 82-100 % bit-equal
    # (loss rel <= 1.6e-6). The scale left unrounded in the low dtype gives 28-46 % bit-equal, the
    # norm in Llama's order (cast, then 1 + weight) 24-26 %.
    low_precision=LowPrecision(dict(num_key_value_heads=2),
                               (("bfloat16", "pynative"), ("bfloat16", "graph"), ("float16", "pynative")),
                               loss_rel=5e-6, bit_equal=0.75, fp32_buffers=("model.rotary_emb.inv_freq",)),
)

GPT2 = Family(
    "gpt2", "hf_gpt2", transformers.GPT2LMHeadModel, transformers.GPT2Config,
    base=dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.1,
              bos_token_id=1, eos_token_id=2),
    configs={
        "base": {},
        "padded": {},
        # 1 / (layer_idx + 1) alone (scale_attn_weights off); with the default scaling it
        # is in the backward check.
        "layer_scaled": dict(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True),
        "upcast": dict(reorder_and_upcast_attn=True),
        "gelu_untied": dict(activation_function="gelu", n_inner=48, layer_norm_epsilon=1e-3,
                            tie_word_embeddings=False),
    },
    batch=causal_batch(128, low=3),
    is_norm=lambda name: ".ln_" in name and name.endswith(".weight"),
    unused_hf=_tied_head,  # GPT-2 ties lm_head to wte: HF's state dict carries it, the bundled model does not
    graph_cases=("padded",),
    hidden_case="base",
    # Dropout off on both sides (the configs' pdrop is 0.1): compare gradients, not masks.
    backward=Backward(dict(scale_attn_by_inverse_layer_idx=True), "graph"),
    # Measured: loss rel 3.7e-5 (at most 5.2e-5 over seeds 0-3), bit-equal 74.5 %. Skipping the
    # per-op rounding gives loss rel 2.1e-4 and 28.6 % bit-equal.
    low_precision=LowPrecision({}, (("bfloat16", "pynative"),), loss_rel=1e-4, bit_equal=0.5),
)

BERT = Family(
    "bert", "hf_bert", transformers.BertModel, transformers.BertConfig, BERT_BASE, BERT_CONFIGS, bert_batch,
    is_norm=lambda name: "LayerNorm.weight" in name,
    unused_hf=lambda cfg: set(),
    graph_cases=("base",),
    hidden_case="base",
    causal=False,  # padding masks keys only: every query row is defined and compared
)

BERT_MLM = Family(
    "bert_mlm", "hf_bert", transformers.BertForMaskedLM, transformers.BertConfig, BERT_BASE, BERT_CONFIGS,
    bert_batch,
    is_norm=lambda name: "LayerNorm.weight" in name,
    unused_hf=_mlm_head,
    graph_cases=("base",),
    hidden_case="base",
    # Pad id 0 occurs in the batch: torch's padding_idx keeps the lookups' gradient off row 0 (the
    # decoder's still reaches it), so a lookup that leaked gradient there would show as a diff.
    backward=Backward({}, "pynative"),
    # Measured: bit-identical logits and loss (seeds 0-3). Skipping the per-op rounding gives loss
    # rel 1.1e-4 and 29 % bit-equal.
    low_precision=LowPrecision({}, (("bfloat16", "pynative"),), loss_rel=1e-6, bit_equal=0.9),
    causal=False,
)

FAMILIES = {f.name: f for f in (LLAMA, GEMMA, GPT2, BERT, BERT_MLM)}


# ---------- building ----------
def build_hf(family: Family, fields: dict, seed: int = 0):
    cfg = family.hf_config(**{**family.base, **fields})
    cfg._attn_implementation = "eager"  # HF's reference path: fp32 softmax, explicit additive mask
    torch.manual_seed(seed)
    return randomise_norms_and_biases(family.hf_class(cfg).eval(), family.is_norm)


def to_dtype(hf_model, dtype, fp32_buffers: tuple[str, ...] = ()):
    """The HF model cast to `dtype`, the named buffers kept in fp32."""
    kept = {name: hf_model.get_buffer(name).clone() for name in fp32_buffers}
    hf_model = hf_model.to(dtype)
    for name, value in kept.items():
        module, _, attr = name.rpartition(".")
        setattr(hf_model.get_submodule(module), attr, value)
    return hf_model


def ms_config(family: Family, hf_cfg, compute_dtype: str = "float32"):
    """The keymap's `config` table applied to an HF config: the config class the registry
    names for the keymap's target, recording that target."""
    km = family.keymap_for()
    return ConversionPlan.for_source(km, {**km.hf_to_ms_config(hf_cfg.to_dict()),
                                          "compute_dtype": compute_dtype}).config


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()  # float() keeps bf16 exact (numpy has no bf16)


def hf_in_ms_names(family: Family, cfg, hf_arrays: dict) -> dict[str, np.ndarray]:
    """HF-named arrays (weights, gradients) under the MindSpore names, through the keymap."""
    return ConversionPlan(family.keymap_for(), cfg).in_model_names(hf_arrays)


def load_into(ms_model, hf_model, family: Family, cfg) -> dict[str, tuple[str, ...]]:
    """Copy HF's weights into the MindSpore model; MindSpore name -> the HF names it is made of."""
    plan = ConversionPlan(family.keymap_for(), cfg)
    state = {name: to_numpy(t) for name, t in hf_model.state_dict().items()}
    params = dict(ms_model.parameters_and_names())
    values = plan.in_model_names(state)
    assert set(values) == set(params), "MindSpore parameter names differ from the keymap"
    consumed = {s for g in plan.groups for s in g.src}
    assert consumed == set(state) - family.unused_hf(cfg)
    for name, value in values.items():
        param = params[name]
        assert tuple(param.shape) == value.shape, name
        param.set_data(ms.Tensor(np.ascontiguousarray(value)).astype(param.dtype))
    return plan.sources


@functools.cache
def case(family_name: str, name: str):
    """(HF model, MindSpore model, inputs, HF outputs by name), built once per config."""
    family = FAMILIES[family_name]
    hf_model = build_hf(family, family.configs[name])
    cfg = ms_config(family, hf_model.config)
    ms_model = build_model(cfg)
    load_into(ms_model, hf_model, family, cfg)
    inputs = family.batch(padded=name == "padded")
    with torch.no_grad():
        out = hf_forward(hf_model, inputs)
    ref = {key: float(out.loss) if key == "loss" else to_numpy(getattr(out, key)) for key in outputs(ms_model)}
    return hf_model, ms_model, inputs, ref


# ---------- running ----------
def outputs(ms_model) -> tuple[str, ...]:
    """What the bundled model returns before its hidden states, by HF output name."""
    return tuple(getattr(type(ms_model), "OUTPUTS", ("logits", "loss")))


def hf_forward(hf_model, inputs: dict, **kwargs):
    takes = inspect.signature(hf_model.forward).parameters
    args = {k: torch.from_numpy(v) for k, v in inputs.items() if v is not None and k in takes}
    return hf_model(**args, **kwargs)


def ms_inputs(ms_model, inputs: dict) -> list:
    """The inputs as the bundled model's positional arguments (None where absent); labels
    only for a model with a loss."""
    keys = [k for k in inputs if k != "labels" or "loss" in outputs(ms_model)]
    return [None if inputs[k] is None else ms.Tensor(inputs[k].astype(np.int32)) for k in keys]


def ms_forward(ms_model, inputs: dict, **kwargs):
    return ms_model(*ms_inputs(ms_model, inputs), **kwargs)


def compared_rows(family: Family, inputs: dict) -> np.ndarray:
    """Positions compared: a causal model's padded query rows are ill-defined, and left out."""
    mask = inputs.get("attention_mask")
    if family.causal and mask is not None:
        return mask.astype(bool)
    return np.ones(inputs["input_ids"].shape, bool)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
