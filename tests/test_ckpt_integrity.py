"""Training checkpoints carry manifest.json (size and sha256 of every file); resume,
`migrate ckpt merge` and `migrate export` verify it and refuse a damaged checkpoint in
one line naming the file, before anything is written.

One real 4-step run (`migrate train`, checkpoints at steps 2 and 4) of the tiny Llama;
every case damages a copy of that run folder and drives the command a user would type.
"""
import hashlib
import json
import shutil

import numpy as np
import pytest

from migrate.checkpoints.manifest import MANIFEST_FILE, verify_manifest, write_manifest
from migrate.cli import main
from migrate.errors import MigrateError
from migrate.train.checkpoint.folder import LATEST, open_checkpoint
from migrate.train.checkpoint.shards import LAYOUT_FILE, shard_file
from train_setup import RUN, make_run_dir, metrics

# slow as a whole: its module fixtures build trained runs with checkpoints
pytestmark = pytest.mark.slow

SHORT_RUN = (RUN.replace("total_steps: 200", "total_steps: 4").replace("warmup_steps: 20", "warmup_steps: 2")
             + "checkpoint_interval: 2\nkeep_checkpoints: 2\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("integrity"), run_yaml=SHORT_RUN)
    assert main(["train", "--config", str(root / "run.yaml")]) == 0
    return root


def _copy(run, tmp_path):
    """A private copy of the run folder (ms_out) to damage."""
    return shutil.copytree(run / "ms_out", tmp_path / "ms_out", symlinks=True)


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("migrate: error: "), err  # one line, no traceback
    return err


def _flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_every_checkpoint_carries_a_manifest_of_all_its_files(run):
    for step in (2, 4):
        folder = run / "ms_out" / "checkpoints" / f"checkpoint-{step}"
        record = json.loads((folder / MANIFEST_FILE).read_text())
        assert record["algorithm"] == "sha256"
        on_disk = {p.name for p in folder.iterdir()} - {MANIFEST_FILE}
        assert set(record["files"]) == on_disk >= {"model.ckpt", "model.yaml", "optimizer.ckpt", "trainer_state.json",
                                                   "rng_state.json", "metrics.jsonl"}
        for name, entry in record["files"].items():
            data = (folder / name).read_bytes()
            assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert json.loads((folder / "trainer_state.json").read_text())["version"] == 2


DAMAGE = {
    # name: (what is done to checkpoint-4, what the one line must say)
    "rng_state.json emptied": (lambda f: (f / "rng_state.json").write_bytes(b""), "rng_state.json size differs"),
    "rng_state.json half written": (lambda f: (f / "rng_state.json").write_bytes(
        (f / "rng_state.json").read_bytes()[:1000]), "rng_state.json size differs (1000 bytes"),
    "metrics.jsonl lost its last lines": (lambda f: (f / "metrics.jsonl").write_text(
        "".join((f / "metrics.jsonl").read_text().splitlines(keepends=True)[:2])), "metrics.jsonl size differs"),
    "model.ckpt one flipped byte": (lambda f: _flip_byte(f / "model.ckpt"), "model.ckpt checksum differs"),
    "optimizer.ckpt deleted": (lambda f: (f / "optimizer.ckpt").unlink(), "optimizer.ckpt missing"),
    "a file appeared": (lambda f: (f / "notes.txt").write_text("hi\n"), "extra file notes.txt"),
    "manifest.json deleted": (lambda f: (f / MANIFEST_FILE).unlink(), "manifest.json missing"),
    "manifest.json damaged": (lambda f: (f / MANIFEST_FILE).write_text("{\"format\": "),
                              "unreadable manifest.json"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_resume_refuses_a_damaged_checkpoint_naming_the_file(run, tmp_path, capsys, case):
    damage, message = DAMAGE[case]
    out = _copy(run, tmp_path)
    folder = out / "checkpoints" / "checkpoint-4"
    damage(folder)
    before = _snapshot(out)
    code = main(["train", "--config", str(run / "run.yaml"), "--out", str(out),
                 "--resume", str(out / "checkpoints" / LATEST)])
    err = _one_error(capsys)
    assert code == 2
    assert err.startswith(f"migrate: error: {folder} is damaged: ") and message in err, err
    assert _snapshot(out) == before  # nothing lost, nothing written


@pytest.mark.parametrize("case", ["model.ckpt one flipped byte", "rng_state.json emptied", "a file appeared"])
def test_ckpt_merge_and_export_refuse_a_damaged_checkpoint(run, tmp_path, capsys, case):
    damage, message = DAMAGE[case]
    out = _copy(run, tmp_path)
    latest = out / "checkpoints" / LATEST
    damage(latest.resolve())
    for argv, made in ((["ckpt", "merge", str(latest), str(tmp_path / "merged")], tmp_path / "merged"),
                       (["export", str(latest), str(tmp_path / "hf")], tmp_path / "hf")):
        code = main(argv)
        err = _one_error(capsys)
        assert code == 2 and " is damaged: " in err and message in err, (argv, err)
        assert not made.exists() and not list(tmp_path.glob(f".{made.name}*"))


def test_intact_checkpoint_merges_and_exports_and_the_merge_has_its_own_manifest(run, tmp_path, capsys):
    latest = run / "ms_out" / "checkpoints" / LATEST
    assert main(["export", str(latest), str(tmp_path / "hf")]) == 0
    assert main(["ckpt", "merge", str(latest), str(tmp_path / "merged")]) == 0
    merged = tmp_path / "merged"
    verify_manifest(merged)
    assert open_checkpoint(merged).step == 4
    assert capsys.readouterr().err == ""


def _make_old(folder):
    """What migrate wrote before manifests: format version 1, no manifest.json."""
    (folder / MANIFEST_FILE).unlink()
    state = json.loads((folder / "trainer_state.json").read_text())
    (folder / "trainer_state.json").write_text(json.dumps({**state, "version": 1}, indent=1) + "\n")


def test_an_old_checkpoint_without_manifest_resumes_with_one_warning(run, tmp_path, capsys):
    out = _copy(run, tmp_path)
    folder = out / "checkpoints" / "checkpoint-2"
    _make_old(folder)
    code = main(["train", "--config", str(run / "run.yaml"), "--out", str(out), "--resume", str(folder)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    warnings = [line for line in captured.err.splitlines() if line.startswith("migrate: warning:")]
    assert warnings == [f"migrate: warning: {folder} has no manifest.json (checkpoint format 1, from an older "
                        f"migrate): its files cannot be checked for damage"]
    keys = ("step", "loss", "lr", "grad_norm", "tokens")
    assert [[r[k] for k in keys] for r in metrics(out)] == [[r[k] for k in keys] for r in metrics(run / "ms_out")]
    verify_manifest(out / "checkpoints" / "checkpoint-4")  # the checkpoints it writes have one


@pytest.mark.parametrize("content, message", [
    (b"", "unreadable rng_state.json in "),
    (b'{"python": [3, [1, 2', "unreadable rng_state.json in "),
    (b"{}\n", "rng_state.json does not hold the Python, numpy and MindSpore generator states"),
])
def test_an_old_checkpoint_with_a_damaged_rng_state_is_refused_in_one_line(run, tmp_path, capsys, content, message):
    out = _copy(run, tmp_path)
    folder = out / "checkpoints" / "checkpoint-2"
    _make_old(folder)
    (folder / "rng_state.json").write_bytes(content)
    before = _snapshot(out)
    code = main(["train", "--config", str(run / "run.yaml"), "--out", str(out), "--resume", str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[0].startswith("migrate: warning:") and len(err) == 2  # the old-format warning, then the refusal
    assert err[1].startswith("migrate: error: ") and message in err[1], err
    assert _snapshot(out) == before


# ---------- the manifest itself ----------
def test_verify_sees_a_change_after_an_earlier_verify(tmp_path):
    (tmp_path / "a.bin").write_bytes(np.arange(1000, dtype=np.float32).tobytes())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b\n")
    record = write_manifest(tmp_path)
    assert set(record["files"]) == {"a.bin", "sub/b.txt"}
    verify_manifest(tmp_path)
    verify_manifest(tmp_path)  # unchanged: remembered, not hashed again
    _flip_byte(tmp_path / "a.bin", offset=7)  # same size, new bytes: the fingerprint changes
    with pytest.raises(MigrateError, match="a.bin checksum differs"):
        verify_manifest(tmp_path)
    (tmp_path / "sub" / "b.txt").unlink()
    (tmp_path / "sub" / "b.txt").symlink_to(tmp_path / "a.bin")
    with pytest.raises(MigrateError, match="sub/b.txt is not a regular file"):
        verify_manifest(tmp_path)


# ---------- optimizer shards (ranks simulated, as tests/test_ckpt_merge.py does) ----------
def test_a_damaged_optimizer_shard_is_named(tmp_path, capsys):
    from test_ckpt_merge import _sharded_checkpoint

    folder, _, _ = _sharded_checkpoint(tmp_path / "run")
    assert json.loads((folder / MANIFEST_FILE).read_text())["files"].keys() >= {shard_file(0), shard_file(1),
                                                                                LAYOUT_FILE}
    _flip_byte(folder / shard_file(1))
    code = main(["ckpt", "merge", str(folder), str(tmp_path / "merged")])
    err = _one_error(capsys)
    assert code == 2 and f"{shard_file(1)} checksum differs" in err
    assert not (tmp_path / "merged").exists()


def test_an_old_sharded_checkpoint_still_has_its_layout_checked(tmp_path, capsys):
    from test_ckpt_merge import _sharded_checkpoint

    folder, _, _ = _sharded_checkpoint(tmp_path / "run")
    _make_old(folder)
    (folder / shard_file(1)).unlink()
    code = main(["ckpt", "merge", str(folder), str(tmp_path / "merged")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].startswith("migrate: warning:")
    assert err[1] == f"migrate: error: checkpoint {folder} lacks {shard_file(1)}, which {LAYOUT_FILE} names"
