"""Does the tokenizer agree with the configs and the embedding? One `Finding` per question.

Errors (exit 1): a row count that disagrees (tokenizer larger than the embedding, embedding
rows != vocab_size, head rows != embedding rows, HF rows != MindSpore rows), a token the
tokenizer can produce with no embedding row (an added token, a special id), bos / eos ids that
disagree between the tokenizer, config.json, generation_config.json and model.yaml. Warnings:
pad / unk ids that disagree, an eos the tokenizer knows that no config sets. Spare rows beyond
the tokenizer (vocabularies padded for tensor parallelism or speed) are normal: info.
"""
from __future__ import annotations

from typing import Any

from migrate.vocab.facts import SPECIALS, SideFacts, TokenizerFacts
from migrate.vocab.findings import ERROR, INFO, OK, WARNING, VocabReport

# A disagreement on these breaks training data (EOS separates documents) and generation's stop.
_STRICT = ("bos", "eos")


def check_model(hf: SideFacts, ms: SideFacts | None, tok: TokenizerFacts | None,
                report: VocabReport | None = None) -> VocabReport:
    report = report or VocabReport()
    for side in (hf, ms):
        if side is not None:
            _rows(side, report)
    if ms is not None and hf.rows is not None and ms.rows is not None:
        level = OK if hf.rows == ms.rows else ERROR
        report.add("rows.hf_vs_mindspore", level, f"embedding rows: HF {hf.rows:,} · MindSpore {ms.rows:,}"
                   + ("" if level == OK else " (convert again, or resize both sides with `migrate vocab resize --hf`)"),
                   hf=hf.rows, mindspore=ms.rows)
    rows = min(r for r in (hf.rows, ms.rows if ms else None, hf.vocab_size) if r is not None) \
        if any(r is not None for r in (hf.rows, hf.vocab_size)) else None
    if tok is not None and rows is not None:
        _tokenizer(tok, rows, report)
    elif tok is None:
        report.add("tokenizer", INFO, f"no tokenizer in {hf.folder}: tokenizer checks skipped (--tokenizer DIR)")
    for name in SPECIALS:
        _special(name, hf, ms, tok, rows, report)
    return report


def _rows(side: SideFacts, report: VocabReport) -> None:
    tag = "hf" if side.label == "HF" else "mindspore"
    if side.embedding is None:
        report.add(f"rows.{tag}_embedding", ERROR, f"{side.label}: no embedding tensor in {side.folder}")
        return
    name, shape = side.embedding
    if side.vocab_size != shape[0]:
        report.add(f"rows.{tag}_embedding", ERROR, f"{side.label}: {name} has {shape[0]:,} rows but "
                   f"{side.config_file} says vocab_size {side.vocab_size}", rows=shape[0], vocab_size=side.vocab_size)
    else:
        report.add(f"rows.{tag}_embedding", OK, f"{side.label}: {name} {shape[0]:,} rows = {side.config_file} "
                   f"vocab_size", rows=shape[0], vocab_size=side.vocab_size)
    if side.head is None:
        if side.headless:
            report.add(f"rows.{tag}_head", OK, f"{side.label}: the model has no output head")
        elif side.tied:
            report.add(f"rows.{tag}_head", OK, f"{side.label}: output head tied to the embedding")
        else:
            report.add(f"rows.{tag}_head", ERROR, f"{side.label}: no output head tensor, and "
                       f"{side.config_file} does not tie it to the embedding")
        return
    head, hshape = side.head
    level = OK if hshape[0] == shape[0] else ERROR
    report.add(f"rows.{tag}_head", level, f"{side.label}: {head} {hshape[0]:,} rows"
               + (" = embedding" if level == OK else f" ≠ embedding's {shape[0]:,}"), rows=hshape[0])


def _tokenizer(tok: TokenizerFacts, rows: int, report: VocabReport) -> None:
    if tok.size > rows:
        report.add("tokenizer.size", ERROR, f"tokenizer has {tok.size:,} tokens but the embedding only {rows:,} rows: "
                   f"ids {rows:,}..{tok.size - 1:,} have no row (resize: `migrate vocab resize --to {tok.size}`)",
                   tokenizer=tok.size, rows=rows)
    elif tok.size < rows:
        report.add("tokenizer.size", INFO, f"tokenizer {tok.size:,} tokens < {rows:,} embedding rows: "
                   f"{rows - tok.size:,} spare rows (padding; never produced by the tokenizer)",
                   tokenizer=tok.size, rows=rows)
    else:
        report.add("tokenizer.size", OK, f"tokenizer {tok.size:,} tokens = embedding rows",
                   tokenizer=tok.size, rows=rows)
    if not tok.added:
        return
    beyond = {i: t for i, t in sorted(tok.added.items()) if i >= rows}
    ids = sorted(tok.added)
    if beyond:
        shown = ", ".join(f"{i} {t!r}" for i, t in list(beyond.items())[:5]) + (" …" if len(beyond) > 5 else "")
        report.add("tokenizer.added", ERROR, f"{len(beyond):,} of {len(ids):,} added tokens have no embedding row "
                   f"(ids ≥ {rows:,}): {shown}", beyond=sorted(beyond), added=len(ids))
    else:
        report.add("tokenizer.added", OK, f"{len(ids):,} added tokens (ids {ids[0]}..{ids[-1]}), all within the "
                   f"embedding", added=len(ids))


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _special(name: str, hf: SideFacts, ms: SideFacts | None, tok: TokenizerFacts | None, rows: int | None,
             report: VocabReport) -> None:
    sources: dict[str, Any] = {}
    if tok is not None and tok.special.get(name) is not None:
        sources["tokenizer"] = tok.special[name]
    for side, prefix in ((hf, "HF "), (ms, "MindSpore ")):
        if side is None:
            continue
        if name in side.special:
            sources[prefix + side.config_file] = side.special[name]
        if side.generation and name in side.generation:
            sources[prefix + "generation_config.json"] = side.generation[name]
    key = f"special.{name}"
    if not sources:
        return
    listed = " · ".join(f"{src} {val}" for src, val in sources.items())
    bad = sorted({i for v in sources.values() for i in _ids(v) if i < 0 or (rows is not None and i >= rows)})
    if bad:
        report.add(key, ERROR, f"{name} id {', '.join(map(str, bad))} has no embedding row ({rows:,} rows): {listed}",
                   ids=sources)
        return
    ref_src = next(iter(sources))
    ref = _ids(sources[ref_src])
    # A list (generation_config's eos ids) agrees when it holds the reference id.
    differ = [src for src, v in sources.items() if ref and not (set(ref) & set(_ids(v)))]
    if differ:
        level = ERROR if name in _STRICT else WARNING
        report.add(key, level, f"{name} id differs: {listed}", ids=sources, differ=differ)
        return
    if name == "eos" and list(sources) == ["tokenizer"]:
        report.add(key, WARNING, f"eos id {ref[0]} is the tokenizer's, but no config sets eos_token_id "
                   f"(generation would not stop at it)", ids=sources)
        return
    report.add(key, OK, f"{name} id {ref[0] if len(ref) == 1 else ref} agrees: {listed}", ids=sources)
