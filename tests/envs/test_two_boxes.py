"""docs/two-boxes.md run for real on two environments (`make test-envs`; pyproject's norecursedirs keeps
tests/envs out of `make test`, `pytest tests/envs` runs it).

MIGRATE_ENVS names the folder `make envs-install` built and keeps: mf/ (../shared/mindformers/setup.sh:
MindSpore 2.10, MindFormers 2.0.0, transformers 4.57.1, numpy<2; venv/, stubs/) and torch-hf4/ (torch
2.13.0 CPU, transformers 4.57.1), each with recipe.txt, the `pip freeze` of what its recipe installed.

Every bash block of the page marked `<!-- box: torch -->` or `<!-- box: mindspore -->` runs there, in
page order, line by line, in one folder both boxes share: `migrate/` (a copy of this working tree, the
checkout a user installs from), `hf_model/` and `corpus/` (tests/envs/make_hf_model.py, saved by the
torch box's transformers 4.x), and the page's `# file:` blocks as the flow reaches them. A command sees
its box's venv first on PATH and nothing of this process's Python environment. Before a box's
`pip install` line migrate is removed from it (a second run starts where the first did), and
`pip install --dry-run --report` of the same line must replace nothing the box holds; after it, the
box's `pip freeze` still holds every package of its recipe at the same version (an install that would
replace one is not run: the box is kept for the next run).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "two-boxes.md"
ENVS = Path(os.environ["MIGRATE_ENVS"]) if os.environ.get("MIGRATE_ENVS") else None
BOXES = {"torch": "torch-hf4", "mindspore": "mf"}
FENCE = re.compile(r"^```(\S*)\s*$")

pytestmark = pytest.mark.skipif(ENVS is None, reason="MIGRATE_ENVS not set: run `make test-envs`")


@dataclass
class Step:
    box: str
    command: str
    want: int
    code: int
    out: str
    seconds: float
    where: str


@dataclass
class Install:
    box: str
    command: str
    replaced: list[str]          # dry run: packages the box holds that the install would replace
    added: list[str]             # dry run: name==version of what it would add
    changed: list[str]           # recipe packages whose version differs after the install (or are gone)
    package: str                 # where the box imports migrate from after the install


@dataclass
class Flow:
    work: Path
    steps: list[Step] = field(default_factory=list)
    installs: list[Install] = field(default_factory=list)
    checkout: dict = field(default_factory=dict)  # the PYTHONPATH=<checkout> run, before any install

    def step(self, prefix: str) -> Step:
        found = [s for s in self.steps if s.command.startswith(prefix)]
        assert found, f"the page runs no `{prefix}`"
        return found[0]


# ---------------------------------------------------------------- the page


def page_blocks(path: Path):
    """(line, lang, text, box, exit) of each fenced block; `<!-- box: NAME -->` and `<!-- exit: N -->`
    on the comment lines just above a fence, as tests/test_docs_commands.py reads its markers."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        box, want, k = None, 0, i - 1
        while k >= 0 and lines[k].strip().startswith("<!--"):
            box = (re.search(r"<!--\s*box:\s*(\w+)\s*-->", lines[k]) or [None, box])[1]
            want = int((re.search(r"<!--\s*exit:\s*(\d+)\s*-->", lines[k]) or [None, want])[1])
            k -= 1
        yield i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n", box, want
        i = j + 1


# ---------------------------------------------------------------- the boxes


def venv(box: str) -> Path:
    return ENVS / BOXES[box] / "venv"


def box_env(box: str, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv(box) / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", COLUMNS="200")
    if box == "mindspore":  # the recipe's stub for the unpublished hyper_parallel; MindFormers' logs out of cwd
        env.update(MF_STUBS=str(ENVS / BOXES[box] / "stubs"), LOCAL_DEFAULT_PATH=str(work / "mf_log"),
                   LOG_MF_PATH=str(work / "mf_log"))
    return env


def run(box: str, work: Path, command: str | list[str], env: dict | None = None) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    done = subprocess.run(command, shell=isinstance(command, str), executable="/bin/bash" if isinstance(
        command, str) else None, cwd=work, env=env or box_env(box, work), capture_output=True, text=True,
        timeout=900)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0


def freeze(box: str) -> dict[str, str]:
    out = subprocess.run([venv(box) / "bin" / "python", "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return {_norm(p["name"]): p["version"] for p in json.loads(out)}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def recipe(box: str) -> dict[str, str]:
    rows = (ENVS / BOXES[box] / "recipe.txt").read_text().splitlines()
    return {_norm(r.split("==")[0]): r.split("==")[1] for r in rows if "==" in r}


def install(box: str, work: Path, command: str, flow: Flow) -> None:
    """The page's `pip install` line, checked: nothing replaced (dry run), the recipe intact (after)."""
    python = str(venv(box) / "bin" / "python")
    subprocess.run([python, "-m", "pip", "uninstall", "--yes", "--quiet", "migrate"], capture_output=True)
    held = freeze(box)
    argv = shlex.split(command, comments=True)
    assert argv[:2] == ["pip", "install"], command
    report = work / f"pip-dry-run-{box}.json"
    dry = ["pip", "install", "--dry-run", "--quiet", "--report", str(report), *argv[2:]]
    code, out, _ = run(box, work, dry)
    assert code == 0, out[-3000:]
    items = json.loads(report.read_text())["install"]
    names = [(_norm(i["metadata"]["name"]), i["metadata"]["version"]) for i in items]
    replaced = [f"{n} {held[n]} -> {v}" for n, v in names if n in held]
    if replaced:  # not installed: the kept box would lose its recipe for every later run
        flow.installs.append(Install(box, command, replaced, [], [], ""))
        return
    code, out, seconds = run(box, work, command)
    flow.steps.append(Step(box, command, 0, code, out, seconds, "install"))
    after = freeze(box)
    where = subprocess.run([python, "-c", "import migrate.keymap as k; print(k.__file__)"], cwd="/",
                           capture_output=True, text=True).stdout.strip()
    flow.installs.append(Install(
        box, command, replaced=[],
        added=[f"{n}=={v}" for n, v in names if n not in held],
        changed=[f"{n} {v} -> {after.get(n)}" for n, v in recipe(box).items() if after.get(n) != v],
        package=where))


def copy_checkout(dest: Path) -> None:
    """This working tree as a user's checkout: tracked and untracked-but-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.fixture(scope="module")
def flow(tmp_path_factory, record_flow) -> Flow:
    for name in BOXES.values():
        assert (ENVS / name / "recipe.txt").is_file(), f"{ENVS / name} not built: run `make envs-install`"
    work = tmp_path_factory.mktemp("two_boxes")
    copy_checkout(work / "migrate")
    flow = Flow(work)
    record_flow(flow)
    torch_env = {**box_env("torch", work), "PYTHONPATH": str(work / "migrate")}
    code, out, _ = run("torch", work, [str(venv("torch") / "bin" / "python"), str(REPO / "tests" / "envs" /
                                                                                "make_hf_model.py"), str(work)],
                       env=torch_env)
    assert code == 0, out[-3000:]
    # The first try: the checkout on PYTHONPATH, nothing installed (no migrate.keymaps package).
    for box in BOXES:
        subprocess.run([venv(box) / "bin" / "python", "-m", "pip", "uninstall", "--yes", "--quiet", "migrate"],
                       capture_output=True)
    flow.checkout = {
        box: run(box, work, [str(venv(box) / "bin" / "python"), "-m", "migrate", "convert", "--help"],
                 env={**box_env(box, work), "PYTHONPATH": str(work / "migrate")})[:2]
        for box in BOXES}
    for line, lang, text, box, want in page_blocks(PAGE):
        if lang in ("python", "yaml") and text.startswith("# file: "):
            (work / text.splitlines()[0][len("# file: "):].strip()).write_text(text)
            continue
        if lang != "bash" or box is None:
            continue
        assert box in BOXES, f"two-boxes.md:{line}: unknown box {box}"
        for command in (c for c in text.splitlines() if c.strip() and not c.lstrip().startswith("#")):
            if command.startswith("pip install"):
                install(box, work, command, flow)
                continue
            code, out, seconds = run(box, work, command)
            flow.steps.append(Step(box, command, want, code, out, seconds, f"two-boxes.md:{line}"))
    return flow


# ---------------------------------------------------------------- what the flow must show


def test_a_checkout_on_pythonpath_runs_without_an_install(flow):
    for box, (code, out) in flow.checkout.items():
        assert code == 0 and "hf_llama" in out, (box, out[-2000:])  # the keymaps listed in --help


def test_installs_replace_nothing_the_recipes_installed(flow):
    assert {i.box for i in flow.installs} == set(BOXES), "the page installs migrate on both boxes"
    for i in flow.installs:
        assert i.replaced == [], (i.box, i.command, i.replaced)
        assert any(a.startswith("migrate==") for a in i.added), i.added
        assert i.changed == [], (i.box, "recipe packages changed", i.changed)
        # non-editable: the box imports the installed copy, not the checkout
        assert "site-packages" in i.package and str(flow.work) not in i.package, i.package
    for step in flow.steps:
        if step.where == "install":
            assert step.code == 0, step.out[-3000:]


def test_every_command_exits_as_the_page_says(flow):
    wrong = [f"{s.where} [{s.box}] `{s.command}` exited {s.code}, the page says {s.want}\n{s.out[-2500:]}"
             for s in flow.steps if s.code != s.want]
    assert not wrong, "\n\n".join(wrong)


def test_each_box_ran_its_own_frameworks(flow):
    hf = json.loads((flow.work / "dumps" / "hf" / "manifest.json").read_text())
    mf = json.loads((flow.work / "dumps" / "mf" / "manifest.json").read_text())
    assert hf["framework"] == "torch" and hf["versions"]["transformers"].startswith("4."), hf["versions"]
    assert mf["framework"] == "mindspore" and mf["model"]["class"].startswith("mindformers."), mf["model"]
    assert "mindspore" not in hf["versions"] and "torch" not in mf["versions"]


def test_the_two_dumps_pass_on_both_boxes(flow):
    diffs = [s for s in flow.steps if s.command.split("#")[0].split() == ["migrate", "diff", "dumps/hf", "dumps/mf"]]
    assert {s.box for s in diffs} == set(BOXES), "the page diffs the dumps on both boxes"
    for s in diffs:
        assert s.code == 0 and re.search(r"^PASS · logits max abs", s.out, re.M), s.out[-2500:]


def test_a_fault_in_mindformers_model_is_located_at_its_layer(flow):
    s = flow.step("migrate diff dumps/hf dumps/mf_swapped")
    assert s.code == 1 and re.search(r"^FAIL · ", s.out, re.M), s.out[-2500:]
    assert re.search(r"^layer 1 · .*first divergence$", s.out, re.M), s.out[-2500:]


def test_the_mindformers_and_training_commands_agree(flow):
    assert "all knobs agree" in flow.step("migrate hparams run.yaml --mindformers").out
    assert re.search(r"^PASS · ", flow.step("migrate compare runs/golden runs/ms").out, re.M)
    golden = json.loads((flow.work / "runs" / "golden" / "effective_hparams.json").read_text())
    assert golden["versions"]["transformers"].startswith("4."), golden["versions"]
