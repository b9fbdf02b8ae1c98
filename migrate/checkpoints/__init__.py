"""Checkpoint readers and writers (Hugging Face in, MindSpore out)."""
