"""The package works installed, not only from the checkout: the wheel carries every
subpackage, the bundled keymaps and the golden script, and they load from there."""
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "migrate").rglob("__init__.py")}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert {"migrate.golden", "migrate.keymaps"} <= listed


@pytest.mark.slow
def test_an_installed_wheel_has_the_keymaps_and_the_golden_script(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
                   check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("migrate-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path)
    probe = (
        "import json, migrate, migrate.golden.train_torch as golden\n"
        "from migrate.keymap import KEYMAP_DIR, Keymap\n"
        "from migrate.train.hparams import load_golden\n"
        "print(json.dumps({'package': migrate.__file__, 'golden': golden.__file__, 'keymaps': str(KEYMAP_DIR),\n"
        "                  'family': Keymap.load('hf_llama').name, 'loaded': load_golden().__file__}))\n"
    )
    # From outside the checkout, the installed copy first on the path.
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, cwd=tmp_path, env=env, capture_output=True,
                         text=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    for key in ("package", "golden", "keymaps", "loaded"):
        assert Path(found[key]).resolve().is_relative_to(site.resolve()), (key, found[key])
    assert found["family"] == "hf_llama"
    assert (site / "migrate" / "keymaps" / "hf_llama.yaml").is_file()
    assert (site / "migrate" / "train" / "kernels" / "adamw.cc").is_file()  # built on first use from here


def test_a_command_whose_framework_is_not_installed_names_the_extra(tmp_path, monkeypatch, capsys):
    """The core installs without the frameworks (pyproject's extras): `convert` on a box without
    transformers is one line naming what to install, exit 2, nothing written."""
    from migrate.cli import main

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails as if absent
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ms")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["migrate: error: convert needs transformers, which is not installed here "
                   "(pip install 'migrate[torch]', or the version your recipe pins)"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_checkout_on_the_path_finds_its_keymaps_without_an_install(monkeypatch):
    """PYTHONPATH=<checkout> has no `migrate.keymaps` package: keymaps/ beside migrate/ is used."""
    import importlib.resources

    from migrate import keymap

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(importlib.resources, "files", missing)
    assert keymap._bundled_dir() == REPO / "keymaps"


def test_a_checkout_on_the_path_loads_its_golden_script_without_an_install(monkeypatch):
    """No `migrate.golden` package either: golden/train_torch.py beside migrate/, under the installed name."""
    import importlib

    from migrate.train import hparams

    real_import = importlib.import_module

    def missing(name, package=None):
        # only the installed package is absent: the script's own imports (transformers' lazy ones) still load
        if name.startswith("migrate.golden"):
            raise ModuleNotFoundError(f"No module named {name!r}", name="migrate.golden")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", missing)
    monkeypatch.delitem(sys.modules, "migrate.golden.train_torch", raising=False)
    module = hparams.load_golden()
    monkeypatch.setitem(sys.modules, "migrate.golden.train_torch", module)  # restored after the test
    assert Path(module.__file__) == REPO / "golden" / "train_torch.py" and callable(module.main)
