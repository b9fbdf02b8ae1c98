"""The variant sweep of issue 26: hostile or careless inputs beyond the issue's own list, through the
command line. Each case failed before its fix (a replaced file, a hang, a silent exit 0, a FIFO read
forever or overwritten, a link out of a run folder followed) and is now one `migrate: error:` line,
exit 2, with nothing written and nothing the user had lost.

One tiny converted Llama and one hand-written run folder per module; no training."""
from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """hf/, its conversion ms/, and a run folder run/ (metrics, health log, hyperparameters) with a
    golden twin golden/, as the trainers write them."""
    r = tmp_path_factory.mktemp("hostile")
    save_hf_model(build_hf_model("gqa", seed=3), r / "hf")
    convert(r / "hf", r / "ms")
    for side in ("run", "golden"):
        (r / side).mkdir()
        (r / side / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "loss": 5.0 - 0.1 * i, "lr": 1e-3, "grad_norm": 1.0}) + "\n"
            for i in range(4)))
    (r / "run" / "health.jsonl").write_text(json.dumps(
        {"step": 4, "kind": "verdict", "healthy": True, "first": {}, "counts": {},
         "line": "health after step 4: healthy (no event)"}) + "\n")
    (r / "run.yaml").write_text("hf_model: hf\nms_model: ms\ndata: data\nseq_length: 16\nmicro_batch_size: 4\n"
                                "total_steps: 4\n")
    return r


def refused(capsys, *argv, match: str) -> str:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("migrate: error: "), (code, err)
    assert match in err, err
    return err


def run_copy(root: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(root / name, tmp_path / name))


# ---------- outputs: a regenerated file is replaced only over one migrate wrote ----------
def test_report_over_a_file_migrate_did_not_write_is_refused(root, tmp_path, capsys):
    """`report RUN -o run.yaml` exited 0 and replaced the run config with HTML."""
    config = Path(shutil.copy(root / "run.yaml", tmp_path / "run.yaml"))
    before = config.read_bytes()
    refused(capsys, "report", root / "run", "-o", config, match="exists and was not written by migrate")
    refused(capsys, "compare", root / "golden", root / "run", "--json", config, match="not written by migrate")
    assert config.read_bytes() == before
    # its own report is replaced: the second run over the first's file
    assert main(["report", str(root / "run"), "-o", str(tmp_path / "r.html")]) == 0
    assert main(["report", str(root / "run"), "-o", str(tmp_path / "r.html")]) == 0


# ---------- inputs that are not regular files ----------
class _Releaser:
    """While a test runs, a writer opens and closes `fifo` every few seconds: a reader blocked on it
    (the bug) reads nothing and goes on, so the test fails on the result instead of hanging."""

    def __init__(self, fifo: Path, every: float = 5.0):
        self.fifo, self.every, self.stop = fifo, every, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.wait(self.every):
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # no reader at the moment

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()


def test_compare_on_a_fifo_is_refused_not_read_forever(root, tmp_path, capsys):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    with _Releaser(fifo):
        refused(capsys, "compare", root / "golden", fifo, match="not a regular file or folder (MindSpore metrics)")


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_dump_inputs_that_is_not_a_file_is_refused_and_left_alone(root, tmp_path, capsys, kind):
    """A FIFO named by --inputs was replaced by the seeded ids (exit 0); a folder failed on a rename
    naming a temporary file."""
    inputs = tmp_path / "in.npz"
    os.mkfifo(inputs) if kind == "fifo" else inputs.mkdir()
    words = "is not a regular file" if kind == "fifo" else "is a folder"
    refused(capsys, "dump", root / "ms", tmp_path / "out", "--inputs", inputs, match=f"--inputs {inputs} {words}")
    mode = os.lstat(inputs).st_mode
    assert (stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISDIR(mode))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]   # no dump, no partial file


_DAMAGES = [
    # a folder read as "no steps": health said healthy, exit 0
    ("metrics.jsonl", "folder", "metrics.jsonl is a folder, not a file"),
    ("health.jsonl", "fifo", "health.jsonl is a FIFO, device or socket, not a file"),
    # a link out of the run folder was followed and read as this run's curve
    ("metrics.jsonl", "link", "metrics.jsonl is a link to a file outside the run folder"),
    # compare skipped it ("hyperparameters not cross-checked") and passed
    ("effective_hparams.json", "fifo", "effective_hparams.json is a FIFO, device or socket, not a file"),
]


@pytest.mark.parametrize("verb, member, damage, words", [
    (verb, *case) for verb in ("health", "report", "compare") for case in _DAMAGES
    if not (verb == "compare" and case[0] == "health.jsonl")      # compare reads no health log
    and not (verb == "health" and case[0] == "effective_hparams.json")])   # health replays only without a log
def test_a_run_folder_member_that_breaks_the_reader_rule_is_refused(root, tmp_path, capsys, verb, member,
                                                                     damage, words):
    run = run_copy(root, tmp_path)
    (run / member).unlink(missing_ok=True)
    if damage == "folder":
        (run / member).mkdir()
    elif damage == "fifo":
        os.mkfifo(run / member)
    else:
        (run / member).symlink_to(root / "golden" / "metrics.jsonl")
    argv = {"health": ["health", run], "report": ["report", run, "-o", tmp_path / "r.html"],
            "compare": ["compare", root / "golden", run]}[verb]
    with _Releaser(run / member):
        refused(capsys, *argv, match=words)
    assert not (tmp_path / "r.html").exists()


# ---------- names with control characters ----------
def test_a_newline_in_a_name_stays_inside_one_error_line(root, tmp_path, capsys):
    """A file name holding a newline split the message in two lines (an OSError's second line had no
    `migrate: error:` prefix at all)."""
    err = refused(capsys, "convert", tmp_path / "no\nsuch", tmp_path / "out", match="no\\nsuch")
    assert "\n" not in err
    refused(capsys, "report", tmp_path / "a\nb", match="a\\nb")
    refused(capsys, "compare", tmp_path / "a\rb", root / "golden", match="a\\rb")


# ---------- huge counts in options the issue did not list ----------
@pytest.mark.parametrize("argv, words", [
    # fork: msrun started one MindSpore process per rank (killed for memory); before it, a list of 10**12 ranks
    (["train", "--config", "{root}/run.yaml", "--dp", str(10**12), "--out", "{out}"],
     "ranks is more than any cluster (1,048,576 at most)"),
    (["train", "--config", "{root}/run.yaml", "--dp", str(2**20), "--out", "{out}"],
     "--dp × --mp × --pp = 1,048,576 ranks (1,048,576 MindSpore processes here, 384 MiB each before the model) "
     "needs at least 384.0 TiB"),
    # enumerated the divisors of 10**12 one by one: never ended
    (["plan", "--model", "{root}/ms", "--devices", str(10**12), "--device-memory", "64GB", "--seq-length", "16",
      "--global-batch", "8"], "--devices 1,000,000,000,000 is more than any cluster"),
    # wrote a YAML for 10**12 ranks and an msrun line starting 10**12 local workers
    (["mindformers-config", "{root}/ms", "--out", "{out}.yaml", "--dp", str(10**12)],
     "1,000,000,000,000 ranks is more than any cluster"),
    # a set of 10**12 steps; a single step past the end never fired and the rehearsal said "healthy"
    (["train", "--config", "{root}/run.yaml", "--step-fault", f"nan_grad@1-{10**12}", "--out", "{out}"],
     f"bad step fault 'nan_grad@1-{10**12}': the run has 4 steps (total_steps)"),
    (["train", "--config", "{root}/run.yaml", "--step-fault", "nan_grad@5", "--out", "{out}"],
     "the run has 4 steps"),
    # rows drawn with an infinite std: an export with inf embeddings, exit 0
    (["vocab", "resize", "{root}/ms", "{out}", "--to", "400", "--init", "normal", "--std", "1e400"],
     "argument --std: must be a finite number > 0, got '1e400'"),
])
def test_huge_or_impossible_counts_are_refused_before_acting(root, tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    refused(capsys, *[a.format(root=root, out=out) for a in argv], match=words)
    assert not out.exists() and not (tmp_path / "out.yaml").exists()


def test_plan_finds_the_divisors_of_a_large_cluster_without_trying_each(root, capsys):
    """The divisors are found in O(sqrt n) (plan --devices 10**12 tried every number); speed is bench's business."""
    from migrate.memory_plan import _divisors

    assert _divisors(720720) == [d for d in range(1, 720721) if 720720 % d == 0]
    assert _divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and _divisors(1) == [1]


def test_diff_generate_past_the_models_positions_is_refused(root, capsys):
    """--generate 10**12 ran HF generate for ever (its cache grows; HF only warns past the positions)."""
    refused(capsys, "diff", root / "hf", root / "ms", "--generate", str(10**12),
            match="--generate 1,000,000,000,000 after the 16-token prompt runs past the model's 64 positions")


# ---------- numbers and keys JSON and YAML allow but a config cannot mean ----------
def _hf_config(root: Path, tmp_path: Path, text_change) -> Path:
    hf = Path(shutil.copytree(root / "hf", tmp_path / "hf"))
    (hf / "config.json").write_text(text_change((hf / "config.json").read_text()))
    return hf


PLAN = ["--devices", "1", "--device-memory", "64GB", "--seq-length", "8", "--global-batch", "8"]


@pytest.mark.parametrize("change, words", [
    # 1e400 reads as inf: convert wrote rms_norm_eps inf into model.yaml, exit 0
    (lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e400'), "rms_norm_eps is inf, not a finite number"),
    (lambda t: t.replace('"rope_theta": 10000.0', '"rope_theta": NaN'), "rope_theta is nan, not a finite number"),
    # json kept the second: plan planned a 7-layer model, convert failed on 45 "missing" tensors
    (lambda t: t.rstrip().rstrip("}") + ', "num_hidden_layers": 7}', "key 'num_hidden_layers' appears twice in one "
                                                                      "object"),
])
@pytest.mark.parametrize("verb", ["convert", "plan"])
def test_a_config_json_with_a_value_no_model_has_is_refused(root, tmp_path, capsys, change, words, verb):
    hf = _hf_config(root, tmp_path, change)
    assert (hf / "config.json").read_text() != (root / "hf" / "config.json").read_text()  # the edit took
    argv = ["convert", hf, tmp_path / "out"] if verb == "convert" else ["plan", "--model", hf / "config.json", *PLAN]
    refused(capsys, *argv, match=words)
    assert not (tmp_path / "out").exists()


def test_a_run_yaml_naming_a_key_twice_is_refused(root, tmp_path, capsys):
    """PyYAML kept the last `total_steps` silently: the run trained what the line further down said."""
    config = tmp_path / "run.yaml"
    config.write_text((root / "run.yaml").read_text() + "total_steps: 9\n")
    refused(capsys, "hparams", config, match="key 'total_steps' appears twice in one mapping (line 7, column 1)")
    # a merge key may repeat, and different mappings may share key names
    from migrate.safeyaml import load_yaml

    (tmp_path / "ok.yaml").write_text("a: &a {x: 1}\nb: &b {y: 2}\nc: {<<: *a, <<: *b, z: 3}\nd: {x: 4}\n")
    assert load_yaml(tmp_path / "ok.yaml", "test")["c"] == {"x": 1, "y": 2, "z": 3}


# ---------- foreign logs and adapters with numbers past any run ----------
def test_a_step_past_any_run_is_one_line(root, tmp_path, capsys):
    """A Megatron-LM line logging iteration 10**30 ended in an OverflowError traceback."""
    log = tmp_path / "train.log"
    log.write_text("".join(f" [2025-01-01 00:00:0{i}] iteration {step:>8}/      10 | consumed samples: 8 | learning "
                           f"rate: 1.000000E-04 | lm loss: 3.2 | loss scale: 1.0 | grad norm: 1.000 |\n"
                           for i, step in ((1, 1), (2, 10**30))))
    refused(capsys, "compare", log, root / "golden", match=f"train.log:2: step {10**30} is past any training run")
    run = run_copy(root, tmp_path)
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 10**30, "loss": 1.0, "lr": 1e-3, "grad_norm": 1.0}) + "\n")
    refused(capsys, "compare", root / "golden", run, match=f"'step' must be an integer in 1..{2**53}, got {10**30}")


def test_an_adapter_whose_lora_json_rank_is_not_its_weights_is_refused(root, tmp_path, capsys):
    """lora.json said rank 10**30 over rank-2 weights: merge scaled the update by alpha / 10**30 and wrote
    the base back, exit 0."""
    import numpy as np
    from safetensors.numpy import save_file

    peft = tmp_path / "peft"
    peft.mkdir()
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": np.ones((2, 32), np.float32),
               f"{prefix}.lora_B.weight": np.ones((32, 2), np.float32)}, str(peft / "adapter_model.safetensors"))
    (peft / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                          "target_modules": ["q_proj"]}))
    assert main(["lora", "import", str(peft), str(tmp_path / "adapter"), "--model", str(root / "ms")]) == 0
    record = json.loads((tmp_path / "adapter" / "lora.json").read_text())
    record["spec"]["rank"] = 10**30
    (tmp_path / "adapter" / "lora.json").write_text(json.dumps(record))
    refused(capsys, "lora", "merge", tmp_path / "adapter", tmp_path / "merged", "--model", root / "ms",
            match="A [2, 32] / B [32, 2] in adapter.ckpt are not of the rank "
                  "1000000000000000000000000000000 lora.json states")
    assert not (tmp_path / "merged").exists()


# ---------- an interrupt while a framework initialises ----------
@pytest.mark.parametrize("signum, code, word", [(2, 130, "interrupted"), (15, 143, "terminated")])
def test_an_interrupt_inside_an_extension_import_is_an_interrupt_not_a_traceback(root, tmp_path, capsys,
                                                                                 monkeypatch, signum, code, word):
    """SIGINT during `import mindspore` (seconds long) reached the handler inside the C extension's
    initialisation and came back as ImportError("initialization failed"): a traceback, exit 1."""
    import migrate.probe.dumping as dumping
    from migrate.signals import Interrupted

    def interrupted_import(*args, **kwargs):
        try:
            raise Interrupted(signum)
        except Interrupted as exc:
            raise ImportError("initialization failed") from exc

    monkeypatch.setattr(dumping, "dump", interrupted_import)
    capsys.readouterr()
    assert main(["dump", str(root / "ms"), str(tmp_path / "out")]) == code
    assert capsys.readouterr().err.strip() == f"migrate: {word}"
    assert not (tmp_path / "out").exists()


def test_an_empty_checkpoint_file_is_named_as_such(root, tmp_path, capsys):
    """A 0-byte model.ckpt read as a checkpoint of no tensors: "21 parameters not loaded"."""
    ms = Path(shutil.copytree(root / "ms", tmp_path / "ms"))
    ckpts = sorted(ms.glob("*.ckpt"))
    assert ckpts
    for ckpt in ckpts:
        ckpt.write_bytes(b"")
    refused(capsys, "inspect", ms, match=f"{ckpts[0]} is empty (0 bytes)")
    refused(capsys, "export", ms, tmp_path / "hf", match="is empty (0 bytes)")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("argv, words", [
    (["hparams", "{root}/run.yaml", "--mindformers", "{fifo}"],
     "cannot read MindFormers YAML {fifo}: not a regular file"),
    (["compare", "{root}/golden", "{root}/run", "--hparams", "{fifo}", "{fifo}"], "{fifo}: not a regular file"),
])
def test_a_fifo_named_as_a_yaml_or_json_file_is_refused_not_waited_on(root, tmp_path, capsys, argv, words):
    """open() of a FIFO blocks until a writer comes: the bounded YAML and JSON readers waited for ever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with _Releaser(fifo):
        refused(capsys, *[a.format(root=root, fifo=fifo) for a in argv], match=words.format(fifo=fifo))


def test_an_hf_tensor_of_the_wrong_shape_is_one_line_not_transformers_load_report(root, tmp_path, capfd):
    from safetensors.numpy import load_file, save_file

    hf = Path(shutil.copytree(root / "hf", tmp_path / "hf"))
    weights = load_file(hf / "model.safetensors")
    name = next(n for n in weights if n.endswith("q_proj.weight"))
    weights[name] = weights[name][:1]
    save_file(weights, hf / "model.safetensors", metadata={"format": "pt"})
    capfd.readouterr()
    code = main(["diff", str(hf), str(root / "ms")])
    err = capfd.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("migrate: error: transformers cannot load") and name in err and "mismatch" in err
