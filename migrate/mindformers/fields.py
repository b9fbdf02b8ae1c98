"""MindSpore Transformers (MindFormers) 2.0.0's run-YAML fields, pinned.

Field names and value types of the sections `migrate mindformers-config` writes,
read from the installed mindformers==2.0.0 (the __init__ signatures of the classes
each section builds, and the keys its trainer reads), so that the YAML can be
checked here without MindFormers installed:

    models/llama/llama_config.py             LlamaConfig.__init__          model.model_config
    modules/transformer/transformer.py       TransformerOpParallelConfig   parallel_config
    core/optim/__init__.py, adamw.py         AdamW (-> BasicAdamW)         optimizer
    core/lr/lr_schedule.py                   *WarmUpLR                     lr_schedule
    wrapper/wrapper.py                       MFTrainOneStepCell,           runner_wrapper
                                             MFPipelineWithLossScaleCell
    core/callback/callback.py                MFLossMonitor,                callbacks
                                             CheckpointMonitor, TrainCallBack
    mindspore.nn.DynamicLossScaleUpdateCell                                runner_wrapper.scale_sense
    trainer/base_trainer.py, trainer/utils.py (runner_config.*, recompute_config.*)

tests/mf_live_check.py re-reads the signatures from a real MindFormers and fails
when this table and the package disagree.

Types: int, float (an int is accepted), bool, str, dtype (a MindSpore dtype
name), list, dict, and `X|null`.
"""
from __future__ import annotations

from typing import Any

DTYPES = ("float32", "float16", "bfloat16")

# LlamaConfig.__init__ (legacy model), every argument; `parallel_config`/`moe_config` are sections of their own.
LLAMA_CONFIG: dict[str, str] = {
    "type": "str",
    "batch_size": "int", "seq_length": "int", "hidden_size": "int", "num_layers": "int", "num_heads": "int",
    "n_kv_heads": "int|null", "max_position_embedding": "int|null", "intermediate_size": "int|null",
    "vocab_size": "int", "multiple_of": "int", "ffn_dim_multiplier": "int|null", "rms_norm_eps": "float",
    "bos_token_id": "int|null", "eos_token_id": "int|list|null", "pad_token_id": "int", "ignore_token_id": "int",
    "theta": "float", "compute_dtype": "dtype", "layernorm_compute_type": "dtype",
    "softmax_compute_type": "dtype", "rotary_dtype": "dtype", "param_init_type": "dtype",
    "residual_dtype": "dtype|null", "embedding_init_type": "dtype|null", "qkv_has_bias": "bool",
    "qkv_concat": "bool", "attn_proj_has_bias": "bool", "use_past": "bool", "extend_method": "str",
    "scaling_factor": "float|dict", "is_dynamic": "bool", "use_rope_slice": "bool", "use_flash_attention": "bool",
    "use_ring_attention": "bool", "use_attn_mask_compression": "bool", "use_eod_attn_mask_compression": "bool",
    "parallel_optimizer": "bool", "fine_grain_interleave": "int", "pp_interleave_num": "int", "offset": "int",
    "init_method_std": "float", "checkpoint_name_or_path": "str", "repetition_penalty": "float",
    "max_decode_length": "int", "block_size": "int", "num_blocks": "int", "top_k": "int", "top_p": "float",
    "do_sample": "bool", "quant_config": "dict|null", "tie_word_embeddings": "bool", "llm_backend": "str",
    "fused_rms_norm": "bool", "input_sliced_sig": "bool", "rmsnorm_compute_2d": "bool", "chunk_prefill": "bool",
    "calculate_per_token_loss": "bool", "pipeline_stage": "dict|null", "return_hidden_states": "bool",
}
# Values of `extend_method` (modules/layers.py SeqExtendMethod).
EXTEND_METHODS = ("None", "PI", "NTK", "YARN", "LLAMA3", "DYNAMIC_NTK", "linear")

PARALLEL_CONFIG: dict[str, str] = {
    "data_parallel": "int", "model_parallel": "int", "context_parallel": "int", "expert_parallel": "int",
    "pipeline_stage": "int", "micro_batch_num": "int", "seq_split_num": "int", "use_seq_parallel": "bool",
    "optimizer_shard": "bool|null", "gradient_aggregation_group": "int", "vocab_emb_dp": "bool",
    "context_parallel_algo": "str", "ulysses_degree_in_cp": "int", "mem_coeff": "float",
}

# optimizer: type AdamW -> mindformers.core.optim.AdamW.__new__ (use_fused False -> BasicAdamW).
OPTIMIZER: dict[str, str] = {
    "type": "str", "betas": "list", "eps": "float", "weight_decay": "float", "use_fused": "bool",
    "amsgrad": "bool", "maximize": "bool", "swap": "bool",
}

LR_SCHEDULES: dict[str, dict[str, str]] = {
    "ConstantWarmUpLR": {"learning_rate": "float", "warmup_steps": "int|null", "warmup_lr_init": "float",
                         "warmup_ratio": "float|null", "total_steps": "int|null"},
    "LinearWithWarmUpLR": {"learning_rate": "float", "total_steps": "int", "warmup_steps": "int|null",
                           "warmup_lr_init": "float", "warmup_ratio": "float|null"},
    "CosineWithWarmUpLR": {"learning_rate": "float", "warmup_steps": "int", "total_steps": "int|null",
                           "num_cycles": "float", "lr_end": "float", "warmup_lr_init": "float",
                           "warmup_ratio": "float|null", "decay_steps": "int|null", "decay_ratio": "float|null"},
    "PolynomialWithWarmUpLR": {"learning_rate": "float", "total_steps": "int", "warmup_steps": "int|null",
                               "lr_end": "float", "power": "float", "warmup_lr_init": "float",
                               "warmup_ratio": "float|null", "decay_steps": "int|null"},
}

_WRAPPER_COMMON = {"type": "str", "use_clip_grad": "bool", "max_grad_norm": "float", "scale_sense": "float|dict",
                   "local_norm": "bool", "calculate_per_token_loss": "bool", "global_norm_spike_threshold": "float",
                   "use_skip_data_by_global_norm": "bool", "print_separate_loss": "bool"}
WRAPPERS: dict[str, dict[str, str]] = {
    "MFTrainOneStepCell": dict(_WRAPPER_COMMON),
    "MFPipelineWithLossScaleCell": {**_WRAPPER_COMMON, "micro_batch_num": "int"},
}
# runner_wrapper.scale_sense as a dict: type DynamicLossScaleUpdateCell (mindspore.nn)
DYNAMIC_LOSS_SCALE: dict[str, str] = {"type": "str", "loss_scale_value": "float", "scale_factor": "float",
                                      "scale_window": "int"}

# Keys the trainer reads (base_trainer.py, trainer/utils.py check_runner_config).
RUNNER_CONFIG: dict[str, str] = {"epochs": "int|float", "batch_size": "int", "sink_mode": "bool", "sink_size": "int",
                                 "gradient_accumulation_steps": "int", "initial_epoch": "int", "initial_step": "int",
                                 "stop_step": "int"}
# The callbacks the YAML lists (core/callback/callback.py, registered by name; base_trainer.py builds each listed
# one): the arguments migrate writes, a subset of each __init__'s.
CALLBACKS: dict[str, dict[str, str]] = {
    "MFLossMonitor": {},
    "CheckpointMonitor": {"prefix": "str", "save_checkpoint_steps": "int", "keep_checkpoint_max": "int",
                          "integrated_save": "bool", "async_save": "bool"},
    "TrainCallBack": {"stop_step": "int"},
}
RECOMPUTE_CONFIG: dict[str, str] = {"recompute": "bool", "select_recompute": "bool",
                                    "parallel_optimizer_comm_recompute": "bool", "select_comm_recompute": "bool",
                                    "mp_comm_recompute": "bool", "recompute_slice_activation": "bool"}

TOP_LEVEL = ("seed", "output_dir", "run_mode", "use_parallel", "use_legacy", "load_checkpoint", "load_ckpt_format",
             "src_strategy_path_or_dir", "auto_trans_ckpt", "only_save_strategy", "resume_training", "trainer",
             "runner_config", "runner_wrapper", "optimizer", "lr_schedule", "lr_scale", "layer_scale",
             "train_dataset", "train_dataset_task", "do_eval", "context", "parallel", "parallel_config",
             "micro_batch_interleave_num", "recompute_config", "model", "callbacks", "profile")


def _fits(value: Any, spec: str) -> bool:
    for kind in spec.split("|"):
        if kind == "null" and value is None:
            return True
        if kind == "bool" and isinstance(value, bool):
            return True
        if isinstance(value, bool):
            continue
        if (kind == "int" and isinstance(value, int)) or (kind == "float" and isinstance(value, (int, float))):
            return True
        if kind == "str" and isinstance(value, str):
            return True
        if kind == "dtype" and value in DTYPES:
            return True
        if (kind == "list" and isinstance(value, list)) or (kind == "dict" and isinstance(value, dict)):
            return True
    return False


def _check_section(where: str, section: Any, table: dict[str, str]) -> list[str]:
    if not isinstance(section, dict):
        return [f"{where} must be a mapping"]
    problems = []
    for key, value in section.items():
        if key not in table:
            problems.append(f"{where}.{key} is not a MindFormers 2.0.0 field")
        elif not _fits(value, table[key]):
            problems.append(f"{where}.{key} = {value!r} is not of type {table[key]}")
    return problems


def check_run_yaml(doc: dict) -> list[str]:
    """Every problem of a run YAML against the pinned fields; empty when it fits."""
    problems = [f"{key} is not a top-level key migrate writes" for key in doc if key not in TOP_LEVEL]
    model = doc.get("model", {}) or {}
    problems += _check_section("model.model_config", model.get("model_config"), LLAMA_CONFIG)
    mc = model.get("model_config") or {}
    if isinstance(mc, dict) and mc.get("extend_method", "None") not in EXTEND_METHODS:
        problems.append(f"model.model_config.extend_method {mc.get('extend_method')!r} is not one of {EXTEND_METHODS}")
    if (model.get("arch") or {}).get("type") != "LlamaForCausalLM":
        problems.append("model.arch.type must be LlamaForCausalLM (the legacy model)")
    problems += _check_section("parallel_config", doc.get("parallel_config", {}), PARALLEL_CONFIG)
    if "optimizer" in doc:
        problems += _check_section("optimizer", doc["optimizer"], OPTIMIZER)
    if "lr_schedule" in doc:
        kind = (doc["lr_schedule"] or {}).get("type")
        if kind not in LR_SCHEDULES:
            problems.append(f"lr_schedule.type {kind!r} is not one of {', '.join(LR_SCHEDULES)}")
        else:
            problems += _check_section("lr_schedule", doc["lr_schedule"], {"type": "str", **LR_SCHEDULES[kind]})
    if "runner_wrapper" in doc:
        kind = (doc["runner_wrapper"] or {}).get("type")
        if kind not in WRAPPERS:
            problems.append(f"runner_wrapper.type {kind!r} is not one of {', '.join(WRAPPERS)}")
        else:
            problems += _check_section("runner_wrapper", doc["runner_wrapper"], WRAPPERS[kind])
            scale = doc["runner_wrapper"].get("scale_sense")
            if isinstance(scale, dict):
                problems += _check_section("runner_wrapper.scale_sense", scale, DYNAMIC_LOSS_SCALE)
    if "runner_config" in doc:
        problems += _check_section("runner_config", doc["runner_config"], RUNNER_CONFIG)
    for i, callback in enumerate(doc.get("callbacks") or []):
        kind = callback.get("type") if isinstance(callback, dict) else None
        if kind not in CALLBACKS:
            problems.append(f"callbacks[{i}].type {kind!r} is not one of {', '.join(CALLBACKS)}")
        else:
            problems += _check_section(f"callbacks[{i}]", callback, {"type": "str", **CALLBACKS[kind]})
    if "recompute_config" in doc:
        problems += _check_section("recompute_config", doc["recompute_config"], RECOMPUTE_CONFIG)
    return problems


# LlamaConfig's defaults for the fields that change what the model computes (a YAML that omits
# one gets this value): what `migrate hparams --mindformers` compares a YAML's model with.
LLAMA_DEFAULTS: dict[str, Any] = {
    "seq_length": 2048, "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "n_kv_heads": None,
    "max_position_embedding": None, "intermediate_size": None, "vocab_size": 32000, "rms_norm_eps": 1e-5,
    "pad_token_id": 0, "theta": 10000.0, "compute_dtype": "float16", "layernorm_compute_type": "float32",
    "softmax_compute_type": "float32", "rotary_dtype": "float32", "param_init_type": "float16",
    "residual_dtype": None, "qkv_has_bias": False, "qkv_concat": False, "attn_proj_has_bias": False,
    "extend_method": "None", "scaling_factor": 1.0, "tie_word_embeddings": False,
}
