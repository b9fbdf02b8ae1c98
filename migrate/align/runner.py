"""`migrate diff`: run the HF model and the converted MindSpore model on the same
inputs and compare them tensor by tensor. `run_diff` returns the `Report`;
the CLI only prints and writes it. MindSpore's execution mode is scoped to the run
(`models.mode.execution_mode`): the caller's mode is back when it returns.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from migrate.align.adapters import attach_to_hf, attach_to_ms, load_adapter
from migrate.align.hf_side import HFSide
from migrate.align.model_faults import check_fault, parse_fault
from migrate.align.ms_side import MSSide
from migrate.align.optimizer_reference import TensorByTensorAdamW
from migrate.collector import older_objects_frozen
from migrate.dtype_names import PRECISIONS
from migrate.errors import MigrateError
from migrate.judge.noise import TWIN
from migrate.judge.report import Report
from migrate.judge.thresholds import Thresholds, fallback_factor
from migrate.judge.twin import REFERENCES, twin_refused
from migrate.keymap import Keymap, recorded_keymap
from migrate.models.conversion_plan import ConversionPlan
from migrate.models.mode import execution_mode
from migrate.probe.inputs import Inputs, decode, seeded_inputs, text_inputs
from migrate.probe.live import paired_forward
from migrate.probe.sides import Side, bundled_align

ADAMW = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def run_diff(
    hf_dir: str | Path,
    ms_dir: str | Path,
    *,
    dtype: str = "fp32",
    batch: int = 2,
    seq_len: int = 16,
    seed: int = 0,
    text: str | None = None,
    padded: bool = False,
    detail: bool = False,
    grads: bool = False,
    generate: int = 0,
    inject: str | None = None,
    thresholds: Thresholds | None = None,
    keymap: str | None = None,
    mode: str = "pynative",
    lr: float = 1e-4,
    adapter: str | Path | None = None,
    reference: str = "fp64",
    trust: bool = False,
) -> Report:
    """`reference`: "fp64" runs HF's model a second time in float64 (`judge.noise`) and widens
    every bound to the reference's own error, unless the float64 copy would not fit in memory;
    "none" judges on the fixed bounds scaled for depth and width (`thresholds.fallback_factor`).
    `trust`: the converted folder's model class may be imported even if migrate does not bundle it
    (`--trust-model-class`)."""
    hf_dir, ms_dir = Path(hf_dir), Path(ms_dir)
    for folder, what in ((hf_dir, "HF model folder"), (ms_dir, "MindSpore model folder")):
        if not folder.is_dir():
            raise MigrateError(f"{what} not found: {folder}")
    if dtype not in PRECISIONS:
        raise MigrateError(f"unknown dtype {dtype!r}; choose from {', '.join(PRECISIONS)}")
    if mode not in ("pynative", "graph"):
        raise MigrateError(f"unknown mode {mode!r}; choose pynative or graph")
    if reference not in REFERENCES:
        raise MigrateError(f"unknown reference {reference!r}; choose {' or '.join(REFERENCES)}")
    fault = parse_fault(inject) if inject else None
    if fault and text is None:
        detail = True  # a fault is located down to the sub-block

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    with execution_mode("pynative" if fault else mode), older_objects_frozen():  # faults patch methods: PyNative
        return _run(hf_dir, ms_dir, dtype=dtype, batch=batch, seq_len=seq_len, seed=seed, text=text,
                    padded=padded, detail=detail, grads=grads, generate=generate, fault=fault,
                    thresholds=thresholds, keymap=keymap, mode=mode, lr=lr, adapter=adapter, reference=reference,
                    trust=trust)


def _run(hf_dir: Path, ms_dir: Path, *, dtype, batch, seq_len, seed, text, padded, detail, grads, generate,
         fault, thresholds, keymap, mode, lr, adapter, reference, trust) -> Report:
    ms_side = MSSide(ms_dir, dtype, seed, trust)
    config = ms_side.config
    # The variant and target the folder was converted with (model.yaml records them).
    km = Keymap.load(keymap or recorded_keymap(ms_dir)).for_model(config.to_dict())
    plan = ConversionPlan(km, config, trust)  # pairs gradients and parameters by name
    if grads and not ms_side.has_loss:
        raise MigrateError(f"--grads needs a model with a loss; {type(ms_side.model).__name__} has none")
    layer = None
    if fault:
        layer = check_fault(fault[0], config, dtype, padded, fault[1], grads=grads)
        fault[0].apply(ms_side, layer)
    hf_side = HFSide(hf_dir, dtype, km.align, seed)
    if adapter is not None:  # the same LoRA adapter on both sides (migrate.align.adapters)
        if grads:
            raise MigrateError("--grads with --adapter is not supported; compare the forward and --generate")
        lora, sites, fields = load_adapter(adapter, ms_dir, trust)
        attach_to_ms(ms_side.model, lora, sites, fields)
        attach_to_hf(hf_side.model, lora, sites)
    if generate and not hf_side.can_generate:
        raise MigrateError(f"--generate needs a generative model; {type(hf_side.model).__name__} is not one")
    thresholds = thresholds or Thresholds.for_dtype(dtype)
    why_not = twin_refused(hf_side.model, reference, in_place=True)
    twin = None if why_not else hf_side  # run again in float64 in place (`judge.twin`)
    if why_not:
        factor = fallback_factor(config.num_layers, getattr(config, "hidden_size", None))
        thresholds, ref_info = thresholds.scaled(factor), {"source": "fallback", "factor": factor, "why": why_not}
    else:
        ref_info = {"source": TWIN, "of": "HF PyTorch"}

    inputs = text_inputs(hf_dir, text) if text is not None else seeded_inputs(
        config.vocab_size, batch, seq_len, seed, padded, pad_id=config.pad_token_id or 0)
    if inputs.ids.max() >= config.vocab_size:
        raise MigrateError("token ids exceed the model's vocabulary")
    if generate:
        _check_generation_length(config, int(inputs.valid[0].sum()), generate)

    report = Report(
        dtype=dtype, inputs=inputs.description, seed=seed, ref_dir=hf_dir, got_dir=ms_dir,
        ref_label="HF PyTorch", got_label="MindSpore",
        versions=_versions(), thresholds=thresholds, reference=ref_info,
        extra={"mode": mode, "detail": detail, "keymap": km.name,
               **({"adapter": str(adapter)} if adapter is not None else {}),
               **({"inject": fault[0].name, "inject_layer": layer, "expected_block": fault[0].block}
                  if fault else {})},
    )
    sides = (Side("HF PyTorch", "hf", str(hf_dir), "torch", hf_side.model, dict(km.align)),   # probe's protocol
             Side("MindSpore", "converted", str(ms_dir), "mindspore", ms_side.model,
                  bundled_align(type(ms_side.model))))
    passes = {}  # --grads: the gradients of the runs the forward records (`_gradient_runs`)
    runs = _gradient_runs(hf_side, ms_side, inputs, plan, twin, passes,
                          pynative=bool(fault) or mode == "pynative") if grads else None
    # After the twin only --generate runs HF's model again: else it stays float64 (`float64_in_place`).
    _forward(report, hf_side, ms_side, inputs, detail, twin, sides, runs, restore_ref=bool(generate))
    if grads:
        _backward(report, hf_side, ms_side, inputs, plan, lr, twin, passes)
    if generate:
        _generation(report, hf_side, ms_side, inputs, generate, hf_dir)
    return report.finalize()


def _valid(array: np.ndarray, inputs: Inputs) -> np.ndarray:
    """Positions compared: padded query rows are dropped (their output is ill-defined).
    Per-sequence outputs (BERT's pooled output) have no positions to drop."""
    if inputs.mask is None or array.shape[:2] != inputs.ids.shape:
        return array
    return array[inputs.valid]


def _forward(report, hf_side, ms_side, inputs, detail, twin, sides, runs=None, restore_ref=True) -> None:
    """The forward through probe's side protocol: both models recorded by the same hooks and
    paired by their block tables (`probe.live`), as `migrate diff` does on any pair."""
    ref, got = sides
    for c in paired_forward(ref, got, inputs, num_layers=ms_side.config.num_layers, detail=detail,
                            twin=twin is not None, runs=runs, restore_ref=restore_ref):
        if c.kind == "loss":
            report.add(c.name, c.ref, c.got, kind="loss", exact=c.exact)
        else:
            report.add(c.name, _valid(c.ref, inputs), _valid(c.got, inputs), kind=c.kind, layer=c.layer,
                       block=c.block, exact=None if c.exact is None else _valid(c.exact, inputs))


def _gradient_runs(hf_side, ms_side, inputs, plan: ConversionPlan, twin, into: dict, pynative: bool) -> dict:
    """What the recorded forward runs with --grads (`probe.live.paired_forward`'s runs): each side's
    gradient pass, whose forward is the one recorded, so each model (and the float64 twin, widened
    once) runs forward once instead of twice; the gradients land in `into` ("hf", "ms", "exact").
    The MindSpore side only in PyNative: under --mode graph its gradient graph is compiled, hooks do
    not run there, and `_backward` runs it on its own."""
    def hf(_model):
        into["hf"] = hf_side.gradients(inputs)[1]
        hf_side.model.zero_grad(set_to_none=True)  # held as numpy: the twin's widening would convert them too

    def ms(_model):
        into["ms"] = ms_side.gradients(inputs)[1]

    def exact(_model):  # the model itself, widened to float64 in place (`judge.twin`)
        into["exact"] = plan.in_model_names(twin.gradients(inputs)[1])
        twin.model.zero_grad(set_to_none=True)

    return {"ref": hf, **({"got": ms} if pynative else {}), **({"twin": exact} if twin else {})}


def _backward(report, hf_side, ms_side, inputs, plan: ConversionPlan, lr, twin, passes: dict) -> None:
    """passes: the gradients `_gradient_runs` computed while the forward was recorded."""
    hf_grads, ex_grads = passes.pop("hf"), passes.pop("exact", {})
    ms_grads = passes.pop("ms") if "ms" in passes else ms_side.gradients(inputs)[1]
    ms_order = ms_side.parameter_names()
    ref_grads = plan.in_model_names(hf_grads)
    unpaired_ms = [n for n in ms_order if n not in ref_grads]
    paired = {s for g in plan.groups if all(d in ms_grads for d in g.dst) for s in g.src}
    unpaired_hf = sorted(set(hf_grads) - paired)
    if unpaired_ms or unpaired_hf:
        raise MigrateError(
            "gradients do not pair up by name: "
            + "; ".join(filter(None, [
                unpaired_ms and f"MindSpore only: {', '.join(unpaired_ms)}",
                unpaired_hf and f"HF only: {', '.join(unpaired_hf)}",
            ]))
        )
    backward = list(reversed(ms_order))  # lm_head first: the order backprop visits them
    for name in backward:
        report.add(name, ref_grads.pop(name), ms_grads.pop(name), kind="grad", exact=ex_grads.pop(name, None))
    del hf_grads, ref_grads, ex_grads
    hf_side.model.zero_grad(set_to_none=True)  # judged: free them before the optimizer step
    # The optimizer in isolation: MindSpore's AdamW step against torch's on the same (MindSpore's)
    # gradients. Stepping each side from its own gradients would judge the gradients again, through
    # AdamW's first step, which maps a gradient near zero to a move of up to lr whichever way its
    # rounding falls (on SmolLM2 one tensor moved 60x further than torch's own float64 twin).
    # AdamW is elementwise per tensor, so both sides step one tensor at a time (`MSSide.adamw_steps`).
    reference = TensorByTensorAdamW(lr=lr, **ADAMW)
    exact_reference = TensorByTensorAdamW(lr=lr, exact=True, **ADAMW) if twin else None
    for name, before, grad, ms_after in ms_side.adamw_steps(backward, lr=lr, **ADAMW):
        ref_after = reference.step(before, grad)
        exact = exact_reference.step(before, grad) if twin else None
        report.add(name, ref_after, ms_after, kind="param_after_step", exact=exact)
    report.extra["adamw"] = {"lr": lr, **{k: list(v) if isinstance(v, tuple) else v for k, v in ADAMW.items()}}


# RoPE scalings made to run past max_position_embeddings (by their `factor`): dynamic NTK rescales there.
_EXTENDING_ROPE = {"dynamic", "yarn", "longrope", "llama3", "linear"}


def _check_generation_length(config, prompt_len: int, steps: int) -> None:
    """--generate compares greedy tokens within the positions the model was built for (times a scaling
    RoPE's factor): past them HF warns ("performance degradation") and goes on, and --generate 10**12 ran
    for ever (HF's cache grows)."""
    scaling = getattr(config, "rope_scaling", None) or {}
    factor = scaling.get("factor") if scaling.get("rope_type", scaling.get("type")) in _EXTENDING_ROPE else None
    extends = isinstance(factor, (int, float)) and factor > 1
    positions = int(config.seq_length * factor) if extends else config.seq_length
    if prompt_len + steps > positions:
        what = f"{config.seq_length:,} × its RoPE factor {factor:g}" if extends else "max_position_embeddings"
        raise MigrateError(f"--generate {steps:,} after the {prompt_len}-token prompt runs past the model's "
                           f"{positions:,} positions ({what}); generate at most {max(positions - prompt_len, 0):,}")


def _generation(report, hf_side, ms_side, inputs, steps, hf_dir) -> None:
    prompt = inputs.ids[0][inputs.valid[0]]
    ref = hf_side.generate(prompt, steps)
    got = ms_side.generate(prompt, steps)
    texts = decode(hf_dir, [ref, got]) if inputs.prompt is not None else None
    report.set_generation(ref, got, ref_text=texts and texts[0], got_text=texts and texts[1],
                          prompt=inputs.prompt)


def _versions() -> dict:
    import mindspore
    import torch
    import transformers

    from migrate import __version__

    return {"migrate": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "mindspore": mindspore.__version__}
