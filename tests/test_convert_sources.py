"""What conversion.json records about the source files: names and sizes always,
their sha256 only with --hash-sources (hashing costs more CPU than the copy)."""
import hashlib
import json

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
