"""The MindFormers YAMLs against the real MindSpore Transformers 2.0.0 (tests/mf_live_check.py).

Runs only where MIGRATE_MF_PYTHON names the python of a MindFormers 2.0.0 env (recipe in
../shared/mindformers/: `PROBE=/tmp/mf_env bash setup.sh`, then
MIGRATE_MF_PYTHON=/tmp/mf_env/venv/bin/python); about 2.5 minutes on 2 cores. CI keeps the
pinned-field checks of tests/test_mindformers_config.py instead.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MF_PYTHON = os.environ.get("MIGRATE_MF_PYTHON")
SCRIPT = Path(__file__).with_name("mf_live_check.py")


@pytest.mark.skipif(not MF_PYTHON, reason="MIGRATE_MF_PYTHON (a MindFormers 2.0.0 env) not set")
def test_mindformers_builds_loads_matches_and_trains_like_the_golden(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "prepare", str(tmp_path)], check=True)
    env = {**os.environ, "LOCAL_DEFAULT_PATH": str(tmp_path), "LOG_MF_PATH": str(tmp_path / "mf_log")}
    done = subprocess.run([MF_PYTHON, str(SCRIPT), "check", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    report = json.loads((tmp_path / "report.json").read_text()) if (tmp_path / "report.json").is_file() else {}
    assert done.returncode == 0 and report.get("ok"), json.dumps(report, indent=1) or done.stderr[-3000:]
    for name, case in report["models"].items():
        assert case["not_loaded"] == case["unused"] == [] and case["logits_max_abs"] <= 1e-5, name
    training = report["training"]
    assert training["max_loss_rel"] <= 1e-5
    # MindFormers stopped itself at run.yaml's total_steps (nothing in the check stops it) ...
    assert training["steps"] == training["last_step"] == training["checkpoint"]["global_step"] == 20, training
    # ... and `migrate hparams run.yaml --mindformers` finds every knob the same
    assert training["hparams"]["exit"] == 0 and training["hparams"]["all_agree"], training["hparams"]["tail"]
