"""Recording and comparing any model pair: the alignment harness for the user's own models.

- `record(model, "DUMP_DIR")`: a context manager that hooks every module of a
  `torch.nn.Module` or MindSpore `nn.Cell` and writes a dump folder (`dump_format`)::

      from migrate.probe import record
      with record(model, "dumps/mine"):
          model(ids)

- `dump`: `migrate dump` (one side on the shared inputs, a dump folder);
- `diff_pair`: `migrate diff` on any two of: HF folder, converted folder,
  `module:factory`, dump folder.

No module here imports torch or MindSpore at load time: `hooks_torch` / `hooks_ms` and a
side's model load when a side of theirs is opened or hooked.
"""
from migrate.probe.diff_any import diff_pair
from migrate.probe.dumping import dump, record

__all__ = ["diff_pair", "dump", "record"]
