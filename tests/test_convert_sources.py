"""What conversion.json records about the source files (names and sizes always,
their sha256 only with --hash-sources: hashing costs more CPU than the copy), and
what conversion costs to import (never MindSpore)."""
import hashlib
import json
import subprocess
import sys

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main


def _sources(folder):
    return json.loads((folder / "conversion.json").read_text())["sources"]


def test_sources_are_hashed_only_on_request(tmp_path):
    src = save_hf_model(build_hf_model("gqa", seed=3), tmp_path / "hf", "sharded_safetensors")
    assert main(["convert", str(src), str(tmp_path / "plain")]) == 0
    assert main(["convert", str(src), str(tmp_path / "hashed"), "--hash-sources"]) == 0

    plain, hashed = _sources(tmp_path / "plain"), _sources(tmp_path / "hashed")
    assert [s["file"] for s in plain] == [s["file"] for s in hashed]
    assert {"config.json", "model.safetensors.index.json"} <= {s["file"] for s in plain}
    for record in plain:
        assert record["sha256"] is None
        assert record["bytes"] == (src / record["file"]).stat().st_size
    for record in hashed:
        assert record["sha256"] == hashlib.sha256((src / record["file"]).read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--qkv-concat"], ["--format", "safetensors"]])
def test_convert_and_export_never_import_mindspore(tmp_path, extra):
    """MindSpore's import alone holds 0.5 GB, more than conversion's memory budget."""
    src = save_hf_model(build_hf_model("bias", seed=4), tmp_path / "hf", "bin")
    code = (
        "import sys\n"
        "from migrate.cli import main\n"
        f"assert main(['convert', {str(src)!r}, {str(tmp_path / 'ms')!r}, *{extra!r}]) == 0\n"
        f"assert main(['export', {str(tmp_path / 'ms')!r}, {str(tmp_path / 'back')!r}]) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
