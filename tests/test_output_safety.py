"""Outputs: `--overwrite` never destroys what migrate did not write or what it reads;
every failure to write is one line, exit 2, and leaves nothing behind; SIGTERM is SIGINT.

Driven through `migrate.cli.main` (or `python -m migrate` where a real signal or
resource limit is needed), as a user runs it.
"""
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.cli import main

REPO = Path(__file__).resolve().parents[1]
TEMP = re.compile(r"\..*\.(partial|old)$")


@pytest.fixture(scope="module")
def model():
    return build_hf_model("gqa", seed=11)


@pytest.fixture
def src(tmp_path, model):
    return save_hf_model(model, tmp_path / "hf")


def run_cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


def assert_one_line(code, err, pattern, exit_code=2):
    assert code == exit_code, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert pattern in err, err


def snapshot(folder: Path) -> dict:
    """Every file under folder (hidden ones too) -> sha256 of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMP.match(p.name))


def converted(capsys, src, out, *extra):
    code, err = run_cli(capsys, "convert", src, out, *extra)
    assert code == 0, err
    return out


# ---------- the --overwrite rule ----------
def test_overwrite_never_deletes_a_folder_holding_the_input(capsys, tmp_path, model):
    """`migrate convert m/llama m --overwrite` used to delete m/, the model and its siblings."""
    m = tmp_path / "m"
    src = save_hf_model(model, m / "llama")
    (m / "other").mkdir()
    (m / "other" / "notes.txt").write_text("mine")
    before = snapshot(m)
    code, err = run_cli(capsys, "convert", src, m, "--overwrite")
    assert_one_line(code, err, f"output {m} contains the input {src}")
    assert snapshot(m) == before and temporaries(tmp_path) == []
    # Even when the folder carries migrate's own marker: what the command reads comes first.
    (m / ".migrate").write_text(json.dumps({"tool": "migrate 0.1.0", "command": "convert"}))
    before = snapshot(m)
    code, err = run_cli(capsys, "convert", src, m, "--overwrite")
    assert_one_line(code, err, "contains the input")
    assert snapshot(m) == before


def test_export_never_replaces_the_folder_it_reads(capsys, tmp_path, src):
    ms = converted(capsys, src, tmp_path / "ms")
    before = snapshot(ms)
    code, err = run_cli(capsys, "export", ms, ms, "--overwrite")
    assert_one_line(code, err, f"output {ms} is the input {ms}")
    assert snapshot(ms) == before and temporaries(tmp_path) == []


def test_output_inside_the_input_is_refused(capsys, tmp_path, src):
    code, err = run_cli(capsys, "convert", src, src / "ms")
    assert_one_line(code, err, f"output {src / 'ms'} is inside the input {src}")
    assert not (src / "ms").exists() and temporaries(src) == []


def test_a_keymap_file_is_an_input(capsys, tmp_path, src):
    ms = converted(capsys, src, tmp_path / "ms")
    keymap = ms / "my_keymap.yaml"
    shutil.copy(REPO / "keymaps" / "hf_llama.yaml", keymap)
    before = snapshot(ms)
    code, err = run_cli(capsys, "convert", "--keymap", keymap, src, ms, "--overwrite")
    assert_one_line(code, err, f"output {ms} contains the input {keymap}")
    assert snapshot(ms) == before


def test_shards_reached_through_links_are_inputs(capsys, tmp_path, model):
    """A hub-cache snapshot links its files into ../../blobs: the blobs folder is an input too,
    even when it carries a migrate marker."""
    repo = tmp_path / "hub" / "models--t--tiny"
    plain = save_hf_model(model, tmp_path / "plain", "sharded_safetensors")
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    for f in plain.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo / "blobs" / digest)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", digest))
    (repo / "blobs" / ".migrate").write_text(json.dumps({"tool": "migrate 0.1.0", "command": "convert"}))
    before = snapshot(repo / "blobs")
    code, err = run_cli(capsys, "convert", snap, repo / "blobs", "--overwrite")
    assert_one_line(code, err, f"output {repo / 'blobs'} contains the input {snap}/")
    assert snapshot(repo / "blobs") == before and temporaries(repo) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_migrate_did_not_write_is_never_replaced(capsys, tmp_path, src, overwrite):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "cat.jpg").write_bytes(b"\xff\xd8 not really")
    code, err = run_cli(capsys, "convert", src, out, *(["--overwrite"] if overwrite else []))
    assert_one_line(code, err, f"output {out} already exists and was not written by migrate")
    assert snapshot(out) == {"cat.jpg": hashlib.sha256(b"\xff\xd8 not really").hexdigest()}
    assert temporaries(tmp_path) == []


def test_a_file_in_place_of_the_output_is_never_replaced(capsys, tmp_path, src):
    out = tmp_path / "out"
    out.write_text("precious")
    for extra in ([], ["--overwrite"]):
        code, err = run_cli(capsys, "convert", src, out, *extra)
        assert_one_line(code, err, f"output {out} ")
        assert out.read_text() == "precious"
    assert "is not a folder" in err
    assert temporaries(tmp_path) == []


def test_overwrite_replaces_what_migrate_wrote(capsys, tmp_path, src):
    ms = converted(capsys, src, tmp_path / "ms")
    assert json.loads((ms / ".migrate").read_text())["command"] == "convert"
    converted(capsys, src, ms, "--overwrite", "--dtype", "fp16")
    assert json.loads((ms / "conversion.json").read_text())["dtype"] == "fp16"
    # A folder converted before the marker existed: its conversion.json says migrate wrote it.
    (ms / ".migrate").unlink()
    converted(capsys, src, ms, "--overwrite")
    assert json.loads((ms / "conversion.json").read_text())["dtype"] == "fp32"
    # An exported HF folder carries the marker too, and an empty folder holds nothing to lose.
    hf = tmp_path / "hf_back"
    assert run_cli(capsys, "export", ms, hf)[0] == 0
    assert json.loads((hf / ".migrate").read_text())["command"] == "export"
    assert run_cli(capsys, "export", ms, hf, "--overwrite")[0] == 0
    (tmp_path / "empty").mkdir()
    converted(capsys, src, tmp_path / "empty", "--overwrite")
    assert (tmp_path / "empty" / "model.ckpt").is_file()
    assert temporaries(tmp_path) == []


def test_output_folders_follow_the_umask(capsys, tmp_path, src):
    old = os.umask(0o027)
    try:
        out = converted(capsys, src, tmp_path / "new" / "ms")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o750          # tempfile.mkdtemp made it 0o700
    assert out.parent.stat().st_mode & 0o777 == 0o750
    assert (out / "model.ckpt").stat().st_mode & 0o777 == 0o640


# ---------- OSErrors: one line, exit 2, nothing left ----------
def test_output_under_a_regular_file(capsys, tmp_path, src):
    (tmp_path / "file").write_text("x")
    code, err = run_cli(capsys, "convert", src, tmp_path / "file" / "out")
    assert_one_line(code, err, f"{tmp_path / 'file'} is a file, not a folder")
    assert (tmp_path / "file").read_text() == "x"


def test_output_name_is_a_dangling_symlink(capsys, tmp_path, src):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    code, err = run_cli(capsys, "convert", src, link)
    assert_one_line(code, err, f"output {link} is a symbolic link (to {tmp_path / 'gone'}, which does not exist)")
    assert os.path.islink(link) and not (tmp_path / "gone").exists() and temporaries(tmp_path) == []


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount(options) -> a fresh tmpfs folder, or None where this process may not mount."""
    mounted = []

    def mount(options: str):
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            return None
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_output_parent_not_writable(capsys, tmp_path, src, mount_tmpfs):
    if os.geteuid() != 0:  # permissions stop an ordinary user
        parent = tmp_path / "locked"
        parent.mkdir(mode=0o555)
        reason = "permission denied"
    else:  # root passes every permission check: a read-only file system stops it
        parent = mount_tmpfs("ro,size=1m")
        if parent is None:
            pytest.skip("root without the right to mount a read-only tmpfs")
        reason = "read-only file system"
    code, err = run_cli(capsys, "convert", src, parent / "deeper" / "out")
    assert_one_line(code, err, f"{parent} is not writable ({reason})")
    assert list(parent.iterdir()) == []


def test_overwrite_from_inside_the_output(capsys, tmp_path, src, monkeypatch):
    """`migrate convert base . --overwrite` run inside the output: EBUSY and a `..XXXX.old/` before."""
    ms = converted(capsys, src, tmp_path / "ms")
    before = snapshot(ms)
    monkeypatch.chdir(ms)
    code, err = run_cli(capsys, "convert", src, ".", "--overwrite")
    assert_one_line(code, err, "output . holds the current folder")
    assert snapshot(ms) == before and temporaries(ms) == [] and temporaries(tmp_path) == []


def test_a_250_character_output_name_works(capsys, tmp_path, src):
    """The temporary name used to add 18 characters to the output's: ENAMETOOLONG at 238+."""
    out = tmp_path / ("m" * 250)
    converted(capsys, src, out)
    assert (out / "model.ckpt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["hf", out.name])
    converted(capsys, src, out, "--overwrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["hf", out.name])
    code, err = run_cli(capsys, "convert", src, tmp_path / ("m" * 256))
    assert_one_line(code, err, "is 256 bytes long; this file system allows at most 255")


def test_no_space_left(capsys, tmp_path, src, mount_tmpfs):
    small = mount_tmpfs("size=64k")  # the checkpoint alone is 108 KB
    if small is None:
        pytest.skip("cannot mount a small tmpfs here (test_no_space_left_simulated covers the path)")
    code, err = run_cli(capsys, "convert", src, small / "out")
    assert_one_line(code, err, f"cannot write output {small / 'out'}: No space left on device")
    assert list(small.iterdir()) == []


def test_no_space_left_simulated(capsys, tmp_path, src, monkeypatch):
    from migrate.checkpoints import ms_ckpt

    def full(self, chunk):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ms_ckpt._TensorStream, "write", full)
    out = tmp_path / "new" / "out"
    code, err = run_cli(capsys, "convert", src, out, "--dtype", "fp16")  # a cast: bytes go through write()
    assert_one_line(code, err, f"cannot write output {out}: No space left on device")
    assert not (tmp_path / "new").exists()  # the parent it created is gone too


def _python(code: str, cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_file_too_large(tmp_path, src):
    """EFBIG for real: a file size limit below the checkpoint's size (SIGXFSZ ignored, as Python does)."""
    proc = _python(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
        from migrate.cli import main
        sys.exit(main(["convert", {str(src)!r}, "out"]))
    """, tmp_path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == ["migrate: error: cannot write output out: File too large"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_racing_overwrite_writers(capsys, tmp_path, src, monkeypatch):
    """Another `--overwrite` run renames its output into place between this run's move
    of the old output and its own rename (ENOTEMPTY): this one gives one line, the
    other's output stays whole."""
    out = converted(capsys, src, tmp_path / "ms")
    real_replace = os.replace
    armed = [True]

    def replace(a, b):
        if armed[0] and os.path.realpath(b) == os.path.realpath(out) and os.fspath(a).endswith(".partial"):
            armed[0] = False
            assert main(["convert", str(src), str(out), "--overwrite", "--dtype", "fp16"]) == 0  # the winner
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    code, err = run_cli(capsys, "convert", src, out, "--overwrite")
    monkeypatch.undo()
    assert not armed[0]
    assert_one_line(code, err, f"output {out} was written by another process while this one ran")
    record = json.loads((out / "conversion.json").read_text())
    assert record["dtype"] == "fp16" and sorted(record["files"]) == ["model.ckpt"]
    assert run_cli(capsys, "inspect", out)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "ms"]


RACING_CONVERT = """
    import os, sys, time
    real_replace = os.replace

    def replace(a, b):  # both processes reach their final rename before either makes it
        if os.path.realpath(b) == os.path.realpath({out!r}) and os.fspath(a).endswith(".partial"):
            open(os.path.join({barrier!r}, str(os.getpid())), "w").close()
            while len(os.listdir({barrier!r})) < 2:
                time.sleep(0.01)
        return real_replace(a, b)

    os.replace = replace
    from migrate.cli import main
    sys.exit(main(["convert", {src!r}, {out!r}, "--overwrite", "--dtype", {dtype!r}]))
"""


@pytest.mark.slow
def test_two_real_writers_at_once(tmp_path, src, capsys):
    """Two processes replacing the same output, held so that both rename at once: one
    wins, the other ends with one line (ENOTEMPTY before: a traceback and a `.old`
    folder holding the previous output)."""
    out = converted(capsys, src, tmp_path / "ms")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [_python(RACING_CONVERT.format(out=str(out), barrier=str(barrier), src=str(src), dtype=dtype), tmp_path)
             for dtype in ("fp16", "bf16")]
    results = sorted((p.wait(timeout=300), p.communicate()[1].strip()) for p in procs)
    assert [code for code, _ in results] == [0, 2], results
    assert_one_line(*results[1], f"output {out} was written by another process while this one ran")
    assert json.loads((out / "conversion.json").read_text())["dtype"] in ("fp16", "bf16")
    assert run_cli(capsys, "inspect", out)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["barrier", "hf", "ms"]


# ---------- signals ----------
SLOW_CONVERT = """
    import sys, time
    from migrate.checkpoints import stream
    real_run = stream.run

    def slow_run(jobs, sink, on_done=None, **kw):  # 0.3 s per tensor: time to send a signal mid-way
        def done(job):
            time.sleep(0.3)
            if on_done:
                on_done(job)
        return real_run(jobs, sink, on_done=done, **kw)

    stream.run = slow_run
    from migrate.cli import main
    sys.exit(main(["convert", {src!r}, "out"]))
"""


def _start_slow_conversion(tmp_path, src) -> tuple[subprocess.Popen, Path]:
    proc = _python(SLOW_CONVERT.format(src=str(src)), tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        partial = [p for p in tmp_path.iterdir() if p.name.startswith(".out.") and p.name.endswith(".partial")]
        if partial and any(partial[0].iterdir()):  # writing has begun
            return proc, partial[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the conversion never started writing")


@pytest.mark.slow
@pytest.mark.parametrize("signum,code,word", [(signal.SIGTERM, 143, "terminated"),
                                              (signal.SIGINT, 130, "interrupted")])
def test_sigterm_is_handled_like_sigint(tmp_path, src, signum, code, word):
    proc, partial = _start_slow_conversion(tmp_path, src)
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f"migrate: {word}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no output, no temporary folder


def test_a_killed_runs_leftover_is_removed_by_the_next_run(capsys, tmp_path, src):
    proc, partial = _start_slow_conversion(tmp_path, src)
    proc.kill()
    proc.communicate(timeout=60)
    assert partial.is_dir()  # SIGKILL leaves it: nothing can clean up then
    # Leftovers that are not this output's, or whose process still lives, stay.
    other = tmp_path / partial.name.replace(".out.", ".out2.", 1)
    other.mkdir()
    live = subprocess.Popen(["sleep", "60"])
    try:
        owner = re.fullmatch(r"\.out\.([0-9a-f]{6})-(\d+)-([0-9a-f]{8})\.partial", partial.name)
        assert owner and int(owner.group(2)) == proc.pid
        alive = tmp_path / f".out.{owner.group(1)}-{live.pid}-{owner.group(3)}.partial"
        alive.mkdir()
        converted(capsys, src, tmp_path / "out")
        assert not partial.exists()
        assert alive.is_dir() and other.is_dir()
    finally:
        live.kill()
        live.wait()


# ---------- the other commands that write folders ----------
def test_ckpt_merge_follows_the_overwrite_rule(capsys, tmp_path):
    from test_ckpt_merge import _sharded_checkpoint

    folder, _, _ = _sharded_checkpoint(tmp_path / "run")
    run = tmp_path / "run"
    before = snapshot(run)
    code, err = run_cli(capsys, "ckpt", "merge", folder, run, "--overwrite")
    assert_one_line(code, err, f"output {run} contains the input")
    assert snapshot(run) == before
    out = tmp_path / "merged"
    assert run_cli(capsys, "ckpt", "merge", folder, out)[0] == 0
    assert json.loads((out / ".migrate").read_text())["command"] == "ckpt merge"
    assert run_cli(capsys, "ckpt", "merge", folder, out, "--overwrite")[0] == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    code, err = run_cli(capsys, "ckpt", "merge", folder, mine, "--overwrite")
    assert_one_line(code, err, "was not written by migrate")
    assert (mine / "keep.txt").read_text() == "x"


def test_data_tokenize_never_overwrites_its_tokenizer(capsys, tmp_path):
    from migrate.data.corpus import train_bpe_tokenizer

    doc = tmp_path / "doc.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    tok = train_bpe_tokenizer([doc], 300, tmp_path / "tok")
    before = snapshot(tok)
    code, err = run_cli(capsys, "data", "tokenize", doc, "--tokenizer", tok, "--seq-length", "8",
                        "--out", tok, "--overwrite")
    assert_one_line(code, err, f"output {tok} is the input {tok}")
    assert snapshot(tok) == before


def test_an_oserror_anywhere_is_one_line(capsys, tmp_path):
    """A path of the user's that cannot be written, outside the atomic folders (compare --json): the
    output rule (migrate.cli_verbs.guard_outputs) now refuses it before the comparison runs."""
    lines = "".join(json.dumps({"step": i + 1, "loss": 5.0 - 0.01 * i, "lr": 1e-3, "grad_norm": 1.0,
                                "tokens": 64 * (i + 1), "time": 0.1 * i}) + "\n" for i in range(30))
    (tmp_path / "g.jsonl").write_text(lines)
    (tmp_path / "file").write_text("x")
    code, err = run_cli(capsys, "compare", tmp_path / "g.jsonl", tmp_path / "g.jsonl",
                        "--json", tmp_path / "file" / "c.json")
    assert_one_line(code, err, f"migrate: error: cannot create output {tmp_path / 'file' / 'c.json'}: "
                               f"{tmp_path / 'file'} is a file, not a folder")
