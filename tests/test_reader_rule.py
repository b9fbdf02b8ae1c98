"""The reader rule, through the command line: every folder format migrate reads (dumps, inputs files,
data folders, run folders, checkpoints, adapters, MindIR exports, HF folders) has its members resolved
inside the folder, what its index or manifest says checked against what the member holds, and its
JSON/YAML bounded in size and depth. Bad input is one `migrate: error:` line, exit 2, nothing
written (`migrate.checkpoints.input_folder`, `migrate.jsonsafe.load_json`, `migrate.safeyaml`).

One tiny HF Llama is built and dumped once per module; each case copies the dump (or writes a small
folder by hand), damages it one way, and runs the command in-process."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save
from safetensors.torch import load_file, save_file

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main

MAX_JSON_DEPTH, MAX_JSON_BYTES = 100, 64 << 20  # migrate.jsonsafe's bounds (test_bounds_are_the_documented_ones)
DEEP = "[" * 100_000 + "]" * 100_000  # a RecursionError in json's decoder before the rule


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """An HF folder and one dump of it (tensors mode, its inputs.npz beside it)."""
    root = tmp_path_factory.mktemp("reader")
    save_hf_model(build_hf_model("gqa", seed=3), root / "hf")
    assert main(["dump", str(root / "hf"), str(root / "dump"), "--inputs", str(root / "in.npz"),
                 "--reference", "none"]) == 0
    return root


def run_cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


def refused(capsys, *argv, match: str, out: Path | None = None) -> str:
    """The command exits 2 with one `migrate: error:` line holding `match`; `out` was not written."""
    code, err = run_cli(capsys, *argv)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("migrate: error: "), err
    assert match in err, err
    if out is not None:
        assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return err


def test_bounds_are_the_documented_ones():
    from migrate import jsonsafe

    assert (jsonsafe.MAX_JSON_DEPTH, jsonsafe.MAX_JSON_BYTES) == (MAX_JSON_DEPTH, MAX_JSON_BYTES)


# ---------- dumps (`migrate diff` over a damaged dump) ----------
@pytest.fixture
def dump(world, tmp_path) -> Path:
    return Path(shutil.copytree(world / "dump", tmp_path / "dump"))


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    data = change(data) or data
    path.write_text(json.dumps(data))


TENSORS = "tensors-00001.safetensors"


def test_an_intact_dump_diffs_clean_and_a_hard_link_is_an_ordinary_member(world, dump, capsys, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    os.replace(dump / TENSORS, outside)
    os.link(outside, dump / TENSORS)  # a hard link is a file of the folder like any other
    code, err = run_cli(capsys, "diff", dump, world / "dump")
    assert code == 0, err


@pytest.mark.parametrize("name", ["../outside.safetensors", "ABSOLUTE"])
def test_a_record_naming_a_file_outside_the_dump_is_refused(world, dump, capsys, tmp_path, name):
    shutil.copy(dump / TENSORS, tmp_path / "outside.safetensors")
    name = str(tmp_path / "outside.safetensors") if name == "ABSOLUTE" else name
    edit_json(dump / "modules.json", lambda recs: [{**r, "file": name} for r in recs])
    edit_json(dump / "manifest.json", lambda m: {**m, "files": [*m["files"], name]})  # the manifest agrees
    refused(capsys, "diff", dump, world / "dump", match=f"names a file outside the dump: {name}")


def test_a_record_file_the_manifest_does_not_list_is_refused(world, dump, capsys):
    shutil.copy(dump / TENSORS, dump / "other.safetensors")
    edit_json(dump / "modules.json", lambda recs: [{**r, "file": "other.safetensors"} for r in recs])
    refused(capsys, "diff", dump, world / "dump", match="is not one of the files manifest.json lists")


def test_a_tensors_file_linked_out_of_the_dump_is_refused(world, dump, capsys, tmp_path):
    os.replace(dump / TENSORS, tmp_path / "outside.safetensors")
    os.symlink(tmp_path / "outside.safetensors", dump / TENSORS)
    refused(capsys, "diff", dump, world / "dump", match=f"names a file outside the dump: {TENSORS} (a link to")


def test_a_tensors_file_that_is_a_folder_is_refused(world, dump, capsys):
    (dump / TENSORS).unlink()
    (dump / TENSORS).mkdir()
    refused(capsys, "diff", dump, world / "dump", match=f"names {TENSORS}, which is a folder")


@pytest.mark.parametrize("text, match", [
    ('{"key": "x"}', "modules.json: expected an array, found an object"),
    ("5", "modules.json: expected an array, found an integer"),
    (DEEP, f"modules.json: nested more than {MAX_JSON_DEPTH} levels deep"),
    ("[5]", "modules.json: record 0: 5 is not an object"),
    ('[{"key": 5}]', "record 0: key must be text"),
])
def test_modules_json_of_another_shape_is_refused(world, dump, capsys, text, match):
    (dump / "modules.json").write_text(text)
    refused(capsys, "diff", dump, world / "dump", match=match)


def test_record_fields_of_another_type_are_refused(world, dump, capsys):
    edit_json(dump / "modules.json", lambda recs: [{**recs[0], "shape": "abc"}, *recs[1:]])
    refused(capsys, "diff", dump, world / "dump", match="record 0: shape must list whole numbers")


def test_a_deeply_nested_or_huge_manifest_is_refused(world, dump, capsys):
    (dump / "manifest.json").write_text(DEEP)
    refused(capsys, "diff", dump, world / "dump", match=f"manifest.json: nested more than {MAX_JSON_DEPTH}")
    with open(dump / "manifest.json", "wb") as fh:  # sparse: nothing is written but its length
        fh.write(b"{")
        fh.truncate(MAX_JSON_BYTES + 1)
    refused(capsys, "diff", dump, world / "dump", match=f"manifest.json: larger than {MAX_JSON_BYTES >> 20} MiB")


def test_manifest_fields_of_another_type_are_refused(world, dump, capsys):
    edit_json(dump / "manifest.json", lambda m: {**m, "files": 5})
    refused(capsys, "diff", dump, world / "dump", match="files is 5, not what migrate dump writes")


def test_an_inputs_file_linked_out_of_the_dump_is_refused(world, dump, capsys, tmp_path):
    os.replace(dump / "inputs.npz", tmp_path / "in.npz")
    os.symlink(tmp_path / "in.npz", dump / "inputs.npz")
    refused(capsys, "diff", dump, world / "dump", match="inputs.npz is a link to a file outside the dump")


def test_a_record_count_the_manifest_does_not_state_is_refused(world, dump, capsys):
    edit_json(dump / "modules.json", lambda recs: recs[:-1])
    refused(capsys, "diff", dump, world / "dump", match="records, manifest.json says")


def test_a_truncated_tensors_file_is_refused(world, dump, capsys):
    data = (dump / TENSORS).read_bytes()
    (dump / TENSORS).write_bytes(data[: len(data) // 2])
    refused(capsys, "diff", dump, world / "dump", match=f"corrupt safetensors file {TENSORS}")


def test_a_swapped_tensors_file_is_refused(world, dump, capsys):
    (dump / TENSORS).write_bytes(save({"x": np.zeros(3, np.float32)}))
    refused(capsys, "diff", dump, world / "dump", match=f"{TENSORS} holds no tensor")


def test_a_recorded_shape_that_disagrees_with_the_stored_tensor_is_refused(world, dump, capsys):
    def fold(recs):  # same element count, another shape: a reshape would have accepted it
        for r in recs:
            if len(r["shape"]) == 3:
                r["shape"] = [r["shape"][0] * r["shape"][1], r["shape"][2]]
                return
    edit_json(dump / "modules.json", fold)
    refused(capsys, "diff", dump, world / "dump", match="modules.json records float32")


# ---------- inputs files (`migrate dump --inputs`, `migrate diff --inputs`) ----------
@pytest.mark.parametrize("kind, match", [
    ("truncated", "not an inputs file written by migrate dump"),
    ("empty", "not an inputs file written by migrate dump"),
    ("negative", "token ids must be ≥ 0, found -6"),
    ("float", "ids must be whole numbers, found float64"),
    ("labels", "labels must be token ids ≥ 0 or -100"),
    ("zero length", "ids are empty"),
    ("mask", "mask must hold only 0"),
])
def test_bad_inputs_files_are_refused_before_a_dump_is_written(world, capsys, tmp_path, kind, match):
    path = tmp_path / "in.npz"
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    if kind == "truncated":
        data = (world / "in.npz").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "negative":
        np.savez(path, ids=ids * [[1], [-1]], labels=ids)
    elif kind == "float":
        np.savez(path, ids=ids + 0.5, labels=ids)
    elif kind == "labels":
        np.savez(path, ids=ids, labels=ids - 7)
    elif kind == "zero length":
        np.savez(path, ids=ids[:, :0], labels=ids[:, :0])
    else:
        np.savez(path, ids=ids, labels=ids, mask=ids)
    refused(capsys, "dump", world / "hf", tmp_path / "out", "--inputs", path, match=match, out=tmp_path / "out")


@pytest.mark.slow  # loads both sides
def test_inputs_past_the_vocabulary_are_refused_by_a_live_diff(world, capsys, tmp_path):
    path = tmp_path / "in.npz"
    ids = np.array([[1, 2, 3], [4, 5, 99_999]])
    np.savez(path, ids=ids, labels=ids)
    refused(capsys, "diff", world / "hf", world / "hf", "--inputs", path, match="past the model's vocabulary")


# ---------- data folders (`migrate vocab check --data`) ----------
def data_folder(root: Path, rows: np.ndarray, **meta) -> Path:
    root.mkdir()
    np.save(root / "train.npy", rows)
    fields = {"format": "migrate-tokens", "version": 1, "seq_length": rows.shape[1] - 1, "samples": len(rows),
              "eos_token_id": 2, "tokenizer": {"vocab_size": 128}, **meta}
    (root / "data.json").write_text(json.dumps(fields))
    return root


def test_a_truncated_or_float_train_npy_is_refused(world, capsys, tmp_path):
    data = data_folder(tmp_path / "data", np.arange(4 * 17, dtype=np.int32).reshape(4, 17) % 100)
    raw = (data / "train.npy").read_bytes()
    (data / "train.npy").write_bytes(raw[: len(raw) // 2])
    refused(capsys, "vocab", "check", world / "hf", "--data", data, match="not a readable .npy of token rows")
    np.save(data / "train.npy", np.zeros((4, 17), np.float32))
    refused(capsys, "vocab", "check", world / "hf", "--data", data, match="token rows must be whole numbers")


def test_data_json_deeply_nested_or_without_sizes_is_refused(world, capsys, tmp_path):
    data = data_folder(tmp_path / "data", np.zeros((4, 17), np.int32))
    (data / "data.json").write_text(DEEP)
    refused(capsys, "vocab", "check", world / "hf", "--data", data, match="data.json: nested more than")
    (data / "data.json").write_text(json.dumps({"format": "migrate-tokens", "samples": [4], "seq_length": 16}))
    refused(capsys, "vocab", "check", world / "hf", "--data", data, match="samples must be a whole number")


def test_a_train_npy_linked_out_of_the_data_folder_is_refused(world, capsys, tmp_path):
    data = data_folder(tmp_path / "data", np.zeros((4, 17), np.int32))
    os.replace(data / "train.npy", tmp_path / "elsewhere.npy")
    os.symlink(tmp_path / "elsewhere.npy", data / "train.npy")
    refused(capsys, "vocab", "check", world / "hf", "--data", data, match="train.npy is a link to a file outside")


# ---------- run folders (`migrate health`) ----------
def run_folder(root: Path, metrics: str | bytes, health: bytes | None = None) -> Path:
    root.mkdir()
    (root / "metrics.jsonl").write_bytes(metrics.encode() if isinstance(metrics, str) else metrics)
    (root / "effective_hparams.json").write_text(json.dumps({"config": {"data": "data", "seq_length": 16,
                                                                         "total_steps": 5}}))
    if health is not None:
        (root / "health.jsonl").write_bytes(health)
    return root


STEPS = "".join(json.dumps({"step": i + 1, "loss": 5.0, "lr": 5e-5, "grad_norm": 1.0}) + "\n" for i in range(3))


def test_health_reads_well_formed_runs(capsys, tmp_path):
    code, err = run_cli(capsys, "health", run_folder(tmp_path / "run", STEPS))
    assert code == 0, err


@pytest.mark.parametrize("metrics, health, match", [
    (STEPS, b'{"step": 1, "kind": "verdict", "line": "ok"}\n\xff\xfe\n', "health.jsonl: not UTF-8 text (byte 45)"),
    (b"\xff\n", None, "metrics.jsonl: not UTF-8 text (byte 0)"),
    (STEPS.replace('"lr": 5e-05, ', "", 1), None, "metrics.jsonl:1: no lr (a number) to replay"),
    (STEPS.replace('"lr": 5e-05', '"lr": [1]', 1), None, "metrics.jsonl:1: no lr (a number)"),
    (DEEP + "\n" + STEPS, None, "metrics.jsonl:1: nested more than"),
    (STEPS, b'{"step": 1, "kind": "loss_spike", "action": {"a": 1}}\n', "health.jsonl:1: action must be text"),
])
def test_health_refuses_a_damaged_run_in_one_line(capsys, tmp_path, metrics, health, match):
    refused(capsys, "health", run_folder(tmp_path / "run", metrics, health), match=match)


# ---------- checkpoints, adapters, run configs ----------
def test_a_deeply_nested_trainer_state_is_refused(capsys, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(DEEP)
    refused(capsys, "ckpt", "merge", ckpt, tmp_path / "out", match="unreadable trainer_state.json",
            out=tmp_path / "out")


def test_a_deeply_nested_adapter_config_is_refused(world, capsys, tmp_path):
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(DEEP)
    refused(capsys, "lora", "import", peft, tmp_path / "out", "--model", world / "hf",
            match="adapter_config.json: nested more than", out=tmp_path / "out")


def test_adapter_weights_linked_out_of_the_adapter_folder_are_refused(world, capsys, tmp_path):
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    (tmp_path / "elsewhere.safetensors").write_bytes(save({"x": np.zeros(2, np.float32)}))
    os.symlink(tmp_path / "elsewhere.safetensors", peft / "adapter_model.safetensors")
    refused(capsys, "lora", "import", peft, tmp_path / "out", "--model", world / "hf",
            match="adapter_model.safetensors is a link to a file outside the adapter folder", out=tmp_path / "out")


def test_a_converted_checkpoint_linked_out_of_its_folder_is_refused(world, capsys, tmp_path):
    assert main(["convert", str(world / "hf"), str(tmp_path / "ms")]) == 0
    os.replace(tmp_path / "ms" / "model.ckpt", tmp_path / "elsewhere.ckpt")
    os.symlink(tmp_path / "elsewhere.ckpt", tmp_path / "ms" / "model.ckpt")
    refused(capsys, "inspect", tmp_path / "ms", match="model.ckpt is a link to a file outside the model folder")


def test_a_deeply_nested_run_yaml_is_refused(capsys, tmp_path):
    (tmp_path / "run.yaml").write_text("data: " + "[" * 1_500 + "]" * 1_500 + "\n")
    refused(capsys, "train", "--config", tmp_path / "run.yaml", match="run.yaml: nested more than 100 levels deep")


def test_a_run_yaml_nested_deep_only_through_an_alias_is_refused(capsys, tmp_path):
    """60 levels defined under an anchor, used once at the top and once under 50 more levels: the
    document expands to 110 levels. Depth was counted where the walk first met the anchor (the shallow
    use), and the deep use went through."""
    anchor = "[" * 60 + "]" * 60
    (tmp_path / "run.yaml").write_text(f"a: &deep {anchor}\nb: {'[' * 50}*deep{']' * 50}\nc: *deep\n")
    refused(capsys, "train", "--config", tmp_path / "run.yaml", match="run.yaml: nested more than 100 levels deep")
    # the same anchor used only where it stays within the bound is read: the refusal is of the depth
    (tmp_path / "ok.yaml").write_text(f"a: &deep {anchor}\nb: {'[' * 30}*deep{']' * 30}\nc: *deep\n")
    from migrate.safeyaml import load_yaml
    assert load_yaml(tmp_path / "ok.yaml", "run config")["b"][0][0][0] is not None


# ---------- HF folders ----------
def test_inspect_lists_a_tensor_of_a_dtype_convert_cannot_read(world, capsys, tmp_path):
    hf = Path(shutil.copytree(world / "hf", tmp_path / "hf"))
    tensors = load_file(str(hf / "model.safetensors"))
    name = next(iter(tensors))
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, str(hf / "model.safetensors"), metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["inspect", str(hf)]) == 0
    listed = capsys.readouterr().out
    assert any(name in line and "F8_E4M3" in line for line in listed.splitlines()), listed
    refused(capsys, "convert", hf, tmp_path / "ms", match="dtype F8_E4M3 is not supported", out=tmp_path / "ms")


def test_a_deeply_nested_config_json_is_refused(world, capsys, tmp_path):
    hf = Path(shutil.copytree(world / "hf", tmp_path / "hf"))
    (hf / "config.json").write_text(DEEP)
    refused(capsys, "convert", hf, tmp_path / "ms", match="config.json: nested more than", out=tmp_path / "ms")


def test_an_index_naming_a_folder_or_an_absolute_path_is_refused(world, capsys, tmp_path):
    hf = Path(shutil.copytree(world / "hf", tmp_path / "hf"))
    weights = hf / "model.safetensors"
    names = list(load_file(str(weights)))
    os.replace(weights, tmp_path / "w.safetensors")
    index = hf / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: str(tmp_path / "w.safetensors") for n in names}}))
    refused(capsys, "convert", hf, tmp_path / "ms", match="names a file outside the model folder",
            out=tmp_path / "ms")
    (hf / "shard").mkdir()
    index.write_text(json.dumps({"weight_map": {n: "shard" for n in names}}))
    refused(capsys, "convert", hf, tmp_path / "ms", match="missing shard shard", out=tmp_path / "ms")
    index.write_text(json.dumps({"weight_map": 5}))
    refused(capsys, "convert", hf, tmp_path / "ms", match="weight_map is not a mapping", out=tmp_path / "ms")
