"""CkptWriter / iter_ckpt / read_ckpt_specs against MindSpore's own save and load."""
from __future__ import annotations

import os

import mindspore as ms
import mindspore.train.serialization as ms_serialization
import numpy as np
import pytest

from migrate.checkpoints import ms_ckpt
from migrate.checkpoints.dtypes import bfloat16, canonical
from migrate.checkpoints.ms_ckpt import CkptWriter, iter_ckpt, read_ckpt_specs
from migrate.checkpoints.ms_reader import open_ms_checkpoint
from migrate.errors import MigrateError


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "layer.weight": rng.standard_normal((5, 7)).astype(np.float32),
        "layer.bias": rng.standard_normal(7).astype(np.float16),
        # bf16 bit patterns no fp32 round trip would keep (NaN payloads, -0, denormals).
        "embed": np.array([0x7FC1, 0x8000, 0x0001, 0x3F80, 0xFF80, 0x1234], np.uint16).view(bfloat16).reshape(2, 3),
        "ids": np.arange(-3, 3, dtype=np.int32),
        "step": np.array(42, np.int32),  # 0-d scalar
        "big_ids": np.array([2**40, -1], np.int64),
        "mask": np.array([[True, False], [False, True]]),
        "bytes": np.arange(5, dtype=np.uint8),
        "signed": np.array([-128, 0, 127], np.int8),
        "double": np.array([1.5, -2.25]),
        "über.weight": np.ones((1, 2), np.float32),  # non-ASCII name
    }


def write_ours(path, tensors, crc=False):
    with CkptWriter(path, crc=crc) as writer:
        for name, array in tensors.items():
            writer.write(name, array)
    return path


def assert_same(got: dict, want: dict):
    assert list(got) == list(want)
    for name, array in want.items():
        assert canonical(got[name].dtype) == canonical(array.dtype), name  # MindSpore and ml_dtypes bf16 alike
        assert got[name].shape == array.shape, name
        # Compare bits, so bf16 NaN payloads and -0 count.
        assert got[name].tobytes() == array.tobytes(), name


def ms_load(path, crc=False) -> dict:
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path), crc_check=crc).items()}


@pytest.mark.parametrize("crc", [False, True])
def test_bytes_match_save_checkpoint(tmp_path, crc):
    tensors = sample_tensors()
    ms.save_checkpoint(dict(tensors), str(tmp_path / "ms.ckpt"), crc_check=crc)
    write_ours(tmp_path / "ours.ckpt", tensors, crc=crc)
    assert (tmp_path / "ours.ckpt").read_bytes() == (tmp_path / "ms.ckpt").read_bytes()


@pytest.mark.parametrize("crc", [False, True])
def test_multi_piece_bytes_match(tmp_path, monkeypatch, crc):
    monkeypatch.setattr(ms_ckpt, "PIECE_BYTES", 4096)
    monkeypatch.setattr(ms_serialization, "SLICE_SIZE", 4)  # KiB, so the same 4096 bytes
    rng = np.random.default_rng(1)
    tensors = {
        "a": rng.standard_normal((100, 37)).astype(np.float32),     # 14800 B: 4 pieces
        "exact": rng.standard_normal(2048).astype(np.float32),     # 8192 B: exactly 2 pieces
        "b": rng.standard_normal((3001,)).astype(np.float32).astype(bfloat16),  # 6002 B: 2 pieces
        "small": np.ones(3, np.float16),
    }
    ms.save_checkpoint(dict(tensors), str(tmp_path / "ms.ckpt"), crc_check=crc)
    write_ours(tmp_path / "ours.ckpt", tensors, crc=crc)
    data = (tmp_path / "ours.ckpt").read_bytes()
    assert data == (tmp_path / "ms.ckpt").read_bytes()
    assert data.count(b"\x12\x07Float32") == 4 + 2  # the pieces really are separate records
    assert_same(dict(iter_ckpt(tmp_path / "ours.ckpt")), tensors)
    assert_same(ms_load(tmp_path / "ours.ckpt", crc), tensors)
    assert read_ckpt_specs(tmp_path / "ours.ckpt") == [
        ("a", "Float32", (100, 37)), ("exact", "Float32", (2048,)), ("b", "BFloat16", (3001,)),
        ("small", "Float16", (3,))]


@pytest.mark.parametrize("crc", [False, True])
def test_mindspore_loads_ours(tmp_path, crc):
    tensors = sample_tensors()
    write_ours(tmp_path / "ours.ckpt", tensors, crc=crc)
    assert_same(ms_load(tmp_path / "ours.ckpt", crc), tensors)


@pytest.mark.parametrize("crc", [False, True])
def test_iter_reads_mindspore_files(tmp_path, crc):
    tensors = sample_tensors()
    ms.save_checkpoint(dict(tensors), str(tmp_path / "ms.ckpt"), crc_check=crc)
    assert_same(dict(iter_ckpt(tmp_path / "ms.ckpt")), tensors)


def test_specs(tmp_path):
    tensors = sample_tensors()
    write_ours(tmp_path / "ours.ckpt", tensors, crc=True)
    specs = read_ckpt_specs(tmp_path / "ours.ckpt")
    assert [(n, s) for n, _, s in specs] == [(n, a.shape) for n, a in tensors.items()]
    assert [t for _, t, _ in specs] == ["Float32", "Float16", "BFloat16", "Int32", "Int32", "Int64",
                                        "Bool", "UInt8", "Int8", "Float64", "Float32"]


def test_empty_tensor_is_kept(tmp_path):
    # MindSpore's writer drops empty tensors (no piece at all); ours keeps one empty record.
    tensors = {"empty": np.zeros((0, 4), np.float32), "w": np.ones(2, np.float32)}
    ms.save_checkpoint(dict(tensors), str(tmp_path / "ms.ckpt"))
    assert list(ms_load(tmp_path / "ms.ckpt")) == ["w"]
    write_ours(tmp_path / "ours.ckpt", tensors)
    assert_same(ms_load(tmp_path / "ours.ckpt"), tensors)
    assert_same(dict(iter_ckpt(tmp_path / "ours.ckpt")), tensors)
    assert read_ckpt_specs(tmp_path / "ours.ckpt")[0] == ("empty", "Float32", (0, 4))


def test_non_contiguous_input(tmp_path):
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_ours(tmp_path / "t.ckpt", {"t": base.T, "s": base[:, ::2]})
    got = dict(iter_ckpt(tmp_path / "t.ckpt"))
    assert np.array_equal(got["t"], base.T) and np.array_equal(got["s"], base[:, ::2])


def test_writer_rejects_bad_input(tmp_path):
    with pytest.raises(MigrateError, match="complex64"):
        with CkptWriter(tmp_path / "x.ckpt") as writer:
            writer.write("c", np.zeros(2, np.complex64))
    assert not (tmp_path / "x.ckpt").exists()  # a failed write leaves no file behind
    with pytest.raises(MigrateError, match="twice"):
        with CkptWriter(tmp_path / "y.ckpt") as writer:
            writer.write("a", np.zeros(2, np.float32))
            writer.write("a", np.zeros(2, np.float32))


def ckpt_bytes(folder, tensors, crc=False) -> bytes:
    path = write_ours(folder / "scratch.ckpt", tensors, crc)
    return path.read_bytes()


def record_ends(folder, tensors) -> set[int]:
    """Byte offsets where records end: file sizes after 0, 1, 2, ... tensors."""
    names = list(tensors)
    return {len(ckpt_bytes(folder, {n: tensors[n] for n in names[:k]})) for k in range(len(names) + 1)}


def test_truncated_files_raise(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32), "s": np.array(1, np.int64), "b": np.ones(3, bfloat16)}
    data = ckpt_bytes(tmp_path, tensors)
    ends = record_ends(tmp_path, tensors)
    path = tmp_path / "cut.ckpt"
    for cut in range(len(data)):
        if cut in ends:
            continue  # a cut between records is a valid, shorter checkpoint (only a CRC could tell)
        path.write_bytes(data[:cut])
        with pytest.raises(MigrateError, match="corrupt or truncated"):
            read_ckpt_specs(path)
        with pytest.raises(MigrateError, match="corrupt or truncated"):
            list(iter_ckpt(path))
    with_crc = ckpt_bytes(tmp_path, tensors, crc=True)
    for cut in range(len(data) + 1, len(with_crc)):  # cut inside the CRC trailer
        path.write_bytes(with_crc[:cut])
        with pytest.raises(MigrateError):
            list(iter_ckpt(path))


def test_crc_mismatch_raises(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float16)}
    data = bytearray(ckpt_bytes(tmp_path, tensors, crc=True))
    data[data.index(b"Float32") + 12] ^= 1  # one bit of tensor content
    path = tmp_path / "bad.ckpt"
    path.write_bytes(bytes(data))
    with pytest.raises(MigrateError, match="CRC mismatch"):
        list(iter_ckpt(path))
    with pytest.raises(ValueError):  # MindSpore agrees the file is damaged
        ms.load_checkpoint(str(path), crc_check=True)
    # Without a CRC the flipped bit goes unnoticed by both; with one, it is caught.
    assert read_ckpt_specs(path)[0] == ("a", "Float32", (6,))


def test_corrupt_header_raises(tmp_path):
    data = bytearray(ckpt_bytes(tmp_path, {"a": np.arange(6, dtype=np.float32)}))
    path = tmp_path / "bad.ckpt"
    for index, value in [(0, 0x0B), (1, 0x7F), (data.index(b"Float32") - 1, 0x12)]:
        broken = bytearray(data)
        broken[index] = value
        path.write_bytes(bytes(broken))
        with pytest.raises(MigrateError, match="corrupt or truncated"):
            list(iter_ckpt(path))
        with pytest.raises(MigrateError, match="corrupt or truncated"):
            read_ckpt_specs(path)
    with pytest.raises(MigrateError, match="cannot read"):
        read_ckpt_specs(tmp_path / "missing.ckpt")


def test_iter_is_lazy(tmp_path):
    data = ckpt_bytes(tmp_path, {"a": np.arange(6, dtype=np.float32)})
    path = tmp_path / "tail.ckpt"
    path.write_bytes(data + b"\x0a\x7f garbage")
    tensors = iter_ckpt(path)
    name, array = next(tensors)  # the good first tensor arrives before the bad tail is read
    assert name == "a" and np.array_equal(array, np.arange(6, dtype=np.float32))
    with pytest.raises(MigrateError, match="corrupt or truncated"):
        next(tensors)


# ---------------------------------------------------------------- streaming, kernel copy, shards
def stream_ours(path, tensors, chunk, crc=False):
    """Each tensor fed to `open_tensor` in byte chunks of `chunk` (cut anywhere, even mid-element)."""
    with CkptWriter(path, crc=crc) as writer:
        for name, array in tensors.items():
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            with writer.open_tensor(name, array.dtype, array.shape) as stream:
                for start in range(0, raw.size, chunk):
                    stream.write(raw[start:start + chunk])
    return path


def float_tensors():
    rng = np.random.default_rng(2)
    return {
        "w32": rng.standard_normal((100, 37)).astype(np.float32),              # 14800 B
        "w16": rng.standard_normal((3000,)).astype(np.float16),                # 6000 B
        "wbf": np.arange(5000, dtype=np.uint16).view(bfloat16).reshape(50, 100),  # 10000 B, odd bit patterns
        "exact": rng.standard_normal(2048).astype(np.float32),                  # 8192 B: 2 whole pieces
        "scalar": np.array(1.5, np.float32),
        "small": np.ones(3, np.float16),
    }


@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("chunk", [1, 333, 4096, 1 << 20])
def test_streamed_chunks_match_save_checkpoint(tmp_path, monkeypatch, crc, chunk):
    monkeypatch.setattr(ms_ckpt, "PIECE_BYTES", 4096)
    monkeypatch.setattr(ms_serialization, "SLICE_SIZE", 4)
    tensors = float_tensors()
    ms.save_checkpoint(dict(tensors), str(tmp_path / "ms.ckpt"), crc_check=crc)
    stream_ours(tmp_path / "ours.ckpt", tensors, chunk, crc)
    assert (tmp_path / "ours.ckpt").read_bytes() == (tmp_path / "ms.ckpt").read_bytes()
    assert_same(ms_load(tmp_path / "ours.ckpt", crc), tensors)


def test_record_bytes_is_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(ms_ckpt, "PIECE_BYTES", 4096)
    for name, array in {**float_tensors(), **sample_tensors()}.items():
        path = write_ours(tmp_path / "one.ckpt", {name: array})
        assert ms_ckpt.record_bytes(name, array.dtype, array.shape) == path.stat().st_size, name
    path = write_ours(tmp_path / "all.ckpt", float_tensors(), crc=True)
    with CkptWriter(tmp_path / "again.ckpt", crc=True) as writer:
        for name, array in float_tensors().items():
            writer.write(name, array)
    assert writer.bytes_written == path.stat().st_size


@pytest.mark.parametrize("pieces", [False, True])
def test_kernel_copy_matches_save_checkpoint(tmp_path, monkeypatch, pieces):
    if pieces:
        monkeypatch.setattr(ms_ckpt, "PIECE_BYTES", 4096)
        monkeypatch.setattr(ms_serialization, "SLICE_SIZE", 4)
    tensors = float_tensors()
    # A source file holding the raw bytes at odd offsets, as a safetensors shard would.
    source, offsets, blob = tmp_path / "source.bin", {}, bytearray(b"x" * 7)
    for name, array in tensors.items():
        offsets[name] = len(blob)
        blob += array.tobytes() + b"pad"
    source.write_bytes(bytes(blob))
    fd = os.open(source, os.O_RDONLY)
    try:
        with CkptWriter(tmp_path / "ours.ckpt") as writer:
            for name, array in tensors.items():
                with writer.open_tensor(name, array.dtype, array.shape) as stream:
                    assert stream.copy_from(fd, offsets[name])
        with CkptWriter(tmp_path / "crc.ckpt", crc=True) as writer:  # a CRC needs the bytes: refused
            stream = writer.open_tensor("w32", np.float32, (100, 37))
            assert not stream.copy_from(fd, offsets["w32"])
            stream.write(tensors["w32"].reshape(-1).view(np.uint8))
            stream.close()
    finally:
        os.close(fd)
    ms.save_checkpoint(dict(tensors), str(tmp_path / "ms.ckpt"))
    assert (tmp_path / "ours.ckpt").read_bytes() == (tmp_path / "ms.ckpt").read_bytes()
    assert_same(ms_load(tmp_path / "crc.ckpt", crc=True), {"w32": tensors["w32"]})


def test_stream_checks_sizes(tmp_path):
    with pytest.raises(MigrateError, match="more than its 8 bytes"):
        with CkptWriter(tmp_path / "a.ckpt") as writer:
            writer.open_tensor("a", np.float32, (2,)).write(b"x" * 12)
    assert not (tmp_path / "a.ckpt").exists()
    with pytest.raises(MigrateError, match="got 4 of its 8 bytes"):
        with CkptWriter(tmp_path / "b.ckpt") as writer:
            with writer.open_tensor("a", np.float32, (2,)) as stream:
                stream.write(b"x" * 4)
    assert not (tmp_path / "b.ckpt").exists()
    writer = CkptWriter(tmp_path / "c.ckpt")
    writer.open_tensor("a", np.float32, (2,)).write(b"x" * 4)
    with pytest.raises(MigrateError, match="left incomplete"):
        writer.close()
    assert not (tmp_path / "c.ckpt").exists()


def test_parse_size():
    from migrate.checkpoints.sharding import parse_size

    assert parse_size("1.9GB") == 1_900_000_000
    assert parse_size("2GiB") == 2**31
    assert parse_size("500MB") == 500_000_000
    assert parse_size("64kib") == 65536
    assert parse_size("4096") == 4096 and parse_size(4096) == 4096 and parse_size("10 B") == 10
    for bad in ("", "GB", "1.9 parsecs", "-1GB", "0", 0):
        with pytest.raises(MigrateError):
            parse_size(bad)


def test_plan_shards():
    from migrate.checkpoints.sharding import plan_shards

    sizes = [("a", 40), ("b", 40), ("c", 30), ("big", 500), ("d", 10)]
    assert plan_shards(sizes, 100) == [["a", "b"], ["c"], ["big"], ["d"]]
    assert plan_shards(sizes, 100, fixed=20) == [["a", "b"], ["c"], ["big"], ["d"]]
    assert plan_shards(sizes, 110) == [["a", "b", "c"], ["big"], ["d"]]
    assert plan_shards(sizes, None) == [["a", "b", "c", "big", "d"]]


def test_balanced_shards_cut_as_many_shards_into_equal_shares():
    from migrate.checkpoints.sharding import plan_balanced_shards, plan_shards

    sizes = [(f"t{i}", 10) for i in range(21)]           # greedy at 190: 190 + 20
    assert [len(s) for s in plan_shards(sizes, 190)] == [19, 2]
    assert [len(s) for s in plan_balanced_shards(sizes, 190)] == [11, 10]
    assert plan_balanced_shards(sizes, None) == plan_shards(sizes, None)
    assert plan_balanced_shards(sizes[:5], 190) == [[name for name, _ in sizes[:5]]]
    # equal shares would put a shard over the bound: the greedy plan stands
    lopsided = [("a", 10), ("b", 100), ("c", 100)]
    assert plan_balanced_shards(lopsided, 110) == plan_shards(lopsided, 110)
    with_trailer = plan_balanced_shards(sizes, 190, fixed=8)
    assert len(with_trailer) == len(plan_shards(sizes, 190, fixed=8))
    assert all(8 + 10 * len(shard) <= 190 for shard in with_trailer)


def write_sharded(folder, tensors, max_bytes, crc=False):
    from migrate.checkpoints.sharding import ShardedWriter, plan_shards

    sizes = [(n, ms_ckpt.record_bytes(n, a.dtype, a.shape)) for n, a in tensors.items()]
    shards = plan_shards(sizes, max_bytes, fixed=ms_ckpt.CRC_TRAILER if crc else 0)
    with ShardedWriter(folder, "ckpt", shards, lambda path, names: CkptWriter(path, crc=crc), {"producer": "t"}) as w:
        for name, array in tensors.items():
            with w.open_tensor(name, array.dtype, array.shape) as stream:
                stream.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return w


@pytest.mark.parametrize("crc", [False, True])
def test_sharded_ckpt_and_index(tmp_path, crc):
    import json

    from migrate.checkpoints.ms_reader import open_ms_checkpoint

    tensors = float_tensors()
    writer = write_sharded(tmp_path, tensors, 16000, crc)
    files = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert files == writer.files and len(files) >= 3
    assert files[0] == f"model-00001-of-{len(files):05d}.ckpt"
    assert all((tmp_path / f).stat().st_size <= 16000 for f in files if len(writer.shards[files.index(f)]) > 1)
    index = json.loads((tmp_path / "model.ckpt.index.json").read_text())
    assert index["metadata"]["format"] == "ckpt"
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    assert set(index["weight_map"]) == set(tensors) and set(index["weight_map"].values()) == set(files)
    merged = {}
    for file in files:  # every shard is a checkpoint MindSpore reads on its own
        part = ms_load(tmp_path / file, crc)
        assert set(part) == {n for n, f in index["weight_map"].items() if f == file}
        merged.update(part)
    assert_same({n: merged[n] for n in tensors}, tensors)
    ckpt = open_ms_checkpoint(tmp_path)  # the folder, through the index
    assert ckpt.sharded and ckpt.format == "ckpt" and list(ckpt.specs) == list(tensors)
    assert_same(dict(ckpt.tensors()), tensors)
    assert open_ms_checkpoint(tmp_path / "model.ckpt.index.json").specs == ckpt.specs


def test_one_shard_is_a_plain_model_ckpt(tmp_path):
    writer = write_sharded(tmp_path, float_tensors(), None)
    assert writer.files == ["model.ckpt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_bad_index_is_refused(tmp_path):
    import json

    from migrate.checkpoints.ms_reader import open_ms_checkpoint

    write_sharded(tmp_path, float_tensors(), 16000)
    index_path = tmp_path / "model.ckpt.index.json"
    good = json.loads(index_path.read_text())

    def refused(index, match):
        index_path.write_text(json.dumps(index) if not isinstance(index, str) else index)
        with pytest.raises(MigrateError, match=match):
            open_ms_checkpoint(tmp_path)

    name = next(iter(good["weight_map"]))
    (tmp_path.parent / "outside.ckpt").write_bytes(b"")
    refused({**good, "weight_map": {**good["weight_map"], name: "../outside.ckpt"}},
            "names a file outside the checkpoint folder")
    refused({**good, "weight_map": {**good["weight_map"], name: "model-00099-of-00099.ckpt"}}, "missing shard")
    files = list(good["weight_map"].values())
    shared = next(n for n, f in good["weight_map"].items() if files.count(f) > 1)  # its file stays named
    other = next(f for f in files if f != good["weight_map"][shared])
    refused({**good, "weight_map": {**good["weight_map"], shared: other}}, "does not place there")
    refused({**good, "weight_map": {**good["weight_map"], "ghost": other}}, "absent from their shards")
    refused("{not json", "corrupt index")
    refused({"weight_map": []}, "corrupt index")


@pytest.mark.parametrize("crc", [False, True])
def test_entries_give_the_bytes_where_they_lie_and_every_tensor_as_read(tmp_path, monkeypatch, crc):
    """`MSCheckpoint.entries` (what `migrate export` copies file to file): a one-piece tensor's
    (fd, offset) holds exactly its bytes, a multi-piece tensor has none, and a file with a CRC gives
    none at all (only a read of every record checks it); every tensor reads back as iter_ckpt's."""
    monkeypatch.setattr(ms_ckpt, "PIECE_BYTES", 4096)
    rng = np.random.default_rng(2)
    tensors = {"split": rng.standard_normal((100, 37)).astype(np.float32),   # 4 pieces
               "whole": rng.standard_normal((30, 7)).astype(np.float32).astype(bfloat16),
               "tiny": np.arange(5, dtype=np.int64)}
    write_ours(tmp_path / "model.ckpt", tensors, crc=crc)
    seen = {}
    for name, raw, read in open_ms_checkpoint(tmp_path).entries():
        array = read()
        seen[name] = array
        if crc or name == "split":
            assert raw is None, name
        else:
            fd, offset = raw
            assert os.pread(fd, array.nbytes, offset) == array.tobytes(), name
    assert list(seen) == list(tensors)
    assert_same(seen, tensors)


def test_a_refusal_after_the_first_piece_is_an_error_not_a_headered_hole(tmp_path, monkeypatch):
    """The first piece refused: nothing written, the caller writes the bytes. A later one refused (its header
    already out, the pieces before it copied): an error, never a record whose bytes are missing."""
    monkeypatch.setattr(ms_ckpt, "PIECE_BYTES", 4096)  # w32's 14,800 bytes in four pieces
    array = float_tensors()["w32"]
    source = tmp_path / "source.bin"
    source.write_bytes(array.tobytes())
    fd = os.open(source, os.O_RDONLY)
    try:
        monkeypatch.setattr(ms_ckpt, "copy_file_range", lambda *args: False)
        with CkptWriter(tmp_path / "first.ckpt") as writer:
            stream = writer.open_tensor("w32", array.dtype, array.shape)
            assert not stream.copy_from(fd, 0) and stream.written == 0
            stream.write(array.reshape(-1).view(np.uint8))
            stream.close()
        answers = iter([True, False])
        monkeypatch.setattr(ms_ckpt, "copy_file_range", lambda *args: next(answers))
        stream = CkptWriter(tmp_path / "later.ckpt").open_tensor("w32", array.dtype, array.shape)
        with pytest.raises(MigrateError, match="refused to copy piece 1 of tensor w32"):
            stream.copy_from(fd, 0)
    finally:
        os.close(fd)
    assert_same(ms_load(tmp_path / "first.ckpt"), {"w32": array})
