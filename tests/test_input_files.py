"""What `convert` accepts from a model folder, driven through the CLI as a user runs it:
the hub cache layout, links that leave the folder, buffers that are not parameters,
non-float weights, safetensors headers the reference library refuses, and which
weights file a folder holding several means (transformers' own choice)."""
import hashlib
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from family_fixtures import build_family_model
from hf_fixtures import build_hf_model, save_hf_model
from migrate.checkpoints.dtypes import torch_to_numpy
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.cli import main


@pytest.fixture(scope="module")
def llama():
    return build_hf_model("gqa", seed=7)


def run_cli(capsys, *argv):
    capsys.readouterr()
    code = main(list(map(str, argv)))
    return code, capsys.readouterr().err.strip()


def convert_ok(capsys, src, out, family="hf_llama"):
    code, err = run_cli(capsys, "convert", "--src", family, src, out)
    assert code == 0, err
    return json.loads((out / "conversion.json").read_text())


def assert_refused(capsys, tmp_path, src, pattern, family="hf_llama"):
    """Exit 2, one line naming the problem, nothing under the output's parent."""
    parent = tmp_path / "refused"
    code, err = run_cli(capsys, "convert", "--src", family, src, parent / "ms")
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("migrate: error: "), err
    assert pattern in err, err
    assert not parent.exists() or list(parent.iterdir()) == []
    return err


def ms_tensors(out) -> dict[str, np.ndarray]:
    return dict(open_ms_checkpoint(out).tensors())


# ---------- the Hugging Face hub cache ----------

def to_hub_cache(plain, cache, repo="models--org--tiny", rev="0123456789abcdef0123456789abcdef01234567"):
    """The layout huggingface_hub writes: every file of `plain` stored once under
    blobs/<sha256> and linked from snapshots/<rev>/<name> as ../../blobs/<sha256>."""
    root = cache / repo
    snapshot = root / "snapshots" / rev
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    for file in sorted(plain.iterdir()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = root / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(f"../../blobs/{digest}")
    return snapshot


@pytest.mark.parametrize("layout", ["safetensors", "sharded_safetensors", "bin", "sharded_bin"])
def test_hub_cache_snapshot_converts_like_the_plain_folder(capsys, tmp_path, llama, layout):
    from huggingface_hub import scan_cache_dir

    plain = save_hf_model(llama, tmp_path / "plain", layout)
    (plain / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    snapshot = to_hub_cache(plain, tmp_path / "hub")
    (repo,) = scan_cache_dir(tmp_path / "hub").repos  # huggingface_hub reads it as its own cache
    assert repo.repo_id == "org/tiny" and repo.nb_files == len(list(plain.iterdir()))
    assert all(p.is_symlink() for p in snapshot.iterdir())

    want = convert_ok(capsys, plain, tmp_path / "ms_plain")
    got = convert_ok(capsys, snapshot, tmp_path / "ms_hub")
    for name in ("model.ckpt", "model.yaml", "tokenizer.json"):
        assert (tmp_path / "ms_hub" / name).read_bytes() == (tmp_path / "ms_plain" / name).read_bytes(), name
    assert not (tmp_path / "ms_hub" / "tokenizer.json").is_symlink()
    # Sources are recorded under the names the folder uses, not the blobs' hashes.
    assert got["sources"] == want["sources"] and got["tensors"] == want["tensors"]
    # inspect reads the snapshot as HF does, shards reached through the cache's links too.
    from migrate.inspect_ckpt import inspect_checkpoint

    assert inspect_checkpoint(snapshot) == inspect_checkpoint(plain)


def test_hub_cache_links_leaving_the_repository_are_refused(capsys, tmp_path, llama):
    plain = save_hf_model(llama, tmp_path / "plain", "sharded_safetensors")
    snapshot = to_hub_cache(plain, tmp_path / "hub")
    shard = sorted(snapshot.glob("model-*.safetensors"))[0]
    blob_link = os.readlink(shard)
    refused = f"index model.safetensors.index.json names a file outside the model folder: {shard.name} (a link to"

    elsewhere = tmp_path / "elsewhere"  # the same bytes, outside the cache repository
    elsewhere.mkdir()
    shutil.copyfile(shard, elsewhere / shard.name)
    shard.unlink()
    shard.symlink_to(elsewhere / shard.name)
    assert_refused(capsys, tmp_path, snapshot, refused)

    other = to_hub_cache(plain, tmp_path / "hub", repo="models--org--other")  # another repository's blob
    shard.unlink()
    shard.symlink_to(os.path.relpath((other / shard.name).resolve(), snapshot))
    assert_refused(capsys, tmp_path, snapshot, refused)

    # An index entry climbing out of the snapshot, even to a sibling revision of the same repository.
    shard.unlink()
    shard.symlink_to(blob_link)
    sibling = to_hub_cache(plain, tmp_path / "hub", rev="f" * 40)
    index_path = snapshot / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: f"../{sibling.name}/{v}" for k, v in index["weight_map"].items()}
    index_path.unlink()
    index_path.write_text(json.dumps(index))
    assert_refused(capsys, tmp_path, snapshot,
                   f"index model.safetensors.index.json names a file outside the model folder: ../{sibling.name}/")


def test_link_out_of_a_plain_folder_is_refused(capsys, tmp_path, llama):
    src = save_hf_model(llama, tmp_path / "hf")
    (tmp_path / "elsewhere").mkdir()
    (src / "model.safetensors").rename(tmp_path / "elsewhere" / "model.safetensors")
    (src / "model.safetensors").symlink_to(tmp_path / "elsewhere" / "model.safetensors")
    assert_refused(capsys, tmp_path, src, "model.safetensors is a link to a file outside the model folder")


# ---------- sidecars ----------

def test_sidecar_linking_outside_the_folder_is_refused(capsys, tmp_path, llama):
    src = save_hf_model(llama, tmp_path / "hf")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the output")
    (src / "tokenizer.json").symlink_to(secret)
    err = assert_refused(capsys, tmp_path, src, "tokenizer.json is a link to a file outside the model folder")
    assert str(secret) in err


def test_the_chat_template_and_a_wordpiece_vocab_travel_with_the_weights(capsys, tmp_path, llama):
    """transformers 5 writes the chat template to chat_template.jinja (SmolLM2-Instruct has one) and
    BERT's tokenizer reads vocab.txt: both reach the converted folder and come back with export."""
    src = save_hf_model(llama, tmp_path / "hf")
    (src / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (src / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    convert_ok(capsys, src, tmp_path / "ms")
    for name in ("chat_template.jinja", "vocab.txt"):
        assert (tmp_path / "ms" / name).read_bytes() == (src / name).read_bytes()
    code, err = run_cli(capsys, "export", "--src", "hf_llama", tmp_path / "ms", tmp_path / "back")
    assert code == 0, err
    assert (tmp_path / "back" / "chat_template.jinja").read_bytes() == (src / "chat_template.jinja").read_bytes()


def test_a_chat_template_linking_outside_the_folder_is_refused(capsys, tmp_path, llama):
    src = save_hf_model(llama, tmp_path / "hf")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the output")
    (src / "chat_template.jinja").symlink_to(secret)
    assert_refused(capsys, tmp_path, src, "chat_template.jinja is a link to a file outside the model folder")


def test_named_chat_templates_travel_and_a_folder_linking_outside_is_refused(capsys, tmp_path, llama):
    """transformers 5 saves each named chat template as additional_chat_templates/NAME.jinja."""
    src = save_hf_model(llama, tmp_path / "hf")
    (src / "additional_chat_templates").mkdir()
    (src / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages[0]['content'] }}")
    convert_ok(capsys, src, tmp_path / "ms")
    code, err = run_cli(capsys, "export", "--src", "hf_llama", tmp_path / "ms", tmp_path / "back")
    assert code == 0, err
    for folder in ("ms", "back"):
        assert (tmp_path / folder / "additional_chat_templates" / "tool_use.jinja").read_text() == \
            "{{ messages[0]['content'] }}"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.jinja").write_text("not for the output")
    shutil.rmtree(src / "additional_chat_templates")
    (src / "additional_chat_templates").symlink_to(tmp_path / "outside")
    assert_refused(capsys, tmp_path, src,
                   "additional_chat_templates/secret.jinja is a link to a file outside the model folder")


def test_export_refuses_a_sidecar_linking_outside(capsys, tmp_path, llama):
    src = save_hf_model(llama, tmp_path / "hf")
    convert_ok(capsys, src, tmp_path / "ms")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the output")
    (tmp_path / "ms" / "tokenizer_config.json").symlink_to(secret)
    code, err = run_cli(capsys, "export", "--src", "hf_llama", tmp_path / "ms", tmp_path / "back" / "hf")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "tokenizer_config.json is a link to a file outside the model folder" in err
    assert not (tmp_path / "back").exists() or list((tmp_path / "back").iterdir()) == []


# ---------- buffers that are not parameters ----------

@pytest.mark.parametrize("family, prefix", [("hf_bert", ""), ("hf_bert_mlm", "bert.")])
def test_old_bert_position_ids_buffer_is_ignored_and_recorded(capsys, tmp_path, family, prefix):
    model = build_family_model(family, seed=11)
    plain = save_hf_model(model, tmp_path / "plain")
    old = save_hf_model(model, tmp_path / "old")
    state = load_file(old / "model.safetensors")
    n = model.config.max_position_embeddings
    # As transformers saved them before the buffers became non-persistent: int64.
    state[f"{prefix}embeddings.position_ids"] = torch.arange(n).expand((1, -1)).contiguous()
    state[f"{prefix}embeddings.token_type_ids"] = torch.zeros((1, n), dtype=torch.long)
    save_file(state, old / "model.safetensors", metadata={"format": "pt"})

    manifest = convert_ok(capsys, old, tmp_path / "ms_old", "hf_bert")
    convert_ok(capsys, plain, tmp_path / "ms_plain", "hf_bert")
    assert f"{prefix}embeddings.position_ids" in manifest["ignored"]
    assert f"{prefix}embeddings.token_type_ids" in manifest["ignored"]
    got, want = ms_tensors(tmp_path / "ms_old"), ms_tensors(tmp_path / "ms_plain")
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_fp16_llama_with_fp32_rope_buffers_keeps_fp16(capsys, tmp_path):
    """Old fp16 Llama files carry RoPE's inv_freq (and some exporters its caches) in fp32."""
    model = build_hf_model("mha", seed=12, dtype=torch.float16)
    src = save_hf_model(model, tmp_path / "hf", "bin")
    state = torch.load(src / "pytorch_model.bin", weights_only=True)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    for i in range(model.config.num_hidden_layers):
        state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = inv_freq
        state[f"model.layers.{i}.self_attn.rotary_emb.cos_cached"] = torch.ones(1, 1, 8, head_dim)
        state[f"model.layers.{i}.self_attn.rotary_emb.sin_cached"] = torch.zeros(1, 1, 8, head_dim)
    state["model.rotary_emb.inv_freq"] = inv_freq
    torch.save(state, src / "pytorch_model.bin")
    manifest = convert_ok(capsys, src, tmp_path / "ms")
    assert manifest["dtype"] == "fp16"
    assert len(manifest["ignored"]) == 3 * model.config.num_hidden_layers + 1
    saved = ms_tensors(tmp_path / "ms")
    assert not any("rotary" in k for k in saved)
    assert all(v.dtype == np.float16 for v in saved.values())


def test_an_unknown_extra_tensor_alone_still_fails_naming_it(capsys, tmp_path, llama):
    src = save_hf_model(llama, tmp_path / "hf")
    state = load_file(src / "model.safetensors")
    state["model.embeddings.position_ids"] = torch.arange(64).expand((1, -1)).contiguous()  # BERT's name, not Llama's
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    err = assert_refused(capsys, tmp_path, src, "coverage check failed: 1 unexpected: model.embeddings.position_ids")
    assert "missing" not in err and "mis-shaped" not in err


# ---------- non-float weights ----------

@pytest.mark.parametrize("dtype, shown", [(torch.int8, "int8"), (torch.bool, "bool"), (torch.int32, "int32")])
def test_non_float_weight_is_refused_naming_tensor_and_dtype(capsys, tmp_path, llama, dtype, shown):
    src = save_hf_model(llama, tmp_path / "hf")
    state = load_file(src / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    state[name] = (state[name] * 100).to(dtype)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    assert_refused(capsys, tmp_path, src, f"tensor {name} is {shown}, not floating point")


# ---------- safetensors headers the reference library refuses ----------

def st_bytes(entries, data: bytes, pad: int = 0) -> bytes:
    """A safetensors file written by hand: `entries` is a list of (name, dtype, shape,
    begin, end) turned into header text one by one (so a name may appear twice)."""
    body = ",".join(json.dumps(name) + ":" + json.dumps({"dtype": dt, "shape": list(shape), "data_offsets": [b, e]})
                    for name, dt, shape, b, e in entries)
    header = ("{" + body + "}").encode()
    header += b" " * pad
    return struct.pack("<Q", len(header)) + header + data


def tensors_of(path):
    """(entries laid out back to back, their bytes) of a real safetensors file."""
    with safe_open(path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    entries, chunks, offset = [], [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()
        entries.append([name, "F32", tuple(t.shape), offset, offset + len(raw)])
        chunks.append(raw)
        offset += len(raw)
    return entries, chunks


def reference_refuses(blob: bytes, tmp_path) -> bool:
    probe = tmp_path / "probe.safetensors"
    probe.write_bytes(blob)
    try:
        with safe_open(probe, "np") as f:
            [f.get_tensor(k) for k in f.keys()]
    except SafetensorError:
        return True
    return False


def test_hand_built_file_round_trips(capsys, tmp_path, llama):
    """The builder itself is right: the intact rebuild converts and the reference loads it."""
    src = save_hf_model(llama, tmp_path / "hf")
    entries, chunks = tensors_of(src / "model.safetensors")
    blob = st_bytes(entries, b"".join(chunks))
    assert not reference_refuses(blob, tmp_path)
    (src / "model.safetensors").write_bytes(blob)
    convert_ok(capsys, src, tmp_path / "ms")


def bad_header(case, entries, chunks):
    """(file bytes, what the one line must say) for one header fault."""
    return dict(_bad_headers(entries, chunks))[case]


HEADER_FAULTS = ["listed twice", "hole", "trailing bytes", "utf-16 header", "latin-1 byte", "lone surrogate"]


def _bad_headers(entries, chunks):
    data = b"".join(chunks)
    # A tensor listed twice: first over extra bytes of its own, then over its real bytes.
    name, dt, shape, b, e = entries[-1]
    twice = [[name, dt, shape, 0, e - b]] + [[n, d, s, b2 + e - b, e2 + e - b] for n, d, s, b2, e2 in entries]
    yield "listed twice", (st_bytes(twice, chunks[-1][::-1] + data), f"header lists {name} twice")
    # Eight unused bytes between the first tensor and the rest.
    gap = [entries[0]] + [[n, d, s, b2 + 8, e2 + 8] for n, d, s, b2, e2 in entries[1:]]
    yield "hole", (st_bytes(gap, chunks[0] + bytes(8) + b"".join(chunks[1:])), "leaving 8 unused bytes")
    yield "trailing bytes", (st_bytes(entries, data + bytes(4)), f"cover {len(data)} of the {len(data) + 4} bytes")
    # The same header in UTF-16 (Python's json would decode it; the format is UTF-8).
    text = st_bytes(entries, b"")[8:].decode()
    utf16 = text.encode("utf-16")
    yield "utf-16 header", (struct.pack("<Q", len(utf16)) + utf16 + data, "header is not UTF-8")
    bad = text.replace('"shape"', '"sh\xe9pe"', 1).encode("latin-1")
    yield "latin-1 byte", (struct.pack("<Q", len(bad)) + bad + data, "header is not UTF-8")
    surrogate = text.replace("{", '{"__metadata__": {"x": "\\ud800"}, ', 1).encode()
    yield "lone surrogate", (struct.pack("<Q", len(surrogate)) + surrogate + data, "header is not JSON")


@pytest.mark.parametrize("case", HEADER_FAULTS)
def test_headers_the_reference_refuses_are_refused(capsys, tmp_path, llama, case):
    src = save_hf_model(llama, tmp_path / "hf")
    blob, pattern = bad_header(case, *tensors_of(src / "model.safetensors"))
    assert reference_refuses(blob, tmp_path)
    (src / "model.safetensors").write_bytes(blob)
    err = assert_refused(capsys, tmp_path, src, "corrupt safetensors file model.safetensors: ")
    assert pattern in err, err


# ---------- which weights a folder holding several means ----------

def converted_vs_hf(capsys, tmp_path, folder):
    """Convert `folder`; return (converted tensors by HF name, what from_pretrained loads)."""
    from transformers import AutoModelForCausalLM

    manifest = convert_ok(capsys, folder, tmp_path / "ms")
    saved = ms_tensors(tmp_path / "ms")
    converted = {r["source"]: saved[r["target"]] for r in manifest["tensors"]}
    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    return converted, {k: torch_to_numpy(v) for k, v in loaded.items()}, manifest


def weights_of(model):
    return {k: torch_to_numpy(v) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("copied, own, explicit, used", [
    ("safetensors", "sharded_safetensors", None, "model.safetensors"),
    ("bin", "sharded_bin", None, "pytorch_model.bin"),
    ("bin", "safetensors", None, "model.safetensors"),
    ("bin", "sharded_safetensors", None, "model.safetensors.index.json"),
    ("safetensors", "sharded_safetensors", "model.safetensors.index.json", "model.safetensors.index.json"),
])
def test_folder_with_several_weights_converts_what_transformers_loads(capsys, tmp_path, copied, own, explicit, used):
    """A folder saved as `own` (model A) gets model B's weights saved as `copied` beside
    them: the conversion must hold what `from_pretrained(folder)` loads, and record the
    files it read."""
    a, b = build_hf_model("gqa", seed=21), build_hf_model("gqa", seed=22)
    folder = save_hf_model(a, tmp_path / "hf", own)
    other = save_hf_model(b, tmp_path / "other", copied)
    for file in other.iterdir():
        if file.name != "config.json":
            shutil.copyfile(file, folder / file.name)
    if explicit:
        config = json.loads((folder / "config.json").read_text())
        config["transformers_weights"] = explicit
        (folder / "config.json").write_text(json.dumps(config))
    converted, loaded, manifest = converted_vs_hf(capsys, tmp_path, folder)
    expected = weights_of(a if (tmp_path / "hf" / used).exists() and not (other / used).exists() else b)
    for name, value in converted.items():
        assert np.array_equal(value, loaded[name]), name     # what transformers runs ...
        assert np.array_equal(value, expected[name]), name   # ... is the model it was saved from
    files = {used}
    if used.endswith(".index.json"):
        files |= set(json.loads((folder / used).read_text())["weight_map"].values())
    assert {s["file"] for s in manifest["sources"]} == files | {"config.json"}


@pytest.mark.parametrize("value, pattern", [
    ("../other/model.safetensors", "config.json's transformers_weights names a file outside the model folder: ../"),
    ("adapter_model.bin", "transformers_weights names 'adapter_model.bin': a model's weights are read from"),
    ("model-extra.safetensors", "config.json's transformers_weights names model-extra.safetensors, which is not in"),
])
def test_transformers_weights_is_followed_only_inside_the_folder(capsys, tmp_path, llama, value, pattern):
    src = save_hf_model(llama, tmp_path / "hf")
    (tmp_path / "other").mkdir()
    shutil.copyfile(src / "model.safetensors", tmp_path / "other" / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config["transformers_weights"] = value
    (src / "config.json").write_text(json.dumps(config))
    assert_refused(capsys, tmp_path, src, pattern)
