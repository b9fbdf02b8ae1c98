"""Continued pretraining: the run config both sides read, the HF learning-rate
schedules as pure Python, and the weight-decay grouping rule."""
