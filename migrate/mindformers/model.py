"""The `model:` section of a MindFormers 2.0.0 run YAML for a converted Llama-family folder.

MindFormers' legacy `LlamaForCausalLM` (use_legacy: True) loads `migrate convert`'s
checkpoints by name (plain and `--qkv-concat`). Its `LlamaConfig` is not HF's:

- `seq_length` is the input length (run.yaml's; a predict YAML's is capped, `run.PREDICT_SEQ_LENGTH`);
  HF's max_position_embeddings is `max_position_embedding` (the RoPE table);
- `param_init_type` defaults to float16, and `load_param_into_net` refuses a checkpoint
  of another dtype: it must name the checkpoint's dtype;
- every token equal to `pad_token_id` is masked out of attention and out of the loss
  (LowerTriangularMaskWithDynamic, LlamaForCausalLM.construct). HF masks nothing in
  packed pretraining rows, so pad_token_id is -1 (no token id) whatever HF's is;
- head_dim is hidden_size // num_heads, the MLP is SiLU-gated without bias, there is no
  sliding window, no embedding scale and no (1 + w) norm: a model that needs any of these
  is refused in one line naming the field, never written into a YAML that computes
  something else;
- the o-projection bias is `attn_proj_has_bias`; RoPE scaling is `extend_method` +
  `scaling_factor` (linear -> "PI": positions / factor, the same angles; its "linear"
  method is unusable in 2.0.0, whose factor check lacks a `not` and rejects every number);
- on CPU it needs use_rope_slice True, fused_rms_norm False, use_flash_attention False.
"""
from __future__ import annotations

from typing import Any

from migrate.dtype_names import spelled
from migrate.errors import MigrateError
from migrate.models.config import LlamaConfig

# Our precision name -> MindSpore dtype name.
MS_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Families the legacy Llama computes exactly (the keymap names conversion.json records).
FAMILIES = ("hf_llama", "hf_qwen2", "hf_mistral")


def refuse(field: str, why: str) -> MigrateError:
    return MigrateError(f"MindFormers 2.0.0's LlamaForCausalLM cannot express {field}: {why}")


def check_expressible(config: LlamaConfig, seq_length: int, family: str | None = None,
                      target: str | None = None) -> None:
    """Raise, in one line naming the field, for anything the legacy Llama would compute differently."""
    if family == "hf_gemma" or config.scale_embeddings or config.rms_norm_unit_offset:
        raise MigrateError("MindFormers 2.0.0 has no Gemma, and its LlamaForCausalLM would compute a Gemma checkpoint "
                           "without the embedding scale (scale_embeddings) and the (1 + weight) RMSNorm "
                           "(rms_norm_unit_offset): refused")
    if family is not None and family not in FAMILIES:
        raise MigrateError(f"no MindFormers 2.0.0 run YAML for family {family}: the legacy LlamaForCausalLM "
                           f"runs {', '.join(FAMILIES)}")
    if target == "mcore":
        raise MigrateError("MindFormers 2.0.0 trains no mcore (use_legacy: False) Llama or Qwen2: its mcore "
                           "Qwen2ForCausalLM raises 'Train mode is not supported' and Llama has only the legacy "
                           "class; convert with --qkv-concat (the legacy fused layout) or without a target")
    if config.head_dim != config.hidden_size // config.num_heads:
        raise refuse("head_dim", f"{config.head_dim} != hidden_size // num_heads = "
                                 f"{config.hidden_size // config.num_heads}; it always computes the latter")
    if config.hidden_act != "silu":
        raise refuse("hidden_act", f"{config.hidden_act!r}; its MLP is SiLU-gated")
    if config.mlp_bias:
        raise refuse("mlp_bias", "its feed-forward projections have no bias")
    if config.attention_dropout:
        raise refuse("attention_dropout", f"{config.attention_dropout}; it has no attention dropout")
    window = _window(config)
    if window is not None and window < seq_length:
        raise refuse("sliding_window", f"{window} < seq_length {seq_length}: it attends to every earlier position")
    method, _ = extend_method(config, seq_length)  # raises for a RoPE scaling it lacks
    if method == "None" and seq_length > config.seq_length:
        # FreqsMgr builds max_position_embedding rows of RoPE angles and slices seq_length of them
        raise MigrateError(f"seq_length {seq_length:,} exceeds the model's max_position_embeddings "
                           f"{config.seq_length:,}: MindFormers' RoPE table (max_position_embedding) has no more rows")


def _window(config: LlamaConfig) -> int | None:
    """The window some layer attends through (the bundled Llama's rule), or None."""
    if config.sliding_window is None:
        return None
    if config.layer_types and "sliding_attention" not in config.layer_types:
        return None
    return config.sliding_window


def extend_method(config: LlamaConfig, seq_length: int) -> tuple[str, Any]:
    """(extend_method, scaling_factor) computing HF's rope_scaling, or a refusal naming it."""
    scaling = dict(config.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return "None", 1.0
    if kind == "linear":
        return "PI", float(scaling["factor"])
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        return "LLAMA3", {k: (int(scaling[k]) if k.startswith("original") else float(scaling[k])) for k in keys}
    if kind == "dynamic" and seq_length <= config.seq_length:
        # HF's dynamic NTK equals the default rotary up to max_position_embeddings; the YAML never runs longer.
        return "None", 1.0
    raise refuse("rope_scaling.rope_type", f"{kind!r} (it has None, PI, NTK, YARN and LLAMA3 with other "
                                           "formulas; migrate maps default, linear, llama3, and dynamic "
                                           "within max_position_embeddings)")


def model_section(config: LlamaConfig, *, seq_length: int, precision: str, params_dtype: str, cpu: bool,
                  family: str | None = None, target: str | None = None) -> dict:
    """`model:` of the run YAML. `precision`: fp32|bf16|fp16 (compute); `params_dtype`: the
    checkpoint's dtype, which param_init_type must name."""
    check_expressible(config, seq_length, family, target)
    method, factor = extend_method(config, seq_length)
    params = MS_DTYPE[spelled(params_dtype) or params_dtype]
    fields = {
        "type": "LlamaConfig",
        "batch_size": 1,
        "seq_length": seq_length,
        "max_position_embedding": config.seq_length,
        "hidden_size": config.hidden_size,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "n_kv_heads": config.n_kv_heads,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": float(config.rms_norm_eps),
        "theta": float(config.theta),
        "extend_method": method,
        "scaling_factor": factor,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": -1,
        "ignore_token_id": config.ignore_token_id,
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "qkv_has_bias": bool(config.qkv_has_bias),
        "attn_proj_has_bias": bool(config.out_proj_has_bias),
        "qkv_concat": bool(config.qkv_concat),
        "compute_dtype": MS_DTYPE[precision],
        "param_init_type": params,
        "embedding_init_type": params,
        # torch.autocast keeps norms, softmax, RoPE and the residual stream in fp32.
        "layernorm_compute_type": "float32",
        "softmax_compute_type": "float32",
        "rotary_dtype": "float32",
        "residual_dtype": "float32",
        "init_method_std": float(config.initializer_range),
        "use_past": False,
        "checkpoint_name_or_path": "",
        "use_rope_slice": cpu,
        "fused_rms_norm": not cpu,
        "use_flash_attention": not cpu,
        "offset": 0,
    }
    return {"model_config": fields, "arch": {"type": "LlamaForCausalLM"}}
