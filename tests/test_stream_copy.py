"""`stream.copy_file_range`: the kernel copy (offsets page-aligned alike) and the
buffered copy (offsets that are not) write the same bytes at the same place."""
import os

import numpy as np
import pytest

from migrate.checkpoints import stream


@pytest.mark.parametrize("src_offset,dst_offset", [(0, 0), (4096 + 8, 8), (8, 13), (4093, 0)])
def test_copy_lands_every_byte(tmp_path, monkeypatch, src_offset, dst_offset):
    monkeypatch.setattr(stream, "COPY_BUFFER_BYTES", 1000)  # several buffer rounds
    monkeypatch.setattr(stream, "_buffers", type(stream._buffers)())
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
