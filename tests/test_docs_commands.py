"""Every command README.md and docs/*.md show, executed, so the docs cannot drift.

The convention (docs/layout.md's "How the docs are tested" says it for readers):

- A fence's info string says what it holds: ```bash blocks are commands, run in order;
  ```text is output, ```yaml / ```python are files or snippets. Every fence has one.
- Each page runs in a folder of its own, prepared by PAGES below with exactly the names the
  page's preamble lists (`hf_model/`, `ms_model/`, `run.yaml`, ...): tiny models built here
  from a config and a seed, nothing downloaded. The blocks of one page share that folder, so a
  later block reads what an earlier one wrote.
- HTML comments on the lines just above a fence steer it:
  `<!-- not run: REASON -->` skips it (a reason is required), `<!-- exit: N -->` says every
  command in it exits N (default 0), `<!-- prepare: NAME -->` runs PREPARE[NAME] in the
  folder first (inputs only a foreign tool would make).
- A ```yaml or ```python block whose first line is `# file: NAME` is written to NAME in the
  page's folder when the flow reaches it.
- Every `migrate VERB ... --flag` in a bash block or an inline code span, run or not, must be
  a verb and flags of the real command line.

`migrate ...` runs in this process through `migrate.cli.main` (one MindSpore/torch import
for the whole file), `python golden/train_torch.py ...` through the golden's `main`.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
DOCS = [REPO / "README.md"] + sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "DESIGN.md")
RUN_LANGS = {"bash", "sh", "console", "shell"}
MARKER = re.compile(r"<!--\s*(not run|exit|prepare):\s*(.*?)\s*-->")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    skip: str | None = None
    exit: int = 0
    prepare: str | None = None

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        assert j < len(lines), f"{path.name}:{start + 1}: fence never closed"
        block = Block(path.name if path.name != "README.md" else "README.md", start + 1, m.group(1),
                      "\n".join(lines[start + 1:j]) + "\n")
        k = start - 1
        while k >= 0 and lines[k].strip().startswith("<!--"):
            for kind, value in MARKER.findall(lines[k]):
                if kind == "not run":
                    assert value, f"{block.where()}: `not run` needs a reason"
                    block.skip = value
                elif kind == "exit":
                    block.exit = int(value)
                else:
                    block.prepare = value
            k -= 1
        out.append(block)
        i = j + 1
    return out


def commands(block: Block) -> list[list[str]]:
    """The block's commands as argv lists: `\\` continuations joined, comments dropped, `&&` split."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    argvs = []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tokens = shlex.split(line, comments=True)
        argv: list[str] = []
        for t in tokens + ["&&"]:
            if t == "&&":
                if argv:
                    argvs.append(argv)
                argv = []
            else:
                argv.append(t)
    return argvs


def parser():
    from migrate.cli import build_parser

    return build_parser()


def resolve(p: argparse.ArgumentParser, args: list[str]):
    """(the verb path, the parser that takes the remaining arguments)."""
    path = []
    for tok in args:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and tok in subs[0].choices:
            p = subs[0].choices[tok]
            path.append(tok)
        else:
            break
    return path, p


def check_migrate_argv(p, args: list[str], where: str) -> list[str]:
    path, sub = resolve(p, args)
    if not path:
        return [f"{where}: `migrate {' '.join(args[:2])}`: no such verb"]
    subs = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        return [f"{where}: `migrate {' '.join(path)}` needs one of {sorted(subs[0].choices)}"]
    flags = {s for a in sub._actions for s in a.option_strings}
    bad = []
    for tok in args[len(path):]:
        if tok.startswith("-") and not re.fullmatch(r"-[\d.e+-]+", tok) and tok not in ("-", "--"):
            name = tok.split("=")[0]
            if name not in flags:
                bad.append(f"{where}: `migrate {' '.join(path)}` has no flag {name}")
    return bad


def golden_module():
    spec = importlib.util.spec_from_file_location("golden_train_torch_for_docs", REPO / "golden" / "train_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- static checks (no model)


def test_every_fence_says_what_it_holds_and_every_marker_is_known():
    problems = []
    for page in DOCS:
        text = page.read_text()
        for b in blocks(page):
            if not b.lang:
                problems.append(f"{b.where()}: fence without an info string (bash, text, yaml, python)")
            if (b.skip or b.exit or b.prepare) and b.lang not in RUN_LANGS:
                problems.append(f"{b.where()}: run marker above a {b.lang} block")
            if b.prepare and b.prepare not in PREPARE:
                problems.append(f"{b.where()}: unknown prepare step {b.prepare}")
        for m in re.finditer(r"<!--(.*?)-->", text, re.S):
            body = m.group(1).strip()
            if body.split(":")[0] in ("not run", "exit", "prepare") and not MARKER.search(m.group(0)):
                problems.append(f"{page.name}: malformed marker {m.group(0)}")
        unrun = [b for b in blocks(page) if b.lang in RUN_LANGS and not b.skip]
        if unrun:
            if page.name not in PAGES:
                problems.append(f"{page.name}: runs commands but has no folder in PAGES")
    assert not problems, "\n".join(problems)


def test_every_verb_and_flag_shown_exists():
    p = parser()
    golden = None
    problems = []
    for page in DOCS:
        for b in blocks(page):
            if b.lang not in RUN_LANGS:
                continue
            for argv in commands(b):
                if argv[0] == "migrate":
                    problems += check_migrate_argv(p, argv[1:], b.where())
                elif argv[:2] == ["python", "golden/train_torch.py"]:
                    golden = golden or golden_flags()
                    problems += [f"{b.where()}: golden/train_torch.py has no flag {t}" for t in argv[2:]
                                 if t.startswith("--") and t.split("=")[0] not in golden]
        for i, line in enumerate(page.read_text().splitlines(), 1):
            for span in re.findall(r"`(migrate [^`]+)`", line):
                args = [t for t in span.split()[1:] if t not in ("…", "...")]
                if args and re.fullmatch(r"[a-z][a-z-]*", args[0]):
                    problems += check_migrate_argv(p, args, f"{page.name}:{i}")
    assert not problems, "\n".join(problems)


def golden_flags() -> set[str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        golden_module().main(["--help"])
    return set(re.findall(r"--[a-z][a-z-]*", buf.getvalue()))


# ---------------------------------------------------------------- the pages' folders

VOCAB = 316  # not a multiple of 8, for docs/vocab.md's resize
# 3 layers: docs/diff.md injects a fault into layer 2; each layer more costs generate and train compile time
# bos/eos/pad as the BPE tokenizer numbers its special tokens (<s>, </s>, <pad>)
TINY = dict(vocab_size=VOCAB, max_position_embeddings=512, initializer_range=0.1, num_hidden_layers=3,
            bos_token_id=0, eos_token_id=1, pad_token_id=2)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """hf_model/ (a tied GQA Llama with a BPE tokenizer) and corpus/*.txt, built once."""
    from hf_fixtures import build_hf_model, save_hf_model
    from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus

    root = tmp_path_factory.mktemp("docs_base")
    files = write_stdlib_corpus(root / "corpus", modules=["textwrap", "heapq", "json"])
    train_bpe_tokenizer(files, VOCAB, root / "tok")
    save_hf_model(build_hf_model("tied", seed=12, **TINY), root / "hf_model")
    for f in (root / "tok").iterdir():
        shutil.copy(f, root / "hf_model" / f.name)
    shutil.rmtree(root / "tok")
    return root


def _convert(root: Path) -> None:
    from migrate.convert import convert

    convert(root / "hf_model", root / "ms_model")


# run.yaml of the pages that train: the doc's names, a size that runs in seconds; a global batch of 8
# for docs/mindformers.md's --dp 8.
RUN_YAML = """\
hf_model: hf_model
ms_model: ms_model
data: data
seq_length: 512
total_steps: 2
micro_batch_size: 4
grad_accum_steps: 2
max_grad_norm: 1.0
seed: 42
checkpoint_interval: 2
optimizer: {lr: 3.0e-3, weight_decay: 0.1}
schedule: {name: cosine, warmup_steps: 1, min_lr_rate: 0.1}
out_dir: {golden: runs/golden, ms: runs/ms}
"""


def _tokenize(root: Path) -> None:
    from migrate.data.tokenize import tokenize_corpus

    tokenize_corpus(sorted((root / "corpus").glob("*.txt")), root / "hf_model", 512, root / "data")


def _tinylm(root: Path) -> None:
    from hf_fixtures import build_hf_model
    from test_custom_keymap import user_checkpoint

    user_checkpoint(root / "tinylm", build_hf_model("gqa", seed=3))


def _my_port(root: Path) -> None:
    (root / "my_port.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from hand_port_ms import from_hf\n\n\n"
        "def build():\n"
        "    return from_hf('hf_model')   # the hand port of tests/hand_port_ms.py\n")


def _run_yaml(root: Path) -> None:
    (root / "run.yaml").write_text(RUN_YAML)


def _lora_run(root: Path) -> None:
    lora = "lora: {rank: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, v_proj]}\n"  # docs/lora.md's
    (root / "run.yaml").write_text(RUN_YAML + lora)
    _tokenize(root)


TRAINED: dict[str, Path] = {}  # runs/ms of the first page whose flow ran `migrate train --config run.yaml`


def _trained(root: Path) -> None:
    """runs/ms/: a finished `migrate train --config run.yaml`, copied from a page that ran it (README's)."""
    if "runs/ms" not in TRAINED:
        from migrate.cli import main

        cwd = os.getcwd()
        os.chdir(root)
        try:
            assert main(["train", "--config", "run.yaml"]) == 0
        finally:
            os.chdir(cwd)
        return
    shutil.copytree(TRAINED["runs/ms"], root / "runs" / "ms")


# page -> what its folder holds before its first block (the page's preamble names the same)
PAGES = {
    "README.md": [_run_yaml],
    "convert.md": [_tinylm],
    "diff.md": [_convert, _my_port],
    "vocab.md": [_convert, _tokenize],
    "train.md": [_convert, _run_yaml],
    "lora.md": [_convert, _lora_run],
    "mindformers.md": [_convert, _run_yaml, _tokenize],
    "generate.md": [_convert],
    "scaling.md": [_convert, _run_yaml, _tokenize, _trained],
}


def _foreign_logs(root: Path) -> None:
    """The golden run of runs/golden as HF Trainer, Megatron-LM, MindFormers and TensorBoard write it."""
    import foreign_logs as fl

    recs = fl.records(root / "runs" / "golden")
    next_lr = [0.0] + [r["lr"] for r in recs[1:]] + [recs[-1]["lr"]]
    fl.write_hf_trainer_state(recs, root / "hf_out")
    shutil.copy(root / "hf_out" / "trainer_state.json", root / "trainer_state.json")
    fl.write_megatron(recs, root / "megatron_train.log", next_lr)
    fl.write_mindformers(recs, root / "mindformers.log")
    fl.write_hf_tensorboard(recs, root / "runs" / "hf_tb")


PREPARE = {"foreign-logs": _foreign_logs}


# ---------------------------------------------------------------- running a page


def run_argv(argv: list[str], golden) -> int:
    import mindspore as ms

    from migrate.cli import main

    try:
        if argv[0] == "migrate":
            return main(argv[1:])
        if argv[:2] == ["python", "golden/train_torch.py"]:
            return golden.main(argv[2:])
        raise AssertionError(f"the doc test runs `migrate` and `python golden/train_torch.py` only: {argv}")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def expand(argv: list[str]) -> list[str]:
    out = []
    for t in argv:
        out += sorted(glob.glob(t)) or [t] if any(c in t for c in "*?[") else [t]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_the_page_runs_as_written(page, base, tmp_path, monkeypatch, capsys, one_torch_thread):
    path = REPO / page if page == "README.md" else REPO / "docs" / page
    root = tmp_path / "work"
    shutil.copytree(base, root)
    (root / "golden").symlink_to(REPO / "golden")
    for step in PAGES[page]:
        step(root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    golden = golden_module()
    ran, failures, times = 0, [], []
    for b in blocks(path):
        if b.lang in ("yaml", "python") and b.text.startswith("# file: "):
            name = b.text.splitlines()[0][len("# file: "):].strip()
            (root / name).write_text(b.text)
            continue
        if b.lang not in RUN_LANGS or b.skip:
            continue
        if b.prepare:
            PREPARE[b.prepare](root)
        for argv in commands(b):
            t0 = time.perf_counter()
            code = run_argv(expand(argv), golden)
            times.append((time.perf_counter() - t0, " ".join(argv)))
            out = capsys.readouterr()
            ran += 1
            if code == 0 and argv == ["migrate", "train", "--config", "run.yaml"] and "runs/ms" not in TRAINED:
                keep = tmp_path.parent / "docs_trained_run"
                shutil.copytree(root / "runs" / "ms", keep)
                TRAINED["runs/ms"] = keep
            if code != b.exit:
                failures.append(f"{b.where()}: `{' '.join(argv)}` exited {code}, the doc says {b.exit}\n"
                                f"{out.out[-1500:]}{out.err[-1500:]}")
    with capsys.disabled():
        for t, cmd in times:
            print(f"\n  {t:6.1f}s  {page}: {cmd}", end="")
    assert ran, f"{page}: no command ran"
    assert not failures, "\n\n".join(failures)


sys.path.insert(0, str(TESTS))


# ---------------------------------------------------------------- DESIGN.md and the paths the docs cite


def test_design_layers_are_the_ones_test_architecture_enforces():
    from test_architecture import LAYERS

    text = (REPO / "docs" / "DESIGN.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. )", "\n" + section.split("\n\n", 1)[1].split("\n\n")[0].strip())
    items = [i for i in items if i.strip()]
    shown = [{"migrate" if n == "migrate" else f"migrate.{n}" for n in re.findall(r"`([\w.]+)`", item)}
             for item in items]
    assert len(shown) == len(LAYERS), f"DESIGN lists {len(shown)} layers, the test {len(LAYERS)}"
    for (name, prefixes), names in zip(LAYERS, shown, strict=True):
        assert names == set(prefixes), (f"layer {name}: DESIGN lists {sorted(names - set(prefixes))} too much, "
                                        f"misses {sorted(set(prefixes) - names)}")


CITED = re.compile(r"`((?:migrate|tests|bench|golden|keymaps|docs|\.ci)/[\w./-]*?)`")


def test_every_repository_path_the_docs_cite_exists():
    missing = []
    for page in DOCS + [REPO / "docs" / "DESIGN.md"]:
        for i, line in enumerate(page.read_text().splitlines(), 1):
            for path in CITED.findall(line):
                if re.search(r"[A-Z]{3,}", path):
                    continue  # a placeholder: keymaps/NAME.yaml
                if not (REPO / path.rstrip("/")).exists():
                    missing.append(f"{page.name}:{i}: {path}")
    assert not missing, "\n".join(missing)
