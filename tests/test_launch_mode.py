"""PyNative launches its kernels synchronously on the CPU (`models.mode.launch_synchronously_on_cpu`):
MindSpore takes the setting only before its first kernel, so every bundled model's module, and each
module that runs MindSpore's kernels, must have made it once it is imported."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

ENTRY_MODULES = (
    "migrate.models.llama",        # every bundled model stands on models.base (and the hooks of
    "migrate.models.bert",         # dump / probe run on a model already built)
    "migrate.models.gpt2",
    "migrate.align.ms_side",       # migrate diff
    "migrate.train.trainer",       # migrate train, LoRA
    "migrate.infer.runners",       # migrate generate (its request imports models.mode before any kernel)
    "migrate.replay.ms_side",      # migrate replay
)

CHECK = """
import importlib, sys
from mindspore._c_expression import RuntimeConf  # the setting's only getter
conf = RuntimeConf.get_instance()
assert not conf.is_launch_blocking()
for name in sys.argv[1:]:
    importlib.import_module(name)
    print(name, conf.is_launch_blocking())
"""


def _launch_blocking_after_import(*modules: str, env: dict | None = None) -> dict[str, bool]:
    out = subprocess.run([sys.executable, "-c", CHECK, *modules], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-2000:]
    return {name: flag == "True" for name, flag in (line.split() for line in out.stdout.splitlines())}


@pytest.mark.slow
def test_each_module_that_runs_mindspore_leaves_pynative_launching_synchronously_on_the_cpu():
    # One interpreter per module: each must make the setting itself, not inherit it from another's import.
    for name in ENTRY_MODULES:
        assert _launch_blocking_after_import(name) == {name: True}
    # The caller's own process may keep MindSpore's asynchronous default.
    assert _launch_blocking_after_import(ENTRY_MODULES[0], env={"MIGRATE_SYNC_LAUNCH": "off"}) == \
        {ENTRY_MODULES[0]: False}


@pytest.mark.slow
def test_pynative_gradients_are_the_same_bits_launched_either_way(tmp_path):
    """The setting changes who launches the kernels, not what they compute: PyNative gradients of a
    model bit-equal to those of an interpreter where MindSpore launches asynchronously (its default)."""
    script = """
import sys, numpy as np, mindspore as ms
if sys.argv[1] == "async":
    ms.runtime.launch_blocking = lambda: None   # what MindSpore does without the project's setting
from migrate.models.mode import execution_mode
from migrate.models.llama import LlamaConfig, LlamaForCausalLM
from mindspore._c_expression import RuntimeConf
assert RuntimeConf.get_instance().is_launch_blocking() == (sys.argv[1] == "sync")
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, n_kv_heads=2,
                     seq_length=16)
with execution_mode("pynative"):
    model = LlamaForCausalLM(config, seed=3)
    ids = ms.Tensor(np.arange(16, dtype=np.int32).reshape(2, 8) % 64)
    params = model.trainable_params()
    loss, grads = ms.value_and_grad(lambda i: model(i, labels=i)[1], None, params)(ids)
np.savez(sys.argv[2], loss=loss.asnumpy(), **{p.name: g.asnumpy() for p, g in zip(params, grads)})
"""
    files = {}
    for how in ("sync", "async"):
        files[how] = tmp_path / f"{how}.npz"
        out = subprocess.run([sys.executable, "-c", script, how, str(files[how])], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    sync, asynchronous = dict(np.load(files["sync"])), dict(np.load(files["async"]))
    assert sync.keys() == asynchronous.keys() and len(sync) > 5
    for name in sync:
        assert sync[name].tobytes() == asynchronous[name].tobytes(), name
