import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("GLOG_v", "3")  # MindSpore: errors only
# `migrate generate` keeps compiled graphs in ~/.cache; the suite calls it in-process, where MindSpore
# honours one cache path per process (migrate/infer/compile_cache.py): tests/test_compile_cache.py
# turns it on in processes of its own.
os.environ.setdefault("MIGRATE_COMPILE_CACHE", "off")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _pynative_by_default():
    """Tests that switch to GRAPH_MODE must not leak it into the next test."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(autouse=True, scope="session")
def _compile_each_step_once():
    """Training runs in one test process reuse the step graphs compiled for an earlier run whose graphs
    are the same (`migrate.train.step.reuse`; a fresh build's numbers, bit for bit, tests/test_step_reuse.py):
    most of a tiny run's time is its compile. Twelve runs kept, not the default four: the suite's models are
    tiny, and with four a file like tests/test_replay.py evicted runs it then took up again."""
    if os.environ.get("MIGRATE_TEST_REUSE_STEPS", "on") == "off":
        yield
        return
    from migrate.train.step.reuse import keep_compiled_steps

    with keep_compiled_steps(runs=12):
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny golden runs gain nothing from threads, and spinning OpenMP threads on a busy
    2-core machine slow them 10-50x; the numbers are bit-identical either way."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """Costliest files first (tests/file_costs.py): the last file a worker starts is a short one."""
    from file_costs import longest_files_first

    items[:] = longest_files_first(items)


def pytest_configure(config):
    from file_costs import CostRecorder, recording_wanted

    if recording_wanted(config):
        config.pluginmanager.register(CostRecorder(), "migrate-file-costs")
