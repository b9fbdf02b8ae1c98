"""The golden PyTorch training side, importable as `migrate.golden` from an installed package
(the checkout keeps it at the top, runnable as `python golden/train_torch.py`)."""
