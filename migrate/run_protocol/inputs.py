"""What a run reads besides its training rows: the eval rows, and the check that the data's
vocabulary fits the model's embeddings (both trainers, the same rule and message)."""
from __future__ import annotations

from migrate.data.samples import load_samples, read_meta
from migrate.errors import MigrateError


def eval_rows(cfg):
    """The eval rows (file order, at most eval_samples), or None when the run does not evaluate."""
    if not cfg.eval_interval:
        return None
    rows = load_samples(cfg.eval_data, cfg.seq_length)
    return rows[: cfg.eval_samples] if cfg.eval_samples else rows


def check_vocab(data_dir, model_vocab: int, model_where) -> None:
    """Refuse data tokenized with more tokens than `model_where` has embeddings (one line)."""
    vocab = read_meta(data_dir)["tokenizer"]["vocab_size"]
    if vocab > model_vocab:
        raise MigrateError(f"{data_dir} was tokenized with a {vocab}-token vocabulary, "
                           f"but {model_where} has only {model_vocab} embeddings")
