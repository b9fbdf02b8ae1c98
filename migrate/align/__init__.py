"""Numerical alignment of a reference model and its converted counterpart.

`migrate diff` is a client of `migrate.judge`: `metrics` compares plain numpy arrays
(any float dtype, bf16 included), `thresholds` holds the per-dtype bounds, `checks`
turns metrics into the judge's checks, and `report` collects the judged entries in
forward / backward order, finds the first divergence and renders the report in every
format. None of them knows anything about PyTorch or MindSpore: the runner that feeds
them (`runner`, `hf_side`, `ms_side`, `faults`) lives beside them.
"""


def __getattr__(name):
    # `migrate.align.compare` is the public entry point; imported lazily so the
    # framework-free metrics/report modules load without torch or MindSpore.
    if name == "compare":
        from migrate.align.runner import compare

        return compare
    raise AttributeError(name)
