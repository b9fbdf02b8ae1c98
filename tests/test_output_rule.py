"""The output rule, for every verb that writes: an output (folder or single file) is never an input
of the command, never holds one, never lies inside one; a refusal is one `migrate: error:` line,
exit 2, before anything is read into memory or written (migrate.cli_verbs.guard_outputs, the rule
in migrate.checkpoints.output_guard).

Each verb declares what it writes and reads at its registration (`@verb(..., writes=, reads=)`);
the walk below tries every declared output of every declared writing verb against an input, and
a verb whose parser has an output-like argument it does not declare fails `test_every_output_is_declared`.
Driven through `migrate.cli.main` in-process, as a user runs it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import build_parser, main
from migrate.cli_verbs import VERBS, Output, Verb, guard_outputs
from migrate.convert import convert

build_parser()  # declares every verb
WRITERS = {name: v for name, v in VERBS.items() if v.run is not None and v.writes}
# argparse destinations that name what a verb writes; a verb having one must declare it
OUTPUT_NAMES = {"out", "out_dir", "output", "report", "json", "plot"}
FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction, argparse._CountAction)

RUN_YAML = """\
hf_model: hf
ms_model: ms
data: data
seq_length: 16
micro_batch_size: 4
total_steps: 2
out_dir: {golden: golden, ms: ms_out}
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Inputs every verb can be pointed at: an HF folder, its conversion, a run folder, data, run.yaml."""
    top = tmp_path_factory.mktemp("rule")
    r = top / "in"
    save_hf_model(build_hf_model("gqa", seed=3), r / "hf")
    convert(r / "hf", r / "ms")
    (r / "run").mkdir()
    (r / "run" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "loss": 5.0 - 0.1 * i, "lr": 1e-3, "grad_norm": 1.0}) + "\n" for i in range(3)))
    (r / "data").mkdir()
    (r / "data" / "data.json").write_text('{"format": "migrate-tokens"}\n')
    (r / "text.txt").write_text("hello world\n")
    (r / "run.yaml").write_text(RUN_YAML)
    return r


def command(verb: str, r: Path) -> tuple[list, Path]:
    """Verb -> (its command line with {dest} for each output, the input folder the walk aims at)."""
    hf, ms, run = r / "hf", r / "ms", r / "run"
    table = {
        "convert": (["convert", hf, "{out_dir}", "--mindformers-yaml", "{mindformers_yaml}"], hf),
        "export": (["export", ms, "{out_dir}"], ms),
        "diff": (["diff", hf, ms, "--report", "{report}"], ms),
        "lora export": (["lora", "export", ms, "{out}"], ms),
        "lora import": (["lora", "import", hf, "{out}", "--model", ms], ms),
        "lora merge": (["lora", "merge", ms, "{out}", "--model", ms], ms),
        "mindformers-config": (["mindformers-config", ms, "--out", "{out}"], ms),
        "dump": (["dump", ms, "{out}", "--inputs", "{inputs}"], ms),
        "report": (["report", run, "-o", "{output}"], run),
        "data tokenize": (["data", "tokenize", r / "text.txt", "--tokenizer", hf, "--seq-length", "16",
                           "--out", "{out}"], hf),
        "compare": (["compare", run, run, "--plot", "{plot}", "--json", "{json}"], run),
        "replay": (["replay", run, run, "--report", "{report}"], run),
        "train": (["train", "--config", r / "run.yaml", "--out", "{out}"], ms),
        "ckpt merge": (["ckpt", "merge", run, "{out}"], run),
        "vocab resize": (["vocab", "resize", ms, "{out_dir}", "--to", "400", "--hf", hf, "{hf}"], ms),
    }
    return table[verb]


def snapshot(folder: Path) -> dict:
    """Every path under folder (hidden ones too) -> sha256 of its bytes (None: a folder)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def run_cli(capsys, argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("migrate: error: output "), err
    assert "Traceback" not in err
    assert any(w in err for w in words), err


# ---------- every verb that writes declares it, and the walk knows every declared one ----------
def _undeclared(v: Verb) -> list[str]:
    p = argparse.ArgumentParser()
    if v.options is not None:
        v.options(p)
    declared = {o.dest for o in v.writes}
    return [a.dest for a in p._actions if not isinstance(a, FLAGS) and a.dest not in declared
            and (a.dest in OUTPUT_NAMES or a.dest.endswith(("_out", "_yaml")) or _names_an_output(a.metavar))]


def _names_an_output(metavar) -> bool:  # e.g. --hf HF_DIR HF_OUT
    names = metavar if isinstance(metavar, tuple) else (metavar or "",)
    return any(n.endswith("_OUT") or n in ("OUT", "OUT_DIR", "OUTPUT") for n in names)


def test_every_output_is_declared():
    missing = {name: _undeclared(v) for name, v in VERBS.items() if v.run is not None}
    assert {name: dests for name, dests in missing.items() if dests} == {}


def test_an_undeclared_output_is_caught():
    """What the test above does with a new verb that writes `out` and does not say so."""
    def options(p):
        p.add_argument("src")
        p.add_argument("--out")
        p.add_argument("--json", action="store_true")  # prints JSON: not an output
        p.add_argument("--pair", nargs=2, metavar=("SRC", "PAIR_OUT"))

    assert _undeclared(Verb("new", "", options=options, run=lambda a: 0)) == ["out", "pair"]
    assert _undeclared(Verb("new", "", options=options, run=lambda a: 0,
                            writes=(Output("out"), Output("pair", value=lambda a: a.pair[1])))) == []


def test_declarations_name_real_arguments(tmp_path):
    for name, v in WRITERS.items():
        p = argparse.ArgumentParser()
        v.options(p)
        dests = {a.dest for a in p._actions}
        for o in v.writes:
            assert o.dest in dests, (name, o.dest)
            assert o.overwrite is None or o.overwrite in dests, (name, o.overwrite)
        for r in v.reads:
            assert callable(r) or r in dests, (name, r)
        argv, _ = command(name, tmp_path)
        assert {f"{{{o.dest}}}" for o in v.writes} <= {str(a) for a in argv}, name


def test_the_walk_covers_every_writing_verb():
    assert set(WRITERS) == {"convert", "export", "diff", "lora export", "lora import", "lora merge",
                            "mindformers-config", "dump", "report", "data tokenize", "compare", "replay",
                            "train", "ckpt merge", "vocab resize"}


# ---------- the walk: each output, onto each input ----------
CASES = ("is", "inside", "inside_existing", "contains")
WRITTEN_IF_NEW = {("dump", "inputs")}  # an existing FILE is read, not written: only "inside" writes one
WALK = [(name, o.dest, case) for name, v in WRITERS.items() for o in v.writes for case in CASES
        if (name, o.dest) not in WRITTEN_IF_NEW or case == "inside"]


@pytest.mark.parametrize(("name", "dest", "case"), WALK, ids=[f"{n}-{d}-{c}" for n, d, c in WALK])
def test_an_output_never_touches_an_input(capsys, tmp_path, root, name, dest, case):
    argv, target = command(name, root)
    existing = sorted(p for p in target.iterdir() if p.is_file())[0]
    bad = {"is": target, "inside": target / "new_output", "inside_existing": existing, "contains": root}[case]
    fresh = {o.dest: tmp_path / f"fresh_{o.dest}" for o in WRITERS[name].writes}
    fresh[dest] = bad
    line = [fresh[str(a)[1:-1]] if str(a).startswith("{") else a for a in argv]
    before = snapshot(root)
    code, err = run_cli(capsys, line)
    assert_refused(code, err, "is the input", "is inside the input", "contains the input")
    assert snapshot(root) == before  # no byte of any input changed, nothing added beside them
    assert not any(p.exists() for d, p in fresh.items() if d != dest)  # no other output written first


# ---------- what the hostile sweep found (each exited 0 and lost or polluted data) ----------
def test_report_never_replaces_the_runs_metrics(capsys, root):
    before = snapshot(root)
    code, err = run_cli(capsys, ["report", root / "run", "-o", root / "run" / "metrics.jsonl"])
    assert_refused(code, err, f"output {root / 'run' / 'metrics.jsonl'} is inside the input {root / 'run'}")
    assert snapshot(root) == before


@pytest.mark.parametrize("into", ["ms", "data", "hf"])
def test_train_out_never_writes_into_the_models_or_the_data(capsys, root, into):
    before = snapshot(root)
    code, err = run_cli(capsys, ["train", "--config", root / "run.yaml", "--out", root / into])
    assert_refused(code, err, f"output {root / into} is the input")
    code, err = run_cli(capsys, ["train", "--config", root / "run.yaml", "--out", root / into / "run"])
    assert_refused(code, err, f"output {root / into / 'run'} is inside the input")
    assert snapshot(root) == before


@pytest.mark.parametrize("argv", [
    ["dump", "{ms}", "{ms}/dumps"],
    ["lora", "import", "{hf}", "{ms}/adapter", "--model", "{ms}"],
    ["vocab", "resize", "{ms}", "{out}", "--to", "400", "--hf", "{hf}", "{ms}/hf_out"],
    ["vocab", "resize", "{ms}", "{hf}/ms_out", "--to", "400", "--hf", "{hf}", "{out}"],
], ids=["dump", "lora-import", "vocab-resize-hf-out", "vocab-resize-out"])
def test_never_writes_inside_the_folder_it_reads(capsys, tmp_path, root, argv):
    line = [a.format(ms=root / "ms", hf=root / "hf", out=tmp_path / "out") for a in argv]
    before = snapshot(root)
    code, err = run_cli(capsys, line)
    assert_refused(code, err, "is inside the input")
    assert snapshot(root) == before and not (tmp_path / "out").exists()


def test_convert_checks_its_yaml_before_converting(capsys, tmp_path, root):
    """A refused --mindformers-yaml used to leave the finished conversion under the output name."""
    before = snapshot(root)
    code, err = run_cli(capsys, ["convert", root / "hf", tmp_path / "ms", "--mindformers-yaml",
                                 root / "hf" / "config.json", "--overwrite", "--yaml-overwrite"])
    assert_refused(code, err, f"output {root / 'hf' / 'config.json'} is inside the input {root / 'hf'}")
    assert snapshot(root) == before and not (tmp_path / "ms").exists()
    mine = tmp_path / "notes.yaml"  # a file of the user's: --yaml-overwrite replaces only migrate's YAML
    mine.write_text("keep: me\n")
    code, err = run_cli(capsys, ["convert", root / "hf", tmp_path / "ms", "--mindformers-yaml", mine,
                                 "--yaml-overwrite"])
    assert_refused(code, err, "was not written by migrate")
    code, err = run_cli(capsys, ["convert", root / "hf", tmp_path / "ms", "--mindformers-yaml", mine])
    assert_refused(code, err, "already exists (pass --overwrite")
    assert mine.read_text() == "keep: me\n" and not (tmp_path / "ms").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.yaml"]


def test_file_outputs_replace_what_the_rule_allows(tmp_path, root):
    """A report, plot or comparison JSON outside the inputs is regenerated in place over one migrate
    wrote, never over another file (`report -o run.yaml` replaced the run config with HTML);
    RUN/report.html (report's own default) may be named; a folder or a link is never a file output."""
    parser = build_parser()

    def guard(*argv):
        guard_outputs(parser.parse_args([str(a) for a in argv]))

    from migrate.errors import MigrateError

    old, old_json = tmp_path / "old.html", tmp_path / "old.json"
    old.write_text("<!DOCTYPE html>\n<html><head><title>Training run report: run</title>")
    old_json.write_text('{\n  "schema_version": 1,\n  "tool": "migrate compare"\n}\n')
    guard("report", root / "run", "-o", old)
    guard("report", root / "run", "-o", root / "run" / "report.html")
    guard("compare", root / "run", root / "run", "--json", old_json)
    for argv in (["report", root / "run", "-o"], ["compare", root / "run", root / "run", "--json"],
                 ["compare", root / "run", root / "run", "--plot"]):
        mine = tmp_path / "mine.yaml"
        mine.write_text("keep: me\n")
        with pytest.raises(MigrateError, match="exists and was not written by migrate"):
            guard(*argv, mine)
        assert mine.read_text() == "keep: me\n"
    with pytest.raises(MigrateError, match="not written by migrate"):   # a report is not a comparison JSON
        guard("compare", root / "run", root / "run", "--json", old)

    with pytest.raises(MigrateError, match="is a folder"):
        guard("compare", root / "run", root / "run", "--json", tmp_path)
    (tmp_path / "link.json").symlink_to(old)
    with pytest.raises(MigrateError, match="symbolic link"):
        guard("compare", root / "run", root / "run", "--json", tmp_path / "link.json")
    side = tmp_path / "side"
    side.mkdir()
    (side / "metrics.jsonl").write_text((root / "run" / "metrics.jsonl").read_text())
    (side / "effective_hparams.json").write_text("{}\n")
    with pytest.raises(MigrateError, match="is the input"):  # beside a metrics file: its hparams, read too
        guard("compare", side / "metrics.jsonl", side / "metrics.jsonl", "--json", side / "effective_hparams.json")


def test_what_migrate_regenerates_carries_its_signature(root, tmp_path):
    """The report, the comparison JSON and the plot migrate writes are recognised as its own (so a
    second run replaces them) by the signatures the output rule looks for."""
    from migrate.checkpoints.output_guard import COMPARE_JSON_SIGNATURE, PNG_SIGNATURE, REPORT_SIGNATURE

    out = tmp_path / "again"
    for argv in (["report", root / "run", "-o", out / "r.html"],
                 ["compare", root / "run", root / "run", "--json", out / "c.json", "--plot", out / "c.png"]):
        out.mkdir(exist_ok=True)
        assert main([str(a) for a in argv]) in (0, 1)
        assert main([str(a) for a in argv]) in (0, 1)   # the second run replaces the first's files
    assert REPORT_SIGNATURE in (out / "r.html").read_bytes()[:4096]
    assert COMPARE_JSON_SIGNATURE in (out / "c.json").read_bytes()[:4096]
    assert PNG_SIGNATURE in (out / "c.png").read_bytes()[:4096]


def test_declared_constants_match_the_library():
    from migrate.cli_mindformers import YAML_FIRST_LINE
    from migrate.mindformers.run import MARKER
    from migrate.train.run_report.page import REPORT_FILE

    assert YAML_FIRST_LINE == MARKER and REPORT_FILE == "report.html"
