"""Checks of tokenized data (`migrate data tokenize` output) against the vocabulary.

Read in chunks of rows from the memory-mapped `train.npy`, so a corpus of any size costs a
few chunks of memory. Errors: an id outside the embedding (an embedding lookup past its rows
is an out-of-bounds gather: a crash on Ascend, garbage elsewhere), data tokenized with another
EOS. Warnings: unknown tokens above a share, one token above a share of all tokens, padding
tokens inside packed rows, duplicated rows, rows mostly one token (the batch of repeated
special tokens that spikes a loss).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from migrate.data.samples import load_samples, read_meta
from migrate.vocab.facts import TokenizerFacts
from migrate.vocab.findings import ERROR, INFO, OK, WARNING, VocabReport

CHUNK_ROWS = 8192


@dataclass(frozen=True)
class DataLimits:
    max_unk_share: float = 0.01        # unknown tokens, share of all tokens
    max_token_share: float = 0.2       # one token, share of all tokens
    max_duplicate_share: float = 0.01  # rows that repeat an earlier row
    mono_row_share: float = 0.5        # a row is "mostly one token" above this share of it


def check_data(data_dir, rows: int, tok: TokenizerFacts | None, special: dict[str, int | None],
               limits: DataLimits = DataLimits(), report: VocabReport | None = None) -> VocabReport:
    """`rows`: the embedding's row count; `special`: the ids in use (tokenizer's, else config's)."""
    report = report or VocabReport()
    meta = read_meta(data_dir)
    samples = load_samples(data_dir)
    _meta(meta, tok, special, report)
    n, width = samples.shape
    total = n * width
    counts = np.zeros(max(rows, 1), np.int64)
    low = beyond = 0
    first_bad = None
    hashes = np.empty((n, 2), np.uint64)
    mono_rows, mono_token = [], []
    rng = np.random.default_rng(0)  # two fixed random projections: a 128-bit row hash
    proj = rng.integers(1, 2**63, size=(2, width), dtype=np.int64).astype(np.uint64)
    for start in range(0, n, CHUNK_ROWS):
        chunk = np.asarray(samples[start:start + CHUNK_ROWS], dtype=np.int64)
        bad = (chunk < 0) | (chunk >= rows)
        if bad.any():
            low += int((chunk < 0).sum())
            beyond += int((chunk >= rows).sum())
            if first_bad is None:
                r, c = np.argwhere(bad)[0]
                first_bad = (start + int(r), int(c), int(chunk[r, c]))
        ok = chunk[~bad]
        counts += np.bincount(ok, minlength=len(counts))[: len(counts)]
        with np.errstate(over="ignore"):
            u = chunk.astype(np.uint64)
            hashes[start:start + len(chunk)] = np.stack([(u * p).sum(axis=1) for p in proj], axis=1)
        top_row, top_tok = _row_modes(chunk, limits.mono_row_share)
        hit = np.nonzero(top_row > limits.mono_row_share * width)[0]
        mono_rows += (start + hit).tolist()
        mono_token += top_tok[hit].tolist()

    if low or beyond:
        r, c, v = first_bad
        report.add("data.ids_beyond_vocab", ERROR, f"{beyond + low:,} token ids outside the embedding's {rows:,} rows "
                   f"({beyond:,} ≥ {rows:,}, {low:,} negative); first: row {r}, position {c}, id {v}",
                   count=beyond + low, first={"row": r, "position": c, "id": v})
    else:
        report.add("data.ids_beyond_vocab", OK, f"all {total:,} token ids < {rows:,} embedding rows", tokens=total)
    if tok is not None and tok.size < rows and counts[tok.size:].sum():
        extra = int(counts[tok.size:].sum())
        report.add("data.ids_beyond_tokenizer", WARNING, f"{extra:,} ids ≥ the tokenizer's {tok.size:,} tokens "
                   f"(spare embedding rows: no text, never trained)", count=extra)
    _shares(counts, total, tok, special, limits, report)
    _duplicates(samples, hashes, limits, report)
    _mono(mono_rows, mono_token, n, width, samples, tok, limits, report)
    return report


def _meta(meta: dict, tok: TokenizerFacts | None, special: dict, report: VocabReport) -> None:
    for name in ("eos", "bos"):
        used, now = meta.get(f"{name}_token_id"), special.get(name)
        if name == "bos" and not meta.get("add_bos"):
            continue  # no BOS was written: which id it would be does not matter
        if used is not None and now is not None and used != now:
            report.add(f"data.{name}", ERROR, f"data was tokenized with {name} id {used}, the model's is {now}: "
                       f"documents are separated by another token", data=used, model=now)
    recorded = (meta.get("tokenizer") or {}).get("vocab_size")
    if tok is not None and recorded is not None and recorded != tok.size:
        report.add("data.tokenizer", WARNING, f"data was tokenized by a tokenizer of {recorded:,} tokens, "
                   f"this one has {tok.size:,}", data=recorded, tokenizer=tok.size)


def _shares(counts: np.ndarray, total: int, tok, special: dict, limits: DataLimits, report: VocabReport) -> None:
    def text(i: int) -> str:
        return f"{i} {tok.decode([i])!r}" if tok is not None else str(i)

    unk = special.get("unk")
    if unk is None:
        report.add("data.unk_share", INFO, "the tokenizer has no unknown token (byte-level: every text is covered)")
    else:
        share = counts[unk] / total if unk < len(counts) else 0.0
        level = WARNING if share > limits.max_unk_share else OK
        report.add("data.unk_share", level, f"unknown token {unk}: {share:.2%} of tokens "
                   f"(limit {limits.max_unk_share:.0%})", share=float(share), limit=limits.max_unk_share)
    pad = special.get("pad")
    if pad is not None and pad not in (special.get("eos"), special.get("bos")) and pad < len(counts) and counts[pad]:
        report.add("data.pad_in_rows", WARNING, f"padding token {text(pad)} appears {int(counts[pad]):,} times in "
                   f"packed rows (trained on as text)", count=int(counts[pad]))
    shares = counts / max(total, 1)
    heavy = [int(i) for i in np.argsort(-counts)[:5] if shares[i] > limits.max_token_share]
    top = [int(i) for i in np.argsort(-counts)[:3]]
    listed = ", ".join(f"{text(i)} {shares[i]:.1%}" for i in (heavy or top))
    if heavy:
        report.add("data.token_frequency", WARNING, f"{len(heavy)} token{'s' * (len(heavy) > 1)} above "
                   f"{limits.max_token_share:.0%} of all tokens: {listed}",
                   tokens={str(i): float(shares[i]) for i in heavy})
    else:
        report.add("data.token_frequency", OK, f"no token above {limits.max_token_share:.0%}; most frequent: {listed}",
                   tokens={str(i): float(shares[i]) for i in top})


def _duplicates(samples, hashes: np.ndarray, limits: DataLimits, report: VocabReport) -> None:
    n = len(hashes)
    keys = hashes.view([("a", np.uint64), ("b", np.uint64)]).reshape(-1)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    repeats = np.nonzero(first[inverse.reshape(-1)] != np.arange(n))[0]
    # a hash match is confirmed on the rows themselves before it is reported
    repeats = [int(r) for r in repeats if np.array_equal(samples[r], samples[first[inverse[r]]])]
    if not repeats:
        report.add("data.duplicates", OK, f"no duplicated row among {n:,}", count=0)
        return
    share = len(repeats) / n
    level = WARNING if share > limits.max_duplicate_share else INFO
    r = repeats[0]
    report.add("data.duplicates", level, f"{len(repeats):,} rows ({share:.1%}) repeat an earlier row "
               f"(limit {limits.max_duplicate_share:.0%}); first: row {r} = row {int(first[inverse[r]])}",
               count=len(repeats), share=share, first=[r, int(first[inverse[r]])])


def _row_modes(chunk: np.ndarray, share: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how often its most frequent token occurs, and that token. Where only a majority
    matters (share >= 0.5), a token filling over half a row is its median: a partition and a
    count instead of a sort, about twice as fast."""
    n, w = chunk.shape
    if share >= 0.5 and w:
        median = np.partition(chunk, w // 2, axis=1)[:, w // 2]
        return (chunk == median[:, None]).sum(axis=1), median
    s = np.sort(chunk, axis=1)
    starts = np.ones((n, w), bool)
    starts[:, 1:] = s[:, 1:] != s[:, :-1]
    # run length at each run start = distance to the next run start
    idx = np.where(starts, np.arange(w), w)
    next_start = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]
    nxt = np.concatenate([next_start[:, 1:], np.full((n, 1), w)], axis=1)
    runs = np.where(starts, nxt - np.arange(w), 0)
    best = runs.argmax(axis=1)
    return runs[np.arange(n), best], s[np.arange(n), best]


def _mono(rows_hit: list[int], tokens: list[int], n: int, width: int, samples, tok, limits: DataLimits,
          report: VocabReport) -> None:
    if not rows_hit:
        report.add("data.mono_rows", OK, f"no row is over {limits.mono_row_share:.0%} one token", count=0)
        return
    r, t = rows_hit[0], tokens[0]
    share = float((np.asarray(samples[r]) == t).mean())
    shown = f"{t} {tok.decode([t])!r}" if tok is not None else str(t)
    report.add("data.mono_rows", WARNING, f"{len(rows_hit):,} rows are over {limits.mono_row_share:.0%} one token; "
               f"first: row {r}, token {shown} × {share:.0%} of its {width} ids",
               count=len(rows_hit), rows=rows_hit[:20], tokens=tokens[:20])
