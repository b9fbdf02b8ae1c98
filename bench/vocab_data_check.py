"""`migrate vocab check --data` throughput next to the least any check must do: one pass of
`numpy.bincount` over the same memory-mapped train.npy. Synthetic Zipf-distributed token rows
(no tokenizer); prints both times and their ratio, measured side by side in one run.

    python bench/vocab_data_check.py [--tokens 40000000]"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from migrate.vocab.data_checks import check_data

VOCAB, SEQ = 32000, 2048


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=40_000_000)
    rows = parser.parse_args(argv).tokens // (SEQ + 1)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = np.minimum(rng.zipf(1.2, size=(rows, SEQ + 1)), VOCAB - 1).astype(np.int32)
        np.save(folder / "train.npy", data)
        (folder / "data.json").write_text(json.dumps({"format": "migrate-tokens", "seq_length": SEQ,
                                                      "samples": rows, "eos_token_id": 2}))
        del data
        best_base = best_check = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            mm = np.load(folder / "train.npy", mmap_mode="r")
            np.bincount(np.asarray(mm).ravel(), minlength=VOCAB)
            best_base = min(best_base, time.perf_counter() - start)
            start = time.perf_counter()
            report = check_data(folder, VOCAB, None, {"eos": 2})
            best_check = min(best_check, time.perf_counter() - start)
    n = rows * (SEQ + 1)
    print(f"{n / 1e6:.1f}M tokens ({rows:,} rows of {SEQ + 1})")
    print(f"bincount pass          {best_base:7.2f}s  {n / best_base / 1e6:7.1f}M tokens/s")
    print(f"migrate vocab --data   {best_check:7.2f}s  {n / best_check / 1e6:7.1f}M tokens/s  "
          f"{best_check / best_base:.1f}× the bincount pass")
    print(report.verdict())


if __name__ == "__main__":
    main()
