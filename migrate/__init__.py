"""migrate: PyTorch / Hugging Face to MindSpore migration toolkit for LLMs."""

__version__ = "0.1.0"
