"""Numerical alignment of an HF model and its converted MindSpore counterpart (`migrate diff`).

A client of `migrate.judge`, which measures (`judge.metrics`), bounds (`judge.thresholds`),
judges (`judge.checks`) and reports (`judge.report`) without knowing PyTorch or MindSpore.
What lives here feeds it: `runner` (the live diff), `hf_side` / `ms_side` (the two models),
`faults` (known bugs `--inject` plants), `adapters` (`--adapter`), `optimizer_reference`
(torch's AdamW step for `--grads`).
"""


def __getattr__(name):
    # `migrate.align.run_diff` is the public entry point; imported lazily so that importing the
    # package (its adapters, its faults' list) does not load torch and MindSpore.
    if name == "run_diff":
        from migrate.align.runner import run_diff

        return run_diff
    raise AttributeError(name)
