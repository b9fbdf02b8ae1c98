"""Numerical alignment of a reference model and its converted counterpart.

`metrics` compares plain numpy arrays (any float dtype, bf16 included) and
judges them against per-dtype thresholds; `report` collects the judged
entries in forward / backward order, finds the first divergence and writes
the report files. Neither module knows anything about PyTorch or MindSpore:
the runner that feeds them lives elsewhere.
"""


def __getattr__(name):
    # `migrate.align.compare` is the public entry point; imported lazily so the
    # framework-free metrics/report modules load without torch or MindSpore.
    if name == "compare":
        from migrate.align.runner import compare

        return compare
    raise AttributeError(name)
