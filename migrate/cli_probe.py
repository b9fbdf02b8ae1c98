"""`migrate dump`, and `migrate diff` on any pair (an HF folder against its converted folder, dump
folders, `module:factory`, a mapping file, statistics mode, two training checkpoints). Argument handling
only: `migrate.probe.dumping.dump`, `migrate.align.runner.run_diff`, `migrate.probe.diff_any.diff_pair`
and `migrate.state_diff.compare.diff_states` do the work. Verbs declared at their handlers (`migrate.cli_verbs`)."""
from __future__ import annotations

from pathlib import Path

from migrate.cli_args import SEED
from migrate.cli_verbs import Output, arguments, trust_argument, verb
from migrate.dtype_names import NAMES
from migrate.errors import MigrateError

_RUNNER_ONLY = ("inject", "grads", "generate", "adapter", "text")


def code_files(*specs) -> list:
    """The files a `file.py:factory` side names (a plain module name or a folder names none)."""
    return [s.rpartition(":")[0] for s in specs if s and ":" in s]


def _new_inputs(args):
    """--inputs FILE is written (seeded ids) when it does not exist yet: an output then."""
    import os

    return args.inputs if args.inputs and not os.path.lexists(args.inputs) else None


@verb("dump", "run one side (HF folder, converted folder or module:factory) and write "
              "every module's outputs to a dump folder",
      writes=(Output("out"), Output("inputs", "file", overwrite=None, value=_new_inputs)),
      reads=("side", "inputs", "keymap", lambda a: code_files(a.side)))
def _cmd_dump(args) -> int:
    from migrate.probe.dumping import dump
    from migrate.ui import console

    result = dump(args.side, args.out, dtype=args.dtype, seed=args.seed, inputs_file=args.inputs,
                  batch=args.batch, seq_len=args.seq_len, padded=args.padded, statistics=args.stats,
                  keymap=args.keymap or args.src, overwrite=args.overwrite, record_inputs=args.record_inputs,
                  params=args.params, scope=args.scope, reference=args.reference, trust=args.trust_model_class)
    note = f"; inputs written to {args.inputs}" if result.inputs_written else ""
    console().print(f"[green]dumped[/] {result.records} tensors ({result.mode}, {result.bytes / 2**20:.1f} MiB) "
                    f"-> {result.out_dir}{note}", markup=True, highlight=False)
    return 0


@arguments("dump")
def _dump_arguments(p) -> None:
    p.add_argument("side", help="an HF folder, a converted folder, or module:factory / file.py:factory "
                                "(your code; factory() returns a torch.nn.Module or a MindSpore nn.Cell)")
    p.add_argument("out", help="the dump folder to write")
    p.add_argument("--inputs", metavar="FILE", help="token ids to feed: read if FILE exists, else seeded ids are "
                                                    "written to it (give the second dump the same FILE)")
    p.add_argument("--stats", action="store_true", help="statistics mode: per tensor min/max/mean/L2/NaN/Inf/"
                                                        "checksum instead of the tensor")
    p.add_argument("--dtype", choices=NAMES, default="fp32", help="dtype HF / converted folders run in")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--padded", action="store_true", help="left-pad rows so the padding mask is exercised")
    p.add_argument("--src", help="family keymap naming the HF folder's blocks (default: from config.json)")
    p.add_argument("--keymap", help="path to a keymap YAML (overrides --src)")
    p.add_argument("--record-inputs", action="store_true", help="also record every module's inputs")
    p.add_argument("--params", action="store_true", help="also record every parameter")
    p.add_argument("--scope", metavar="REGEX", help="record only the modules whose name matches (and the model's "
                                                    "outputs), e.g. 'layers\\.(0|31)\\b'")
    p.add_argument("--overwrite", action="store_true", help="replace a dump folder migrate wrote")
    p.add_argument("--reference", choices=["fp64", "none"], default="fp64",
                   help="fp64 (default): a torch side also runs in float64 and each record keeps its own error "
                        "against it, the noise reference migrate diff judges with; none: skip it")
    trust_argument(p)


def add_diff_options(p) -> None:
    """`migrate diff`'s options for any pair."""
    p.add_argument("--mapping", metavar="FILE", help="YAML pairing blocks to module names ({layer} templates) "
                                                     "for a side without a known table")
    p.add_argument("--stats", action="store_true", help="compare through per-tensor statistics only")
    p.add_argument("--inputs", metavar="FILE", help="token ids from migrate dump --inputs (live sides)")
    p.add_argument("--noise", metavar="STATE", help="two training states: a third one, from a run that differs "
                                                    "from the first only in rounding; every tensor's bound widens "
                                                    "to K x its difference from the first")
    p.add_argument("--model", metavar="DIR", help="two MindFormers checkpoints: the converted folder whose "
                                                  "model.yaml describes them")


def live_pair(args) -> bool:
    """An HF folder against its converted folder, run live by `align.runner.run_diff` (faults,
    gradients, generation, adapters on top of probe's recording); every other pair -- and that
    one with --mapping, --stats or --inputs -- goes through `probe.diff_any.diff_pair`."""
    from migrate.probe.sides import side_kind

    kinds = [side_kind(s) for s in (args.hf_dir, args.ms_dir)]
    return kinds == ["hf", "converted"] and not (args.mapping or args.stats or args.inputs)


def diff(args) -> int:
    """`migrate diff` on any pair: the report judged, printed and written, its exit code."""
    from migrate.judge.report import print_table, write_report
    from migrate.judge.thresholds import Thresholds
    from migrate.ui import console

    def thresholds(dtype: str) -> Thresholds:  # the dtype is the dumps' own when a side is a dump
        return Thresholds.for_dtype(dtype).with_overrides(
            None, max_abs=args.max_abs, cosine=args.cosine, top1=args.top1, kl=args.kl
        ).with_cli_overrides(args.threshold or [])

    out = console()
    if state_pair(args):
        report = _diff_states(args, thresholds)
    elif live_pair(args):
        from migrate.align.runner import run_diff

        report = run_diff(
            args.hf_dir, args.ms_dir, dtype=args.dtype, batch=args.batch, seq_len=args.seq_len, seed=args.seed,
            text=args.text, padded=args.padded, detail=args.detail, grads=args.grads, generate=args.generate,
            inject=args.inject, thresholds=thresholds(args.dtype), keymap=args.keymap or args.src, mode=args.mode,
            lr=args.lr, adapter=args.adapter, reference=args.reference, trust=args.trust_model_class,
        )
    else:
        report = _diff_any(args, thresholds)
        for line in report.pairing.lines():
            out.print(line, markup=False, highlight=False)
        if report.extra.get("statistics"):
            out.print(report.extra["statistics"], markup=False, highlight=False)
    print_table(report, out)
    if args.report:
        paths = write_report(report, Path(args.report))
        out.print(f"report: {', '.join(str(p) for p in paths.values())}")
    return report.exit_code


_STATE_ONLY = ("noise", "model")
_NOT_FOR_STATES = ("inject", "grads", "generate", "adapter", "text", "mapping", "stats", "inputs", "padded", "detail")


def state_pair(args) -> bool:
    """Two training checkpoints (`migrate.state_diff`); a training checkpoint beside something that is no
    model either is refused with what a training checkpoint is."""
    from migrate.state_diff.detect import reader, state_format

    found = [state_format(s) for s in (args.hf_dir, args.ms_dir)]
    if all(found):
        return True
    if any(found):   # a checkpoint folder beside a model is also a model (golden's, migrate train's): diff them
        state, other = (args.hf_dir, args.ms_dir) if found[0] else (args.ms_dir, args.hf_dir)
        if not (_is_model(state) and _is_model(other)):
            reader(other)   # says what a training checkpoint is
    used = [f"--{o}" for o in _STATE_ONLY if getattr(args, o, None)]
    if used:
        raise MigrateError(f"{', '.join(used)}: for two training checkpoints")
    return False


def _is_model(spec: str) -> bool:
    from migrate.probe.sides import side_kind

    try:
        side_kind(spec)
    except MigrateError:
        return False
    return True


def _diff_states(args, thresholds):
    """The report of two training states (`migrate.state_diff.compare`)."""
    from migrate.state_diff.compare import diff_states

    used = [f"--{o.replace('_', '-')}" for o in _NOT_FOR_STATES if getattr(args, o, None)]
    if used:
        raise MigrateError(f"{', '.join(used)}: not for two training checkpoints (they compare saved states, "
                           "nothing is run)")
    return diff_states(args.hf_dir, args.ms_dir, noise=args.noise, thresholds=thresholds,
                       keymap=args.keymap or args.src, model=args.model)


def _diff_any(args, thresholds):
    """The report of `migrate diff` on a pair `live_pair` does not take (dumps, module:factory,
    --mapping, --stats, --inputs)."""
    from migrate.probe.diff_any import diff_pair
    from migrate.probe.sides import side_kind

    kinds = [side_kind(s) for s in (args.hf_dir, args.ms_dir)]
    used = [f"--{o}" for o in _RUNNER_ONLY if getattr(args, o, None)]
    if used:
        raise MigrateError(f"{', '.join(used)} need an HF folder and a converted folder (live); "
                           f"this pair is {' and '.join(kinds)}")
    return diff_pair(args.hf_dir, args.ms_dir, dtype=args.dtype, seed=args.seed, batch=args.batch,
                     seq_len=args.seq_len, padded=args.padded, detail=args.detail, statistics=args.stats,
                     mapping=args.mapping, thresholds=thresholds, keymap=args.keymap or args.src,
                     inputs_file=args.inputs, dtype_given=args.dtype != "fp32", reference=args.reference,
                     trust=args.trust_model_class)
