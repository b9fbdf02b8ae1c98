"""The run protocol: what a training run writes and reads, shared by both trainers.

Framework-free (no MindSpore, no torch): golden/train_torch.py, `migrate train`
(`migrate.train.trainer`) and `migrate compare` (its metrics reader) all take the contract
from here, so two writers of one format cannot drift apart.

    record      the step record of metrics.jsonl (field names as constants), its writer
                (`MetricsLog`, the one place a step record is built and written), the log
                line, the eval record
    cadence     when a run evaluates and checkpoints
    state       the checkpoint state keys (trainer_state.json) and the resume checks
    inputs      the eval rows, the data's vocabulary against the model's
    throughput  the MFU basis (flops per token, peak flops and where it came from), the
                peak-FLOPs probe around a framework's matmul
"""
