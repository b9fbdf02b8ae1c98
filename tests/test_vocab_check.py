"""`migrate vocab check`: each mismatch the issue lists is caught on small built models, and a
clean model passes. Models are tiny HF Llamas with a BPE tokenizer trained here (no download)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert
from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus
from migrate.vocab.check import vocab_check
from migrate.vocab.data_checks import DataLimits, check_data
from migrate.vocab.facts import read_tokenizer
from migrate.vocab.findings import ERROR, OK, WARNING

VOCAB = 300
SEQ = 16


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """HF folder (tokenizer inside, special ids agreeing), its conversion and tokenized data."""
    root = tmp_path_factory.mktemp("vocab")
    files = write_stdlib_corpus(root / "corpus", modules=["textwrap"])
    tok_dir = train_bpe_tokenizer(files, VOCAB, root / "tok")
    tok = read_tokenizer(tok_dir)
    ids = {f"{k}_token_id": tok.special[k] for k in ("bos", "eos", "pad")}
    hf = save_hf_model(build_hf_model("gqa", vocab_size=VOCAB, **ids), root / "hf")
    for f in tok_dir.iterdir():
        shutil.copy(f, hf / f.name)
    convert(hf, root / "ms")
    text = "\n".join(p.read_text() for p in files)
    tokens = np.asarray(tok.tokenizer(text, add_special_tokens=False)["input_ids"] + [tok.special["eos"]])
    rows = tokens[: (len(tokens) // (SEQ + 1)) * (SEQ + 1)].reshape(-1, SEQ + 1)
    _, first = np.unique(rows, axis=0, return_index=True)  # textwrap repeats a few docstrings: clean data has none
    write_data(root / "data", rows[np.sort(first)], tok)
    return root


def write_data(folder, rows: np.ndarray, tok, **meta):
    """A `migrate data tokenize`-shaped folder (the .npy twin and data.json; no MindRecord needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train.npy", rows.astype(np.int32))
    fields = {"format": "migrate-tokens", "version": 1, "seq_length": rows.shape[1] - 1, "samples": len(rows),
              "eos_token_id": tok.special["eos"], "bos_token_id": tok.special["bos"], "add_bos": False,
              "tokenizer": {"vocab_size": tok.size}, **meta}
    (folder / "data.json").write_text(json.dumps(fields))
    return folder


def levels(report) -> dict[str, str]:
    return {f.key: f.level for f in report.findings}


def copy_of(clean, tmp_path, name="hf"):
    return shutil.copytree(clean / name, tmp_path / name)


def edit_json(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_clean_model_and_data_pass(clean, capsys):
    report = vocab_check(clean / "hf", clean / "ms", data=clean / "data")
    assert report.exit_code == 0 and not report.of_level(ERROR) and not report.of_level(WARNING), report.verdict()
    got = levels(report)
    for key in ("rows.hf_embedding", "rows.hf_head", "rows.mindspore_embedding", "rows.mindspore_head",
                "rows.hf_vs_mindspore", "tokenizer.size", "tokenizer.added", "special.bos", "special.eos",
                "special.pad", "data.ids_beyond_vocab", "data.duplicates", "data.mono_rows", "data.token_frequency"):
        assert got[key] == OK, key
    assert main(["vocab", "check", str(clean / "hf"), str(clean / "ms"), "--data", str(clean / "data"),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["errors"] == 0


def test_tokenizer_larger_than_embedding_and_added_tokens(clean, tmp_path, capsys):
    hf = copy_of(clean, tmp_path)
    tok = read_tokenizer(hf).tokenizer
    tok.add_tokens(["<tool_call>", "<tool_result>"], special_tokens=True)
    tok.save_pretrained(str(hf))
    report = vocab_check(hf)
    got = levels(report)
    assert got["tokenizer.size"] == ERROR and got["tokenizer.added"] == ERROR
    added = next(f for f in report.findings if f.key == "tokenizer.added")
    assert added.figures["beyond"] == [VOCAB, VOCAB + 1] and "<tool_call>" in added.message
    assert main(["vocab", "check", str(hf)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_config_vocab_size_and_head_rows(clean, tmp_path):
    hf = copy_of(clean, tmp_path)
    edit_json(hf / "config.json", vocab_size=VOCAB + 8)
    got = levels(vocab_check(hf))
    assert got["rows.hf_embedding"] == ERROR
    # an lm_head with fewer rows than the embedding
    from safetensors.numpy import load_file, save_file

    hf2 = copy_of(clean, tmp_path / "b")
    tensors = load_file(hf2 / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:-4]
    save_file(tensors, hf2 / "model.safetensors", metadata={"format": "pt"})
    report = vocab_check(hf2)
    assert levels(report)["rows.hf_head"] == ERROR
    assert "296 rows ≠ embedding's 300" in next(f.message for f in report.findings if f.key == "rows.hf_head")


def test_hf_and_mindspore_rows_disagree(clean, tmp_path):
    from migrate.vocab.resize import resize_vocab

    resize_vocab(clean / "ms", tmp_path / "ms_only", to=VOCAB + 4)  # MindSpore resized, HF not
    got = levels(vocab_check(clean / "hf", tmp_path / "ms_only"))
    assert got["rows.hf_vs_mindspore"] == ERROR
    assert got["rows.mindspore_embedding"] == OK  # its model.yaml follows


@pytest.mark.parametrize("where, field, value, level", [
    ("hf/config.json", "eos_token_id", 7, ERROR),
    ("hf/generation_config.json", "eos_token_id", 7, ERROR),
    ("hf/generation_config.json", "bos_token_id", 9, ERROR),
    ("ms/model.yaml", "eos_token_id", 7, ERROR),
    ("ms/generation_config.json", "eos_token_id", [7, 8], ERROR),
    ("hf/config.json", "pad_token_id", 5, WARNING),
    ("hf/config.json", "eos_token_id", VOCAB + 3, ERROR),        # no embedding row for it
])
def test_special_ids_disagree(clean, tmp_path, where, field, value, level):
    side, name = where.split("/")
    hf, ms = copy_of(clean, tmp_path, "hf"), copy_of(clean, tmp_path, "ms")
    path = (hf if side == "hf" else ms) / name
    if name == "model.yaml":
        import yaml

        data = yaml.safe_load(path.read_text())
        data[field] = value
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        edit_json(path, **{field: value})
    report = vocab_check(hf, ms)
    key = f"special.{field.split('_')[0]}"
    assert levels(report)[key] == level
    assert report.exit_code == (1 if level == ERROR else 0)
    finding = next(f for f in report.findings if f.key == key)
    assert str(value) in finding.message


def test_eos_list_holding_the_tokenizer_eos_agrees(clean, tmp_path):
    hf = copy_of(clean, tmp_path)
    eos = read_tokenizer(hf).special["eos"]
    edit_json(hf / "generation_config.json", eos_token_id=[eos, 7])  # Llama 3's several stop ids
    assert levels(vocab_check(hf))["special.eos"] == OK


def test_data_findings(clean, tmp_path):
    tok = read_tokenizer(clean / "hf")
    rows = np.load(clean / "data" / "train.npy").astype(np.int64)
    special = dict(tok.special)
    # an id past the embedding: fatal, located
    bad = rows.copy()
    bad[3, 5] = VOCAB + 2
    report = check_data(write_data(tmp_path / "beyond", bad, tok), VOCAB, tok, special)
    f = next(f for f in report.findings if f.key == "data.ids_beyond_vocab")
    assert f.level == ERROR and f.figures["first"] == {"row": 3, "position": 5, "id": VOCAB + 2}
    # duplicated rows, rows of one repeated special token, padding inside rows
    dup = rows.copy()
    dup[10:20] = dup[0]
    dup[30] = tok.special["pad"]
    dup[31, :12] = tok.special["bos"]
    report = check_data(write_data(tmp_path / "dup", dup, tok), VOCAB, tok, special)
    got = levels(report)
    assert got["data.duplicates"] == WARNING and got["data.mono_rows"] == WARNING and got["data.pad_in_rows"] == WARNING
    mono = next(f for f in report.findings if f.key == "data.mono_rows")
    assert mono.figures["rows"] == [30, 31] and mono.figures["tokens"] == [tok.special["pad"], tok.special["bos"]]
    sorted_path = check_data(tmp_path / "dup", VOCAB, tok, special, DataLimits(mono_row_share=0.45))
    assert next(f for f in sorted_path.findings if f.key == "data.mono_rows").figures["rows"] == [30, 31]
    dups = next(f for f in report.findings if f.key == "data.duplicates")
    assert dups.figures["count"] == 10 and dups.figures["first"] == [10, 0]
    # one token dominating the corpus; unknown tokens above their share (unk given as a config id)
    heavy = rows.copy()
    heavy[:, ::2] = 42
    report = check_data(write_data(tmp_path / "heavy", heavy, tok), VOCAB, tok, {**special, "unk": 42},
                        DataLimits(max_token_share=0.3))
    got = levels(report)
    assert got["data.token_frequency"] == WARNING and got["data.unk_share"] == WARNING
    assert report.exit_code == 0  # warnings alone
    # data tokenized with another EOS
    report = check_data(write_data(tmp_path / "eos", rows, tok, eos_token_id=7), VOCAB, tok, special)
    assert levels(report)["data.eos"] == ERROR


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["vocab", "check", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model folder not found" in err[0]


def test_mindspore_rows_disagree_with_model_yaml_and_head(clean, tmp_path):
    import yaml

    from migrate.checkpoints.ms_ckpt import CkptWriter
    from migrate.checkpoints.ms_reader import open_ms_checkpoint

    ms = copy_of(clean, tmp_path, "ms")
    data = yaml.safe_load((ms / "model.yaml").read_text())
    data["vocab_size"] = VOCAB + 8
    (ms / "model.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert levels(vocab_check(clean / "hf", ms))["rows.mindspore_embedding"] == ERROR
    ms2 = copy_of(clean, tmp_path / "b", "ms")
    tensors = list(open_ms_checkpoint(ms2).tensors())
    with CkptWriter(ms2 / "model.ckpt") as writer:
        for name, array in tensors:
            writer.write(name, array[:-4] if name == "lm_head.weight" else array)
    got = levels(vocab_check(clean / "hf", ms2))
    assert got["rows.mindspore_head"] == ERROR and got["rows.mindspore_embedding"] == OK


def test_data_beyond_the_tokenizer_and_from_another_tokenizer(clean, tmp_path):
    tok = read_tokenizer(clean / "hf")
    rows = np.load(clean / "data" / "train.npy").astype(np.int64)
    rows[0, 0] = VOCAB + 2  # a spare embedding row: no text, never trained
    folder = write_data(tmp_path / "d", rows, tok, tokenizer={"vocab_size": 999})
    got = levels(check_data(folder, VOCAB + 8, tok, dict(tok.special)))
    assert got["data.ids_beyond_vocab"] == OK and got["data.ids_beyond_tokenizer"] == WARNING
    assert got["data.tokenizer"] == WARNING
