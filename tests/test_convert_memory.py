"""Large-model conversion: bounded memory, sharded output that every reader
handles, and the streaming pipeline's failure paths."""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch

from hf_fixtures import build_hf_model, save_hf_model
from migrate.checkpoints.dtypes import torch_to_numpy
from migrate.cli import main
from migrate.convert import convert
from migrate.errors import MigrateError
from migrate.models.loading import load_checkpoint_dict, load_model
from ms_helpers import compare, seeded_batch

MB = 10**6


def load_harness():
    path = Path(__file__).resolve().parent.parent / "bench" / "harness.py"
    spec = importlib.util.spec_from_file_location("bench_harness", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_peak_rss_is_bounded_where_the_whole_model_approach_is_not(tmp_path):
    """~400 MB of bf16 in 148 tensors, none over 17 MB: each approach runs in a
    child process, and its peak RSS (ru_maxrss) is compared with a child that
    only imports what the conversion imports."""
    harness = load_harness()
    info = harness.make_llama(tmp_path / "hf", 400 * MB, shard_size=150 * MB)
    largest = info["largest_bytes"]
    assert info["total_bytes"] > 20 * largest  # many mid-size tensors

    idle = harness.measure("idle", tmp_path / "hf", tmp_path / "idle")
    ours = harness.measure("ours", tmp_path / "hf", tmp_path / "ours", "ckpt", "150MB")
    whole = harness.measure("whole", tmp_path / "hf", tmp_path / "whole")
    bound = idle.peak_rss + 2 * largest + 64 * MB
    report = (f"idle {idle.peak_rss / MB:.0f} MB, ours {ours.peak_rss / MB:.0f} MB, "
              f"whole {whole.peak_rss / MB:.0f} MB, bound {bound / MB:.0f} MB, "
              f"checkpoint {info['total_bytes'] / MB:.0f} MB, largest {largest / MB:.1f} MB")
    print("\n" + report)
    assert ours.peak_rss <= bound, report
    assert whole.peak_rss > bound + 100 * MB, report

    # And what it wrote is right: sharded, and equal to the source.
    assert (tmp_path / "ours" / "model.ckpt.index.json").is_file()
    saved = load_checkpoint_dict(tmp_path / "ours")
    from migrate.checkpoints.hf_reader import open_hf_checkpoint

    with open_hf_checkpoint(tmp_path / "hf") as src:
        for name in ("model.embed_tokens.weight", "model.layers.3.mlp.down_proj.weight"):
            target = {"model.embed_tokens.weight": "model.tok_embeddings.embedding_weight",
                      "model.layers.3.mlp.down_proj.weight": "model.layers.3.feed_forward.w2.weight"}[name]
            assert saved[target].asnumpy().tobytes() == src.read(name).tobytes()


@pytest.mark.parametrize("layout", ["bin", "safetensors"])
def test_reading_a_checkpoint_leaves_no_pages_resident(tmp_path, layout, monkeypatch):
    """Every tensor read through a small buffer: resident memory must not grow with
    the file (a memory map would keep each touched page); for .bin, the drop is
    what keeps it so."""
    import psutil

    from migrate.checkpoints import pages
    from migrate.checkpoints.hf_reader import open_hf_checkpoint

    state = {f"t{i}": torch.full((1024, 2048), float(i)) for i in range(24)}  # 24 × 8 MiB
    folder = tmp_path / "hf"
    folder.mkdir()
    if layout == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    del state
    process = psutil.Process()
    buffer = np.empty(1 << 20, np.uint8)

    def growth() -> int:
        with open_hf_checkpoint(folder) as ckpt:
            before = process.memory_info().rss
            for name, spec in ckpt.specs.items():
                for start in range(0, spec.nbytes, buffer.size):
                    chunk = buffer[:min(buffer.size, spec.nbytes - start)]
                    ckpt.read_into(name, start, chunk)
                assert chunk[-4:].view(np.float32)[0] == float(name[1:])
            return process.memory_info().rss - before

    assert growth() < 32 * 2**20
    if layout == "bin":  # the check above is meaningful: without the drop, the pages stay
        monkeypatch.setattr(pages, "drop_pages", lambda *a: False)
        assert growth() > 150 * 2**20


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_sharded_output_loads_exports_and_inspects(tmp_path, fmt, capsys):
    hf = build_hf_model("gqa", seed=11)
    src = save_hf_model(hf, tmp_path / "hf", "sharded_safetensors")
    out = tmp_path / "ms"
    assert main(["convert", str(src), str(out), "--format", fmt, "--max-shard-size", "20KB"]) == 0
    suffix = ".ckpt" if fmt == "ckpt" else ".safetensors"
    shards = sorted(out.glob(f"model-*{suffix}"))
    index = json.loads((out / f"model{suffix}.index.json").read_text())
    assert len(shards) > 3 and not (out / f"model{suffix}").exists()
    assert sorted(set(index["weight_map"].values())) == [p.name for p in shards]
    assert json.loads((out / "conversion.json").read_text())["files"] == [p.name for p in shards]
    for shard in shards:  # each loads with MindSpore on its own
        if fmt == "ckpt" and shard.stat().st_size > 20_000:  # .ckpt shards are sized exactly
            assert len([f for f in index["weight_map"].values() if f == shard.name]) == 1  # alone: too big
        part = ms.load_checkpoint(str(shard), format=fmt)
        assert set(part) == {n for n, f in index["weight_map"].items() if f == shard.name}

    saved = load_checkpoint_dict(out)  # every shard, merged
    state = hf.state_dict()
    assert np.array_equal(saved["model.layers.1.attention.wk.weight"].asnumpy(),
                          torch_to_numpy(state["model.layers.1.self_attn.k_proj.weight"]))
    model, _ = load_model(out)  # streamed into the bundled model, strictly
    max_abs, _ = compare(hf, model, seeded_batch(hf.config.vocab_size))
    assert max_abs <= 1e-5

    from migrate.inspect_ckpt import inspect_checkpoint

    rows = inspect_checkpoint(out)
    assert len(rows) == len(index["weight_map"]) == len(saved)
    assert main(["inspect", str(out / f"model{suffix}.index.json")]) == 0
    assert f"{len(rows)} tensors" in capsys.readouterr().out

    assert main(["export", str(out), str(tmp_path / "back")]) == 0
    from migrate.checkpoints.hf_reader import open_hf_checkpoint

    with open_hf_checkpoint(src) as before, open_hf_checkpoint(tmp_path / "back") as after:
        assert set(before.names()) == set(after.names())
        for name in before.names():
            assert before.read(name).tobytes() == after.read(name).tobytes(), name


def test_crc_and_cast_through_the_pipeline(tmp_path):
    hf = build_hf_model("bias", seed=12)  # fp32 source, converted to bf16 chunk by chunk
    src = save_hf_model(hf, tmp_path / "hf", "sharded_bin")
    result = convert(src, tmp_path / "ms", dtype="bf16", max_shard_size="10KB", crc=True)
    assert len(result.files) > 2 and result.checkpoint.name == "model.ckpt.index.json"
    state = hf.state_dict()
    from migrate.checkpoints.ms_reader import open_ms_checkpoint

    expected = {r["target"]: r["source"] for r in result.records}
    for file in result.files:
        part = ms.load_checkpoint(str(file), crc_check=True)  # MindSpore checks our CRC trailer
        for name, value in part.items():
            want = torch_to_numpy(state[expected[name]].bfloat16())
            assert value.dtype == ms.bfloat16 and value.asnumpy().tobytes() == want.tobytes(), name
    assert len(dict(open_ms_checkpoint(tmp_path / "ms").tensors())) == len(expected)  # our reader checks it too


def test_shard_size_limits(tmp_path):
    hf = build_hf_model("mha", seed=13)
    src = save_hf_model(hf, tmp_path / "hf")
    with pytest.raises(MigrateError, match="over 2 GiB"):
        convert(src, tmp_path / "a", max_shard_size="3GB")
    with pytest.raises(MigrateError, match="cannot read size"):
        convert(src, tmp_path / "b", max_shard_size="lots")
    import migrate.convert as conversion

    conversion_limit = conversion.PROTOBUF_LIMIT
    try:
        conversion.PROTOBUF_LIMIT = 10_000  # as if a tensor were over 2 GiB
        with pytest.raises(MigrateError, match="alone needs .* use --format safetensors"):
            convert(src, tmp_path / "c", max_shard_size="5000")
    finally:
        conversion.PROTOBUF_LIMIT = conversion_limit
    assert not any((tmp_path / n).exists() for n in "abc")
    convert(src, tmp_path / "d", fmt="safetensors", max_shard_size="3GB")  # no such limit there
    assert (tmp_path / "d" / "model.safetensors").is_file()


@pytest.mark.parametrize("side", ["reader", "writer"])
def test_a_failure_mid_stream_leaves_nothing(tmp_path, monkeypatch, side):
    from migrate.checkpoints import ms_ckpt
    from migrate.checkpoints.hf_reader import HFCheckpoint

    hf = build_hf_model("gqa", seed=14)
    src = save_hf_model(hf, tmp_path / "hf", "bin")  # .bin: bytes pass through the reader thread
    calls = []
    if side == "reader":
        original = HFCheckpoint.read_into

        def read_into(self, name, start, out):
            calls.append(name)
            if len(calls) == 7:
                raise MigrateError("disk on fire")
            return original(self, name, start, out)

        monkeypatch.setattr(HFCheckpoint, "read_into", read_into)
    else:
        original = ms_ckpt._TensorStream.write

        def write(self, chunk):
            calls.append(self.name)
            if len(calls) == 7:
                raise OSError(28, "No space left on device")
            return original(self, chunk)

        monkeypatch.setattr(ms_ckpt._TensorStream, "write", write)
    threads = threading.active_count()
    with pytest.raises((MigrateError, OSError), match="disk on fire|No space left"):
        convert(src, tmp_path / "out" / "ms")
    assert len(calls) == 7
    assert threading.active_count() == threads  # the reader and hashing threads are gone
    assert not (tmp_path / "out").exists()  # not even the parent folder the run created


@pytest.mark.parametrize("src, dst", [("float32", "bfloat16"), ("bfloat16", "float16"), ("bfloat16", "float32"),
                                      ("float16", "bfloat16"), ("float32", "float16")])
def test_cast_into_rounds_exactly_like_torch_to(src, dst):
    """The pipeline casts chunk by chunk, in place, in slices: bit for bit what `cast` always
    gave (torch's `.to()` where bf16 is involved, numpy's astype otherwise)."""
    from migrate.checkpoints.dtypes import cast, cast_into, numpy_to_torch, torch_to_numpy

    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    rng = np.random.default_rng(15)
    values = np.concatenate([
        rng.standard_normal(100_000).astype(np.float32) * 10.0 ** rng.integers(-8, 8, 100_000),
        np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 65504, 70000, 3.4e38], np.float32),
    ])
    source = torch_to_numpy(torch.from_numpy(values).to(torch_dtype[src]))
    if src == "float32":
        bits = source.view(np.uint32).copy()
        bits[:5] = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x00000001, 0x80000000]  # NaN payloads, denormals
        source = bits.view(np.float32)
    if "bfloat16" in (src, dst):
        want = torch_to_numpy(numpy_to_torch(source).to(torch_dtype[dst]))
    else:
        with np.errstate(over="ignore"):
            want = source.astype(dst)
    out = np.empty(source.shape, want.dtype)
    with np.errstate(over="ignore"):
        cast_into(source, out)
    assert out.tobytes() == want.tobytes()
    with np.errstate(over="ignore"):
        assert cast(source, want.dtype).tobytes() == want.tobytes()


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_kernel_copy_and_its_fallback_write_the_same_bytes(tmp_path, monkeypatch, fmt):
    from migrate.checkpoints import stream

    hf = build_hf_model("tied", seed=16, dtype=torch.bfloat16)
    src = save_hf_model(hf, tmp_path / "hf", "sharded_safetensors")
    kernel = convert(src, tmp_path / "kernel", fmt=fmt, max_shard_size="30KB")
    monkeypatch.setattr(stream, "_KERNEL_COPY", [False])  # as on a kernel without copy_file_range
    monkeypatch.setattr(stream, "CHUNK_BYTES", 1000)      # and many small chunks through the pool
    fallback = convert(src, tmp_path / "fallback", fmt=fmt, max_shard_size="30KB")
    from migrate.checkpoints.hf_reader import HFCheckpoint

    monkeypatch.setattr(HFCheckpoint, "source", lambda self, name: None)  # every byte through the reader thread
    through_memory = convert(src, tmp_path / "memory", fmt=fmt, max_shard_size="30KB", hash_sources=False)
    assert len(kernel.files) > 1
    for a, b, c in zip(kernel.files, fallback.files, through_memory.files, strict=True):
        assert a.read_bytes() == b.read_bytes() == c.read_bytes()


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_shards_written_side_by_side_are_the_bytes_written_one_after_another(tmp_path, monkeypatch, fmt):
    import migrate.convert as conversion

    hf = build_hf_model("gqa", seed=12)
    src = save_hf_model(hf, tmp_path / "hf", "sharded_safetensors")
    calls, real = [], conversion._shard_writers

    def counted(jobs, shards):
        calls.append(real(jobs, shards))
        return calls[-1]

    monkeypatch.setattr(conversion, "_shard_writers", counted)
    parallel = convert(src, tmp_path / "parallel", fmt=fmt, max_shard_size="20KB")
    monkeypatch.setattr(conversion, "_shard_writers", lambda jobs, shards: 1)
    serial = convert(src, tmp_path / "serial", fmt=fmt, max_shard_size="20KB")
    assert calls[0] > 1 and len(parallel.files) > 3   # the side-by-side path ran
    for a, b in zip(parallel.files, serial.files, strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()
    for name in ("conversion.json", f"model.{fmt}.index.json"):
        first, second = (json.loads((r.out_dir / name).read_text()) for r in (parallel, serial))
        assert first == second, name   # records in tensor order, the same totals
    assert parallel.tensors == serial.tensors and parallel.bytes_written == serial.bytes_written


def test_a_shard_that_fails_leaves_no_output_and_no_thread_writing(tmp_path, monkeypatch):
    import errno

    from migrate.checkpoints import ms_ckpt

    src = save_hf_model(build_hf_model("gqa", seed=12), tmp_path / "hf", "sharded_safetensors")
    real, calls = ms_ckpt.copy_file_range, []

    def failing(src_fd, offset, dst, nbytes):
        calls.append(1)
        if len(calls) == 7:
            raise OSError(errno.EIO, "Input/output error")
        return real(src_fd, offset, dst, nbytes)

    monkeypatch.setattr(ms_ckpt, "copy_file_range", failing)
    with pytest.raises(MigrateError, match="cannot write output .*Input/output error"):
        convert(src, tmp_path / "ms", max_shard_size="20KB")
    assert not (tmp_path / "ms").exists() and [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert not [t for t in threading.enumerate() if t.name.startswith("migrate-shard")]
