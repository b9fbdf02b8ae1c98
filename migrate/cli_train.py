"""Subcommands of the training side: data, train, hparams, compare.

Argument parsing only; each calls one library function. Registered into the
main parser by `migrate.cli`.
"""
from __future__ import annotations


def _cmd_data_tokenize(args) -> int:
    from migrate.data.tokenize import tokenize_corpus
    from migrate.ui import console

    meta = tokenize_corpus(args.files, args.tokenizer, args.seq_length, args.out, add_bos=args.add_bos,
                           overwrite=args.overwrite)
    console().print(
        f"[green]tokenized[/] {len(meta.get('files', args.files))} files -> {meta.get('samples')} samples of "
        f"{args.seq_length}+1 tokens ({meta.get('tokens', 0):,} tokens) in {args.out}"
    )
    return 0


def register(sub) -> None:
    data = sub.add_parser("data", help="prepare training data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("tokenize", help="text files -> MindRecord + .npy twin for the golden script")
    p.add_argument("files", nargs="+", help="text files (one document each)")
    p.add_argument("--tokenizer", required=True, help="HF folder holding the tokenizer")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--out", required=True, help="output data folder")
    p.add_argument("--add-bos", action="store_true", help="prefix every document with BOS")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_data_tokenize)

