"""The torch box's model, saved by its own transformers (4.x): `python make_hf_model.py FOLDER` writes
FOLDER/corpus/*.txt and FOLDER/hf_model/ (a 3-layer GQA Llama, llama3 RoPE at theta 5e5, its BPE tokenizer
beside the weights). Runs in the torch box's venv with the checkout on PYTHONPATH (for the corpus
and tokenizer helpers), before migrate is installed there.

The RoPE is on purpose: transformers 4.x spells it `rope_theta` + `rope_scaling` where 5.x has
`rope_parameters`, and a conversion that missed the theta or the scaling would not PASS."""
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from migrate.data.corpus import train_bpe_tokenizer, write_stdlib_corpus

VOCAB = 512
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

root = Path(sys.argv[1])
files = write_stdlib_corpus(root / "corpus", modules=["textwrap", "heapq", "json"])
train_bpe_tokenizer(files, VOCAB, root / "hf_model")
tok = AutoTokenizer.from_pretrained(root / "hf_model")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                     rope_theta=500000.0, rope_scaling=LLAMA3, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
model = LlamaForCausalLM(config)
with torch.no_grad():  # norms off 1, so a dropped or swapped one shows
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.add_(0.1 * torch.randn_like(p))
model.save_pretrained(root / "hf_model")
