"""Dumps of an encoder (BertModel): the bundled model's block table pairs every layer with HF's
(the embedding output with HF's `embeddings`, not its word lookup), and the encoder's last hidden
state is compared as a hidden state, not as logits. A wrong pairing failed the correct
all-MiniLM-L6-v2 conversion at the embedding output (cosine 0.91)."""
from family_fixtures import build_family_model, save_hf_model
from migrate.convert import convert
from migrate.probe import diff_pair, dump
from migrate.probe.dump_format import Dump


def test_bert_dumps_pair_by_the_bundled_table_and_pass(tmp_path):
    save_hf_model(build_family_model("hf_bert", seed=4), tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ms", keymap="hf_bert")
    ids = tmp_path / "ids.npz"
    dump(str(tmp_path / "hf"), tmp_path / "d_hf", inputs_file=ids)
    dump(str(tmp_path / "ms"), tmp_path / "d_ms", inputs_file=ids)
    assert Dump(tmp_path / "d_ms").manifest["align"]["embedding"] == "embeddings"
    report = diff_pair(str(tmp_path / "d_hf"), str(tmp_path / "d_ms"), detail=True)
    assert report.passed, report.first_divergence and report.first_divergence.describe()
    names = [e.name for e in report.entries]
    assert names[0] == "embedding output" and names[-1] == "last hidden state" and "logits" not in names
    assert "layer 1 attention" in names and "layer 1 mlp" in names
    assert "last hidden state max abs" in report.verdict_text()
