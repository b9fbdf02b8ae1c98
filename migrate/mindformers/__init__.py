"""MindSpore Transformers (MindFormers 2.0.0) output: the run YAML for a converted model,
the translation of run.yaml's knobs, and what MindFormers would do with a YAML, restated from its
source so `migrate hparams --mindformers` compares without importing MindFormers."""
