"""`migrate diff STATE_A STATE_B`: two training states compared tensor by tensor through the keymap.

Each reader turns one checkpoint format into a `state.TrainingState` (parameters, AdamW's two
moments, the step counters, the learning rate, the loss scale, the generator positions):

- `read_ms_trainer`: `migrate train`'s RUN/checkpoints/checkpoint-N (optimizer shards stitched);
- `read_golden`: golden/train_torch.py's checkpoint-N (save_pretrained + trainer_state.pt);
- `read_hf_trainer`: an HF Trainer checkpoint-N (weights, optimizer.pt, scheduler.pt, trainer_state.json);
- `read_mindformers`: one MindSpore Transformers .ckpt / .safetensors (weights, adam_m.*, adam_v.*,
  global_step, scale_sense, learning_rate), legacy or mcore names.

`detect` says which a path is; `hf_names` puts MindSpore-named tensors under HF's names through the
keymap's inverse layouts (a moment moves exactly like its parameter); `noise` measures a noise run;
`compare` judges the pair with `migrate diff`'s judge (`migrate.judge.report.Report`), in the order a
divergence travels. torch files are read with ``torch.load(weights_only=True)`` only (`torch_files`).
"""
