"""Every bench script loads and parses its arguments: `make bench` stopped at bench/train_dp.py, which
imported a helper bench/train_speed.py no longer had (nothing ran the script between benches)."""
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py"))


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their siblings by bare name


def load(script: Path):
    name = f"_bench_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_the_script_loads_and_its_help_parses(script, capsys):
    module = load(script)
    if not hasattr(module, "main"):  # a helper module (harness, page_cache, ms_floor's pieces)
        return
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


def bench_recipe() -> list[str]:
    """The command lines of the Makefile's `bench` target."""
    lines = (BENCH.parent / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("bench:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_make_bench_runs_every_bench_with_targets_and_its_real_rows():
    """The README's figures come from one `make bench` run: a bench printing target lines that the target
    left out (bench/diff.py was) never reached them, nor a --real row the target did not ask for."""
    recipe = bench_recipe()
    run = {Path(word).name: line.split() for line in recipe for word in line.split() if word.startswith("bench/")}
    with_targets = {p.name for p in SCRIPTS if '"target ' in p.read_text() or "f\"target " in p.read_text()}
    assert with_targets and with_targets <= set(run), sorted(with_targets - set(run))
    with_real = {p.name for p in SCRIPTS if '"--real"' in p.read_text()}
    assert with_real and all("--real" in run[name] for name in with_real), sorted(with_real)
