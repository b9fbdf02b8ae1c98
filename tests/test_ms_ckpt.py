"""CkptWriter / iter_ckpt / read_ckpt_specs against MindSpore's own save and load."""
from __future__ import annotations

import mindspore as ms
import mindspore.train.serialization as ms_serialization
import numpy as np
import pytest
from mindspore.common.np_dtype import bfloat16

from migrate.checkpoints import ms_ckpt
from migrate.checkpoints.ms_ckpt import CkptWriter, iter_ckpt, read_ckpt_specs
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
        assert got[name].dtype == array.dtype, name
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
