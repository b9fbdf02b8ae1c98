"""Command line: argument parsing only; each subcommand calls one library function.

User mistakes (MigrateError) print one line on stderr and exit 2, with no traceback.
"""
from __future__ import annotations

import argparse
import sys

from migrate import __version__
from migrate.errors import MigrateError


def _cmd_convert(args) -> int:
    from migrate.convert import convert
    from migrate.ui import console, progress_bar

    with progress_bar("converting") as update:
        result = convert(args.src_dir, args.out_dir, keymap=args.keymap or args.src, fmt=args.format,
                         dtype=args.dtype, overwrite=args.overwrite, on_tensor=update)
    console().print(
        f"[green]converted[/] {result.tensors} tensors, {result.parameters:,} parameters "
        f"({result.bytes_written / 2**20:.1f} MiB) in {result.seconds:.2f}s -> {result.out_dir}"
    )
    return 0


def _cmd_export(args) -> int:
    from migrate.export import export
    from migrate.ui import console, progress_bar

    with progress_bar("exporting") as update:
        result = export(args.ms_dir, args.out_dir, keymap=args.keymap or args.src, overwrite=args.overwrite,
                        on_tensor=update)
    console().print(
        f"[green]exported[/] {result.tensors} tensors, {result.parameters:,} parameters "
        f"in {result.seconds:.2f}s -> {result.out_dir}"
    )
    return 0


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
    console().print(f"{len(rows)} tensors, {total_parameters(rows):,} parameters")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="migrate", description="PyTorch/HF to MindSpore migration for LLMs")
    parser.add_argument("--version", action="version", version=f"migrate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="HF checkpoint folder -> MindSpore checkpoint folder")
    p.add_argument("src_dir")
    p.add_argument("out_dir")
    p.add_argument("--src", default="hf_llama", help="source family (a keymap name), default hf_llama")
    p.add_argument("--keymap", help="path to a keymap YAML (overrides --src)")
    p.add_argument("--format", choices=["ckpt", "safetensors"], default="ckpt")
    p.add_argument("--dtype", choices=["keep", "fp32", "fp16", "bf16"], default="keep")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("export", help="MindSpore checkpoint folder -> HF folder (inverse keymap)")
    p.add_argument("ms_dir")
    p.add_argument("out_dir")
    p.add_argument("--src", default="hf_llama", help="family whose keymap converted the model")
    p.add_argument("--keymap", help="path to a keymap YAML (overrides --src)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("inspect", help="list the tensors of a checkpoint without loading them")
    p.add_argument("path", help="a .ckpt / .safetensors file, a converted folder or an HF folder")
    p.set_defaults(func=_cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MigrateError as exc:
        print(f"migrate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("migrate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
