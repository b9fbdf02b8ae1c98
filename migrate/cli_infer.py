"""Subcommands of the inference side: `generate`, and `export --format mindir`.

Argument parsing only; each calls one library function (`migrate.infer`), imported inside its
function as in `migrate.cli`. `generate` is declared here; `migrate.cli`'s `export` takes its
`--format hf|mindir` switch and the MindIR options from `mindir_options`, and hands --format mindir
to `cmd_export_mindir` (hf, the default, is the inverse-keymap export).
"""
from __future__ import annotations

import sys

from migrate.cli_args import POSITIVE_INT, utf8_text
from migrate.cli_verbs import arguments, trust_argument, verb
from migrate.dtype_names import NAMES
from migrate.errors import MigrateError


def _sampling(args):
    from migrate.infer.sampling import Sampling

    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty, seed=args.seed)


@verb("generate", "generate text with a converted model (KV cache) or its MindIR export")
def _cmd_generate(args) -> int:
    from migrate.infer.compile_cache import wanted as compile_cache_wanted
    from migrate.infer.request import Options, Source, generate_text
    from migrate.ui import console

    sampling = _sampling(args)  # bad values: one line before any model loads
    options = Options(max_new_tokens=args.max_new_tokens, sampling=sampling, stop_tokens=tuple(args.stop_token or ()),
                      ignore_eos=args.ignore_eos, cache=not args.no_cache, mode=args.mode, dtype=args.dtype,
                      cache_len=args.cache_len, compare_hf=args.compare_hf,
                      compile_cache=not args.no_compile_cache and compile_cache_wanted(), fuse=args.fused)
    if args.max_new_tokens <= 0:
        raise MigrateError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.mindir and (args.no_cache or args.cache_len):
        raise MigrateError("--no-cache and --cache-len do not apply to --mindir (its shapes are fixed at export)")

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    stream = not args.no_stream
    outcome = generate_text(Source(args.ms_dir, args.mindir), texts=args.prompt or (), ids=args.ids or (),
                            options=options, write=write if stream else None, trust=args.trust_model_class)
    out = console()
    if not stream or len(outcome.texts) > 1:
        for row, text in enumerate(outcome.texts):
            write((f"[{row}] " if len(outcome.texts) > 1 else "") + text + "\n")
    gen = outcome.generation
    cache = f"; compile cache {outcome.compile_cache}" if options.compile_cache else ""
    out.print(f"{gen.tokens.shape[0]} × {gen.steps} tokens ({sampling.describe()}; {outcome.path}{cache}) · "
              f"{gen.timing_line()}", highlight=False)
    if outcome.comparison is not None:
        out.print(f"vs HF generate: {outcome.comparison.line()}", highlight=False)
        return outcome.comparison.verdict.exit_code
    return 0


@arguments("generate")
def _generate_arguments(p) -> None:
    p.add_argument("ms_dir", nargs="?", help="a converted MindSpore folder (with --mindir: checked to be its source)")
    p.add_argument("--prompt", action="append", type=utf8_text, metavar="TEXT",
                   help="a prompt (repeat for a left-padded batch)")
    p.add_argument("--ids", action="append", metavar="IDS", help="a prompt as token ids, '1,2,3' (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sampling")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="HF's (1: off)")
    p.add_argument("--seed", type=int, default=0, help="the sampling draw's seed (numpy's generator)")
    p.add_argument("--stop-token", type=int, action="append", metavar="ID",
                   help="stop a row at this id too (repeatable; eos ids stop it unless --ignore-eos)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's eos ids")
    p.add_argument("--mindir", metavar="DIR", help="run a `migrate export --format mindir` folder (no model code)")
    p.add_argument("--no-cache", action="store_true", help="the full forward every step (the path without a cache)")
    p.add_argument("--cache-len", type=POSITIVE_INT, metavar="L", help="cache slots (default: prompt + max new tokens)")
    p.add_argument("--mode", choices=["graph", "pynative"], default="graph", help="MindSpore execution mode")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="compile the graphs afresh and keep nothing (default: reuse this model's and shape's "
                        "graphs from ~/.cache/migrate/compile; MIGRATE_COMPILE_CACHE=off, MIGRATE_CACHE_DIR)")
    p.add_argument("--fused", action="store_true",
                   help="decode a Llama-family folder with q/k/v and gate/up fused into one matmul each, as "
                        "`convert --qkv-concat` writes them (the same tokens; see docs/generate.md for when it pays)")
    p.add_argument("--dtype", choices=NAMES, help="compute dtype (default: model.yaml's)")
    p.add_argument("--compare-hf", metavar="HF_DIR",
                   help="run HF generate with the same settings; exit 1 if tokens or per-step logits differ")
    p.add_argument("--no-stream", action="store_true", help="print the text at the end, not as it comes")
    trust_argument(p)


def mindir_options(p) -> None:
    """`migrate export`'s --format switch and the MindIR export's options (`migrate.cli` declares export)."""
    p.add_argument("--format", choices=["hf", "mindir"], default="hf",
                   help="hf (default): the HF folder through the inverse keymap; mindir: prefill and decode "
                        "graphs with the KV cache as inputs/outputs")
    p.add_argument("--batch", type=int, help="mindir: static batch size (default 1)")
    p.add_argument("--prefill-len", type=int, metavar="P", help="mindir: static prompt length (default 64)")
    p.add_argument("--cache-len", type=int, metavar="L",
                   help="mindir: cache slots, prompt + new tokens (default 320)")
    p.add_argument("--dtype", choices=NAMES, help="mindir: compute dtype (default: model.yaml's)")


def cmd_export_mindir(args) -> int:
    """`migrate export --format mindir` (`migrate.cli`'s export hands it over)."""
    from migrate.infer.mindir import export_mindir
    from migrate.ui import console

    if args.src or args.keymap:
        raise MigrateError("--src and --keymap do not apply to --format mindir")
    dtype = None
    if args.dtype:
        from migrate.dtype_names import PRECISIONS

        dtype = PRECISIONS[args.dtype].compute
    def given(value, default):  # 0 is a value (refused by export_mindir), not "not given"
        return default if value is None else value

    record = export_mindir(args.ms_dir, args.out_dir, batch=given(args.batch, 1),
                           prefill_len=given(args.prefill_len, 64), cache_len=given(args.cache_len, 320),
                           compute_dtype=dtype, overwrite=args.overwrite,
                           trust=args.trust_model_class)
    console().print(f"[green]exported[/] prefill.mindir and decode.mindir (batch {record['batch']}, prefill "
                    f"{record['prefill_len']}, cache {record['cache_len']}) -> {args.out_dir}", highlight=False)
    return 0


def hf_only(args) -> None:
    """`migrate export --format hf` (the default): refuse the options that shape a MindIR export."""
    given = [flag for flag, value in (("--dtype", args.dtype), ("--batch", args.batch),
                                      ("--prefill-len", args.prefill_len), ("--cache-len", args.cache_len))
             if value is not None]
    if given:
        raise MigrateError(f"{', '.join(given)} apply to --format mindir only")
