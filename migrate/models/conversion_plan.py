"""What a keymap means for one model config, resolved once.

    plan = ConversionPlan.for_source(km, ms_fields)   # convert, keymap check: builds the target model's config
    plan = ConversionPlan(km, config)                  # export, load_model, diff, training: a model.yaml's config
    plan.groups, plan.tied, plan.ignored              # the keymap's rows for this config, templates expanded
    plan.checkpoint_names                             # model name -> checkpoint name (a target that renames)
    plan.sources                                      # model name -> the HF names it is made of
    plan.expected                                     # the model's parameter names and shapes (registry)

convert, export, `migrate keymap check`, `load_model`, the trainer's decay pairing and
`migrate diff`'s gradient pairing read one plan instead of asking the keymap, each time
with the same fields, the same questions. Each part is resolved when first read and
then kept, so a consumer pays only for what it reads (pairing never computes shapes)
and errors come in the order the consumer asks.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import cached_property

import numpy as np

from migrate.errors import MigrateError
from migrate.keymap import MODEL_CLASS_FIELD, TARGET_FIELD, Group, Keymap, Pair
from migrate.models.registry import config_class, expected_shapes


class ConversionPlan:
    def __init__(self, keymap: Keymap, config, trust: bool = False):
        """`config`: the model's config object (or its fields, for pairing alone); `trust`: the
        caller's opt-in to import a model class migrate does not bundle (`registry.check_model_class`)."""
        self.keymap = keymap
        self.trust = trust
        self.config = config
        self.fields: dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        self.model_class: str = self.fields.get(MODEL_CLASS_FIELD) or keymap.target

    @classmethod
    def for_source(cls, keymap: Keymap, ms_fields: dict, model: str | None = None,
                   trust: bool = False) -> ConversionPlan:
        """The plan for the model `keymap` converts to (or `model`, a `module:Class`), its config
        recording the class and the keymap target the checkpoint is written for."""
        model = model or keymap.target
        fields = {**ms_fields, MODEL_CLASS_FIELD: model}
        if keymap.target_name:
            fields[TARGET_FIELD] = keymap.target_name  # the model loads the checkpoint back through it
        return cls(keymap, config_class(model, trust).from_dict(fields), trust)

    def set_compute_dtype(self, name: str) -> None:
        """The one model.yaml field the weights decide, not the keymap (convert's output dtype).
        The config is rebuilt, so a config class without the field keeps it as an extra."""
        self.config = type(self.config).from_dict({**self.fields, "compute_dtype": name})
        self.fields = self.config.to_dict()

    # ---------- the keymap's rows ----------
    @cached_property
    def _rows(self) -> tuple[list[Group], list[Pair]]:
        return self.keymap.groups(self.fields)

    @property
    def groups(self) -> list[Group]:
        """Every active row: renames one-to-one without a layout, fused rows with theirs."""
        return self._rows[0]

    @property
    def tied(self) -> list[Pair]:
        """Rows dropped because the config ties them (the HF name, and the one it is tied to)."""
        return self._rows[1]

    @cached_property
    def ignored(self) -> set[str]:
        """Source buffers consumed and recorded, never written."""
        return self.keymap.ignored(self.fields)

    @cached_property
    def checkpoint_names(self) -> dict[str, str]:
        """Model parameter name -> name written in the checkpoint; empty when they are the same."""
        return self.keymap.checkpoint_names(self.fields)

    @cached_property
    def sources(self) -> dict[str, tuple[str, ...]]:
        """Model parameter name -> the HF names a row makes it of (one for a rename)."""
        return {dst: group.src for group in self.groups for dst in group.dst}

    # ---------- the model ----------
    @cached_property
    def expected(self) -> dict[str, tuple[int, ...]]:
        """The model's parameter names and shapes, in its own order (no MindSpore for a bundled model)."""
        return expected_shapes(self.config, self.model_class, self.trust)

    def written_name(self) -> Callable[[str], str]:
        """Model parameter name -> name written in the checkpoint (the same, unless the
        keymap target renames: then every parameter must get a distinct name)."""
        names = self.checkpoint_names
        if not names:
            return lambda name: name
        km = self.keymap
        unnamed = [name for name in self.expected if name not in names]
        if unnamed:
            raise MigrateError(f"keymap {km.name} target {km.target_name} gives no checkpoint name to "
                               f"{', '.join(unnamed[:5])}")
        taken = Counter(names[name] for name in self.expected)
        twice = [name for name, n in taken.items() if n > 1]
        if twice:
            raise MigrateError(f"keymap {km.name} target {km.target_name} writes {twice[0]} twice")
        return names.__getitem__

    def in_model_names(self, hf_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """HF-named arrays (gradients, parameters) under the model's names, fused through
        the rows' layouts; rows whose HF arrays are not all given are left out."""
        out = {}
        for group in self.groups:
            if not all(s in hf_arrays for s in group.src):
                continue
            arrays = [hf_arrays[s] for s in group.src]
            if group.layout is not None:
                arrays = group.transform().forward(arrays, self.fields)
            out.update(zip(group.dst, arrays, strict=True))
        return out
