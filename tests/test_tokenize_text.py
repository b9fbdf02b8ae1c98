"""`migrate data tokenize` reads UTF-8 text: a file that decodes as UTF-8 but is made of
control characters (NUL bytes, UTF-16 without its BOM) is refused, named, before anything
is written; text with the usual whitespace and a few escape codes still tokenizes."""
import numpy as np
import pytest

from migrate.cli import main

TEXT = "Document. The quick brown fox jumps over the lazy dog.\n" * 30


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from migrate.data.corpus import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("tok")
    (root / "doc.txt").write_text(TEXT)
    return train_bpe_tokenizer([root / "doc.txt"], 300, root / "tok")


def _tokenize(tok, out, *files):
    return main(["data", "tokenize", *map(str, files), "--tokenizer", str(tok), "--seq-length", "16",
                 "--out", str(out)])


@pytest.mark.parametrize("name, content, count, total, first", [
    ("zeros.txt", b"\0" * 4096, "4,096", "4,096", "U+0000 at character 0"),
    ("utf16.txt", TEXT.encode("utf-16-le"), "1,650", "3,300", "U+0000 at character 1"),  # no BOM: valid UTF-8
    ("mostly_bell.txt", b"ok " + b"\x07" * 20, "20", "23", "U+0007 at character 3"),
])
def test_a_file_of_control_characters_is_refused_by_name(tok, tmp_path, capsys, name, content, count, total, first):
    good, bad = tmp_path / "a_good.txt", tmp_path / name
    good.write_text(TEXT)
    bad.write_bytes(content)
    code = _tokenize(tok, tmp_path / "data", good, bad)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (f"migrate: error: {bad} is not text: {count} of its {total} characters are control characters "
                   f"(first {first}); migrate data tokenize reads UTF-8 text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_good.txt", name]  # nothing written, no temp folder


def test_text_with_whitespace_controls_and_a_few_escape_codes_tokenizes(tok, tmp_path, capsys):
    doc = tmp_path / "log.txt"
    lines = [f"\x1b[32mINFO\x1b[0m\tstep {i}: loss {1 / (i + 1):.4f}\r\n" for i in range(60)]
    doc.write_text("\f".join(lines))  # ~7 % escape characters: a coloured log is still text
    assert _tokenize(tok, tmp_path / "data", doc) == 0, capsys.readouterr().err
    assert np.load(tmp_path / "data" / "train.npy").shape[1] == 17
