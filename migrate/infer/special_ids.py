"""The ids generation stops at and pads with, read as HF `generate` reads them."""
from __future__ import annotations

from pathlib import Path

from migrate.errors import MigrateError
from migrate.jsonsafe import load_json


def stop_and_pad(ms_dir: Path, config) -> tuple[list[int], int | None]:
    """Stop ids and the pad id generation uses: generation_config.json's, else model.yaml's
    (HF pads finished rows with pad_token_id, or with the first eos id when there is none)."""
    fields = {}
    path = Path(ms_dir) / "generation_config.json"
    if path.is_file():
        fields = load_json(path)  # bounded: one line naming the file otherwise
        fields = fields if isinstance(fields, dict) else {}
    eos = fields.get("eos_token_id", getattr(config, "eos_token_id", None))
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
        raise MigrateError(f"eos_token_id must be an id or a list of ids, got {eos!r}"[:200])
    pad = fields.get("pad_token_id", getattr(config, "pad_token_id", None))
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) else (eos[0] if eos else None)
    return eos, pad
