"""The benches' --real plumbing that needs no real model: the shared SmolLM2 lookup, option
parsing and target lines (the real-model runs themselves are `python bench/... --real`, never here)."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_bench(name: str):
    before_env, before_path = dict(os.environ), list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:  # a bench sets its environment and sys.path for a run of its own, not for this process
        for key in set(os.environ) - set(before_env):
            del os.environ[key]
        sys.path[:] = before_path
    return module


@pytest.fixture
def real_tier_home(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    monkeypatch.setenv("MIGRATE_REAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MIGRATE_REAL_SITE", str(tmp_path / "site"))
    from real_tier.benches import prepared_smollm2
    return tmp_path, prepared_smollm2


def test_without_the_wheels_the_benches_real_option_fails_in_one_line(real_tier_home):
    _, prepared_smollm2 = real_tier_home
    with pytest.raises(SystemExit) as failed:
        prepared_smollm2()
    message = str(failed.value)
    assert "make real-install" in message and "\n" not in message


def test_a_prepared_folder_is_used_as_it_is(real_tier_home):
    from real_tier.prepare import MARKER, SMOLLM2

    home, prepared_smollm2 = real_tier_home
    folder = home / "cache" / SMOLLM2["folder"]
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"wheel": SMOLLM2["wheel"]}))
    assert Path(prepared_smollm2()) == folder.resolve()  # no wheels needed: nothing is built


def test_train_speed_lists_keep_their_order_and_refuse_an_unknown_item():
    bench = load_bench("train_speed")
    assert bench.parse_choices("big,,demo", bench.SIZES, "size") == ["big", "demo"]
    assert bench.parse_choices("", bench.SIZES, "size") == []
    with pytest.raises(SystemExit, match=r"^train_speed: unknown dtype 'fp16'; choose from fp32, bf16$"):
        bench.parse_choices("fp32,fp16", bench.DTYPES, "dtype")


def test_generate_target_lines_carry_the_suffix_and_the_verdict():
    bench = load_bench("generate")
    gen = lambda tok_s: SimpleNamespace(decode_tokens_per_s=tok_s)  # noqa: E731
    memory = {"imports": 500.0, "weights": 500.0, "cache": 24.0, "peak": 2000.0}
    speed, peak = bench.decode_targets(8, gen(130.0), gen(100.0), memory, "_smollm2")
    assert speed.startswith("target decode_batch8_smollm2: 1.30×") and speed.endswith("PASS")
    assert peak.startswith("target decode_memory_batch8_smollm2: 2000 MB") and peak.endswith("= 2048 MB) PASS")
    runs = [("cold", (12.0, 1.0, 9.0)), ("stores", (11.0, 1.0, 8.0)), ("hit", (6.0, 0.5, 3.0))]
    assert bench.second_run_target(runs, "_smollm2") == \
        "target generate_second_run_smollm2: 3.0 s to the first decode step (≤ 5 s) PASS"
    line = bench.process_target(runs, 5.0, "_smollm2")
    assert line.startswith("target generate_process_smollm2: 1.20× HF's whole process (6.0 s ÷ 5.0 s;")
    assert "without the compile cache 2.40×" in line and line.endswith("(≤ 1) FAIL")


def test_both_whole_processes_take_the_same_prompt():
    ids = load_bench("generate").cli_prompt(1003)
    assert len(ids) == 1003 and min(ids) == 3 and ids[1000] == 3 and max(ids) == 1002
