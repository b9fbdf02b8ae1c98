"""What each file says about the vocabulary, read lazily: configs as JSON/YAML, the tokenizer
through transformers, and the embedding / lm_head row counts from checkpoint headers (no tensor
data is read).

The embedding and the head are found through the keymap, not by name: the row with `tied_to`
is the output head, and the name it is tied to is the input embedding (Llama's `lm_head` /
`embed_tokens`, GPT-2's `lm_head` / `wte`, BERT's decoder / word embeddings); a model without a
head (BertModel) has its embedding found by the usual names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.errors import MigrateError
from migrate.hf_config import read_raw_config
from migrate.jsonsafe import load_json
from migrate.keymap import Keymap, recorded_keymap, resolve
from migrate.models.conversion_plan import ConversionPlan
from migrate.safeyaml import load_yaml

SPECIALS = ("bos", "eos", "pad", "unk")
_EMBEDDING_NAMES = ("embed_tokens.weight", "word_embeddings.weight", "wte.weight")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@dataclass
class TokenizerFacts:
    folder: Path
    size: int                      # len(tokenizer): base vocabulary + added tokens
    base_size: int                 # tokenizer.vocab_size
    special: dict[str, int | None]
    added: dict[int, str]          # id -> text of every added token
    tokenizer: Any = field(repr=False, default=None)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids]) if self.tokenizer is not None else ""


@dataclass
class SideFacts:
    """One model folder: its config's vocabulary fields and its vocabulary tensors' rows."""
    label: str                                   # "HF" | "MindSpore"
    folder: Path
    config_file: str                             # config.json | model.yaml
    vocab_size: int | None
    special: dict[str, Any]                      # the config's *_token_id fields that are set
    generation: dict[str, Any] | None            # generation_config.json's, when the file exists
    embedding: tuple[str, tuple[int, ...]] | None = None   # checkpoint name, shape
    head: tuple[str, tuple[int, ...]] | None = None        # None when tied (absent from the file)
    tied: bool = False
    headless: bool = False                       # the model has no output head (BertModel)

    @property
    def rows(self) -> int | None:
        return self.embedding[1][0] if self.embedding else None


def has_tokenizer(folder: Path | None) -> bool:
    return folder is not None and any((Path(folder) / name).is_file() for name in TOKENIZER_FILES)


def read_tokenizer(folder: Path) -> TokenizerFacts:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError for bad folders
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MigrateError(f"transformers cannot load a tokenizer from {folder}: {first}"[:300]) from None
    special = {name: getattr(tok, f"{name}_token_id", None) for name in SPECIALS}
    added = {int(i): str(t.content if hasattr(t, "content") else t)
             for i, t in getattr(tok, "added_tokens_decoder", {}).items()}
    return TokenizerFacts(Path(folder), len(tok), int(tok.vocab_size), special, added, tok)


def _special_fields(fields: dict) -> dict[str, Any]:
    return {name: fields[f"{name}_token_id"] for name in SPECIALS if fields.get(f"{name}_token_id") is not None}


def _generation(folder: Path) -> dict[str, Any] | None:
    path = folder / "generation_config.json"
    if not path.is_file():
        return None
    fields = load_json(path)  # bounded: one line naming the file otherwise
    return _special_fields(fields) if isinstance(fields, dict) else {}


def vocab_rows_of(km: Keymap) -> tuple[str, str | None]:
    """(embedding, head) HF names: the keymap row with `tied_to` is the head, tied to the embedding."""
    for rule in km.rules:
        if rule.tied_to and len(rule.src) == 1:
            return rule.tied_to, rule.src[0]
    for rule in km.rules:  # a model without an output head (BertModel): the usual embedding names
        if len(rule.src) == 1 and rule.src[0].endswith(_EMBEDDING_NAMES):
            return rule.src[0], None
    raise MigrateError(f"keymap {km.name} marks no tied output head (`tied_to`): its embedding is unknown")


def hf_side(folder: Path) -> tuple[SideFacts, Keymap]:
    folder = Path(folder)
    raw = read_raw_config(folder)
    km = resolve("auto", raw)
    km = km.for_source(raw)
    emb, head = vocab_rows_of(km)
    facts = SideFacts("HF", folder, "config.json", raw.get("vocab_size"), _special_fields(raw),
                      _generation(folder), tied=bool(raw.get("tie_word_embeddings", False)))
    with open_hf_checkpoint(folder).add_prefix_if_absent(km.base_prefix) as ckpt:
        if emb in ckpt.specs:
            facts.embedding = (emb, tuple(ckpt.specs[emb].shape))
        facts.headless = head is None
        if head is not None and head in ckpt.specs:
            facts.head = (head, tuple(ckpt.specs[head].shape))
    return facts, km


def ms_plan(folder: Path, trust: bool = False) -> tuple[ConversionPlan, dict]:
    """The converted folder's plan (its recorded keymap over its model.yaml) and model.yaml's fields;
    `trust`: the plan may import model.yaml's class for its shapes (`ConversionPlan.expected`)."""
    path = Path(folder) / "model.yaml"
    if not path.is_file():
        raise MigrateError(f"no model.yaml in {folder}: not a folder written by `migrate convert`")
    fields = load_yaml(path, "model config")
    if not isinstance(fields, dict):
        raise MigrateError(f"{path} is not a mapping of fields")
    km = resolve(recorded_keymap(folder)).for_model(fields)
    return ConversionPlan(km, fields, trust), fields


def ms_vocab_names(plan: ConversionPlan) -> tuple[str, str | None]:
    """(embedding, head) checkpoint names of a converted folder; head None when tied."""
    emb_hf, head_hf = vocab_rows_of(plan.keymap)
    written = plan.checkpoint_names
    by_source = {src: dst for dst, src in plan.sources.items() if len(src) == 1}
    names = [by_source.get((hf,)) for hf in (emb_hf, head_hf)]
    if names[0] is None:
        raise MigrateError(f"keymap {plan.keymap.name} maps no parameter from {emb_hf}")
    return written.get(names[0], names[0]), (written.get(names[1], names[1]) if names[1] else None)


def ms_side(folder: Path) -> SideFacts:
    folder = Path(folder)
    plan, fields = ms_plan(folder)
    emb, head = ms_vocab_names(plan)
    facts = SideFacts("MindSpore", folder, "model.yaml", fields.get("vocab_size"), _special_fields(fields),
                      _generation(folder), tied=bool(fields.get("tie_word_embeddings", False)))
    facts.headless = vocab_rows_of(plan.keymap)[1] is None
    specs = open_ms_checkpoint(folder).specs
    if emb in specs:
        facts.embedding = (emb, tuple(specs[emb][1]))
    if head and head in specs:
        facts.head = (head, tuple(specs[head][1]))
    return facts
