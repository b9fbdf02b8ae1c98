"""`migrate data tokenize` from the command line."""
import numpy as np

from migrate.cli import main


def test_data_tokenize_cli(tmp_path, capsys):
    from migrate.data.corpus import train_bpe_tokenizer

    docs = []
    for i in range(3):
        doc = tmp_path / f"doc{i}.txt"
        doc.write_text(f"Document {i}. " + "The quick brown fox jumps over the lazy dog. " * 30)
        docs.append(doc)
    train_bpe_tokenizer(docs, 300, tmp_path / "tok")
    code = main(["data", "tokenize", *map(str, docs), "--tokenizer", str(tmp_path / "tok"),
                 "--seq-length", "16", "--out", str(tmp_path / "data")])
    assert code == 0
    rows = np.load(tmp_path / "data" / "train.npy")
    assert rows.shape[1] == 17 and rows.shape[0] > 10
    assert (tmp_path / "data" / "train.mindrecord").is_file()
    assert "tokenized 3 files" in capsys.readouterr().out


def test_data_tokenize_missing_file_is_one_line(tmp_path, capsys):
    (tmp_path / "tok").mkdir()  # beside the output: an output inside its tokenizer folder is refused first
    code = main(["data", "tokenize", str(tmp_path / "none.txt"), "--tokenizer", str(tmp_path / "tok"),
                 "--seq-length", "8", "--out", str(tmp_path / "d")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"migrate: error: no text file at {tmp_path / 'none.txt'}"
    assert not (tmp_path / "d").exists()


def test_compare_cli_exit_codes(tmp_path, capsys):
    import json

    def write(path, losses, lrs):
        path.write_text("".join(json.dumps({"step": i + 1, "loss": loss, "lr": lr, "grad_norm": 1.0,
                                            "tokens": 64 * (i + 1), "time": 0.1 * i}) + "\n"
                                for i, (loss, lr) in enumerate(zip(losses, lrs, strict=True))))
        return path

    losses = [5.0 - 0.01 * i for i in range(30)]
    lrs = [1e-3 * min(1.0, (i + 1) / 5) for i in range(30)]
    golden = write(tmp_path / "g.jsonl", losses, lrs)
    same = write(tmp_path / "s.jsonl", losses, lrs)
    shifted = write(tmp_path / "o.jsonl", losses, [1e-3 * min(1.0, (i + 2) / 5) for i in range(30)])
    assert main(["compare", str(golden), str(same), "--plot", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(golden), str(shifted)]) == 1
    assert "lr" in capsys.readouterr().out
    assert main(["compare", str(golden), str(tmp_path / "missing.jsonl")]) == 2


def test_plan_cli_prints_layouts_and_assumptions(tmp_path, capsys):
    (tmp_path / "model.yaml").write_text(
        "vocab_size: 32000\nhidden_size: 4096\nintermediate_size: 11008\nnum_layers: 32\n"
        "num_heads: 32\nn_kv_heads: 32\nseq_length: 4096\n")
    assert main(["plan", "--model", str(tmp_path), "--devices", "8", "--device-memory", "64GiB",
                 "--seq-length", "4096", "--global-batch", "512"]) == 0
    out = capsys.readouterr().out
    assert "6.74B params · 8 devices × 64 GiB" in out and "assumptions:" in out and "16 B/param" in out
    assert main(["plan", "--model", str(tmp_path), "--devices", "8", "--device-memory", "lots",
                 "--seq-length", "4096", "--global-batch", "512"]) == 2
    assert "not a memory size: 'lots'" in capsys.readouterr().err
