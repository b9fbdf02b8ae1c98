"""`stream.copy_file_range`: the kernel's copy writes the same bytes at the same place whether the two
offsets are page-aligned alike or not, after what the buffered writer still held."""
import os

import numpy as np
import pytest

from migrate.checkpoints import stream


@pytest.mark.parametrize("src_offset,dst_offset", [(0, 0), (4096 + 8, 8), (8, 13), (4093, 0)])
def test_copy_lands_every_byte(tmp_path, src_offset, dst_offset):
    payload = np.random.default_rng(0).integers(0, 256, 10_000, np.uint8).tobytes()
    src = tmp_path / "src"
    src.write_bytes(b"s" * src_offset + payload + b"tail")
    fd = os.open(src, os.O_RDONLY)
    try:
        with open(tmp_path / "dst", "wb") as dst:
            dst.write(b"h" * dst_offset)  # still in the write buffer: the copy must flush it first
            assert stream.copy_file_range(fd, src_offset, dst, len(payload))
            dst.write(b"after")
    finally:
        os.close(fd)
    assert (tmp_path / "dst").read_bytes() == b"h" * dst_offset + payload + b"after"


def test_a_refused_copy_leaves_the_next_one_to_the_kernel(tmp_path, monkeypatch):
    """One pair of files the kernel will not copy between (another filesystem: EXDEV) falls back for that
    copy alone: the process's next copy between two files on one filesystem goes through the kernel again."""
    import errno

    real = os.copy_file_range
    calls = []

    def refusing_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", refusing_once)
    (tmp_path / "src").write_bytes(b"0123456789")
    fd = os.open(tmp_path / "src", os.O_RDONLY)
    try:
        with open(tmp_path / "a", "wb") as a:
            assert stream.copy_file_range(fd, 0, a, 10) is False and a.tell() == 0
        with open(tmp_path / "b", "wb") as b:
            assert stream.copy_file_range(fd, 2, b, 8) is True
    finally:
        os.close(fd)
    assert (tmp_path / "b").read_bytes() == b"23456789" and len(calls) == 2
