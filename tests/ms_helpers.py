"""Run the bundled MindSpore model and HF's torch model on the same token ids."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import torch


def seeded_batch(vocab: int, batch: int = 2, length: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, length), dtype=np.int64)


def run_hf(model, ids: np.ndarray):
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids))
    return out.logits.float().numpy(), float(out.loss)


def run_ms(model, ids: np.ndarray):
    tensor = ms.Tensor(ids.astype(np.int32))
    logits, loss, _ = model(tensor, None, tensor)
    return logits.astype(ms.float32).asnumpy(), float(loss.asnumpy())


def compare(hf_model, ms_model, ids):
    hf_logits, hf_loss = run_hf(hf_model, ids)
    ms_logits, ms_loss = run_ms(ms_model, ids)
    max_abs = float(np.abs(hf_logits - ms_logits).max())
    loss_rel = abs(hf_loss - ms_loss) / abs(hf_loss)
    return max_abs, loss_rel
