"""`migrate mindformers-config`: a complete MindFormers 2.0.0 run YAML for a converted folder.

    run = mindformers_run(ms_dir, run_config=cfg, dp=2)    # MFRun(doc, notes, launch)
    write_run_yaml(run, "mf.yaml", overwrite=False)

With a run.yaml the YAML trains (run_mode train) with the golden's hyperparameters
(`training`); without one it loads the model for prediction. The model section is
`model`'s; the parallel layout is checked by `migrate.parallel.layout` (the rules
`migrate train` uses) and sized by the planner; every emitted field is checked against
the pinned MindFormers field table (`fields`) before anything is written.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from migrate import __version__
from migrate.checkpoints.atomic import atomic_write_text
from migrate.checkpoints.ms_reader import find_checkpoint, open_ms_checkpoint
from migrate.checkpoints.sharding import read_index
from migrate.data.samples import MINDRECORD_FILE, read_meta
from migrate.dtype_names import spelled
from migrate.errors import MigrateError
from migrate.hf_config import load_hf_config, read_raw_config
from migrate.keymap import TARGET_FIELD, recorded_keymap, resolve
from migrate.memory_plan import estimate_memory
from migrate.mindformers import training as mf_train
from migrate.mindformers.fields import check_run_yaml
from migrate.mindformers.model import check_expressible, model_section
from migrate.models.config import LlamaConfig
from migrate.models.registry import load_model_config
from migrate.parallel.layout import Layout, validate
from migrate.train.config import RunConfig

MARKER = "# written by migrate mindformers-config"
# A predict YAML's default seq_length is at most this. MindFormers' generate pads every prompt to seq_length
# and, without use_past (these YAMLs leave it off), runs all seq_length positions for every new token, so memory
# and time grow with it. Measured with MindFormers 2.0.0 on CPU, SmolLM2-135M's shape in fp32, one forward:
# 4.3 GB peak at 512, 8.9 GB at 1024, killed for memory (22 GB) at 2048; at its max_position_embeddings of
# 8,192 a 24 GB process was killed. MindFormers' own Llama 3.1 predict YAML has seq_length 512 too.
PREDICT_SEQ_LENGTH = 512


def predict_seq_length(config: LlamaConfig, seq_length: int | None) -> int:
    """A predict YAML's seq_length: --seq-length, else max_position_embeddings capped at PREDICT_SEQ_LENGTH."""
    return seq_length or min(config.seq_length, PREDICT_SEQ_LENGTH)


@dataclass
class MFRun:
    doc: dict
    notes: list[str] = field(default_factory=list)
    launch: str = ""
    sources: list[Path] = field(default_factory=list)   # files the YAML was made from (never overwritten)


def check_layout_numbers(**numbers: int | None) -> None:
    """--seq-length, --dp, --mp, --pp, --micro-batches: positive integers (None: the default), refused in
    one line before any arithmetic on them (the batch split divides by dp)."""
    for name, value in numbers.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise MigrateError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")


def precheck_hf(src_dir: str | Path, keymap: str, target: str | None, seq_length: int | None,
                **layout: int | None) -> None:
    """What `convert --mindformers-yaml` checks before converting: the layout's numbers (`layout`: dp,
    mp, pp, micro_batches) and that the model is expressible."""
    check_layout_numbers(seq_length=seq_length, **layout)
    raw = read_raw_config(src_dir)
    km = resolve(keymap, raw).for_source(raw).with_target(target)
    fields = km.hf_to_ms_config(load_hf_config(src_dir, km))
    config = LlamaConfig.from_dict({k: v for k, v in fields.items() if k != TARGET_FIELD})
    check_expressible(config, predict_seq_length(config, seq_length), km.name, target)


def _predict_note(config: LlamaConfig, asked: int | None) -> str:
    chosen = predict_seq_length(config, asked)
    if asked:
        why = "--seq-length"
    elif chosen < config.seq_length:
        why = f"max_position_embeddings {config.seq_length} capped at {PREDICT_SEQ_LENGTH}; --seq-length sets it"
    else:
        why = "max_position_embeddings; --seq-length sets it"
    return (f"seq_length {chosen} ({why}): MindFormers pads every prompt to seq_length, prompt plus new tokens must "
            "fit in it, and without use_past each new token runs all seq_length positions (memory and time grow "
            "with it)")


def _checkpoint(ms_dir: Path) -> tuple[str, str, str]:
    """(load_checkpoint path, format, parameter dtype) of a converted folder."""
    found = find_checkpoint(ms_dir)
    sharded = found.name.endswith(".index.json")
    fmt = read_index(found)[0] if sharded else found.suffix[1:]
    if fmt != "ckpt":
        raise MigrateError(f"{found.name}: migrate writes MindFormers YAMLs for .ckpt checkpoints (the format checked "
                           "against MindFormers 2.0.0); convert with --format ckpt")
    dtypes = {spelled(str(d)) for d, _ in open_ms_checkpoint(ms_dir).specs.values()}
    if len(dtypes) != 1 or None in dtypes:
        raise MigrateError(f"{ms_dir}: parameters of several dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                           "MindFormers' param_init_type names one")
    # A folder: MindFormers loads every .ckpt in it (auto_trans_ckpt False), i.e. all shards.
    return str((ms_dir if sharded else found).resolve()), fmt, dtypes.pop()


def _layout(config: LlamaConfig, dp: int, mp: int, pp: int, micro_batches: int, optimizer_shard: bool,
            batch: mf_train.Batching | None) -> Layout:
    layout = Layout(dp=dp, mp=mp, pp=pp, micro_batches=micro_batches if pp > 1 else 1,
                    optimizer_shard=optimizer_shard, micro_batch_size=batch.batch_size if batch else 1,
                    grad_accum_steps=batch.accumulation if batch else 1)
    errors = validate(layout, config)
    if optimizer_shard and dp < 2:
        errors.append("--optimizer-shard needs dp >= 2")
    if errors:
        raise MigrateError(f"parallel layout {layout.describe()}: {errors[0]}")
    return layout


def mindformers_run(ms_dir: str | Path | None = None, run_config: RunConfig | None = None, *,
                    seq_length: int | None = None, dp: int = 1, mp: int = 1, pp: int = 1, micro_batches: int = 1,
                    optimizer_shard: bool = False, device: str = "ascend", device_memory: int | None = None,
                    output_dir: str | None = None, trust: bool = False) -> MFRun:
    """The MindFormers run YAML of a converted folder (and run.yaml's training); `trust`: the folder's
    model class may be imported even if migrate does not bundle it (`--trust-model-class`)."""
    if device not in ("ascend", "cpu"):
        raise MigrateError(f"unknown device {device!r}; choose ascend or cpu")
    check_layout_numbers(seq_length=seq_length, dp=dp, mp=mp, pp=pp, micro_batches=micro_batches)
    cpu = device == "cpu"
    if ms_dir is None:
        if run_config is None:
            raise MigrateError("name a converted folder, or a run.yaml whose ms_model names one")
        ms_dir = run_config.require("ms_model")
    ms_dir = Path(ms_dir)
    if not (ms_dir / "model.yaml").is_file():
        raise MigrateError(f"{ms_dir} is not a converted folder (no model.yaml)")
    config = load_model_config(ms_dir, trust)
    if not isinstance(config, LlamaConfig):
        raise MigrateError(f"{ms_dir}: MindFormers YAMLs are written for the Llama family (hf_llama, hf_qwen2, "
                           f"hf_mistral), not {type(config).__name__}")
    family, target = recorded_keymap(ms_dir), config.extra.get(TARGET_FIELD)
    if cpu and (dp, mp, pp) != (1, 1, 1):
        raise MigrateError("--device cpu runs one process: MindSpore runs semi_auto_parallel (mp, pp, accumulation "
                           "over dp) only on Ascend/GPU")
    if run_config is not None:
        seq_length = seq_length or run_config.seq_length
        if seq_length != run_config.seq_length:
            raise MigrateError(f"--seq-length {seq_length} differs from run.yaml's seq_length {run_config.seq_length}")
    notes: list[str] = []
    if run_config is None:
        notes.append(_predict_note(config, seq_length))
        seq_length = predict_seq_length(config, seq_length)
    load_path, fmt, params = _checkpoint(ms_dir)
    if run_config is None:
        precision, batch = params, None
    else:
        precision, batch = run_config.dtype, mf_train.batching(run_config, dp, pp, micro_batches, cpu)
        if params != "fp32":
            raise MigrateError(f"the checkpoint is {params}: MindFormers loads it only into {params} parameters, "
                               "training without the golden's fp32 master weights; convert with --dtype fp32")
        notes += batch.notes
    model = model_section(config, seq_length=seq_length, precision=precision, params_dtype=params, cpu=cpu,
                          family=family, target=target)
    layout = _layout(config, dp, mp, pp, micro_batches, optimizer_shard, batch)
    devices = dp * mp * pp
    semi = not cpu and (devices > 1 or (batch is not None and batch.accumulation > 1))
    doc: dict = {
        "seed": run_config.seed if run_config else 0,
        "output_dir": output_dir or "./output",
        "run_mode": "train" if run_config else "predict",
        "use_parallel": semi,
        "use_legacy": True,
        "load_checkpoint": load_path,
        "load_ckpt_format": fmt,
        "src_strategy_path_or_dir": "",
        # A complete checkpoint is sliced for mp/pp only from a folder holding rank_0/<file>.ckpt.
        "auto_trans_ckpt": mp * pp > 1,
        "only_save_strategy": False,
        "resume_training": False,
        "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": "llama"},
    }
    sources = [ms_dir / "model.yaml", Path(load_path)]
    if run_config is not None:
        doc.update(_training(run_config, batch, cpu, notes))
        sources += [p for p in (run_config.source,) if p]
    doc["context"] = {"mode": 0, "device_target": "CPU" if cpu else "Ascend", "max_call_depth": 10000,
                      "save_graphs": False, "device_id": 0}
    if not cpu:
        doc["context"]["max_device_memory"] = "58GB"
    doc["parallel"] = {"parallel_mode": 1, "gradients_mean": False, "enable_alltoall": False, "full_batch": True,
                       "search_mode": "sharding_propagation", "enable_parallel_optimizer": optimizer_shard,
                       "strategy_ckpt_save_file": "./ckpt_strategy.ckpt",
                       "parallel_optimizer_config": {"gradient_accumulation_shard": False,
                                                     "parallel_optimizer_threshold": 64}}
    doc["parallel_config"] = {"data_parallel": dp, "model_parallel": mp, "pipeline_stage": pp,
                              "context_parallel": 1, "use_seq_parallel": False,
                              "micro_batch_num": layout.micro_batches, "vocab_emb_dp": mp == 1,
                              "gradient_aggregation_group": 4}
    doc["micro_batch_interleave_num"] = 1
    doc["model"] = model
    problems = check_run_yaml(doc)
    if problems:  # a bug here, not the user's: the pinned table says MindFormers would not take it
        raise AssertionError("; ".join(problems))
    if mp * pp > 1:
        notes.append(f"mp/pp: MindFormers slices a complete checkpoint (auto_trans_ckpt) only from a folder holding "
                     f"rank_0/<name>.ckpt; put {Path(load_path).name} there and point load_checkpoint at the folder")
    if run_config is not None and not cpu:
        est = estimate_memory(config, layout, seq_length, run_config.dtype,
                              "full" if run_config.recompute else "none")
        notes.append(f"planner: about {est.total / 2**30:.1f} GiB per device ({layout.batch_line(seq_length)})")
        if device_memory is not None and est.total > device_memory:
            raise MigrateError(f"layout {layout.describe()} needs about {est.total / 2**30:.1f} GiB per device, "
                               f"more than {device_memory / 2**30:.1f} GiB (see migrate plan)")
    return MFRun(doc, notes, _launch(devices, semi), sources)


def _training(cfg: RunConfig, batch: mf_train.Batching, cpu: bool, notes: list[str]) -> dict:
    meta = read_meta(cfg.data)
    if meta.get("seq_length") != cfg.seq_length:
        raise MigrateError(f"{cfg.data} was tokenized with seq_length {meta.get('seq_length')}, run.yaml says "
                           f"{cfg.seq_length}")
    runner, more = mf_train.runner_section(cfg, batch, int(meta["samples"]), cpu)
    wrapper, wrapper_notes = mf_train.wrapper_section(cfg, batch)
    notes += more + wrapper_notes + mf_train.training_notes(cfg)
    dataset = mf_train.dataset_section(cfg, str((Path(cfg.data) / MINDRECORD_FILE).resolve()), batch, cpu)
    interval = cfg.checkpoint_interval or cfg.total_steps
    return {
        "runner_config": runner,
        "runner_wrapper": wrapper,
        "optimizer": mf_train.optimizer_section(cfg),
        "lr_schedule": mf_train.lr_section(cfg),
        "lr_scale": False,
        "layer_scale": False,
        "train_dataset": dataset,
        "train_dataset_task": {"type": "CausalLanguageModelDataset", "dataset_config": dataset},
        "do_eval": False,
        "recompute_config": {"recompute": bool(cfg.recompute), "select_recompute": False,
                             "parallel_optimizer_comm_recompute": False, "mp_comm_recompute": True,
                             "recompute_slice_activation": False},
        "callbacks": [{"type": "MFLossMonitor"},
                      {"type": "CheckpointMonitor", "prefix": "llama", "save_checkpoint_steps": interval,
                       "keep_checkpoint_max": cfg.keep_checkpoints or 1, "integrated_save": False,
                       "async_save": False}] + ([mf_train.stop_callback(cfg)] if cpu else []),
        "profile": False,
    }


def _launch(devices: int, semi: bool) -> str:
    if not semi:
        return "python run_mindformer.py --config {yaml}"
    return (f"msrun --worker_num={devices} --local_worker_num={devices} --master_port=8118 --log_dir=output/msrun_log "
            "--join=True run_mindformer.py --config {yaml}")


def render(run: MFRun, path: Path) -> str:
    header = [MARKER + f" {__version__} (MindSpore Transformers 2.0.0, legacy LlamaForCausalLM)",
              "# launch from a MindFormers 2.0.0 checkout: " + run.launch.format(yaml=path)]
    header += [f"# note: {line}" for line in run.notes]
    body = yaml.safe_dump(run.doc, sort_keys=False, default_flow_style=False, width=120)
    return "\n".join(header) + "\n" + body


def write_run_yaml(run: MFRun, path: str | Path, overwrite: bool = False) -> Path:
    """Write atomically; replace only a file this command wrote, and never one of its inputs."""
    path = Path(path)
    if path.is_dir():
        raise MigrateError(f"output {path} is a folder; name a .yaml file")
    real = os.path.realpath(path)
    if any(os.path.exists(s) and os.path.samefile(real, s) for s in run.sources if os.path.exists(real)):
        raise MigrateError(f"output {path} is one of the files the YAML is made from")
    if os.path.lexists(path):
        if os.path.islink(path):
            raise MigrateError(f"output {path} is a symbolic link; name a file")
        if not overwrite:
            raise MigrateError(f"output {path} already exists (pass --overwrite to replace it)")
        with open(path, encoding="utf-8", errors="replace") as fh:
            if not fh.readline().startswith(MARKER):
                raise MigrateError(f"output {path} was not written by migrate mindformers-config; "
                                   "--overwrite replaces only its own files")
    return atomic_write_text(path, render(run, path))
