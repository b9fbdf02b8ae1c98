"""Subcommands of the training side: data, train, ckpt, hparams, compare.

Argument parsing only; each calls one library function, imported inside its
function as in `migrate.cli`. Each verb is declared at its handler (`migrate.cli_verbs`).
"""
from __future__ import annotations

from migrate.byte_sizes import parse_memory_size
from migrate.checkpoints.output_guard import COMPARE_JSON_SIGNATURE, PNG_SIGNATURE
from migrate.cli_args import POSITIVE_INT
from migrate.cli_verbs import Output, arguments, group, trust_argument, verb


def run_yaml_paths(config) -> list:
    """The paths a run.yaml names (data, models, the run folders); none without one."""
    if not config:
        return []
    from migrate.train.config import RunConfig

    cfg = RunConfig.load(config)
    return [cfg.data, cfg.eval_data, cfg.hf_model, cfg.ms_model, cfg.out_dir.golden]


def _beside(args) -> list:
    """compare also reads the effective_hparams.json beside a metrics file it is given."""
    from pathlib import Path

    return [Path(x).parent / "effective_hparams.json" for x in (args.golden, args.ms) if Path(x).is_file()]


group("data", "prepare training data", dest="data_command")


@verb("data tokenize", "text files -> MindRecord + .npy twin for the golden script",
      writes=(Output("out"),), reads=("files", "tokenizer"))
def _cmd_data_tokenize(args) -> int:
    from migrate.checkpoints.output_guard import check_output
    from migrate.data.tokenize import tokenize_corpus
    from migrate.ui import console

    check_output(args.out, overwrite=args.overwrite, inputs=(*args.files, args.tokenizer))  # --overwrite's rule
    meta = tokenize_corpus(args.files, args.tokenizer, args.seq_length, args.out, add_bos=args.add_bos,
                           overwrite=args.overwrite)
    console().print(
        f"[green]tokenized[/] {len(meta.get('files', args.files))} files -> {meta.get('samples')} samples of "
        f"{args.seq_length}+1 tokens ({meta.get('tokens', 0):,} tokens) in {args.out}"
    )
    return 0


@arguments("data tokenize")
def _data_tokenize_arguments(p) -> None:
    p.add_argument("files", nargs="+", help="text files (one document each)")
    p.add_argument("--tokenizer", required=True, help="HF folder holding the tokenizer")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--out", required=True, help="output data folder")
    p.add_argument("--add-bos", action="store_true", help="prefix every document with BOS")
    p.add_argument("--overwrite", action="store_true")


@verb("compare", "loss / lr / grad-norm of two training runs; exit 1 on drift",
      writes=(Output("plot", "file", overwrite=None, signature=PNG_SIGNATURE),
              Output("json", "file", overwrite=None, signature=COMPARE_JSON_SIGNATURE)),
      reads=("golden", "ms", "noise", "hparams", _beside))
def _cmd_compare(args) -> int:
    from migrate.compare import compare_runs, print_summary, write_json, write_plot
    from migrate.ui import console

    result = compare_runs(
        args.golden, args.ms, noise_path=args.noise, dtype=args.dtype, allow_prefix=args.allow_prefix,
        tolerances={"first": args.tol_first, "mean": args.tol_mean, "max": args.tol_max, "lr": args.tol_lr,
                    "clip": args.tol_clip, "drift": args.tol_drift},
        hparams=args.hparams,
    )
    print_summary(result, console())
    if args.plot:
        write_plot(result, args.plot)
        console().print(f"plot: {args.plot}")
    if args.json:
        write_json(result, args.json)
    if not result.passed:
        from migrate.replay.runs import replay_command

        command = replay_command(args.golden, args.ms)
        if command is not None:  # the last line: where to look next
            console().print(f"to see which tensor parts first: {command}", markup=False, highlight=False,
                            soft_wrap=True)
    return result.exit_code


@arguments("compare")
def _compare_arguments(p) -> None:
    p.add_argument("golden", help="golden metrics.jsonl or run folder; or HF Trainer trainer_state.json, a Megatron-LM "
                                  "or MindSpore Transformers log, TensorBoard event files (format detected)")
    p.add_argument("ms", help="MindSpore metrics.jsonl or run folder (or any format the golden takes)")
    p.add_argument("--noise", help="a second golden run: its distance to the first is the noise band")
    p.add_argument("--dtype", help="fp32 | bf16 | fp16: picks the default tolerances (default: the precision the "
                                   "runs' effective_hparams.json record, else fp32)")
    p.add_argument("--plot", help="write a PNG of the curves and their difference")
    p.add_argument("--json", help="write the comparison as JSON")
    p.add_argument("--allow-prefix", action="store_true", help="accept a run that stopped early")
    p.add_argument("--tol-first", type=float, help="first-step loss relative difference bound")
    p.add_argument("--tol-mean", type=float, help="mean relative loss difference bound")
    p.add_argument("--tol-max", type=float, help="max relative loss difference bound")
    p.add_argument("--tol-lr", type=float, help="lr relative difference bound")
    p.add_argument("--tol-clip", type=float, help="mean signed post-clip grad-norm relative difference bound")
    p.add_argument("--tol-drift", type=float,
                   help="fp32: how far (x the first steps' level) the loss rel diff may stay on one side (default 10)")
    p.add_argument("--hparams", nargs=2, metavar=("GOLDEN", "MS"),
                   help="the two runs' effective_hparams.json (default: the files beside each metrics.jsonl)")


@verb("replay", "one optimizer step of both runs from their checkpoints, compared stage by stage; exit 1 where "
                "a quantity parts", writes=(Output("report", overwrite=None),),
      reads=("golden", "ms", "config", lambda a: run_yaml_paths(a.config)))
def _cmd_replay(args) -> int:
    from migrate.judge.report import write_report
    from migrate.replay.replaying import replay
    from migrate.replay.terminal import print_replay
    from migrate.ui import console

    result = replay(args.golden, args.ms, step=args.step, config=args.config, mode=args.mode)
    if args.report:
        paths = write_report(result.report, args.report)
        result.notes.append(f"report (every tensor): {', '.join(str(p) for p in paths.values())}")
    print_replay(result, console())
    return result.exit_code


@arguments("replay")
def _replay_arguments(p) -> None:
    p.add_argument("golden", help="the golden run folder (metrics.jsonl, checkpoint-N/)")
    p.add_argument("ms", help="the MindSpore run folder (metrics.jsonl, checkpoints/checkpoint-N/)")
    p.add_argument("--step", type=POSITIVE_INT,
                   help="the optimizer step to replay (default: the first step migrate compare flags)")
    p.add_argument("--config", help="run.yaml (default: the config the MindSpore run recorded)")
    p.add_argument("--mode", choices=["graph", "pynative"],
                   help="MindSpore execution mode of the replayed step (default: the run's; pynative skips the "
                        "graph compile, the same cells op by op)")
    p.add_argument("--report", metavar="DIR", help="write report.json, report.md, report.html there")


group("keymap", "work with keymaps", dest="keymap_command")


@verb("keymap check", "report what a keymap leaves unmapped on each side, moving no data")
def _cmd_keymap_check(args) -> int:
    from migrate.keymap_check import check_keymap
    from migrate.ui import console

    result = check_keymap(args.keymap, args.hf, args.ms_model, target=args.target, trust=args.trust_model_class)
    out = console()
    out.print(f"keymap {result.keymap.name} v{result.keymap.version} ({result.keymap.path}) -> {result.target}: "
              f"{result.pairs} pairs")
    sections = (
        ("HF tensors no rule consumes", result.unmapped_source),
        ("rules whose HF tensor is absent", result.absent_source),
        ("model parameters no rule fills", result.unfilled_target),
        ("rule targets the model lacks", result.unknown_target),
        ("shape mismatches", result.misshaped),
    )
    for title, names in sections:
        if names:
            out.print(f"[red]{title} ({len(names)}):[/]")
            for name in names:
                out.print(f"  {name}")
    out.print("[green]complete: every tensor maps[/]" if result.complete else "[red]incomplete[/]")
    return 0 if result.complete else 1


@arguments("keymap check")
def _keymap_check_arguments(p) -> None:
    p.add_argument("keymap", help="a keymap YAML file (or a bundled family name)")
    p.add_argument("--hf", required=True, help="an HF model folder the keymap should convert")
    p.add_argument("--ms-model", help="module:Class of the MindSpore model (default: the keymap's target)")
    p.add_argument("--target", help="an entry of the keymap's `targets` (e.g. qkv_concat, mcore)")
    trust_argument(p)


@verb("train", "continue pretraining the converted model on MindSpore",
      writes=(Output("out", overwrite=None),),  # an existing run folder is continued (--resume)
      reads=("config", lambda a: run_yaml_paths(a.config)))
def _cmd_train(args) -> int:
    from migrate.train.config import RunConfig
    from migrate.train.launch.cluster import Cluster
    from migrate.train.run import run_training
    from migrate.ui import console

    out = console()
    run_dir = run_training(args.config, out=args.out, resume=args.resume, mode=args.mode, dp=args.dp, mp=args.mp,
                           pp=args.pp, micro_batches=args.micro_batches, optimizer_shard=args.optimizer_shard,
                           cluster=Cluster(args.nodes, args.node_rank, args.master_addr, args.master_port),
                           echo=lambda line: out.print(line, markup=False, highlight=False, soft_wrap=True),
                           step_faults=args.step_fault or (), profile=args.profile, trust=args.trust_model_class,
                           faults=args.fault or ())
    written = ("metrics.jsonl, checkpoints/" if RunConfig.load(args.config).checkpoint_interval
               else "metrics.jsonl; checkpoint_interval is 0")
    out.print(f"[green]trained[/] -> {run_dir} ({written})")
    return 0


@arguments("train")
def _train_arguments(p) -> None:
    p.add_argument("--config", required=True, help="run.yaml (shared with golden/train_torch.py)")
    p.add_argument("--resume", help="a checkpoint folder, or a run folder (resumes from its latest)")
    p.add_argument("--out", help="run folder (default: the config's out_dir.ms)")
    p.add_argument("--mode", choices=["graph", "pynative"], default="graph", help="MindSpore execution mode")
    p.add_argument("--profile", action="store_true",
                   help="time each step's phases (data, forward+backward, clip, optimizer, dp reduction, host): "
                        "time_*_s fields in metrics.jsonl and a table at the end; the step then runs as "
                        "separate graphs (same numbers), not as the one graph a plain run may use")
    p.add_argument("--step-fault", action="append", metavar="KIND@STEP[-LAST]",
                   help="rehearse the health watch: nan_grad or lr_x100 at those steps (golden: the same flag)")
    p.add_argument("--fault", action="append", metavar="NAME[@STEP]",
                   help="inject a porting fault on the MindSpore side from that optimizer step on (for rehearsing "
                        "compare and replay; names in migrate.train.knob_faults, e.g. beta2@3)")
    g = p.add_argument_group("parallel (more than one process: started through MindSpore's msrun)")
    g.add_argument("--dp", type=int, default=1,
                   help="data-parallel ranks (the config's micro batch is per rank)")
    g.add_argument("--mp", type=int, default=1, help="tensor-parallel width (Ascend/GPU only)")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages (Ascend/GPU only)")
    g.add_argument("--micro-batches", type=int, default=1, help="pipeline micro-batches per step (with --pp)")
    g.add_argument("--optimizer-shard", action="store_true", help="split AdamW states over dp (Ascend/GPU only)")
    g.add_argument("--nodes", type=int, default=1, help="machines taking part; run the command on each")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0..nodes-1")
    g.add_argument("--master-addr", help="address of node 0 (multi-node); default 127.0.0.1")
    g.add_argument("--master-port", type=int,
                   help="msrun scheduler port (multi-node); default: a free port")
    trust_argument(p)


group("ckpt", "work with training checkpoints", dest="ckpt_command")


@verb("ckpt merge", "one single-process checkpoint from a multi-process one",
      writes=(Output("out"),), reads=("checkpoint",))
def _cmd_ckpt_merge(args) -> int:
    from migrate.train.checkpoint.folder import merge_checkpoint
    from migrate.ui import console

    out = merge_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    console().print(f"[green]merged[/] {args.checkpoint} -> {out} (one single-process checkpoint)")
    return 0


@arguments("ckpt merge")
def _ckpt_merge_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its latest checkpoint)")
    p.add_argument("out", help="output checkpoint folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder (atomically)")


@verb("hparams", "both sides' effective hyperparameters; exit 1 on any difference")
def _cmd_hparams(args) -> int:
    from migrate.train.config import RunConfig
    from migrate.train.hparams import format_report, hparams_report
    from migrate.ui import console

    if args.mindformers:  # the MindFormers YAML as the second side
        from migrate.mindformers.hparams_vs_golden import format_mf_report, mf_hparams_report

        report = mf_hparams_report(RunConfig.load(args.config), args.mindformers, trust=args.trust_model_class)
        console().print(format_mf_report(report), markup=False, highlight=False)
        return report.exit_status
    report = hparams_report(RunConfig.load(args.config), trust=args.trust_model_class)
    console().print(format_report(report), markup=False, highlight=False)
    return report.exit_status


@arguments("hparams")
def _hparams_arguments(p) -> None:
    p.add_argument("config", help="run.yaml")
    p.add_argument("--mindformers", metavar="MF_YAML",
                   help="compare the golden with what MindSpore Transformers 2.0.0 does with this run YAML")
    trust_argument(p)


@verb("plan", "per-device memory estimate and a ranked list of parallel layouts that fit")
def _cmd_plan(args) -> int:
    from migrate.hf_model_config import hf_folder, model_config_from_hf
    from migrate.memory_plan import plan, print_plan
    from migrate.models.config import LlamaConfig
    from migrate.ui import console

    # an HF folder (or its config.json): the config convert would write, no weights read
    config = model_config_from_hf(args.model)[1] if hf_folder(args.model) else LlamaConfig.load(args.model)
    estimate, lora_table = None, None
    if args.lora_rank is not None:  # a LoRA run: frozen base, adapters only trained (migrate.lora.memory)
        from migrate.lora.memory import lora_planning

        estimate, lora_table = lora_planning(args.model, config, args.lora_rank, args.lora_targets, args.seq_length,
                                             args.dtype, trust=args.trust_model_class)
    result = plan(config, args.devices, args.device_memory, args.seq_length,
                  args.global_batch, dtype=args.dtype, optimizer_shard=not args.no_optimizer_shard, estimate=estimate)
    print_plan(result, console(), max_rows=args.top)
    if lora_table is not None:
        console().print(lora_table)
    return 0 if result.valid else 1


@arguments("plan")
def _plan_arguments(p) -> None:
    p.add_argument("--model", required=True,
                   help="a converted MindSpore folder or its model.yaml; or an HF folder or its config.json")
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--device-memory", type=parse_memory_size, required=True,  # bytes, read before the model
                   help="per device, e.g. 64GB or 64GiB")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--no-optimizer-shard", action="store_true", help="keep optimizer states whole on every dp rank")
    p.add_argument("--top", type=POSITIVE_INT, default=20, help="layouts to list")
    p.add_argument("--lora-rank", type=int,
                   help="plan a LoRA run of this rank (base frozen), beside full training")
    p.add_argument("--lora-targets", default="q_proj,v_proj", help="LoRA target modules: q_proj,v_proj or all-linear")
    trust_argument(p)
