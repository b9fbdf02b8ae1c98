"""`migrate dump` and `migrate diff` on any pair, with models that are not migrate's: a
MindSpore Llama hand-ported by a user (tests/hand_port_ms.py) and a PyTorch module that is
not an HF class (tests/custom_torch.py). Every fault of `migrate diff --list-faults` is
hooked into the hand port and must be located at its layer and sub-block from live sides,
from dumps made by other processes (with the live figures exactly) and in statistics mode."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_fixtures import build_hf_model, save_hf_model
from migrate.align import run_diff
from migrate.align.model_faults import FAULTS
from migrate.cli import main
from migrate.convert import convert
from migrate.errors import MigrateError
from migrate.probe import diff_pair, record
from migrate.probe.dump_format import Dump
from migrate.probe.inputs import seeded_inputs
from migrate.probe.inputs_file import inputs_bytes
from migrate.probe.pairing import load_mapping, pair

# slow as a whole: its module fixtures build dumps written by other processes
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
HAND = f"{TESTS / 'hand_port_ms.py'}:make"
TORCH = f"{TESTS / 'custom_torch.py'}:make"
HOOKED = [name for name in FAULTS if name != "rmsnorm_no_upcast"]  # that one shows in bf16 only
SEQ = 64  # long enough for the RoPE-base fault to show at layer 0 in statistics mode


def _spec(name: str) -> str:
    return f"{name}@{1 if FAULTS[name].per_layer else 0}" if name in FAULTS else f"{name}@1"


HF_DUMPS = """
import sys
from migrate.probe import dump
root = sys.argv[1]
dump(f"{root}/hf", f"{root}/d_hf", inputs_file=f"{root}/in.npz")
dump(f"{root}/hf", f"{root}/d_hf_stats", inputs_file=f"{root}/in.npz", statistics=True)
"""
HAND_DUMPS = """
import os, sys
from migrate.probe import dump
root, hand = sys.argv[1], sys.argv[2]
for fault in ["", "nan_mlp@1"] + sys.argv[3:]:
    os.environ["HAND_PORT_FAULT"] = fault
    for stats in (False, True) if fault in ("", "nan_mlp@1") else (False,):
        name = (fault.split("@")[0] or "clean") + ("_stats" if stats else "")
        dump(hand, f"{root}/hand_{name}", inputs_file=f"{root}/in.npz", statistics=stats)
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tied GQA Llama (HF, converted), one padded inputs file, and dumps written by three
    other processes at once: HF (tensors, statistics), the converted model, the hand port
    clean and with every fault (tensors; statistics for the clean port and a NaN)."""
    root = tmp_path_factory.mktemp("probe")
    save_hf_model(build_hf_model("tied", seed=11, num_hidden_layers=3, rope_theta=500000.0), root / "hf")
    convert(root / "hf", root / "ms")
    (root / "in.npz").write_bytes(inputs_bytes(seeded_inputs(128, 2, SEQ, 0, padded=True)))
    env = {**os.environ, "HAND_PORT_HF": str(root / "hf")}
    dump = [sys.executable, "-m", "migrate", "dump", "--inputs", str(root / "in.npz")]
    procs = [
        subprocess.Popen([sys.executable, "-c", HF_DUMPS, str(root)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT),
        subprocess.Popen(dump + [str(root / "ms"), str(root / "d_ms")], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, "-c", HAND_DUMPS, str(root), HAND] + [_spec(f) for f in HOOKED], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
    ]
    for p in procs:
        out = p.communicate()[0].decode()
        assert p.returncode == 0, out
    old = os.environ.get("HAND_PORT_HF")
    os.environ["HAND_PORT_HF"] = str(root / "hf")
    yield root
    os.environ.pop("HAND_PORT_FAULT", None)
    os.environ.pop("TORCH_FAULT", None)
    if old is None:
        os.environ.pop("HAND_PORT_HF", None)


def _figures(value):
    """The structure with every float as pytest.approx: numpy's float64 exp (inside the KL) takes
    another SIMD path when the allocator aligns its temporaries otherwise, so a figure near zero
    (KL 2.47e-16) computed in another process can differ in its last bits (2.35e-16); every
    verdict, count and tensor-level figure above that noise must still agree."""
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True)
    if isinstance(value, dict):
        return {k: _figures(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_figures(v) for v in value)
    return value


def _same(a, b):
    """Verdict and every figure equal (report.json's summary and entries, paths aside)."""
    da, db = a.to_dict(), b.to_dict()
    assert da["summary"] == _figures(db["summary"])
    assert [(e["name"], e["metrics"], e["passed"]) for e in da["entries"]] == \
        _figures([(e["name"], e["metrics"], e["passed"]) for e in db["entries"]])


def _located(report, name: str) -> None:
    fault, layer = FAULTS[name], 1 if FAULTS[name].per_layer else 0
    d = report.first_divergence
    assert not report.passed and report.exit_code == 1
    assert d is not None and d.block == fault.block, (name, d and d.location)
    if fault.block in ("attention", "mlp"):
        assert d.layer == layer, (name, d.location)


def test_dumps_from_other_processes_reproduce_the_live_verdict(world):
    live = run_diff(world / "hf", world / "ms", padded=True, seq_len=SEQ, detail=True)
    dumped = diff_pair(str(world / "d_hf"), str(world / "d_ms"), detail=True)
    assert live.passed and dumped.passed
    _same(live, dumped)
    assert Dump(world / "d_hf").manifest["inputs"]["sha256"] == Dump(world / "d_ms").manifest["inputs"]["sha256"]


def test_a_tensor_dump_against_a_statistics_dump_passes_the_clean_pair(world):
    """Mixed modes: the tensor dump is summarised on the fly, its 0-d loss included (safe_open
    hands a 0-d tensor back as (1,), which once failed the loss on shape alone)."""
    for ref, got in (("d_hf_stats", "d_ms"), ("d_hf", "hand_clean_stats")):
        report = diff_pair(str(world / ref), str(world / got), detail=True)
        assert report.passed, (ref, got, [e.name for e in report.entries if not e.passed])


def test_hand_port_pairs_with_hf_without_a_mapping_file(world):
    os.environ["HAND_PORT_FAULT"] = ""
    live = diff_pair(str(world / "hf"), HAND, inputs_file=world / "in.npz", detail=True)
    print("\n" + "\n".join(live.pairing.lines()) + "\n" + live.verdict_text())
    assert live.passed
    pairing = live.pairing.to_dict()
    assert pairing["layers"] == 3 and pairing["methods"]["got"].startswith("automatic")
    assert {(p["block"], p["got"], p["confidence"]) for p in pairing["paired"]} == {
        ("embedding", "embed", "high"), ("attention", "blocks.{layer}.attn", "high"),
        ("mlp", "blocks.{layer}.ffn", "high"), ("layer output", "blocks.{layer}", "high"),
        ("final norm", "norm", "high")}
    assert "attn.qkv" in pairing["unpaired"]["got"]  # fused: no single HF module of its shape
    _same(live, diff_pair(str(world / "d_hf"), str(world / "hand_clean"), detail=True))
    stats = diff_pair(str(world / "d_hf_stats"), str(world / "hand_clean_stats"), detail=True)
    assert stats.passed and "statistics mode" in stats.extra["statistics"]


@pytest.mark.parametrize("name", HOOKED)
def test_hooked_fault_in_hand_port_is_located(world, name):
    os.environ["HAND_PORT_FAULT"] = _spec(name)
    live = diff_pair(str(world / "hf"), HAND, inputs_file=world / "in.npz", detail=True)
    _located(live, name)
    dumped = diff_pair(str(world / "d_hf"), str(world / f"hand_{name}"), detail=True)
    _same(live, dumped)
    # Statistics mode, the HF side a statistics dump, the port live on the dump's inputs.
    stats = diff_pair(str(world / "d_hf_stats"), HAND, detail=True)
    _located(stats, name)
    print(f"\n{name}: {live.first_divergence.location} · statistics mode: {stats.first_divergence.location} "
          f"({stats.first_divergence.reason})")


def test_nan_is_named_in_tensor_and_statistics_mode(world):
    for ref, got in (("d_hf", "hand_nan_mlp"), ("d_hf_stats", "hand_nan_mlp_stats")):
        report = diff_pair(str(world / ref), str(world / got), detail=True)
        assert not report.passed
        assert "NaN in HF PyTorch dump" not in report.verdict_text()
        assert "NaN in MindSpore" in report.verdict_text() and "from layer 1 · mlp output" in report.verdict_text()


def test_fault_on_the_pytorch_side_of_two_user_models(world):
    os.environ["HAND_PORT_FAULT"] = ""
    os.environ["TORCH_FAULT"] = ""
    clean = diff_pair(TORCH, HAND, detail=True)
    assert clean.passed and set(clean.pairing.methods.values()) == {"automatic pairing (order, shapes, names)"}
    os.environ["TORCH_FAULT"] = "1"
    try:
        for statistics in (False, True):
            report = diff_pair(TORCH, HAND, detail=True, statistics=statistics)
            assert not report.passed
            assert report.first_divergence.location == "layer 1 · mlp output", report.first_divergence.location
    finally:
        os.environ["TORCH_FAULT"] = ""


def _records(layers, children, prefix="trunk"):
    """A synthetic recording: embedding, numbered layers with the given children, a norm."""
    out, order = [], 0

    def add(module, shape=(2, 4, 8), index="0"):
        nonlocal order
        out.append({"key": f"{module}/output.{index}", "module": module, "io": "output", "index": index,
                    "call": 0, "order": order, "shape": list(shape), "dtype": "float32"})
        order += 1
    add("emb")
    for i in range(layers):
        for c in children:
            add(f"{prefix}.{i}.{c}")
        add(f"{prefix}.{i}")
    add("final")
    add("", (2, 4, 16), "logits")
    return out


def test_pairing_says_which_modules_need_a_mapping_file(tmp_path):
    ref = _records(2, ["attn_norm", "attention", "mlp_norm", "mlp"], "layers")
    # No numbered siblings on the got side: it cannot be paired automatically, and says so.
    flat = [r for r in _records(2, ["x"]) if not r["module"].startswith("trunk")]
    with pytest.raises(MigrateError, match="no layer output found on the got side"):
        pair(ref, flat)
    # Unnamed sub-blocks are placed by order (medium confidence); a mapping file overrides.
    got = _records(2, ["norm_a", "u", "norm_b", "w"])
    _, summary = pair(ref, got, detail=True)
    assert ("attention", "layers.{layer}.attention", "trunk.{layer}.u", "medium") in \
        [p[:4] for p in summary.paired]
    mapping = tmp_path / "map.yaml"
    mapping.write_text("got:\n  attention: trunk.{layer}.w\n  mlp: trunk.{layer}.u\n")
    points, summary = pair(ref, got, mapping=load_mapping(mapping), detail=True)
    assert [p.got_module for p in points if p.block == "attention"] == ["trunk.0.w", "trunk.1.w"]
    assert summary.methods["got"] == "mapping file"
    mapping.write_text("got:\n  attn: trunk.{layer}.w\n")
    with pytest.raises(MigrateError, match="unknown block 'attn'"):
        load_mapping(mapping)


def test_record_in_three_lines_and_bad_input(world, tmp_path, capsys):
    sys.path.insert(0, str(TESTS))
    from custom_torch import from_hf

    model = from_hf(world / "hf")
    import torch

    with record(model, tmp_path / "mine", statistics=True):
        model(torch.zeros(1, 5, dtype=torch.long))
    dump = Dump(tmp_path / "mine")
    assert dump.statistics and dump.manifest["framework"] == "torch"
    assert [r["module"] for r in dump.records[:3]] == ["tok", "blocks.0.ln_a", "blocks.0.attention.q"]
    assert dump.stats("blocks.0.mlp/output.0")["numel"] == 5 * 32

    # A custom config registered under a name transformers owns: one line, exit 2.
    (tmp_path / "clash.py").write_text("from transformers import AutoConfig, LlamaConfig\n"
                                      "class Mine(LlamaConfig):\n    model_type = 'llama'\n"
                                      "AutoConfig.register('llama', Mine)\ndef make():\n    return None\n")
    assert main(["dump", f"{tmp_path / 'clash.py'}:make", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_type of its own" in err[0] and not (tmp_path / "out").exists()
    # Two dumps fed different inputs; an unknown format version; an output migrate did not write.
    (tmp_path / "other.npz").write_bytes(inputs_bytes(seeded_inputs(128, 2, 8, 1, padded=False)))
    assert main(["dump", str(world / "hf"), str(tmp_path / "d2"), "--inputs", str(tmp_path / "other.npz")]) == 0
    assert main(["diff", str(world / "d_hf"), str(tmp_path / "d2")]) == 2
    assert "fed different inputs" in capsys.readouterr().err
    manifest = json.loads((tmp_path / "d2" / "manifest.json").read_text())
    (tmp_path / "d2" / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    assert main(["diff", str(tmp_path / "d2"), str(tmp_path / "d2")]) == 2
    assert "format version 99" in capsys.readouterr().err
    assert main(["dump", str(world / "hf"), str(tmp_path / "d3"), "--scope", r"layers\.1\b"]) == 0
    assert {r["module"] for r in Dump(tmp_path / "d3").records} == {"", "model.layers.1"} | {
        r["module"] for r in Dump(world / "d_hf").records if r["module"].startswith("model.layers.1.")}
    (tmp_path / "mine_own").mkdir()
    (tmp_path / "mine_own" / "notes.txt").write_text("keep")
    assert main(["dump", str(world / "hf"), str(tmp_path / "mine_own"), "--overwrite"]) == 2
    assert (tmp_path / "mine_own" / "notes.txt").read_text() == "keep"
