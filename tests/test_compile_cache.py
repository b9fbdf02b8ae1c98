"""`migrate generate` keeps its compiled graphs (migrate/infer/compile_cache.py): a second run starts
in seconds, and a cache never serves another model.

Each run is a process of its own, as a user's is (MindSpore honours one cache path per process).
The cache folder is named by the model's config, dtype, shapes and code, not its weights: a model
with other weights and the same config reuses the graphs and must still generate its own tokens,
exactly the tokens it generates without a cache.
"""
import os
import re
import subprocess
import sys

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.convert import convert
from migrate.infer import compile_cache
from migrate.infer.request import Options, _bucketed_shapes

LINE = re.compile(r"compile cache (\w+)")


def _generate(ms_dir, root, ids, *extra):
    # GLOG_v as a user's shell has it (unset): the CLI's own default quiets MindSpore's log
    env = {name: value for name, value in os.environ.items() if name != "GLOG_v"}
    env.update(MIGRATE_CACHE_DIR=str(root), MIGRATE_COMPILE_CACHE="on", COLUMNS="400")
    done = subprocess.run([sys.executable, "-m", "migrate", "generate", str(ms_dir), "--ids", ids,
                           "--max-new-tokens", "12", "--no-stream", *extra],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    # MindSpore's warnings (the cache's hash checks, a deprecated context key) had come between the tokens
    assert "WARNING" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]
    lines = done.stdout.strip().splitlines()
    state = LINE.search(" ".join(lines[1:]))  # the summary line (the console may wrap it)
    return lines[0], state.group(1) if state else None


@pytest.mark.slow
def test_a_second_run_reuses_the_graphs_and_no_other_model_is_served_from_them(tmp_path):
    for name, variant, seed in (("a", "gqa", 1), ("b", "gqa", 2), ("c", "mha", 1)):
        save_hf_model(build_hf_model(variant, seed=seed, initializer_range=0.1), tmp_path / f"hf_{name}")
        convert(tmp_path / f"hf_{name}", tmp_path / name)
    root = tmp_path / "cache"
    first, state = _generate(tmp_path / "a", root, "5,9,17,33,3,8")
    assert state == "stored" and len(list((root / "compile").iterdir())) == 1
    again, state = _generate(tmp_path / "a", root, "5,9,17,33,3,8")
    assert state == "hit" and again == first
    _, state = _generate(tmp_path / "a", root, "5,9,17,33,3,8,40,41")  # another prompt length, the same bucket
    assert state == "hit"
    # Other weights, the same config: the same graphs, its own tokens.
    other, state = _generate(tmp_path / "b", root, "5,9,17,33,3,8")
    uncached, none = _generate(tmp_path / "b", root, "5,9,17,33,3,8", "--no-compile-cache")
    assert state == "hit" and none is None and other == uncached != first
    # Another config (MHA): a folder of its own.
    _, state = _generate(tmp_path / "c", root, "5,9,17,33,3,8")
    assert state == "stored" and len(list((root / "compile").iterdir())) == 2


def test_the_folder_name_covers_config_dtype_and_shapes():
    fields = {"hidden_size": 32, "num_layers": 2, "n_kv_heads": 2}
    base = dict(dtype="fp32", runner="kv_cache", batch=1, prefill_len=32, cache_len=64)
    name = compile_cache.fingerprint(fields, **base)
    assert compile_cache.fingerprint(dict(fields), **base) == name
    changed = [compile_cache.fingerprint({**fields, "n_kv_heads": 4}, **base)]
    changed += [compile_cache.fingerprint(fields, **{**base, key: value})
                for key, value in (("dtype", "bf16"), ("batch", 2), ("prefill_len", 64), ("cache_len", 128))]
    assert name not in changed and len(set(changed)) == len(changed)


def test_shapes_are_bucketed_but_a_given_cache_length_is_kept():
    assert _bucketed_shapes(6, Options(max_new_tokens=12), 18) == (32, 64)
    assert _bucketed_shapes(33, Options(max_new_tokens=40), 73) == (64, 128)
    assert _bucketed_shapes(6, Options(max_new_tokens=12, cache_len=50), 50) == (32, 50)
    assert _bucketed_shapes(6, Options(max_new_tokens=40, cache_len=50), 50) == (6, 50)  # no room to pad


def test_one_cache_path_per_process(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [compile_cache.__file__])  # an entry script (a test worker may have none)
    monkeypatch.setattr(compile_cache, "_path_in_use", tmp_path / "first")
    with compile_cache.compile_cache(tmp_path / "second") as state:
        assert state.startswith("off (this process already caches another model's graphs)")
    assert not (tmp_path / "second").exists()


def test_the_cache_is_on_inside_the_block_only(tmp_path, monkeypatch):
    """MindSpore reads MS_COMPILER_CACHE_* at each compile: graphs compiled after the block are not cached,
    and a value the user had set is theirs again."""
    monkeypatch.setattr(sys, "argv", [compile_cache.__file__])
    monkeypatch.setattr(compile_cache, "_path_in_use", None)
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", "/the/users/own")
    with compile_cache.compile_cache(tmp_path / "graphs") as state:
        assert state == "stored"
        assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "1"
        assert os.environ["MS_COMPILER_CACHE_PATH"] == str(tmp_path / "graphs")
    assert "MS_COMPILER_CACHE_ENABLE" not in os.environ
    assert os.environ["MS_COMPILER_CACHE_PATH"] == "/the/users/own"


def test_a_process_without_an_entry_script_runs_without_the_cache(tmp_path, monkeypatch):
    """MindSpore keys its cache by the entry script's source: `python -c` has none, and its compile would fail."""
    monkeypatch.setattr(sys, "argv", ["-c"])
    with compile_cache.compile_cache(tmp_path / "graphs") as state:
        assert state.startswith("off (MindSpore's cache needs the entry script's file")
    assert not (tmp_path / "graphs").exists()


@pytest.mark.parametrize("value, on", [("", True), ("on", True), ("off", False), ("0", False), ("OFF", False)])
def test_the_switch(monkeypatch, value, on):
    monkeypatch.setenv(compile_cache.ENV_SWITCH, value)
    assert compile_cache.wanted() is on
