"""A checkpoint MindFormers trained holds its optimizer and trainer state beside the weights
(names as a MindFormers 2.0.0 CPU run wrote them: adam_m.*, adam_v.*, global_step, scale_sense,
epoch_num, step_num, loss_scale, global_batch_size; plus accu_grads.* of its accumulating
wrapper). `migrate export --checkpoint` skips exactly that and exports the weights bit for bit;
`migrate inspect` says which tensors are training state. An unknown tensor is still refused."""
from __future__ import annotations

import numpy as np
import pytest

from hf_fixtures import build_hf_model, hf_state, save_hf_model
from migrate.checkpoints.ms_ckpt import CkptWriter, iter_ckpt
from migrate.checkpoints.training_state import is_training_state, split_training_state, summary
from migrate.cli import main
from migrate.convert import convert


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    save_hf_model(build_hf_model("gqa"), root / "hf")
    convert(root / "hf", root / "ms", target="qkv_concat")
    return root


def mindformers_checkpoint(path, weights: dict, extra: dict | None = None):
    """The weights, then what MindFormers' CheckpointMonitor adds, in its order."""
    with CkptWriter(path) as writer:
        for name, array in weights.items():
            writer.write(name, array)
        for name, array in weights.items():
            writer.write(f"adam_m.{name}", np.zeros_like(array, np.float32))
            writer.write(f"adam_v.{name}", np.zeros_like(array, np.float32))
            writer.write(f"accu_grads.{name}", np.zeros_like(array, np.float32))
        for name, value in (("scale_sense", np.float32(1.0)), ("global_step", np.int32(12)),
                            ("epoch_num", np.int32(1)), ("step_num", np.int32(12)), ("loss_scale", np.float32(1.0)),
                            ("global_batch_size", np.int32(8)), *(extra or {}).items()):
            writer.write(name, np.asarray([value]))


def test_names_are_recognised():
    names = ["model.norm_out.weight", "adam_m.lm_head.weight", "global_step", "exp_avg_sq_row_model.x",
             "accu_grads.model.x", "epoch_num", "lm_head.weight"]
    model, state = split_training_state(names)
    assert model == ["model.norm_out.weight", "lm_head.weight"]
    assert summary(state) == "adam_m.* ×1, global_step, exp_avg_sq_row_* ×1, accu_grads.* ×1, epoch_num"
    assert not is_training_state("model.layers.0.attention.w_qkv.weight")


def test_export_skips_mindformers_state_and_keeps_the_weights_bit_for_bit(converted, tmp_path, capsys):
    weights = dict(iter_ckpt(converted / "ms" / "model.ckpt"))
    ckpt = tmp_path / "llama_rank_0-1_12.ckpt"
    mindformers_checkpoint(ckpt, weights)
    assert main(["export", str(converted / "ms"), str(tmp_path / "hf_back"), "--checkpoint", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert f"skipped {3 * len(weights) + 6} training-state tensors" in out and "adam_v.* ×" in out
    want, got = hf_state(converted / "hf"), hf_state(tmp_path / "hf_back")
    assert want.keys() == got.keys() and all(np.array_equal(want[k].numpy(), got[k].numpy()) for k in want)
    assert main(["inspect", str(ckpt)]) == 0
    assert f"{len(weights)} model tensors" in capsys.readouterr().out


def test_an_unknown_tensor_is_still_unexpected(converted, tmp_path, capsys):
    weights = dict(iter_ckpt(converted / "ms" / "model.ckpt"))
    ckpt = tmp_path / "with_extra.ckpt"
    mindformers_checkpoint(ckpt, weights, {"model.extra_scale": np.float32(2.0)})
    assert main(["export", str(converted / "ms"), str(tmp_path / "hf_bad"), "--checkpoint", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert "model.extra_scale" in err and "adam_m" not in err and not (tmp_path / "hf_bad").exists()
