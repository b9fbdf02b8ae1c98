"""Keymaps, model.yaml and config.json from someone else, through the CLI as a user
meets them: no code of theirs is imported, YAML cannot expand without bound, no
value is echoed without bound, a wrong type is one line naming the field, and
`extends` reads no file outside the keymap folders. Each: exit 2, one line,
nothing written."""
import json
import os
import sys
from pathlib import Path

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert
from migrate.keymap import KEYMAP_DIR
from migrate.models.config import LlamaConfig
from migrate.models.registry import TRUST_ENV

LLAMA_KEYMAP = (KEYMAP_DIR / "hf_llama.yaml").read_text()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(hf_dir, ms_dir) of one tiny Llama, and a hidden-48 twin's converted folder."""
    root = tmp_path_factory.mktemp("inputs")
    save_hf_model(build_hf_model("gqa", seed=7), root / "hf")
    convert(root / "hf", root / "ms")
    save_hf_model(build_hf_model("gqa", seed=8, hidden_size=48), root / "hf48")
    convert(root / "hf48", root / "ms48")
    return root / "hf", root / "ms", root / "ms48"


@pytest.fixture(autouse=True)
def _untrusted(monkeypatch):
    # Whatever a test (or --trust-model-class) sets, the next test starts untrusted.
    monkeypatch.delenv(TRUST_ENV, raising=False)


def run(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def refused(capsys, *argv, out: Path, contains: str) -> str:
    code, stdout, err = run(capsys, *argv)
    assert code == 2, (stdout, err)
    assert len(err.splitlines()) == 1, err[:2000]
    assert err.startswith("migrate: error: ") and contains in err, err[:2000]
    assert len(err) < 800, f"{len(err)} characters"
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temporary left
    return err


def with_model_yaml(src: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dst)
    text = (dst / "model.yaml").read_text()
    (dst / "model.yaml").write_text(edit(text))
    return dst


def set_model_class(value: str):
    return lambda text: "\n".join(f"model_class: {value}" if line.startswith("model_class:") else line
                                  for line in text.splitlines()) + "\n"


# ---------------------------------------------------------------- no foreign code is imported

def test_model_yaml_cannot_import_this(folders, tmp_path, capsys):
    hf, ms, _ = folders
    evil = with_model_yaml(ms, tmp_path / "evil", set_model_class("this:s"))
    sys.modules.pop("this", None)
    for argv, out in ((["export", evil, tmp_path / "hf_out"], tmp_path / "hf_out"),
                      (["diff", hf, evil, "--report", tmp_path / "report"], tmp_path / "report")):
        err = refused(capsys, *argv, out=out, contains="refusing to import model class 'this:s'")
        assert "--trust-model-class" in err
    assert "this" not in sys.modules  # the Zen of Python was not printed: the module never ran


def test_train_cannot_import_this(folders, tmp_path, capsys):
    _, ms, _ = folders
    with_model_yaml(ms, tmp_path / "evil", set_model_class("this:s"))
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text("hf_model: hf\nms_model: evil\ndata: data\nseq_length: 16\nmicro_batch_size: 4\n"
                        "total_steps: 2\noptimizer: {lr: 3e-3}\nout_dir: {golden: golden, ms: ms_out}\n")
    sys.modules.pop("this", None)
    refused(capsys, "train", "--config", run_yaml, out=tmp_path / "ms_out",
            contains="refusing to import model class 'this:s'")
    assert "this" not in sys.modules


def test_model_yaml_cannot_import_os_system(folders, tmp_path, capsys):
    hf, ms, _ = folders
    evil = with_model_yaml(ms, tmp_path / "evil", set_model_class("os:system"))
    refused(capsys, "export", evil, tmp_path / "hf_out", out=tmp_path / "hf_out",
            contains="refusing to import model class 'os:system'")
    refused(capsys, "diff", hf, evil, "--report", tmp_path / "report", out=tmp_path / "report",
            contains="refusing to import model class 'os:system'")


def test_keymap_target_cannot_import_os_system(folders, tmp_path, capsys):
    hf, _, _ = folders
    keymap = tmp_path / "evil.yaml"
    keymap.write_text(LLAMA_KEYMAP.replace("family: hf_llama", "family: evil_llama")
                      .replace("target: migrate.models.llama:LlamaForCausalLM", "target: os:system"))
    # Before the fix, convert called os.system(str(config)): the config's text run as a shell command.
    refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
            contains="refusing to import model class 'os:system'")


class UserLlama:
    """A user's own model class (never built here: export reads only its config class)."""

    config_class = LlamaConfig


def test_a_users_own_class_needs_the_opt_in(folders, tmp_path, capsys, monkeypatch):
    _, ms, _ = folders
    mine = with_model_yaml(ms, tmp_path / "mine", set_model_class(f"{__name__}:UserLlama"))
    refused(capsys, "export", mine, tmp_path / "a", out=tmp_path / "a", contains="--trust-model-class")
    # Explicit opt-in: the flag (or MIGRATE_TRUST_MODEL_CLASS=1 for the command) imports it. Its shapes
    # come from building it, so a class that is no model at all is then refused by its own failure.
    import dataclasses

    from migrate.models import registry

    llama = registry.FAMILIES["migrate.models.llama:LlamaForCausalLM"]
    monkeypatch.setitem(registry.FAMILIES, f"{__name__}:UserLlama",
                        dataclasses.replace(llama, model_class=f"{__name__}:UserLlama"))
    code, _, err = run(capsys, "export", "--trust-model-class", mine, tmp_path / "b")
    assert code == 0, err
    assert (tmp_path / "b" / "model.safetensors").is_file()
    # The flag is passed down as an argument: the process environment is left as it was.
    assert TRUST_ENV not in os.environ
    # The variable in the caller's environment opts the command in as the flag does.
    monkeypatch.setenv(TRUST_ENV, "1")
    code, _, err = run(capsys, "export", mine, tmp_path / "c")
    assert code == 0, err
    assert (tmp_path / "c" / "model.safetensors").is_file()


# ---------------------------------------------------------------- YAML bounds

def anchors(levels: int) -> str:
    """'Billion laughs': level i is ten aliases of level i-1, so level n means 10^(n+1) strings."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def bomb(levels: int) -> str:
    return ("family: bomb\ntarget: migrate.models.llama:LlamaForCausalLM\nconfig: {}\n" + anchors(levels)
            + f"params: {{x: *a{levels}}}\n")


@pytest.mark.parametrize("levels", [7, 9])
def test_anchor_bomb_is_refused_before_expanding(folders, tmp_path, capsys, levels):
    # Before: 9 levels took 62 s and 5.5 GB, then MemoryError; 7 levels printed a 34.7 MB line.
    hf, _, _ = folders
    keymap = tmp_path / "bomb.yaml"
    keymap.write_text(bomb(levels))
    refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
            contains="expands to more than 100,000 values")


def test_a_large_value_is_quoted_within_bounds(folders, tmp_path, capsys):
    # Under the bound (11,111 values) but wrong: the error quotes it, clipped (before: 70 kB).
    hf, _, _ = folders
    keymap = tmp_path / "big.yaml"
    keymap.write_text(bomb(3))
    err = refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
                  contains="params.x")
    assert "got [[[[" in err


def test_recursive_alias_is_refused(folders, tmp_path, capsys):
    hf, _, _ = folders
    keymap = tmp_path / "loop.yaml"
    keymap.write_text("family: loop\ntarget: migrate.models.llama:LlamaForCausalLM\nconfig: {}\n"
                      "params: &p {x: *p}\n")
    refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
            contains="refers to its own anchor")


def test_python_tag_in_a_keymap_is_one_line(folders, tmp_path, capsys):
    hf, _, _ = folders
    keymap = tmp_path / "tag.yaml"
    marker = tmp_path / "ran"
    text = LLAMA_KEYMAP.replace("family: hf_llama", "family: tagged").replace(
        "config:\n", f"config: !!python/object/apply:os.system [touch {marker}]\nunused:\n", 1)
    keymap.write_text(text)
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if "!!python" in t)
    err = refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
                  contains="could not determine a constructor for the tag")
    assert "python/object/apply:os.system" in err and f"(line {line}, column 9)" in err
    assert not marker.exists()


@pytest.mark.parametrize("edit, contains", [
    (lambda t: t.replace("model_class:", "model_class: !!python/object/apply:os.system [true]\nold_class:"),
     "could not determine a constructor"),
    (lambda t: t.replace("num_layers: 2", "num_layers: [2"), "invalid model config"),
    (lambda t: t.replace("num_layers: 2", "num_layers: '2'"), "num_layers must be an integer, got '2'"),
    (lambda t: t.replace("num_heads: 4", "num_heads: 0"), "num_heads must be positive"),
    (lambda t: t.replace("hidden_size: 32", "hidden_size: &h [*h]"), "refers to its own anchor"),
    (lambda t: t + anchors(5), "expands to more than 100,000 values"),
    (set_model_class("[migrate.models.llama, LlamaForCausalLM]"), "model class must be 'module:Class'"),
])
def test_bad_model_yaml_is_one_line(folders, tmp_path, capsys, edit, contains):
    _, ms, _ = folders
    bad = with_model_yaml(ms, tmp_path / "bad", edit)
    refused(capsys, "export", bad, tmp_path / "hf_out", out=tmp_path / "hf_out", contains=contains)


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("architectures: [LlamaForCausalLM]\ntarget", "architectures: [[X]]\ntarget"),
     "`architectures` must be a list of strings, got [['X']]"),
    (lambda t: t.replace("model_type: [llama]", "model_type: llama"), "`model_type` must be a list of strings"),
    (lambda t: t.replace("version: 1", "version: [1]"), "`version` must be an integer"),
    (lambda t: t.replace("  hidden_act: hidden_act", "  hidden_act: {a: b}"), "`config.hidden_act` must be"),
    (lambda t: t.replace("  model.norm.weight: model.norm_out.weight",
                         "  model.norm.weight: {to: [[model.norm_out.weight]]}"),
     "`params.model.norm.weight.to` must be a string or a list of strings"),
    (lambda t: t.replace("  model.norm.weight: model.norm_out.weight", "  model.norm.weight: 3"),
     "`params.model.norm.weight` must be a target name or a mapping"),
    (lambda t: t.replace("  - model.layers.{layer}.self_attn.rotary_emb.inv_freq", "  - {when: x}"),
     "`ignore[0]` must be a name or a mapping with `name`"),
    (lambda t: t.replace("  embedding: model.embed_tokens", "  embedding: [model.embed_tokens]"),
     "`align.embedding` must be a string"),
    (lambda t: t.replace("    config_constants:\n", "    config_constants: 7\n    unused:\n"),
     "`targets.qkv_concat.config_constants` must be a mapping"),
    (lambda t: t.replace("\nparams:\n", "\nunused:\n"), "field `params` is required"),
])
def test_keymap_field_of_the_wrong_type_is_named(folders, tmp_path, capsys, edit, field):
    hf, _, _ = folders
    keymap = tmp_path / "typed.yaml"
    text = edit(LLAMA_KEYMAP.replace("family: hf_llama", "family: typed"))
    assert text != LLAMA_KEYMAP.replace("family: hf_llama", "family: typed")
    keymap.write_text(text)
    refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms", contains=field)


def test_config_json_architectures_of_the_wrong_type(folders, tmp_path, capsys):
    import shutil

    hf, _, _ = folders
    bad = tmp_path / "hf"
    shutil.copytree(hf, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "architectures": [["LlamaForCausalLM"]]}))
    refused(capsys, "convert", "--src", "auto", bad, tmp_path / "ms", out=tmp_path / "ms",
            contains="architectures must be a list of names")


# ---------------------------------------------------------------- extends stays in the keymap folders

def _extending(tmp_path, base: str) -> Path:
    keymap = tmp_path / "user" / "mine.yaml"
    keymap.parent.mkdir(exist_ok=True)
    keymap.write_text(f"extends: {base}\nfamily: mine\n")
    return keymap


def test_extends_cannot_climb_out(folders, tmp_path, capsys):
    hf, _, _ = folders
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "evil.yaml").write_text(LLAMA_KEYMAP.replace("family: hf_llama", "family: evil"))
    climb = os.path.relpath(tmp_path / "elsewhere" / "evil", KEYMAP_DIR)  # before: KEYMAP_DIR / climb + ".yaml"
    for base in (climb, str(tmp_path / "elsewhere" / "evil")):
        keymap = _extending(tmp_path, base)
        refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
                contains="`extends` must name a keymap")


def test_extends_a_link_out_of_the_folder_is_refused(folders, tmp_path, capsys):
    hf, _, _ = folders
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "evil.yaml").write_text(LLAMA_KEYMAP.replace("family: hf_llama", "family: evil"))
    keymap = _extending(tmp_path, "base")
    (keymap.parent / "base.yaml").symlink_to(tmp_path / "elsewhere" / "evil.yaml")
    refused(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms", out=tmp_path / "ms",
            contains="outside")


def test_extends_a_keymap_beside_it_or_bundled(folders, tmp_path, capsys):
    hf, _, _ = folders
    keymap = _extending(tmp_path, "base")
    (keymap.parent / "base.yaml").write_text("extends: hf_llama\nfamily: base\n")
    code, _, err = run(capsys, "convert", "--keymap", keymap, hf, tmp_path / "ms")
    assert code == 0, err
    assert json.loads((tmp_path / "ms" / "conversion.json").read_text())["keymap"]["name"] == "mine"


def test_conversion_json_cannot_point_at_a_keymap_file(folders, tmp_path, capsys):
    import shutil

    hf, ms, _ = folders
    evil = tmp_path / "evil"
    shutil.copytree(ms, evil)
    record = json.loads((evil / "conversion.json").read_text())
    record["keymap"]["name"] = str(tmp_path / "elsewhere.yaml")
    (evil / "conversion.json").write_text(json.dumps(record))
    refused(capsys, "export", evil, tmp_path / "hf_out", out=tmp_path / "hf_out",
            contains="which is not a keymap name")


# ---------------------------------------------------------------- export checks weights against model.yaml

def test_export_refuses_weights_that_disagree_with_model_yaml(folders, tmp_path, capsys):
    import shutil

    _, ms, ms48 = folders
    swapped = tmp_path / "swapped"
    shutil.copytree(ms, swapped)
    shutil.copy(ms48 / "model.ckpt", swapped / "model.ckpt")  # hidden 48 weights, model.yaml says 32
    err = refused(capsys, "export", swapped, tmp_path / "hf_out", out=tmp_path / "hf_out",
                  contains="checkpoint does not match its model.yaml")
    assert "model.tok_embeddings.embedding_weight [128, 48] vs [128, 32]" in err and "more" in err


def test_keymap_check_imports_the_class_the_user_typed(folders, capsys):
    """`keymap check --ms-model module:Class` names the class on the command line: that is
    the user's own opt-in, while a class named only inside a file still needs one."""
    hf, _, _ = folders
    code, stdout, err = run(capsys, "keymap", "check", "hf_llama", "--hf", hf, "--ms-model",
                            "migrate_user_models:MyLlama")
    assert code == 0, err
    assert "complete" in stdout
