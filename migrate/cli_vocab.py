"""`migrate vocab check` and `migrate vocab resize`: argument parsing and printing only.

Each verb is declared at its handler (`migrate.cli_verbs`); each subcommand imports its library inside
its function, as in `migrate.cli`.
"""
from __future__ import annotations

from migrate.cli_args import POSITIVE, SEED, SHARE
from migrate.cli_verbs import Output, arguments, group, trust_argument, verb

_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green", "info": "dim"}


group("vocab", "vocabulary: tokenizer vs config vs embedding; resize the embedding", dest="vocab_command")


@verb("vocab check", "tokenizer, configs, embedding rows and special ids agree "
                     "(and the tokenized data fits); exit 1 on errors, 0 on warnings only")
def _cmd_check(args) -> int:
    from migrate.vocab.check import vocab_check
    from migrate.vocab.data_checks import DataLimits

    limits = DataLimits(max_unk_share=args.max_unk_share, max_token_share=args.max_token_share,
                        max_duplicate_share=args.max_duplicate_share, mono_row_share=args.mono_row_share)
    report = vocab_check(args.hf_dir, args.ms_dir, data=args.data, tokenizer=args.tokenizer, limits=limits)
    if args.json:
        import json
        import sys

        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return report.exit_code
    from rich.table import Table

    from migrate.ui import console

    table = Table(title="vocabulary check")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for f in report.sorted():
        style = _STYLE.get(f.level, "")
        table.add_row(f.key, f"[{style}]{f.level}[/]", f.message)
    console().print(table)
    style = "bold red" if report.exit_code else "bold green"
    console().print(f"[{style}]{report.verdict()}[/]", highlight=False)
    return report.exit_code


@arguments("vocab check")
def _vocab_check_arguments(p) -> None:
    p.add_argument("hf_dir", help="the HF model folder")
    p.add_argument("ms_dir", nargs="?", help="its converted MindSpore folder")
    p.add_argument("--data", metavar="DIR", help="a `migrate data tokenize` output folder to check too")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: HF_DIR's, else MS_DIR's)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--max-unk-share", type=SHARE, default=0.01, help="warn above this share of unknown tokens")
    p.add_argument("--max-token-share", type=SHARE, default=0.2, help="warn when one token is above this share")
    p.add_argument("--max-duplicate-share", type=SHARE, default=0.01, help="warn above this share of repeated rows")
    p.add_argument("--mono-row-share", type=SHARE, default=0.5,
                   help="a row is 'mostly one token' when one id fills more than this share of it")


@verb("vocab resize", "grow or pad the embedding and lm_head of a converted model "
                      "(and of its HF source with --hf, so diff still pairs)",
      writes=(Output("out_dir"), Output("hf", value=lambda a: a.hf[1] if a.hf else None)),
      reads=("ms_dir", lambda a: a.hf[:1] if a.hf else []))
def _cmd_resize(args) -> int:
    from migrate.ui import console
    from migrate.vocab.resize import resize_vocab

    result = resize_vocab(args.ms_dir, args.out_dir, to=args.to, multiple=args.pad_to_multiple, init=args.init,
                          std=args.std, seed=args.seed, hf=tuple(args.hf) if args.hf else None,
                          overwrite=args.overwrite, trust=args.trust_model_class)
    console().print(f"[green]resized[/] vocabulary {result.old:,} -> {result.new:,} rows ({result.describe_init()}) "
                    f"-> {', '.join(str(p) for p in result.outputs)}", highlight=False)
    return 0


@arguments("vocab resize")
def _vocab_resize_arguments(p) -> None:
    p.add_argument("ms_dir", help="a converted MindSpore folder")
    p.add_argument("out_dir", help="output folder (never in place)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--to", type=int, metavar="N", help="new number of rows")
    size.add_argument("--pad-to-multiple", type=int, metavar="M",
                      help="round rows up to a multiple of M (e.g. the tensor-parallel size mp)")
    p.add_argument("--init", choices=["mean", "normal"], default="mean",
                   help="new rows: the mean of the old rows (default), or normal(0, --std) drawn with --seed")
    p.add_argument("--std", type=POSITIVE, help="std of --init normal (default: model.yaml's initializer_range)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of --init normal")
    p.add_argument("--hf", nargs=2, metavar=("HF_DIR", "HF_OUT"),
                   help="resize the HF source too, with the same new rows, into HF_OUT")
    p.add_argument("--overwrite", action="store_true", help="replace an output folder migrate wrote")
    trust_argument(p)
