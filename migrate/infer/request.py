"""`migrate generate` as a library call: a converted folder or a MindIR export, prompts in,
tokens and text out, optionally judged against HF `generate`.

MindSpore-free at import: the runner the request needs (the live model, the MindIR graphs) and
the HF side (torch) are imported when used, so bad input is refused before either loads.

    outcome = generate_text(Source(ms_dir="out/ms"), texts=["Hello"], options=Options(max_new_tokens=32))
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from migrate.dtype_names import PRECISIONS, canonical_dtype
from migrate.errors import MigrateError
from migrate.infer.batch import Batch, make_batch
from migrate.infer.compile_cache import CACHE_BUCKET, PREFILL_BUCKET, bucketed, cache_root, compile_cache, fingerprint
from migrate.infer.generate import Generation, check_lengths, generate
from migrate.infer.sampling import Sampling
from migrate.infer.sizes import check_generation_memory
from migrate.infer.special_ids import stop_and_pad
from migrate.infer.text import TextStream, decode, encode_prompts, load_tokenizer
from migrate.models.fused_layout import fused_plans
from migrate.models.registry import load_model_config


@dataclass
class Source:
    ms_dir: str | Path | None = None     # a converted (or trained) MindSpore folder
    mindir: str | Path | None = None     # a `migrate export --format mindir` folder


@dataclass
class Options:
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_tokens: tuple[int, ...] = ()
    ignore_eos: bool = False
    cache: bool = True                   # False: the full forward every step
    mode: str = "graph"                  # graph | pynative (the live model)
    dtype: str | None = None             # fp32 | bf16 | fp16; None: model.yaml's
    cache_len: int | None = None         # default: longest prompt + max_new_tokens
    compare_hf: str | Path | None = None
    compile_cache: bool = False          # MindSpore's compile cache, one folder per model and shape
                                         # (`migrate.infer.compile_cache`; the CLI's default)
    fuse: bool = False                   # the KV-cache path in the fused layout where the folder allows
                                         # (`migrate.models.fused_loading`: q/k/v and gate/up as one matmul each;
                                         # opt-in: no faster on CPU here, docs/generate.md)


@dataclass
class Outcome:
    generation: Generation
    texts: list[str]
    path: str                            # what ran: "KV cache, GRAPH_MODE", "MindIR", ...
    comparison: object | None = None     # compare_hf.HFComparison
    compile_cache: str = "off"           # hit | stored | off (and why)


def generate_text(source: Source, *, texts=(), ids=(), options: Options,
                  write: Callable[[str], None] | None = None, trust: bool = False) -> Outcome:
    """Generate for every prompt (one batch, left-padded); `write` streams a single prompt's text.
    `trust`: the converted folder's model class may be imported even if migrate does not bundle it
    (`--trust-model-class`)."""
    if source.ms_dir is None and source.mindir is None:
        raise MigrateError("generate needs a converted folder MS_DIR or --mindir DIR")
    if options.compare_hf is not None and not Path(options.compare_hf).is_dir():
        raise MigrateError(f"HF model folder not found: {options.compare_hf}")
    spec = None
    if source.mindir is not None:
        from migrate.infer.mindir import check_same_model, read_spec

        spec = read_spec(source.mindir)
        if source.ms_dir is not None:
            check_same_model(spec, source.ms_dir, source.mindir)
        folder, fields = Path(source.mindir), spec["source"]["config"]
        eos, pad = spec["stop_ids"], spec["pad_id"]
    else:
        folder = Path(source.ms_dir)
        if not folder.is_dir():
            raise MigrateError(f"MindSpore model folder not found: {folder}")
        config = load_model_config(folder, trust)
        fields = config.to_dict()
        eos, pad = stop_and_pad(folder, config)
    vocab = fields["vocab_size"]
    bad = [t for t in options.stop_tokens if not 0 <= t < vocab]
    if bad:
        raise MigrateError(f"--stop-token {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    stops = list(options.stop_tokens) + ([] if options.ignore_eos else list(eos))
    tokenizer = load_tokenizer(folder)
    prompts = encode_prompts(list(texts), list(ids), tokenizer, folder)
    prompt_pad = getattr(tokenizer, "pad_token_id", None)
    batch = make_batch(prompts, prompt_pad if prompt_pad is not None else pad, vocab)
    rows = batch.size
    cached_compile = spec is None and options.compile_cache and options.cache and options.mode == "graph"
    fused = spec is None and options.cache and options.fuse and fused_plans(folder, config, trust) is not None
    prefill_len = batch.prompt_len
    if spec is None:
        _check_live_options(options)
        cache_len = options.cache_len or batch.prompt_len + max(options.max_new_tokens, 1)
        if cached_compile:  # shapes that repeat from run to run, so the cached graphs serve the next one
            prefill_len, cache_len = _bucketed_shapes(batch.prompt_len, options, cache_len)
        check_lengths(batch, options.max_new_tokens, cache_len)  # before the model loads
        flag = f"--cache-len {cache_len:,}" if options.cache_len else \
            f"prompt + --max-new-tokens {options.max_new_tokens:,} ({cache_len:,} slots)"
        check_generation_memory(fields, batch.size, cache_len, cache=options.cache, dtype=options.dtype,
                                max_new_tokens=options.max_new_tokens, record_logits=options.compare_hf is not None,
                                what=f"the KV cache for {flag}" if options.cache else f"attention over {flag}")
    from migrate.models.mode import execution_mode

    # MindSpore's mode is process-wide: held while the runner loads and runs, the caller's put back after.
    cache_folder = _compile_cache_folder(fields, options, batch.size, prefill_len, cache_len,
                                         "kv_cache_fused" if fused else _kv_runner_name(config, options)) \
        if cached_compile else None
    with execution_mode("graph" if spec is not None else options.mode), compile_cache(cache_folder) as cache_state:
        if spec is not None:
            runner, batch, path = _mindir_runner(source.mindir, spec, batch, options.max_new_tokens)
        else:
            runner, path = _live_runner(folder, batch, options, cache_len, trust, prefill_len, fused)
        stream = TextStream(tokenizer, write) if write is not None and rows == 1 else None
        on_step = (lambda step, tokens: stream.push(tokens[0])) if stream is not None else None
        result = generate(runner, batch, options.max_new_tokens, options.sampling, stop_ids=stops, pad_id=pad,
                          record_logits=options.compare_hf is not None, on_step=on_step)
    if stream is not None:
        stream.close()
    result = result.rows(rows, stops)
    outcome = Outcome(result, [decode(tokenizer, row) for row in result.tokens], path,
                      compile_cache=cache_state if cache_folder is not None else "off")
    if options.compare_hf is not None:
        outcome.comparison = _compare(options, fields, result, Batch(batch.sequences[:rows], batch.mask[:rows],
                                                                      batch.pad_id), stops, pad)
    return outcome


def _check_live_options(options: Options) -> None:
    if options.mode not in ("graph", "pynative"):
        raise MigrateError(f"unknown mode {options.mode!r}; choose graph or pynative")
    if options.dtype is not None and options.dtype not in PRECISIONS:
        raise MigrateError(f"unknown dtype {options.dtype!r}; choose from {', '.join(PRECISIONS)}")


def _bucketed_shapes(prompt_len: int, options: Options, cache_len: int) -> tuple[int, int]:
    """(prefill length, cache slots) rounded up to the compile cache's buckets; a --cache-len the
    user gave is kept, and the prompt padded only as far as it leaves room for the new tokens."""
    prefill = bucketed(prompt_len, PREFILL_BUCKET)
    if options.cache_len:
        return (prefill if prefill + options.max_new_tokens <= cache_len else prompt_len), cache_len
    return prefill, bucketed(prefill + max(options.max_new_tokens, 1), CACHE_BUCKET)


def _kv_runner_name(config, options: Options) -> str:
    """Which graphs a live KV-cache run compiles: with or without the decode kernels (kernel_decode.py)."""
    from migrate.infer.kernel_decode import why_not_config

    dtype = PRECISIONS[options.dtype].compute if options.dtype else None
    return "kv_cache_kernels" if why_not_config(config, dtype) is None else "kv_cache"


def _compile_cache_folder(fields: dict, options: Options, batch: int, prefill_len: int, cache_len: int,
                          runner: str) -> Path:
    dtype = options.dtype or canonical_dtype(fields.get("compute_dtype", "float32"))
    # runner: other graphs (kv_cache, kv_cache_kernels, kv_cache_fused), another folder
    return cache_root() / fingerprint(fields, dtype=dtype, runner=runner, batch=batch, prefill_len=prefill_len,
                                      cache_len=cache_len)


def _live_runner(folder: Path, batch: Batch, options: Options, cache_len: int, trust: bool = False,
                 prefill_len: int | None = None, fused: bool = False):
    """The converted model as a runner, in the mode the caller holds (`options.mode`); prefill_len:
    the static prompt length (the longest prompt, or a compile-cache bucket), left-padded to; fused:
    loaded in the fused layout (`fused_loading`; the caller has checked that the folder allows it)."""
    from migrate.infer.runners import CachedRunner, UncachedRunner
    from migrate.models.fused_loading import load_fused_model
    from migrate.models.loading import load_model

    dtype = PRECISIONS[options.dtype].compute if options.dtype else None
    model, _ = load_fused_model(folder, dtype, trust=trust) if fused else load_model(folder, dtype, trust=trust)
    kind = CachedRunner if options.cache else UncachedRunner
    runner = kind(model, batch.size, prefill_len or batch.prompt_len, cache_len)
    mode = "GRAPH_MODE" if options.mode == "graph" else "PyNative"
    layout = ", fused q/k/v and gate/up" if fused else ""
    if getattr(runner, "kernels", None) is not None:
        mode += ", one kernel per layer"
    return runner, (f"KV cache{layout}, {mode}" if options.cache else f"no cache (full forward each step), {mode}")


def _mindir_runner(folder, spec: dict, batch: Batch, max_new_tokens: int):
    """The MindIR runner, the batch filled to the export's static batch with copies of its last row."""
    from migrate.infer.mindir import MindIRRunner

    if batch.size > spec["batch"]:
        raise MigrateError(f"{batch.size} prompts for a MindIR export of batch {spec['batch']}")
    if batch.prompt_len > spec["prefill_len"]:
        raise MigrateError(f"the prompt ({batch.prompt_len} tokens) is longer than the exported prefill length "
                           f"({spec['prefill_len']}); export again with a larger --prefill-len")
    check_lengths(batch, max_new_tokens, spec["cache_len"], spec["prefill_len"], spec.get("max_positions"))
    fill = spec["batch"] - batch.size
    filled = Batch(np.concatenate([batch.sequences] + [batch.sequences[-1:]] * fill),
                   np.concatenate([batch.mask] + [batch.mask[-1:]] * fill), batch.pad_id)
    return MindIRRunner(folder, spec), filled, "MindIR (prefill.mindir + decode.mindir)"


def _compare(options: Options, fields: dict, result: Generation, batch: Batch, stops, pad):
    from migrate.infer.compare_hf import compare_with_hf, load_hf_model

    dtype = options.dtype or canonical_dtype(fields.get("compute_dtype", "float32"))
    hf = load_hf_model(options.compare_hf, dtype)
    text = hf.config.get_text_config()
    ours = {"vocab size": fields.get("vocab_size"), "layers": fields.get("num_layers"),
            "hidden size": fields.get("hidden_size")}
    theirs = {"vocab size": text.vocab_size, "layers": text.num_hidden_layers, "hidden size": text.hidden_size}
    differ = [f"{k} {theirs[k]} vs {ours[k]}" for k in ours if ours[k] != theirs[k]]
    if differ:
        raise MigrateError(f"{options.compare_hf} is another model than the MindSpore side: {', '.join(differ)}")
    return compare_with_hf(options.compare_hf, result, batch, options.sampling, stops, pad, dtype, model=hf)
