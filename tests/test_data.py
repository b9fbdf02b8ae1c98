"""Tokenized data: MindRecord and .npy twins hold the same rows; the sample order is fixed."""
import hashlib

import mindspore.dataset as ds
import numpy as np
import pytest
from transformers import AutoTokenizer

from migrate.data.corpus import STDLIB_MODULES, module_text, train_bpe_tokenizer, write_stdlib_corpus
from migrate.data.samples import load_samples, read_meta, run_order, sample_order
from migrate.data.tokenize import tokenize_corpus
from migrate.errors import MigrateError
from migrate.train.config import RunConfig

SEQ = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    files = write_stdlib_corpus(root / "corpus", modules=["textwrap", "heapq", "json"])
    tok = train_bpe_tokenizer(files, 300, root / "tok")
    return root, files, tok


def test_corpus_and_tokenizer_are_deterministic(corpus, tmp_path):
    root, files, tok = corpus
    assert [f.name for f in files] == ["heapq.txt", "json.txt", "textwrap.txt"]
    assert files[1].read_text() == module_text("json") and "JSON (JavaScript Object Notation)" in module_text("json")
    assert write_stdlib_corpus(tmp_path / "again", modules=["json"])[0].read_bytes() == files[1].read_bytes()
    again = train_bpe_tokenizer(reversed(files), 300, tmp_path / "tok")
    assert (again / "tokenizer.json").read_bytes() == (tok / "tokenizer.json").read_bytes()
    loaded = AutoTokenizer.from_pretrained(str(tok), local_files_only=True)
    assert len(loaded) == 300 and (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<s>", "</s>", "<pad>")
    text = "Déjà vu: 'naïve' ≠ “smart” 🙂"  # byte-level: anything round-trips
    assert loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) == text
    with pytest.raises(MigrateError, match="vocab_size must be at least 259"):
        train_bpe_tokenizer(files, 100, tmp_path / "small")


def test_corpus_text_does_not_depend_on_what_else_was_imported(monkeypatch):
    # transformers patches logging.Logger.info_once on import; the demo imported it before or after the corpus.
    import logging

    before = module_text("logging")

    def info_once(self, msg):
        """A foreign method patched onto a standard-library class."""

    monkeypatch.setattr(logging.Logger, "info_once", info_once, raising=False)
    assert module_text("logging") == before


def test_default_corpus_is_a_few_hundred_kb(tmp_path):
    files = write_stdlib_corpus(tmp_path / "c")
    assert len(files) == len(STDLIB_MODULES)
    assert 100_000 < sum(f.stat().st_size for f in files) < 2_000_000


def test_tokenize_writes_twin_files(corpus, tmp_path):
    root, files, tok = corpus
    meta = tokenize_corpus(list(reversed(files)), tok, SEQ, tmp_path / "out")  # order given does not matter
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["data.json", "train.mindrecord", "train.mindrecord.db",
                                                     "train.npy"]
    # Expected rows, rebuilt independently: sorted files, each + EOS, concatenated, cut, tail dropped.
    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    stream = []
    for f in sorted(files):
        stream += tokenizer(f.read_text(), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    n = len(stream) // (SEQ + 1)
    expected = np.asarray(stream[: n * (SEQ + 1)], dtype=np.int32).reshape(n, SEQ + 1)
    rows = load_samples(out, SEQ)
    assert rows.dtype == np.int32 and isinstance(rows, np.memmap)
    np.testing.assert_array_equal(rows, expected)
    assert meta == read_meta(out)
    assert (meta["samples"], meta["tokens"], meta["seq_length"]) == (n, len(stream), SEQ)
    assert meta["tokens_dropped"] == len(stream) - n * (SEQ + 1) < SEQ + 1
    assert [r["sha256"] for r in meta["files"]] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(files)]
    assert meta["tokenizer"]["vocab_size"] == 300 and meta["eos_token_id"] == tokenizer.eos_token_id
    # MindSpore reads the MindRecord back as exactly the npy rows, in order.
    dataset = ds.MindDataset(str(out / "train.mindrecord"), columns_list=["input_ids"], shuffle=False)
    ms_rows = np.stack([row for (row,) in dataset.create_tuple_iterator(output_numpy=True)])
    assert ms_rows.dtype == np.int32
    np.testing.assert_array_equal(ms_rows, rows)


def test_tokenize_bos_and_errors(corpus, tmp_path):
    root, files, tok = corpus
    meta = tokenize_corpus(files[:1], tok, 4, tmp_path / "bos", add_bos=True)
    assert load_samples(tmp_path / "bos")[0, 0] == meta["bos_token_id"] == 0
    with pytest.raises(MigrateError, match="already exists"):
        tokenize_corpus(files, tok, SEQ, tmp_path / "bos")
    tokenize_corpus(files[:1], tok, 8, tmp_path / "bos", overwrite=True)
    assert read_meta(tmp_path / "bos")["seq_length"] == 8
    with pytest.raises(MigrateError, match="fewer than one row"):
        tokenize_corpus(files[:1], tok, 10**7, tmp_path / "huge")
    assert not (tmp_path / "huge").exists() and not list(tmp_path.glob(".huge*"))  # nothing partial left
    with pytest.raises(MigrateError, match="no text file at"):
        tokenize_corpus([tmp_path / "absent.txt"], tok, SEQ, tmp_path / "x")
    with pytest.raises(MigrateError, match="seq_length 8"):
        load_samples(tmp_path / "bos", seq_length=16)
    with pytest.raises(MigrateError, match="no data.json"):
        load_samples(tmp_path)


def test_sample_order():
    plain = sample_order(5, 12, None)
    np.testing.assert_array_equal(plain, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1])
    order = sample_order(7, 20, seed=3)
    for epoch in (order[:7], order[7:14]):
        assert sorted(epoch) == list(range(7))  # each epoch visits every row once
    np.testing.assert_array_equal(order[:7], np.random.default_rng([3, 0]).permutation(7))
    np.testing.assert_array_equal(order[14:], np.random.default_rng([3, 2]).permutation(7)[:6])
    np.testing.assert_array_equal(order, sample_order(7, 20, seed=3))
    assert not np.array_equal(order, sample_order(7, 20, seed=4))
    with pytest.raises(MigrateError):
        sample_order(0, 3, None)


def test_run_order_layout():
    cfg = RunConfig.from_dict({"data": "d", "seq_length": 8, "total_steps": 3, "micro_batch_size": 2,
                               "grad_accum_steps": 2, "data_seed": 9})
    order = run_order(cfg, 5)
    assert order.shape == (3, 2, 2)
    flat = sample_order(5, 12, 9)
    assert order[1, 1].tolist() == flat[(1 * 2 + 1) * 2:][:2].tolist()  # step 1, micro 1
    np.testing.assert_array_equal(order.reshape(-1), flat)
