"""The real-checkpoint tier's steps, as data: each is one command a user would type, the exit code
a correct tool gives, and for faults where report.json must place the first divergence.

Commands are templates: the first word is `migrate` (the venv's console script) or `python`;
`{name}` fields come from `Workspace.paths()` plus `{report}`, the step's own report folder
(`work/reports/<step>`). `needs` names steps whose outputs this one reads; `before` makes inputs
no migrate command makes; `check` adds claims on the outputs beyond the exit code. The tests
(tests/real/) and the bench (bench/real_models.py) run this same list.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import inputs
from .measure import Measured


@dataclass(frozen=True)
class Location:
    """Where report.json's summary must put the first divergence."""
    block: str
    layer: int | None = None
    key: str = "first_divergence"  # or "first_grad_divergence"

    def __str__(self):
        return self.block if self.layer is None else f"layer {self.layer} · {self.block}"


# check(paths, measured, earlier) -> problems; `earlier` maps step names already run to their Measured.
Check = Callable[[dict, Measured, dict], list[str]]


@dataclass(frozen=True)
class Step:
    name: str
    group: str
    command: str
    exit: int = 0
    at: Location | None = None
    needs: tuple[str, ...] = ()
    before: Callable[[dict], None] | None = None
    check: Check | None = None


# ------------------------------------------------------------------ checks
def _tensor_count(expected: int) -> Check:
    def check(paths, measured, earlier):
        count = len(json.loads((Path(paths["smol_ms"]) / "conversion.json").read_text())["tensors"])
        return [] if count == expected else [f"conversion.json lists {count} tensors, expected {expected}"]
    return check


def _prints(text: str) -> Check:
    def check(paths, measured, earlier):
        return [] if text in measured.stdout + measured.stderr else [f"output does not contain {text!r}"]
    return check


def _one_error_line(paths, measured, earlier):
    lines = [ln for ln in measured.stderr.splitlines() if ln.strip()]
    return [] if len(lines) == 1 else [f"expected one line on stderr, got {len(lines)}"]


def _first_row_is_paris(paths, measured, earlier):
    rows = inputs.generated_rows(measured.stdout)
    return [] if rows and rows[0].startswith(" Paris") else [f"row 0 is not ' Paris…': {rows[:1]}"]


def _same_rows_as(step: str) -> Check:
    def check(paths, measured, earlier):
        live, mindir = inputs.generated_rows(earlier[step].stdout), inputs.generated_rows(measured.stdout)
        return [] if live and live == mindir else [f"MindIR rows {mindir} differ from {step}'s {live}"]
    return check


def _export_bit_exact(paths, measured, earlier):
    exported = Path(paths["work"]) / "minilm-back"
    return inputs.export_differences(Path(paths["bert_hf"]), Path(paths["bert_ms"]), exported)


# ------------------------------------------------------------------ inputs
def _lora_adapter(paths):
    inputs.make_lora_adapter(Path(paths["smol_hf"]), Path(paths["work"]) / "lora-adapter")


def _bert_query_swapped(paths):
    inputs.swap_bert_query_weights(Path(paths["bert_ms"]), Path(paths["work"]) / "minilm-ms-query-swapped", (2, 3))


def _run_yamls(paths):
    work = Path(paths["work"])
    common = dict(hf=paths["smol_hf"], ms=paths["smol_ms"], data=str(work / "data"),
                  golden_out=str(work / "runs" / "golden"))
    inputs.write_run_yaml(work / "run.yaml", ms_out=str(work / "runs" / "ms"), **common)
    # The one-sided fault: the MindSpore run decays with 0 where the golden used 0.1.
    inputs.write_run_yaml(work / "run-wd0.yaml", ms_out=str(work / "runs" / "ms-wd0"), weight_decay=0.0, **common)


# ------------------------------------------------------------------ the steps
SMOL = "{smol_hf} {smol_ms}"
PROMPTS = '--prompt "The capital of France is" --prompt "Once upon a time" --max-new-tokens 24'

SMOLLM2 = [
    Step("smollm2-convert", "smollm2", "migrate convert --src auto {smol_hf} {smol_ms}", check=_tensor_count(272)),
    Step("smollm2-inspect", "smollm2", "migrate inspect {smol_ms}/model.ckpt", needs=("smollm2-convert",),
         check=_prints("272 tensors")),
    Step("smollm2-diff-grads", "smollm2", f"migrate diff {SMOL} --detail --grads --report {{report}}",
         needs=("smollm2-convert",)),
    Step("smollm2-diff-text", "smollm2",
         f'migrate diff {SMOL} --text "The capital of France is Paris." --detail --report {{report}}',
         needs=("smollm2-convert",)),
    Step("smollm2-diff-bf16", "smollm2", f"migrate diff {SMOL} --dtype bf16 --detail --report {{report}}",
         needs=("smollm2-convert",)),
    Step("smollm2-generate", "smollm2", f"migrate generate {{smol_ms}} {PROMPTS} --compare-hf {{smol_hf}}",
         needs=("smollm2-convert",), check=_first_row_is_paris),
    Step("smollm2-dump-hf", "smollm2",
         "migrate dump {smol_hf} {work}/dumps/smol-hf --inputs {work}/dumps/smol-ids.npz"),
    Step("smollm2-dump-ms", "smollm2", "migrate dump {smol_ms} {work}/dumps/smol-ms --inputs {work}/dumps/smol-ids.npz",
         needs=("smollm2-convert", "smollm2-dump-hf")),
    Step("smollm2-diff-dumps", "smollm2", "migrate diff {work}/dumps/smol-hf {work}/dumps/smol-ms --detail "
         "--report {report}", needs=("smollm2-dump-hf", "smollm2-dump-ms")),
    Step("smollm2-dump-hf-stats", "smollm2",
         "migrate dump {smol_hf} {work}/dumps/smol-hf-stats --stats --inputs {work}/dumps/smol-ids.npz",
         needs=("smollm2-dump-hf",)),
    Step("smollm2-dump-ms-stats", "smollm2",
         "migrate dump {smol_ms} {work}/dumps/smol-ms-stats --stats --inputs {work}/dumps/smol-ids.npz",
         needs=("smollm2-convert", "smollm2-dump-hf")),
    Step("smollm2-diff-dumps-stats", "smollm2", "migrate diff {work}/dumps/smol-hf-stats {work}/dumps/smol-ms-stats "
         "--detail --report {report}", needs=("smollm2-dump-hf-stats", "smollm2-dump-ms-stats")),
    Step("smollm2-diff-lora", "smollm2", f"migrate diff {SMOL} --adapter {{work}}/lora-adapter --report {{report}}",
         needs=("smollm2-convert",), before=_lora_adapter),
    Step("smollm2-export-mindir", "smollm2",
         "migrate export {smol_ms} {work}/smollm2-mindir --format mindir --batch 2 --prefill-len 16 --cache-len 48",
         needs=("smollm2-convert",)),
    Step("smollm2-generate-mindir", "smollm2",
         f"migrate generate {{smol_ms}} --mindir {{work}}/smollm2-mindir {PROMPTS}",
         needs=("smollm2-export-mindir", "smollm2-generate"), check=_same_rows_as("smollm2-generate")),
    Step("smollm2-vocab-check", "smollm2", "migrate vocab check {smol_hf} {smol_ms}", needs=("smollm2-convert",)),
    Step("smollm2-vocab-check-data", "smollm2", "migrate vocab check {smol_hf} {smol_ms} --data {work}/data",
         needs=("smollm2-convert", "training-tokenize")),
]

# fault -> (extra diff options, where it must show). Forward faults: no --grads, to keep the tier fast.
SMOLLM2_FAULTS = {
    "qk_swap@4": ("", Location("attention", 4)),
    "gate_up_swap@17": ("", Location("mlp", 17)),
    "rope_theta": ("", Location("attention", 0)),
    "gqa_repeat": ("", Location("attention", 0)),
    "untied_head": ("", Location("logits")),
    "loss_no_shift": ("", Location("loss")),
    "mask_fill": (" --padded", Location("attention", 0)),
    "rms_eps": ("", Location("attention", 0)),
    "rmsnorm_no_upcast": (" --dtype bf16", Location("attention", 0)),
}
SMOLLM2 += [
    Step(f"smollm2-fault-{fault}", "smollm2-faults",
         f"migrate diff {SMOL} --inject {fault}{options} --detail --report {{report}}", exit=1, at=at,
         needs=("smollm2-convert",))
    for fault, (options, at) in SMOLLM2_FAULTS.items()
]
# A backward-only fault (the forward is bit-identical): the first gradient divergence, in layer 23,
# where backward order meets that layer's MLP first.
SMOLLM2.append(Step(
    "smollm2-fault-mlp_grad_scale@23", "smollm2-faults",
    f"migrate diff {SMOL} --grads --inject mlp_grad_scale@23 --report {{report}}", exit=1,
    at=Location("model.layers.23.feed_forward.w3.weight", 23, "first_grad_divergence"), needs=("smollm2-convert",)))

BERT = "{bert_hf} {bert_ms}"
MINILM = [
    Step("minilm-convert", "minilm", "migrate convert --src auto {bert_hf} {bert_ms}"),
    Step("minilm-diff", "minilm", f"migrate diff {BERT} --detail --report {{report}}", needs=("minilm-convert",)),
    Step("minilm-diff-bf16", "minilm", f"migrate diff {BERT} --dtype bf16 --detail --report {{report}}",
         needs=("minilm-convert",)),
    Step("minilm-export", "minilm", "migrate export {bert_ms} {work}/minilm-back", needs=("minilm-convert",),
         check=_export_bit_exact),
    Step("minilm-dump-hf", "minilm", "migrate dump {bert_hf} {work}/dumps/bert-hf --inputs {work}/dumps/bert-ids.npz"),
    Step("minilm-dump-ms", "minilm", "migrate dump {bert_ms} {work}/dumps/bert-ms --inputs {work}/dumps/bert-ids.npz",
         needs=("minilm-convert", "minilm-dump-hf")),
    Step("minilm-diff-dumps", "minilm", "migrate diff {work}/dumps/bert-hf {work}/dumps/bert-ms --detail "
         "--report {report}", needs=("minilm-dump-hf", "minilm-dump-ms")),
    # migrate's fault catalogue is Llama-only: refused in one line.
    Step("minilm-inject-refused", "minilm", f"migrate diff {BERT} --inject qk_swap@1", exit=2,
         needs=("minilm-convert",), check=_one_error_line),
    # A real fault instead: layers 2 and 3 exchanged their query weights in a copy of the checkpoint.
    Step("minilm-fault-query-swap", "minilm",
         "migrate diff {bert_hf} {work}/minilm-ms-query-swapped --detail --report {report}", exit=1,
         at=Location("attention", 2), needs=("minilm-convert",), before=_bert_query_swapped),
]

# Continued pretraining: 6 fp32 steps of the golden and of `migrate train` from one run.yaml (the
# README, the diff and train pages and DESIGN tokenized with the model's tokenizer: about the text
# the README alone held before the manual moved to docs/), judged by compare with the first-step
# bound taken from the golden's own float64 reference; then a one-sided fault on the MindSpore side only.
TRAINING = [
    Step("training-tokenize", "training",
         "migrate data tokenize {repo}/README.md {repo}/docs/diff.md {repo}/docs/train.md {repo}/docs/DESIGN.md "
         "--tokenizer {smol_hf} --seq-length 128 --out {work}/data"),
    Step("training-golden", "training", "python {golden} --config {work}/run.yaml",
         needs=("smollm2-convert", "training-tokenize"), before=_run_yamls),
    Step("training-train", "training", "migrate train --config {work}/run.yaml", needs=("training-golden",)),
    Step("training-compare", "training", "migrate compare {work}/runs/golden {work}/runs/ms "
         "--plot {work}/runs/compare.png", needs=("training-golden", "training-train"),
         check=_prints("float64")),
    Step("training-train-wd0", "training", "migrate train --config {work}/run-wd0.yaml", needs=("training-golden",)),
    Step("training-compare-wd0", "training", "migrate compare {work}/runs/golden {work}/runs/ms-wd0", exit=1,
         needs=("training-golden", "training-train-wd0"), check=_prints("weight_decay")),
]

STEPS = {step.name: step for step in SMOLLM2 + MINILM + TRAINING}


def names(*groups: str) -> list[str]:
    return [name for name, step in STEPS.items() if step.group in groups]
