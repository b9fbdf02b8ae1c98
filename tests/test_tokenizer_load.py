"""`load_tokenizer` loads transformers' generic fast class directly where AutoTokenizer would choose it
(migrate/infer/text.py: AutoTokenizer's import brings torch, seconds of a `migrate generate` process).
Each model type on the direct list is checked against AutoTokenizer itself: the same class, the same ids,
the same text back; anything else still goes through AutoTokenizer."""
import json
import shutil
import subprocess
import sys

import pytest

from migrate.data.corpus import train_bpe_tokenizer
from migrate.infer import text
from migrate.infer.text import DIRECT_MODEL_TYPES, direct_class_name, load_tokenizer

SAMPLE = "def main():\n    return {'héllo': 3.5}  # 你好 <|endoftext|>"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    corpus = root / "corpus.txt"
    corpus.write_text(open(text.__file__).read())
    return train_bpe_tokenizer([corpus], 300, root / "tok")


def folder_for(trained, tmp_path, model_type: str, **tokenizer_changes):
    folder = tmp_path / (model_type or "converted")
    shutil.copytree(trained, folder)
    if model_type:  # a converted folder has none
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **tokenizer_changes}))
    return folder


@pytest.mark.parametrize("model_type", sorted(DIRECT_MODEL_TYPES))
@pytest.mark.parametrize("named", ["TokenizersBackend", "PreTrainedTokenizerFast"])
def test_the_direct_class_is_the_one_autotokenizer_loads(trained, tmp_path, model_type, named):
    from transformers import AutoTokenizer

    folder = folder_for(trained, tmp_path, model_type, tokenizer_class=named)
    assert direct_class_name(folder) == "TokenizersBackend"
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(ours) is type(theirs)
    ids = theirs(SAMPLE)["input_ids"]
    assert ours(SAMPLE)["input_ids"] == ids and len(ids) > 10
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.all_special_ids == theirs.all_special_ids


def test_the_list_holds_no_type_autotokenizer_corrects():
    from transformers.models.auto.tokenization_auto import (
        MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS,
        TOKENIZER_MAPPING_NAMES,
    )

    assert not DIRECT_MODEL_TYPES & MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS and "" in DIRECT_MODEL_TYPES
    assert all("Mistral" not in (TOKENIZER_MAPPING_NAMES.get(t) or "") for t in DIRECT_MODEL_TYPES)


@pytest.mark.parametrize("change", [
    {"tokenizer_class": "LlamaTokenizer"},                # a model-specific class: AutoTokenizer decides
    {"auto_map": {"AutoTokenizer": [None, "x.Tok"]}},     # code of its own
    {"model_type": "phi3"},                               # a type AutoTokenizer corrects
    {"model_type": "mistral"},                            # may be Mistral's own backend
])
def test_everything_else_goes_through_autotokenizer(trained, tmp_path, change):
    model_type = change.pop("model_type", "llama")
    folder = folder_for(trained, tmp_path, model_type, **{"tokenizer_class": "TokenizersBackend", **change})
    assert direct_class_name(folder) is None


def test_a_damaged_config_goes_through_autotokenizer_and_its_error(trained, tmp_path):
    folder = folder_for(trained, tmp_path, "llama", tokenizer_class="TokenizersBackend")
    (folder / "config.json").write_text("{not json")
    assert direct_class_name(folder) is None


def test_loading_a_direct_tokenizer_imports_no_torch(trained, tmp_path):
    folder = folder_for(trained, tmp_path, "llama", tokenizer_class="TokenizersBackend")
    code = ("import sys\nfrom migrate.infer.text import load_tokenizer\n"
            f"tok = load_tokenizer({str(folder)!r})\n"
            "print(type(tok).__name__, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["TokenizersBackend", "False"]
