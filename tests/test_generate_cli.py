"""`migrate generate` and `migrate export --format mindir` from the command line, as a user runs
them: text prompts through the folder's tokenizer, HF `generate` beside, the MindIR files alone
giving the same tokens, and every bad input one line with exit code 2."""
import json
import shutil

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main
from migrate.convert import convert

# slow as a whole: its module fixtures build compiled decode graphs and MindIR exports
pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Rome"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from migrate.data.corpus import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("generate")
    corpus = root / "corpus.txt"
    corpus.write_text("The capital of France is Paris. The capital of Italy is Rome.\n" * 20)
    train_bpe_tokenizer([corpus], 320, root / "tok")
    for name, seed in (("main", 12), ("other", 13)):
        save_hf_model(build_hf_model("tied", seed=seed, vocab_size=320, initializer_range=0.1), root / name / "hf")
        for f in (root / "tok").iterdir():
            (root / name / "hf" / f.name).write_bytes(f.read_bytes())
        convert(root / name / "hf", root / name / "ms")
    assert main(["export", "--format", "mindir", str(root / "main" / "ms"), str(root / "mindir"), "--batch", "2",
                 "--prefill-len", "8", "--cache-len", "48"]) == 0
    return root


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _prompts():
    return [arg for p in PROMPTS for arg in ("--prompt", p)]


def test_generate_matches_hf_and_the_mindir_files_alone(folders, capsys):
    ms_dir, hf_dir, mindir = folders / "main" / "ms", folders / "main" / "hf", folders / "mindir"
    spec = json.loads((mindir / "mindir.json").read_text())
    names = [i["name"] for i in spec["graphs"]["decode"]["inputs"]]
    assert names == ["input_ids", "positions", "start", "key_mask", "k_cache.0", "v_cache.0", "k_cache.1", "v_cache.1"]
    assert [o["name"] for o in spec["graphs"]["decode"]["outputs"]] == ["logits"] + names[4:]
    assert spec["graphs"]["prefill"]["inputs"][0]["shape"] == [2, 8] and spec["tokenizer"]
    live = _run(capsys, "generate", ms_dir, *_prompts(), "--max-new-tokens", 40, "--ignore-eos", "--compare-hf",
                hf_dir)
    assert live[0] == 0 and "vs HF generate: PASS" in live[1]
    # The MindIR graphs, without model code or checkpoint (the folder is moved away from its source).
    alone = folders / "alone"
    shutil.copytree(mindir, alone)
    graph = _run(capsys, "generate", "--mindir", alone, *_prompts(), "--max-new-tokens", 40, "--ignore-eos",
                 "--compare-hf", hf_dir)
    assert graph[0] == 0 and "vs HF generate: PASS" in graph[1]
    texts = [line for line in live[1].splitlines() if line.startswith("[")]
    assert len(texts) == 2 and texts == [line for line in graph[1].splitlines() if line.startswith("[")]
    # One prompt streams its text; a batch of 1 fills the export's static batch of 2.
    one = _run(capsys, "generate", "--mindir", alone, "--prompt", PROMPTS[0], "--max-new-tokens", 12,
               "--ignore-eos")
    assert one[0] == 0 and "1 × 12 tokens" in one[1]
    # The compiles stay out of the decode rate: prefill in the first token, the decode graph's in the
    # first decode step; the rate is timed over the decode steps after it (12 tokens: 10 steps).
    line = " ".join(one[1].split("1 × 12 tokens")[-1].split())  # the console may wrap it
    assert " · first token " in line and " · first decode step " in line and "(compile ≈ " in line, line
    assert line.endswith(" tokens/s over 10 steps"), line
    assert " tokens/s over 38 steps vs HF generate: PASS" in " ".join(live[1].split())
    with capsys.disabled():
        print("\n" + live[1] + graph[1] + one[1])


@pytest.mark.parametrize("argv, message", [
    (["--ids", "1,2,3,4,5,6,7,8", "--cache-len", "4"], "longer than the cache (4 slots)"),
    (["--ids", "1,2,3", "--cache-len", "8", "--max-new-tokens", "6"], "exceeds the cache (8 slots)"),
    (["--ids", "1,2,3", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--ids", "1,2,3", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--ids", "1,2,3", "--temperature", "-1"], "--temperature must be >= 0"),
    (["--ids", "1,2,3", "--top-k", "-2"], "--top-k must be >= 0"),
    (["--ids", "1,2,3", "--repetition-penalty", "0"], "--repetition-penalty must be > 0"),
    (["--ids", "1,2,999"], "outside the vocabulary"),
    (["--ids", "1,x"], "--ids takes token ids"),
    (["--ids", "1,,2"], "--ids takes token ids"),   # an empty entry is refused, not read as 1,2
    (["--ids", "1,2", "--seed", "-1"], "--seed must be >= 0"),
    (["--ids", "1,2", "--stop-token", "400"], "--stop-token 400 is outside the vocabulary"),
])
def test_bad_generation_input_is_one_line(folders, capsys, argv, message):
    code, _, err = _run(capsys, "generate", folders / "main" / "ms", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_bad_mindir_folders_are_one_line(folders, capsys, tmp_path):
    mindir, other_ms = folders / "mindir", folders / "other" / "ms"
    cases = []
    missing = tmp_path / "missing"
    shutil.copytree(mindir, missing)
    (missing / "decode.mindir").unlink()
    cases.append((["--mindir", missing, "--ids", "1,2"], "decode.mindir missing"))
    changed = tmp_path / "changed"
    shutil.copytree(mindir, changed)
    shutil.copy(mindir / "prefill.mindir", changed / "decode.mindir")
    cases.append((["--mindir", changed, "--ids", "1,2"], "decode.mindir"))
    no_spec = tmp_path / "no_spec"
    shutil.copytree(mindir, no_spec)
    (no_spec / "mindir.json").unlink()
    cases.append((["--mindir", no_spec, "--ids", "1,2"], "no mindir.json"))
    cases.append(([other_ms, "--mindir", mindir, "--ids", "1,2"], "exported from another model"))
    cases.append((["--mindir", mindir, "--ids", "1,2,3,4,5,6,7,8,9"], "longer than the exported prefill length"))
    cases.append((["--mindir", mindir, "--ids", "1,2", "--max-new-tokens", "41"], "exceeds the cache (48 slots)"))
    cases.append((["--mindir", mindir] + [a for _ in range(3) for a in ("--ids", "1,2")], "3 prompts"))
    cases.append((["--mindir", mindir, "--ids", "1,2", "--max-new-tokens", "4", "--compare-hf", folders / "nothing"],
                  "HF model folder not found"))
    for argv, message in cases:
        code, _, err = _run(capsys, "generate", *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_another_hf_model_or_no_tokenizer_is_one_line(folders, capsys, tmp_path):
    hf_other = tmp_path / "hf_other"
    save_hf_model(build_hf_model("tied", seed=1), hf_other)  # vocabulary 128, not 320
    code, _, err = _run(capsys, "generate", folders / "main" / "ms", "--ids", "1,2", "--max-new-tokens", 2,
                        "--mode", "pynative", "--compare-hf", hf_other)
    assert code == 2 and "another model" in err
    bare = tmp_path / "bare"
    shutil.copytree(folders / "main" / "ms", bare, ignore=shutil.ignore_patterns("tokenizer*", "vocab*", "merges*"))
    code, _, err = _run(capsys, "generate", bare, "--prompt", "hi")
    assert code == 2 and "needs a tokenizer" in err


def test_a_refused_export_writes_nothing(folders, capsys, tmp_path):
    out = tmp_path / "x"
    code, _, err = _run(capsys, "export", "--format", "mindir", folders / "main" / "ms", out, "--prefill-len", 64,
                        "--cache-len", 32)
    assert code == 2 and "--prefill-len (64) must be shorter than --cache-len (32)" in err and not out.exists()
    code, _, err = _run(capsys, "export", folders / "main" / "ms", out, "--batch", 2)
    assert code == 2 and "--batch apply to --format mindir only" in err and not out.exists()


def test_generate_export_and_the_mindir_runner_leave_the_mode_as_they_found_it(folders, capsys, tmp_path):
    import mindspore as ms

    from migrate.infer.batch import make_batch
    from migrate.infer.generate import generate
    from migrate.infer.mindir import MindIRRunner
    from migrate.infer.sampling import Sampling

    ms_dir = folders / "main" / "ms"
    for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        other = "graph" if mode == ms.PYNATIVE_MODE else "pynative"
        for argv in (["generate", ms_dir, "--ids", "1,2", "--max-new-tokens", 2],
                     ["generate", ms_dir, "--ids", "1,2", "--max-new-tokens", 2, "--mode", other],
                     ["generate", "--mindir", folders / "mindir", "--ids", "1,2", "--max-new-tokens", 2],
                     ["export", "--format", "mindir", ms_dir, tmp_path / f"export{mode}", "--prefill-len", 4,
                      "--cache-len", 8]):
            assert _run(capsys, *argv)[0] == 0 and ms.get_context("mode") == mode, argv
    # The runner holds GRAPH_MODE while it loads and while it steps, whatever mode its user is in.
    ms.set_context(mode=ms.PYNATIVE_MODE)
    runner = MindIRRunner(folders / "mindir")
    assert ms.get_context("mode") == ms.PYNATIVE_MODE
    tokens = generate(runner, make_batch([[1, 2], [1, 2]], 0, 320), 3, Sampling()).tokens
    assert ms.get_context("mode") == ms.PYNATIVE_MODE and tokens.shape == (2, 3)


def _rehashed(mindir, folder, change):
    """A copy of the export, changed by `change(folder)`, its manifest written again over the change:
    the manifest says the files are intact, so only the reader rule stands between them and a run."""
    from migrate.checkpoints.manifest import MANIFEST_FILE, write_manifest

    shutil.copytree(mindir, folder)
    change(folder)
    (folder / MANIFEST_FILE).unlink()
    write_manifest(folder)
    return folder


def test_mindir_graphs_of_another_export_are_one_line_after_a_rehashed_manifest(folders, capsys, tmp_path):
    """decode.mindir replaced by a graph taking other shapes (here the export's own prefill graph) and the
    manifest re-hashed: the graph's run against mindir.json's shapes is refused, not a MindSpore traceback."""
    def swap(folder):
        shutil.copy(folder / "prefill.mindir", folder / "decode.mindir")

    swapped = _rehashed(folders / "mindir", tmp_path / "swapped", swap)
    code, _, err = _run(capsys, "generate", "--mindir", swapped, "--ids", "1,2", "--max-new-tokens", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "decode.mindir" in err and "mindir.json lists" in err, err


def test_mindir_graphs_of_another_model_with_the_same_shapes_are_refused_after_a_rehashed_manifest(
        folders, capsys, tmp_path):
    """Both graphs replaced by an export of another model of identical shapes, the manifest re-hashed: the
    graphs ran unnoticed (their outputs have the shapes mindir.json lists) unless MS_DIR was given. The
    weights inside the graphs are hashed again and compared with what mindir.json records."""
    other = tmp_path / "other_export"
    assert main(["export", "--format", "mindir", str(folders / "other" / "ms"), str(other), "--batch", "2",
                 "--prefill-len", "8", "--cache-len", "48"]) == 0
    capsys.readouterr()

    def swap(folder):
        for graph in ("prefill", "decode"):
            shutil.copy(other / f"{graph}.mindir", folder / f"{graph}.mindir")

    swapped = _rehashed(folders / "mindir", tmp_path / "swapped", swap)
    code, out, err = _run(capsys, "generate", "--mindir", swapped, "--ids", "1,2", "--max-new-tokens", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out, err
    assert "prefill.mindir holds the weights of another model than mindir.json records" in err, err
    # the two exports of two models record two fingerprints; each export's own graphs pass
    ours, theirs = (json.loads((f / "mindir.json").read_text())["source"]["graph_weights_sha256"]
                    for f in (folders / "mindir", other))
    assert ours != theirs
    assert _run(capsys, "generate", "--mindir", other, "--ids", "1,2", "--max-new-tokens", "2")[0] == 0


@pytest.mark.parametrize("change, message", [
    (lambda spec, tmp: spec["graphs"]["prefill"].update(file="../outside.mindir"),
     "prefill graph names a file outside the MindIR export: ../outside.mindir"),
    (lambda spec, tmp: spec["graphs"]["decode"].update(file=str(tmp / "outside.mindir")),
     "decode graph names a file outside the MindIR export"),
    (lambda spec, tmp: spec.update(vocab_size=64), "source config's vocab_size 320 is not vocab_size 64"),
    (lambda spec, tmp: spec.update(batch="2"), "batch must be a whole number ≥ 1, found '2'"),
    (lambda spec, tmp: spec["graphs"]["decode"]["outputs"][0].update(shape=[2, 64]), "outputs must be logits [2, 320]"),
])
def test_a_mindir_json_the_exporter_would_not_write_is_one_line(folders, capsys, tmp_path, change, message):
    shutil.copy(folders / "mindir" / "prefill.mindir", tmp_path / "outside.mindir")

    def edit(folder):
        spec = json.loads((folder / "mindir.json").read_text())
        change(spec, tmp_path)
        (folder / "mindir.json").write_text(json.dumps(spec))

    folder = _rehashed(folders / "mindir", tmp_path / "edited", edit)
    code, _, err = _run(capsys, "generate", "--mindir", folder, "--ids", "1,2", "--max-new-tokens", "3")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_deeply_nested_mindir_json_is_one_line(folders, capsys, tmp_path):
    folder = _rehashed(folders / "mindir", tmp_path / "deep",
                       lambda f: (f / "mindir.json").write_text("[" * 100_000 + "]" * 100_000))
    code, _, err = _run(capsys, "generate", "--mindir", folder, "--ids", "1,2")
    assert code == 2 and "mindir.json: nested more than 100 levels deep" in err, err
