"""The semantic translation table: run.yaml / model.yaml knob -> MindFormers 2.0.0 fields.

One row per knob: the MindFormers type and fields `migrate mindformers-config` writes,
why they reproduce torch's behaviour, what still differs, where in MindFormers' source
that was read, and how it was checked against MindFormers itself on CPU
(tests/mf_live_check.py, with the figures in `verified`). `migrate mindformers-config
--table` prints it; tests/test_mindformers_config.py holds every RunConfig field to a row.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Translation:
    knob: str            # run.yaml key (or model.yaml field, prefixed "model.")
    mindformers: str     # the YAML fields written
    same: str            # why it computes what the golden computes
    differs: str         # what remains different ("" when nothing)
    source: str          # where in mindformers 2.0.0 this was read
    verified: str        # how it was checked against MindFormers itself


TABLE: tuple[Translation, ...] = (
    Translation("optimizer.lr, betas, eps, weight_decay",
                "optimizer: {type: AdamW, betas, eps, weight_decay, use_fused: false}; lr in lr_schedule",
                "BasicAdamW: bias-corrected m/v, eps added to sqrt(v_hat), decoupled decay p·(1 − lr·wd): "
                "torch.optim.AdamW's update; fp32 moments adam_m/adam_v",
                "eps is written explicitly: omitted it is 1e-8 (AdamW) but 1e-6 in MindFormers' templates and in "
                "mindspore.nn.AdamWeightDecay, which also has no bias correction (never written)",
                "core/optim/__init__.py AdamW, core/optim/adamw.py _update_run_op",
                "6 steps on the same gradients vs torch.optim.AdamW: max abs 1.5e-8"),
    Translation("optimizer.no_decay", "(none: the trainer's rule)",
                "get_optimizer_grouped_parameters exempts 1-D parameters and names ending .bias: for the Llama "
                "family exactly HF Trainer's [bias, norm]",
                "any other no_decay (embedding, or decaying norms/biases) cannot be expressed: refused",
                "trainer/optimizer_grouped_parameters.py",
                "groups formed on the real network = migrate's set, 7 models (plain, fused, biases, Qwen2)"),
    Translation("schedule (constant|linear|cosine), warmup_steps|warmup_ratio, min_lr|min_lr_rate",
                "lr_schedule: ConstantWarmUpLR | LinearWithWarmUpLR | PolynomialWithWarmUpLR (linear to a floor, "
                "power 1) | CosineWithWarmUpLR {learning_rate, warmup_steps, warmup_lr_init: 0, total_steps, "
                "decay_steps, lr_end, num_cycles: 0.5}",
                "each cell restates transformers' lambda; the optimizer reads it at global_step before "
                "incrementing it (0 for step 1), LambdaLR's index; warmup lr·step/warmup",
                "evaluated in float32 (≤ 1.1e-7 of the peak lr); warmup_ratio would floor (HF rounds up), so "
                "warmup_steps is always written",
                "core/lr/lr_schedule.py, core/optim/adamw.py construct (get_lr before assignadd)",
                "7 schedules, every step vs transformers.get_scheduler: ≤ 1.1e-7 × peak lr"),
    Translation("total_steps", "lr_schedule.total_steps; Ascend: runner_config {epochs, sink_mode: true, "
                "sink_size: 1}; CPU: runner_config {epochs: whole epochs, sink_mode: false} + callbacks "
                "TrainCallBack {stop_step: total_steps}",
                "MindFormers trains int(dataset_size / sink_size × epochs) sink steps of 1: epochs is chosen so that "
                "this is total_steps (never total_steps: -1); on CPU MindSpore's Model.train runs no dataset sink "
                "(whatever sink_mode says), so whole epochs are planned and TrainCallBack, which MindFormers builds "
                "from `callbacks`, stops the run at total_steps",
                "runner_config.stop_step is ignored by 2.0.0 (its TrainCallBack is built, never added)",
                "trainer/utils.py check_runner_config, trainer/base_trainer.py create_lr_scheduler and callbacks, "
                "core/callback/callback.py TrainCallBack, mindspore/train/model.py train",
                "CPU run planned as 2 epochs of 12 stops itself at step 20: 20 steps logged, global_step 20 in its "
                "last checkpoint (24 steps without the callback, 240 with sink_mode true)"),
    Translation("max_grad_norm", "runner_wrapper {use_clip_grad, max_grad_norm}",
                "ClipGradNorm: coefficient max/(norm + 1e-6) when norm ≥ max, as clip_grad_norm_",
                "below max_norm it still multiplies by max/(max + 1e-6) (1 − 1e-6/max) where torch leaves the "
                "gradient; the omitted default of use_clip_grad depends on the wrapper (MFTrainOneStepCell false, "
                "MFPipelineWithLossScaleCell true), so it is written",
                "core/clip_grad.py, wrapper/wrapper.py",
                "above max: identical to torch; below: 1.01e-6 relative (the stated factor)"),
    Translation("grad_accum_steps, micro_batch_size (+ --dp, --pp, --micro-batches)",
                "runner_config {batch_size, gradient_accumulation_steps}, parallel_config {data_parallel, "
                "micro_batch_num}, runner_wrapper MFPipelineWithLossScaleCell {micro_batch_num}",
                "the golden's global batch is kept (batch_size × dp × accumulation); MFPipelineWithLossScaleCell "
                "divides the summed micro-batch losses by micro_batch_num: torch's loss / grad_accum_steps",
                "accumulation runs only under semi_auto_parallel (2.0.0 resets it to 1 otherwise), so use_parallel "
                "is set; with pp it is micro_batch_num; CPU folds it into one batch (same mean gradient); "
                "micro_batch_interleave_num > 1 would sum undivided (written as 1)",
                "trainer/base_trainer.py _check_grad_accumulation_steps, _reset_wrapper_for_grad_accu, "
                "wrapper.py grads_for_legacy; mindspore.nn.MicroBatchInterleaved",
                "CPU run with accumulation folded: losses match the golden (micro 4 × accum 2)"),
    Translation("seed, shuffle, data_seed, data", "seed; train_dataset {MindDataset over train.mindrecord, "
                "input_columns [input_ids], shuffle, seed, drop_remainder}; CausalLanguageModelDataset",
                "rows of seq_length + 1 tokens; LlamaForCausalLM slices input [:-1] and labels [1:] (its "
                "input_sliced_sig false), as the golden",
                "with shuffle the sample order is MindDataset's, not the golden's run_order (shuffle: false reads "
                "file order on both sides); past the first epoch MindFormers drops the tail",
                "models/llama/llama.py construct, dataset/causal_language_model_dataset.py",
                "12 CPU steps, shuffle false: loss rel diff ≤ 3.4e-7 at every step"),
    Translation("dtype (fp32|bf16|fp16)", "model_config {compute_dtype, param_init_type: float32, "
                "residual_dtype/layernorm/softmax/rotary float32}",
                "fp32 master weights and an fp32 residual stream, norms, softmax and RoPE, as torch.autocast",
                "param_init_type must be the checkpoint's dtype (load_param_into_net refuses another), so "
                "training needs an fp32 checkpoint; bf16/fp16 not run here (MindSpore CPU lacks the kernels)",
                "models/llama/llama_config.py, llama.py",
                "fp32: logits within 6.3e-7 of HF"),
    Translation("loss_scale (fp16)", "runner_wrapper.scale_sense: {type: DynamicLossScaleUpdateCell, "
                "loss_scale_value, scale_factor, scale_window}; fp32/bf16: 1.0",
                "grows by scale_factor after scale_window good steps, divides on overflow and skips the step "
                "(and the lr step), as GradScaler", "backoff must be 1/growth; MindSpore keeps the scale ≥ 1",
                "mindspore/nn/wrap/loss_scale.py", "source only"),
    Translation("recompute", "recompute_config.recompute", "full recompute per layer", "", "llama.py LayerSetting",
                "source only"),
    Translation("checkpoint_interval, keep_checkpoints, out_dir",
                "callbacks CheckpointMonitor {save_checkpoint_steps, keep_checkpoint_max}; output_dir",
                "checkpoints hold MindFormers' names (= migrate's legacy names) plus adam_m/adam_v, global_step, ...",
                "migrate export --checkpoint skips that training state", "core/callback/callback.py",
                "a MindFormers CPU checkpoint exports to HF"),
    Translation("dropout", "(none)", "the legacy Llama has no dropout", "dropout > 0 refused", "llama.py", "—"),
    Translation("eval_data, eval_interval, eval_samples", "(not translated)", "",
                "MindFormers' do_eval needs a metric setup of its own", "", "—"),
    Translation("health, tensorboard", "(not translated)", "",
                "migrate's health watch and event files run in migrate train and the golden script; MindFormers "
                "has its own tensorboard: and monitor_config: sections", "", "—"),
    Translation("reference", "(not translated)", "",
                "the golden script's float64 measure of its own step-1 rounding; no MindSpore side reads it", "", "—"),
    Translation("hf_model, ms_model, micro_batch_size, peak_flops, lora", "load_checkpoint (the converted .ckpt "
                "file, or the folder of shards)", "strict load: nothing missing or unused", "peak_flops and lora "
                "are not translated", "trainer/utils.py get_load_checkpoint_result", "7 models load strictly"),
    Translation("model.seq_length (HF max_position_embeddings)", "model_config.max_position_embedding; "
                "model_config.seq_length = the training length; predict: max_position_embeddings up to 512, or "
                "--seq-length",
                "MindFormers' seq_length is the input length",
                "predict pads every prompt to seq_length and without use_past runs all of it per new token, so a "
                "predict YAML's default is capped (SmolLM2-135M's shape on CPU: 4.3 GB at 512, 8.9 at 1024, out "
                "of memory at 2048)", "llama_config.py, FreqsMgr; generation/text_generator.py",
                "logits; one forward's peak memory at 512/1024/2048"),
    Translation("model.pad_token_id", "pad_token_id: -1",
                "MindFormers masks tokens equal to pad_token_id out of attention and loss; the golden's packed rows "
                "mask nothing", "", "llama.py construct, LowerTriangularMaskWithDynamic", "logits"),
    Translation("model.out_proj_has_bias, qkv_has_bias, qkv_concat, tie_word_embeddings",
                "attn_proj_has_bias, qkv_has_bias, qkv_concat, tie_word_embeddings", "the same layers", "",
                "llama_transformer.py", "Llama with biases, Qwen2, fused: strict load, logits ≤ 6.3e-7"),
    Translation("model.rope_scaling", "extend_method + scaling_factor: default -> None; linear -> PI (factor); "
                "llama3 -> LLAMA3 {factor, low/high_freq_factor, original_max_position_embeddings}; dynamic -> "
                "None within max_position_embeddings",
                "the same angles (PI divides positions by the factor)",
                "yarn, longrope, dynamic past max_position_embeddings refused; extend_method 'linear' is unusable "
                "in 2.0.0 (its factor check lacks a `not`)", "modules/layers.py FreqsMgr",
                "llama3 and linear: logits ≤ 9e-8"),
    Translation("model.head_dim, hidden_act, mlp_bias, sliding_window, attention_dropout, Gemma flags",
                "(none)", "", "head_dim ≠ hidden/heads, non-SiLU, mlp_bias, a window shorter than seq_length, "
                "attention dropout and Gemma (embedding scale, 1 + w norm) refused in one line",
                "llama_transformer.py, llama_layer.py", "—"),
    Translation("--target mcore", "(none)", "", "MindFormers 2.0.0 trains no mcore Llama/Qwen2 (Qwen2ForCausalLM "
                "is predict-only): refused; --qkv-concat loads into the legacy class", "models/qwen2/modeling_qwen2.py",
                "—"),
    Translation("--device cpu", "model_config {use_rope_slice: true, fused_rms_norm: false, use_flash_attention: "
                "false}; context.device_target CPU; one process; num_parallel_workers 1",
                "the kernels MindSpore has on CPU", "MindSpore's loss-scale wrapper checks overflow with Ascend ops: "
                "a CPU run needs its overflow check replaced (tests/mf_live_check.py does)", "llama.py", "CPU runs"),
)


def format_table() -> str:
    """Markdown table of TABLE (the README's)."""
    lines = ["| run.yaml / model.yaml | MindFormers 2.0.0 | why it matches torch | still differs | verified |",
             "|---|---|---|---|---|"]
    for t in TABLE:
        cells = (t.knob, t.mindformers, t.same, t.differs or "—", t.verified)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
