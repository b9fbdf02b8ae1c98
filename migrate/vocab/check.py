"""`migrate vocab check HF_DIR [MS_DIR] [--data DIR]` as a library call."""
from __future__ import annotations

from pathlib import Path

from migrate.errors import MigrateError
from migrate.vocab.data_checks import DataLimits, check_data
from migrate.vocab.facts import has_tokenizer, hf_side, ms_side, read_tokenizer
from migrate.vocab.findings import VocabReport
from migrate.vocab.model_checks import check_model


def vocab_check(hf_dir, ms_dir=None, data=None, tokenizer=None, limits: DataLimits = DataLimits()) -> VocabReport:
    """Every finding on the model folders (and the data); MigrateError on unreadable input."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise MigrateError(f"model folder not found: {hf_dir}")
    if ms_dir is not None and not Path(ms_dir).is_dir():
        raise MigrateError(f"converted model folder not found: {ms_dir}")
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise MigrateError(f"tokenizer folder not found: {tokenizer}")
    if data is not None and not Path(data).is_dir():
        raise MigrateError(f"data folder not found: {data}")
    hf, _ = hf_side(hf_dir)
    ms = ms_side(Path(ms_dir)) if ms_dir is not None else None
    tok_dir = Path(tokenizer) if tokenizer is not None else next(
        (d for d in (hf_dir, Path(ms_dir) if ms_dir else None) if has_tokenizer(d)), None)
    tok = read_tokenizer(tok_dir) if tok_dir is not None else None
    report = check_model(hf, ms, tok)
    if data is not None:
        rows = next((r for r in (ms.rows if ms else None, hf.rows, hf.vocab_size) if r is not None), None)
        if rows is None:
            raise MigrateError(f"no embedding rows or vocab_size in {hf_dir}: the data cannot be checked")
        special = dict(tok.special) if tok is not None else {}
        for name, value in hf.special.items():  # the config's ids where the tokenizer has none
            if special.get(name) is None and isinstance(value, int):
                special[name] = value
        check_data(data, rows, tok, special, limits, report)
    return report
