"""SafetensorsWriter output read back by safetensors (torch, numpy) and MindSpore."""
from __future__ import annotations

import json
import struct

import mindspore as ms
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from migrate.checkpoints.dtypes import bfloat16, canonical, torch_to_numpy
from migrate.checkpoints.ms_safetensors import SafetensorsWriter
from migrate.errors import MigrateError


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "mask": np.array([True, False, True]),                        # 3 bytes: misaligns what follows
        "layer.weight": rng.standard_normal((5, 7)).astype(np.float32),
        "embed": np.array([0x7FC1, 0x8000, 0x0001, 0x3F80, 0xFF80], np.uint16).view(bfloat16),
        "layer.bias": rng.standard_normal(7).astype(np.float16),
        "ids": np.arange(-3, 3, dtype=np.int32),
        "step": np.array(42, np.int64),                               # 0-d scalar
        "bytes": np.arange(5, dtype=np.uint8),
        "signed": np.array([-128, 0, 127], np.int8),
        "double": np.array([1.5, -2.25]),
        "empty": np.zeros((0, 4), np.float32),
    }


def specs_of(tensors):
    return [(name, array.dtype, array.shape) for name, array in tensors.items()]


def write_ours(path, tensors, metadata=None):
    with SafetensorsWriter(path, specs_of(tensors), metadata) as writer:
        for name, array in tensors.items():
            writer.write(name, array)
    return path


def assert_same(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        assert canonical(got[name].dtype) == canonical(array.dtype), name  # MindSpore and ml_dtypes bf16 alike
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name  # bits, so bf16 NaN payloads count


def read_torch(path) -> dict:
    with safe_open(str(path), framework="pt") as handle:
        return {name: torch_to_numpy(handle.get_tensor(name)) for name in handle.keys()}


def test_safe_open_torch_reads_ours(tmp_path):
    tensors = sample_tensors()
    write_ours(tmp_path / "m.safetensors", tensors, {"format": "pt", "note": "ü"})
    assert_same(read_torch(tmp_path / "m.safetensors"), tensors)
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt", "note": "ü"}


def test_safe_open_numpy_reads_ours(tmp_path):
    tensors = {k: v for k, v in sample_tensors().items() if v.dtype != bfloat16}
    write_ours(tmp_path / "m.safetensors", tensors)
    with safe_open(str(tmp_path / "m.safetensors"), framework="numpy") as handle:
        assert_same({name: handle.get_tensor(name) for name in handle.keys()}, tensors)


def test_mindspore_loads_ours(tmp_path):
    tensors = sample_tensors()
    write_ours(tmp_path / "m.safetensors", tensors)
    loaded = ms.load_checkpoint(str(tmp_path / "m.safetensors"), format="safetensors")
    assert_same({k: v.asnumpy() for k, v in loaded.items()}, tensors)
    assert loaded["embed"].dtype == ms.bfloat16


def to_torch(array: np.ndarray) -> torch.Tensor:
    if array.dtype == bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def test_same_content_as_safetensors_save_file(tmp_path):
    tensors = sample_tensors()
    save_file({k: to_torch(v) for k, v in tensors.items()}, str(tmp_path / "ref.safetensors"),
              metadata={"format": "pt"})
    write_ours(tmp_path / "ours.safetensors", tensors, {"format": "pt"})
    assert_same(read_torch(tmp_path / "ours.safetensors"), read_torch(tmp_path / "ref.safetensors"))
    ours, ref = header(tmp_path / "ours.safetensors"), header(tmp_path / "ref.safetensors")
    assert {k: (v["dtype"], v["shape"]) for k, v in ours.items() if k != "__metadata__"} == \
        {k: (v["dtype"], v["shape"]) for k, v in ref.items() if k != "__metadata__"}


def header(path) -> dict:
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size])


def test_layout_follows_spec(tmp_path):
    tensors = sample_tensors()
    path = write_ours(tmp_path / "m.safetensors", tensors, {"k": "v"})
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    assert size % 8 == 0 and data[8:8 + size].rstrip(b" ").endswith(b"}")  # space padding
    head = json.loads(data[8:8 + size])
    assert head.pop("__metadata__") == {"k": "v"}
    spans = sorted(tuple(v["data_offsets"]) for v in head.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data) - 8 - size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # no holes, no overlaps
    for name, info in head.items():  # every tensor aligned to its item size
        assert info["data_offsets"][0] % tensors[name].dtype.itemsize == 0, name


def test_non_contiguous_input(tmp_path):
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensors = {"t": base.T, "s": base[:, ::2]}
    write_ours(tmp_path / "m.safetensors", tensors)
    got = read_torch(tmp_path / "m.safetensors")
    assert np.array_equal(got["t"], base.T) and np.array_equal(got["s"], base[:, ::2])


@pytest.mark.parametrize("name, array, match", [
    ("b", np.zeros(2, np.float32), "expected tensor a next"),
    ("a", np.zeros(2, np.float16), "specs say float32"),
    ("a", np.zeros(3, np.float32), "specs say float32"),
])
def test_write_checks_order_dtype_shape(tmp_path, name, array, match):
    specs = [("a", np.float32, (2,)), ("b", np.float32, (2,))]
    with pytest.raises(MigrateError, match=match):
        with SafetensorsWriter(tmp_path / "m.safetensors", specs) as writer:
            writer.write(name, array)
    assert not (tmp_path / "m.safetensors").exists()


def test_close_requires_every_spec(tmp_path):
    writer = SafetensorsWriter(tmp_path / "m.safetensors", [("a", np.float32, (2,)), ("b", np.int8, (1,))])
    writer.write("a", np.zeros(2, np.float32))
    with pytest.raises(MigrateError, match="1 tensors never written, first b"):
        writer.close()
    assert not (tmp_path / "m.safetensors").exists()


def test_bad_specs(tmp_path):
    with pytest.raises(MigrateError, match="duplicated"):
        SafetensorsWriter(tmp_path / "m.safetensors", [("a", np.float32, (1,)), ("a", np.float32, (1,))])
    with pytest.raises(MigrateError, match="complex64"):
        SafetensorsWriter(tmp_path / "m.safetensors", [("c", np.complex64, (1,))])
    with pytest.raises(MigrateError, match="strings"):
        SafetensorsWriter(tmp_path / "m.safetensors", [], {"n": 1})
    assert not (tmp_path / "m.safetensors").exists()


def test_torch_bf16_round_trip(tmp_path):
    source = torch.randn(4, 3).to(torch.bfloat16)
    array = torch_to_numpy(source)
    write_ours(tmp_path / "m.safetensors", {"w": array})
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("w"), source)


# ---------------------------------------------------------------- streaming writer, explicit-read reader
def test_streamed_chunks_and_kernel_copy_equal_write(tmp_path):
    import os

    tensors = sample_tensors()
    write_ours(tmp_path / "whole.safetensors", tensors)
    with SafetensorsWriter(tmp_path / "chunks.safetensors", specs_of(tensors)) as writer:
        for name, array in tensors.items():
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            with writer.open_tensor(name, array.dtype, array.shape) as stream:
                for start in range(0, raw.size, 3):
                    stream.write(raw[start:start + 3])
    assert (tmp_path / "chunks.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()

    source = tmp_path / "source.bin"
    source.write_bytes(b"hdr" + b"".join(a.tobytes() for a in tensors.values()))
    offsets, at = {}, 3
    for name, array in tensors.items():
        offsets[name], at = at, at + array.nbytes
    fd = os.open(source, os.O_RDONLY)
    try:
        with SafetensorsWriter(tmp_path / "copied.safetensors", specs_of(tensors)) as writer:
            for name, array in tensors.items():
                with writer.open_tensor(name, array.dtype, array.shape) as stream:
                    assert stream.copy_from(fd, offsets[name])
    finally:
        os.close(fd)
    assert (tmp_path / "copied.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()


def test_stream_checks_sizes(tmp_path):
    with pytest.raises(MigrateError, match="got 4 of its 8 bytes"):
        with SafetensorsWriter(tmp_path / "m.safetensors", [("a", np.float32, (2,))]) as writer:
            with writer.open_tensor("a", np.float32, (2,)) as stream:
                stream.write(b"x" * 4)
    assert not (tmp_path / "m.safetensors").exists()
    writer = SafetensorsWriter(tmp_path / "m.safetensors", [("a", np.float32, (2,))])
    writer.open_tensor("a", np.float32, (2,)).write(b"x" * 4)
    with pytest.raises(MigrateError, match="never written, first a"):
        writer.close()
    assert not (tmp_path / "m.safetensors").exists()


def test_reader_reads_save_file_output(tmp_path):
    from migrate.checkpoints.safetensors_file import SafetensorsFile

    tensors = sample_tensors()
    save_file({k: to_torch(v) for k, v in tensors.items()}, str(tmp_path / "ref.safetensors"),
              metadata={"format": "pt"})
    with SafetensorsFile(tmp_path / "ref.safetensors") as handle:
        assert handle.metadata == {"format": "pt"}
        assert_same({name: handle.read(name) for name in handle.entries}, tensors)
        offsets = [e.offset for e in handle.entries.values()]
        assert offsets == sorted(offsets)  # file order
        w = tensors["layer.weight"].reshape(-1).view(np.uint8)
        part = np.empty(50, np.uint8)
        handle.read_into("layer.weight", 17, part)  # any byte range
        assert part.tobytes() == w[17:67].tobytes()
        with pytest.raises(MigrateError, match="past the end"):
            handle.read_into("layer.weight", w.size - 10, part)


@pytest.mark.parametrize("damage, match", [
    (lambda d: d[:7], "shorter than"),
    (lambda d: struct.pack("<Q", 10**12) + d[8:], "does not fit the file"),
    (lambda d: d[:8] + b"[" + d[9:], "not JSON"),
    (lambda d: d[:-1], "past the end of the file"),
])
def test_reader_refuses_corrupt_files(tmp_path, damage, match):
    from migrate.checkpoints.safetensors_file import SafetensorsFile

    data = write_ours(tmp_path / "m.safetensors", sample_tensors()).read_bytes()
    (tmp_path / "bad.safetensors").write_bytes(damage(data))
    with pytest.raises(MigrateError, match=f"corrupt safetensors file bad.safetensors: .*{match}"):
        SafetensorsFile(tmp_path / "bad.safetensors")


def test_reader_checks_sizes_and_overlaps(tmp_path):
    from migrate.checkpoints.safetensors_file import SafetensorsFile

    def file_with(header: dict, data: bytes = b"\0" * 16):
        blob = json.dumps(header).encode()
        (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + data)
        return tmp_path / "h.safetensors"

    with pytest.raises(MigrateError, match="do not fit shape"):
        SafetensorsFile(file_with({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}))
    with pytest.raises(MigrateError, match="overlap"):
        SafetensorsFile(file_with({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}))
    with pytest.raises(MigrateError, match="bad header entry"):
        SafetensorsFile(file_with({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}))
