"""Command line: argument parsing only; each subcommand calls one library function.

User mistakes (MigrateError) and OSErrors on the user's paths print one line on stderr and exit 2,
with no traceback; SIGINT and SIGTERM exit 130 and 143 after the same cleanup.

Each verb is declared at its handler (`@verb(name, help)`, and `@arguments(name)` on what adds its
arguments: `migrate.cli_verbs`); the parser is built from those declarations. Each handler imports
its library inside its function: a command loads only what it runs (`migrate convert` never imports
MindSpore, whose import alone holds 0.5 GB).
"""
from __future__ import annotations

import argparse
import os
import sys

from migrate import __version__
from migrate.cli_args import COUNT, POSITIVE, SEED, Parser, utf8_text
from migrate.cli_mindformers import YAML_FIRST_LINE
from migrate.cli_probe import code_files
from migrate.cli_verbs import Output, add_verbs, arguments, guard_outputs, trust_argument, verb
from migrate.dtype_names import NAMES
from migrate.errors import MigrateError, one_line
from migrate.keymap import available

# The frameworks pyproject.toml's extras install (the core needs none of them) -> the extra.
EXTRAS = {"torch": "torch", "transformers": "torch", "tokenizers": "torch", "mindspore": "mindspore",
          "matplotlib": "plots", "tensorboard": "train", "peft": "train"}


@verb("convert", "HF checkpoint folder -> MindSpore checkpoint folder",
      writes=(Output("out_dir"), Output("mindformers_yaml", "file", overwrite="yaml_overwrite",
                                         first_line=YAML_FIRST_LINE)),
      reads=("src_dir", "keymap", "mindformers_run"))  # run.yaml's knobs only: its ms_model may be OUT_DIR
def _cmd_convert(args) -> int:
    from migrate.convert import convert
    from migrate.ui import console, progress_bar

    target = args.target
    if args.qkv_concat:
        if target not in (None, "qkv_concat", "mcore"):  # mcore is fused already
            raise MigrateError(f"--qkv-concat cannot be combined with --target {target}")
        target = target or "qkv_concat"
    if args.mindformers_yaml:  # refuse what MindFormers cannot express before converting anything
        from migrate.mindformers.run import precheck_hf

        precheck_hf(args.src_dir, args.keymap or args.src, target, args.seq_length, dp=args.dp, mp=args.mp,
                    pp=args.pp, micro_batches=args.micro_batches)
    with progress_bar("converting") as update:
        result = convert(args.src_dir, args.out_dir, keymap=args.keymap or args.src, fmt=args.format,
                         dtype=args.dtype, overwrite=args.overwrite, on_tensor=update,
                         max_shard_size=args.max_shard_size, hash_sources=args.hash_sources, target=target,
                         trust=args.trust_model_class)
    console().print(
        f"[green]converted[/] {result.tensors} tensors, {result.parameters:,} parameters "
        f"({result.bytes_written / 2**20:.1f} MiB) in {result.seconds:.2f}s -> {result.out_dir}"
    )
    if args.mindformers_yaml:
        from migrate.cli_mindformers import write_yaml
        from migrate.train.config import RunConfig

        write_yaml(args, result.out_dir, RunConfig.load(args.mindformers_run) if args.mindformers_run else None)
    return 0


@arguments("convert")
def _convert_arguments(p) -> None:
    p.add_argument("src_dir")
    p.add_argument("out_dir")
    p.add_argument("--src", default="hf_llama",
                   help=f"source family (a keymap name: {', '.join(available())}) "
                        "or 'auto' from config.json")
    p.add_argument("--keymap", help="path to a keymap YAML (overrides --src)")
    p.add_argument("--format", choices=["ckpt", "safetensors"], default="ckpt")
    p.add_argument("--dtype", choices=["keep", "fp32", "fp16", "bf16"], default="keep")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--qkv-concat", action="store_true",
                   help="MindFormers' fused layout: attention.w_qkv (per KV group) and feed_forward.w_gate_hidden "
                        "(gate/up interleaved); the same as --target qkv_concat")
    p.add_argument("--target", metavar="NAME",
                   help="another MindSpore layout from the keymap's `targets` (hf_llama and its family: "
                        "qkv_concat, mcore = MindFormers 2.x names)")
    p.add_argument("--hash-sources", action="store_true",
                   help="record the sha256 of every source file in conversion.json (about 1 CPU-second per GB)")
    p.add_argument("--max-shard-size", metavar="SIZE",
                   help="split the checkpoint into files of at most SIZE (e.g. 1.9GB, 500MB, 2GiB) with an index; "
                        "default 1.9GB for ckpt, one file for safetensors")
    trust_argument(p)
    p.add_argument("--mindformers-yaml", metavar="FILE", help="also write a MindSpore Transformers 2.0.0 run YAML "
                                                               "for the output (see migrate mindformers-config)")
    p.add_argument("--mindformers-run", metavar="RUN_YAML", help="with --mindformers-yaml: translate this run.yaml's "
                                                                  "training knobs into it")
    from migrate.cli_mindformers import add_yaml_options

    add_yaml_options(p, standalone=False)


@verb("export", "MindSpore checkpoint folder -> HF folder (inverse keymap)",
      writes=(Output("out_dir"),), reads=("ms_dir", "keymap", "checkpoint"))
def _cmd_export(args) -> int:
    from migrate.cli_infer import cmd_export_mindir, hf_only

    if args.format == "mindir":
        return cmd_export_mindir(args)
    hf_only(args)
    from migrate.export import export
    from migrate.ui import console, progress_bar

    with progress_bar("exporting") as update:
        result = export(args.ms_dir, args.out_dir, keymap=args.keymap or args.src, overwrite=args.overwrite,
                        on_tensor=update, checkpoint=args.checkpoint, trust=args.trust_model_class)
    console().print(
        f"[green]exported[/] {result.tensors} tensors, {result.parameters:,} parameters "
        f"in {result.seconds:.2f}s -> {result.out_dir}"
    )
    if result.skipped:
        from migrate.checkpoints.training_state import summary

        console().print(f"skipped {len(result.skipped)} training-state tensors (not weights): "
                        f"{summary(result.skipped)}", markup=False, highlight=False)
    return 0


@arguments("export")
def _export_arguments(p) -> None:
    p.add_argument("ms_dir")
    p.add_argument("out_dir")
    p.add_argument("--src", help="family whose keymap converted the model (default: what conversion.json records)")
    p.add_argument("--keymap", help="path to a keymap YAML (overrides --src)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--checkpoint", metavar="FILE", help="export this checkpoint of the folder's model instead of its "
                                                        "own (e.g. one MindFormers trained; optimizer state skipped)")
    trust_argument(p)
    from migrate.cli_infer import mindir_options

    mindir_options(p)  # --format hf|mindir and the MindIR export's shapes


@verb("inspect", "list the tensors of a checkpoint without loading them")
def _cmd_inspect(args) -> int:
    from rich.table import Table

    from migrate.inspect_ckpt import inspect_checkpoint, total_parameters
    from migrate.ui import console

    rows = inspect_checkpoint(args.path)
    table = Table(title=str(args.path))
    table.add_column("name")
    table.add_column("dtype")
    table.add_column("shape")
    for name, dtype, shape in rows:
        table.add_row(name, dtype, "×".join(map(str, shape)) or "scalar")
    console().print(table)
    from migrate.checkpoints.training_state import is_training_state, summary

    state = [row for row in rows if is_training_state(row[0])]
    if not state:
        console().print(f"{len(rows)} tensors, {total_parameters(rows):,} parameters")
        return 0
    model = [row for row in rows if not is_training_state(row[0])]
    console().print(f"{len(model)} model tensors, {total_parameters(model):,} parameters; "
                    f"{len(state)} training-state tensors, skipped by export: {summary(r[0] for r in state)}",
                    markup=False, highlight=False)
    return 0


@arguments("inspect")
def _inspect_arguments(p) -> None:
    p.add_argument("path", help="a .ckpt / .safetensors file, a converted folder or an HF folder")


@verb("diff", "run HF and MindSpore side by side, or compare two training checkpoints; exit 0 aligned, 1 not, "
              "2 bad input",
      writes=(Output("report", overwrite=None),),
      reads=("hf_dir", "ms_dir", "keymap", "adapter", "mapping", "inputs", "noise", "model",
             lambda a: code_files(a.hf_dir, a.ms_dir)))
def _cmd_diff(args) -> int:
    if args.list_faults:  # the faults are MindSpore cells: a diff of two dumps must not import MindSpore
        from migrate.align.model_faults import all_faults
        from migrate.ui import console

        for fault in all_faults().values():
            needs = f" (needs: {', '.join(fault.needs)})" if fault.needs else ""
            console().print(f"[bold]{fault.name}[/] — {fault.description}; shows at: {fault.block}{needs}")
        return 0
    if not (args.hf_dir and args.ms_dir):
        raise MigrateError("diff needs HF_DIR and MS_DIR")
    from migrate.cli_probe import diff

    return diff(args)  # HF vs converted live (run_diff), or any other pair (diff_pair)


@arguments("diff")
def _diff_arguments(p) -> None:
    p.add_argument("hf_dir", nargs="?", help="an HF folder, a converted folder, a dump, module:factory, "
                                             "or a training checkpoint (then MS_DIR is one too)")
    p.add_argument("ms_dir", nargs="?")
    p.add_argument("--src", help="family whose keymap pairs the names (default: the one conversion.json records)")
    p.add_argument("--keymap", help="path to a keymap YAML (overrides --src)")
    p.add_argument("--dtype", choices=NAMES, default="fp32", help="both sides run in it")
    p.add_argument("--text", type=utf8_text,
                   help="tokenize this text with the HF folder's tokenizer instead of random ids")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--padded", action="store_true", help="left-pad rows so the padding mask is exercised")
    p.add_argument("--detail", action="store_true", help="also compare after attention and after MLP")
    p.add_argument("--grads", action="store_true", help="compare gradients and params after one AdamW step")
    p.add_argument("--lr", type=POSITIVE, default=1e-4, help="AdamW lr for the --grads step")
    p.add_argument("--generate", type=COUNT, default=0, metavar="N", help="greedy-generate N tokens on both (0: none)")
    p.add_argument("--inject", metavar="FAULT[@LAYER]", help="inject a known fault into the MindSpore side")
    p.add_argument("--adapter", metavar="DIR", help="a LoRA adapter (PEFT folder, or `migrate lora import` output / "
                                                    "a LoRA run's checkpoint) attached on both sides")
    p.add_argument("--list-faults", action="store_true", help="list the faults --inject knows")
    p.add_argument("--mode", choices=["pynative", "graph"], default="pynative", help="MindSpore execution mode")
    p.add_argument("--reference", choices=["fp64", "none"], default="fp64",
                   help="fp64 (default): HF's model also runs in float64 on the same inputs and every bound widens "
                        "to the reference's own error; none: fixed bounds scaled for depth and width")
    p.add_argument("--report", metavar="DIR", help="write report.json, report.md, report.html and the plot")
    p.add_argument("--max-abs", type=float, help="override the max-abs bound for every kind")
    p.add_argument("--cosine", type=float, help="override the cosine bound")
    p.add_argument("--top1", type=float, help="override the top-1 agreement bound (logits)")
    p.add_argument("--kl", type=float, help="override the KL bound (logits)")
    p.add_argument("--threshold", action="append", metavar="KIND.NAME=VALUE",
                   help="fine-grained override, e.g. grad.cosine=0.9999 (repeatable)")
    trust_argument(p)
    from migrate.cli_probe import add_diff_options

    add_diff_options(p)


def build_parser() -> argparse.ArgumentParser:
    # Importing a module declares its verbs, listed in `migrate --help` after this module's, in this
    # order (each is light: its handlers import their library when they run). A new cli_* module
    # adds itself here; a new verb in one of them needs nothing else.
    from migrate import cli_health, cli_infer, cli_lora, cli_mindformers, cli_probe, cli_report, cli_train, cli_vocab  # noqa: F401

    # Parser: a bad argument is one `migrate: error:` line, exit 2, as every other user error
    parser = Parser(prog="migrate", description="PyTorch/HF to MindSpore migration for LLMs")
    parser.add_argument("--version", action="version", version=f"migrate {__version__}")
    add_verbs(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    from migrate.keymap import use_keymap_dir
    from migrate.models.registry import trust_from_env
    from migrate.signals import Interrupted, handled

    # The environment is read here, in the entry point; below it, what it said is passed as arguments.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub: local folders only
    # MindSpore's log (its C++ runtime's and its Python side's, both read GLOG_v at import) at errors only:
    # its warnings -- a compile cache's hash checks, API notices -- landed between `migrate generate`'s
    # streamed tokens. A GLOG_v in the user's environment wins (2: warnings).
    os.environ.setdefault("GLOG_v", "3")
    use_keymap_dir(os.environ.get("MIGRATE_KEYMAPS"))  # another keymap folder instead of the bundled one
    try:
        args = build_parser().parse_args(argv)  # a bad argument: MigrateError (cli_args.Parser)
        if hasattr(args, "trust_model_class"):
            # The opt-in: the flag, or MIGRATE_TRUST_MODEL_CLASS=1 in the caller's environment. The handler
            # passes it down as `trust=` (and `migrate train` hands it to its msrun workers' environment).
            args.trust_model_class = args.trust_model_class or trust_from_env(os.environ)
        guard_outputs(args)  # every declared output against every input, before the verb runs
        with handled():  # SIGTERM ends a command as SIGINT does: cleanup runs, nothing half-written stays
            return args.func(args)
    except MigrateError as exc:
        for line in exc.lines():  # one line (a newline in a name it quotes escaped); MigrateErrors: one per rule
            print(f"migrate: error: {line}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(f"migrate: {exc.word}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("migrate: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:  # a framework this command needs is not installed (docs/two-boxes.md)
        extra = EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"migrate: error: {args.command} needs {exc.name}, which is not installed here "
              f"(pip install 'migrate[{extra}]', or the version your recipe pins)", file=sys.stderr)
        return MigrateError.exit_code
    except ImportError as exc:
        # SIGINT/SIGTERM inside a C extension's initialisation (`import mindspore` takes seconds) comes back
        # as ImportError("initialization failed") caused by the interrupt: an interrupt, not a traceback
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, Interrupted):
            print(f"migrate: {cause.word}", file=sys.stderr)
            return cause.exit_code
        if isinstance(cause, KeyboardInterrupt):
            print("migrate: interrupted", file=sys.stderr)
            return 130
        raise
    except OSError as exc:  # a path of the user's that cannot be read or written: a user error too
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"migrate: error: {one_line(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return MigrateError.exit_code


if __name__ == "__main__":
    sys.exit(main())
