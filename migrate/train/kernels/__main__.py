"""`python -m migrate.train.kernels` (`make install`): build the fused kernels ahead, say what the trainer uses."""
from migrate.train.kernels import build

built = build()
print(f"fused AdamW kernel: {built}" if built else "fused AdamW kernel: not built (no C++ compiler or the build "
      "failed); the trainer uses its op-by-op AdamW")
