"""`migrate mindformers-config`: argument parsing only (see migrate.mindformers.run).

Each verb is declared at its handler (`migrate.cli_verbs`); `convert --mindformers-yaml` and
`hparams --mindformers` call the same library functions.
"""
from __future__ import annotations

from migrate.byte_sizes import parse_memory_size
from migrate.cli_verbs import Output, arguments, trust_argument, verb
from migrate.errors import MigrateError

YAML_FIRST_LINE = "# written by migrate mindformers-config"  # migrate.mindformers.run.MARKER (tested equal)


def write_yaml(args, ms_dir, run_config=None) -> None:
    """Build and write the run YAML named by args.mindformers_yaml (or args.out); print what was done."""
    from migrate.mindformers.run import mindformers_run, write_run_yaml
    from migrate.ui import console

    out = getattr(args, "mindformers_yaml", None) or args.out
    run = mindformers_run(ms_dir, run_config, seq_length=args.seq_length, dp=args.dp, mp=args.mp, pp=args.pp,
                          micro_batches=args.micro_batches, optimizer_shard=args.optimizer_shard,
                          device=args.device, output_dir=args.output_dir,
                          device_memory=args.device_memory,
                          trust=args.trust_model_class)
    path = write_run_yaml(run, out, overwrite=args.yaml_overwrite)
    shown = console()
    shown.print(f"[green]wrote[/] MindFormers run YAML ({run.doc['run_mode']}) -> {path}")
    for note in run.notes:
        shown.print(f"  note: {note}", markup=False, highlight=False, soft_wrap=True)
    shown.print("  launch: " + run.launch.format(yaml=path), markup=False, highlight=False, soft_wrap=True)


def _run_yaml_paths(args):
    from migrate.cli_train import run_yaml_paths

    return run_yaml_paths(args.config)


@verb("mindformers-config", "a MindSpore Transformers 2.0.0 run YAML for a converted folder (+ run.yaml's training)",
      writes=(Output("out", "file", overwrite="yaml_overwrite", first_line=YAML_FIRST_LINE),),
      reads=("ms_dir", "config", _run_yaml_paths))
def _cmd_mindformers_config(args) -> int:
    from migrate.train.config import RunConfig

    if args.table:
        from migrate.mindformers.table import format_table

        print(format_table())
        return 0
    if not args.out:
        raise MigrateError("--out names the YAML file to write")

    run_config = RunConfig.load(args.config) if args.config else None
    if args.ms_dir is None and run_config is None:
        raise MigrateError("name a converted folder, or --config run.yaml whose ms_model names one")
    write_yaml(args, args.ms_dir, run_config)
    return 0


@arguments("mindformers-config")
def _mindformers_config_arguments(p) -> None:
    p.add_argument("ms_dir", nargs="?", help="converted folder (default: run.yaml's ms_model)")
    p.add_argument("--config", help="run.yaml: translate its training knobs (otherwise a predict YAML)")
    p.add_argument("--out", help="the YAML file to write")
    p.add_argument("--table", action="store_true", help="print the translation table (run.yaml knob -> MindFormers "
                                                         "fields, what still differs, how it was verified) and exit")
    trust_argument(p)
    add_yaml_options(p, standalone=True)


def add_yaml_options(p, *, standalone: bool) -> None:
    """The YAML's options, shared by `mindformers-config` and `convert --mindformers-yaml`."""
    g = p.add_argument_group("MindFormers run YAML" if not standalone else "layout and device")
    g.add_argument("--seq-length", type=int, help="the input length MindFormers pads to (default: run.yaml's; "
                                                  "predict: max_position_embeddings, at most 512)")
    g.add_argument("--dp", type=int, default=1, help="data_parallel")
    g.add_argument("--mp", type=int, default=1,
                   help="model_parallel (heads, kv heads, vocab, intermediate %% mp)")
    g.add_argument("--pp", type=int, default=1, help="pipeline_stage (layers %% pp)")
    g.add_argument("--micro-batches", type=int, default=1, help="micro_batch_num, with --pp (>= pp)")
    g.add_argument("--optimizer-shard", action="store_true", help="enable_parallel_optimizer (dp >= 2)")
    g.add_argument("--device", choices=["ascend", "cpu"], default="ascend",
                   help="cpu: one process, use_rope_slice/fused_rms_norm/use_flash_attention set for MindSpore CPU")
    g.add_argument("--device-memory", type=parse_memory_size,
                   help="refuse a layout the planner sizes above this per device (e.g. 64GB)")
    g.add_argument("--output-dir", help="MindFormers output_dir (default ./output)")
    g.add_argument("--yaml-overwrite" if not standalone else "--overwrite", dest="yaml_overwrite",
                   action="store_true", help="replace a YAML this command wrote before")
