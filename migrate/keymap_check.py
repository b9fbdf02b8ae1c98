"""Coverage of a keymap against a checkpoint and a model, from headers and the
model's own parameter shapes, before any data moves: `migrate keymap check`
reports it, `migrate convert` refuses to write anything unless it is complete."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from migrate.checkpoints.hf_reader import open_hf_checkpoint
from migrate.errors import MigrateError
from migrate.hf_config import load_hf_config, read_raw_config
from migrate.keymap import Keymap, resolve
from migrate.models.conversion_plan import ConversionPlan


@dataclass
class Coverage:
    unmapped_source: list[str] = field(default_factory=list)   # HF tensors no rule consumes
    absent_source: list[str] = field(default_factory=list)     # rules whose HF tensor is not in the file
    unfilled_target: list[str] = field(default_factory=list)   # model parameters no rule fills
    unknown_target: list[str] = field(default_factory=list)    # rule targets the model lacks
    twice_filled: list[str] = field(default_factory=list)      # model parameters several rules fill
    misshaped: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.unmapped_source or self.absent_source or self.unfilled_target
                    or self.unknown_target or self.twice_filled or self.misshaped)


def coverage(specs: dict, plan: ConversionPlan) -> Coverage:
    """`specs`: source name -> object with `shape` and `dtype`, against the plan's rows
    and the model's shapes. Fused rows are checked through their layout's shape rule."""
    expected = plan.expected
    groups, tied, ignored, fields = plan.groups, plan.tied, plan.ignored, plan.fields
    result = Coverage()
    consumed = {s for g in groups for s in g.src} | {t.src for t in tied} | (ignored & set(specs))
    result.unmapped_source = sorted(n for n in specs if n not in consumed)
    result.absent_source = [s for g in groups for s in g.src if s not in specs]
    targets = Counter(d for g in groups for d in g.dst)
    result.unfilled_target = [n for n in expected if n not in targets]
    result.unknown_target = [d for d in targets if d not in expected]
    result.twice_filled = [d for d, n in targets.items() if n > 1]
    for g in groups:
        if not all(s in specs for s in g.src) or not all(d in expected for d in g.dst):
            continue
        shapes = [tuple(specs[s].shape) for s in g.src]
        if g.layout is None:
            if shapes[0] != tuple(expected[g.dst[0]]):
                result.misshaped.append(f"{g.src[0]} {list(shapes[0])} vs model {g.dst[0]} "
                                        f"{list(expected[g.dst[0]])}")
            continue
        sources = " + ".join(g.src)
        if len({specs[s].dtype for s in g.src}) > 1:
            result.misshaped.append(f"{sources}: dtypes differ, cannot fuse")
            continue
        try:
            produced = g.transform().out_shapes(shapes, fields)
        except MigrateError as exc:
            result.misshaped.append(f"{sources} {[list(x) for x in shapes]} ({g.layout}): {exc}")
            continue
        result.misshaped += [f"{sources} ({g.layout}) {list(shape)} vs model {d} {list(expected[d])}"
                             for d, shape in zip(g.dst, produced, strict=True) if tuple(shape) != tuple(expected[d])]
    return result


@dataclass
class KeymapCheck(Coverage):
    keymap: Keymap | None = None
    target: str = ""
    pairs: int = 0          # active rows, renames and fused ones


def check_keymap(keymap: str | Path, hf_dir: str | Path, ms_model: str | None = None,
                 target: str | None = None, *, trust: bool = False) -> KeymapCheck:
    """`ms_model` checks against another model class (`module:Class`, the caller's own: imported
    as named); `target` applies an entry of the keymap's `targets`; `trust` lets the keymap's
    `target` be a class migrate does not bundle (`--trust-model-class`)."""
    hf_dir = Path(hf_dir)
    raw = read_raw_config(hf_dir)
    km = resolve(str(keymap), raw)
    km.check_source(raw)
    km = km.for_source(raw).with_target(target)
    model = ms_model or km.target
    # A class the user typed (ms_model) is theirs to import: trusted for this check, nothing kept after it.
    plan = ConversionPlan.for_source(km, km.hf_to_ms_config(load_hf_config(hf_dir, km)), model,
                                     trust=trust or bool(ms_model))
    # A config the model cannot run, then one the keymap's rows cannot expand: refused before any file is read
    # (building each property is the check; the first that fails raises).
    _ = plan.expected, plan.groups
    ckpt = open_hf_checkpoint(hf_dir).add_prefix_if_absent(km.base_prefix)
    try:
        found = coverage(ckpt.specs, plan)
    finally:
        ckpt.close()
    result = KeymapCheck(**vars(found), keymap=km, target=model, pairs=len(plan.groups))
    result.unknown_target += [f"{name} (filled twice)" for name in result.twice_filled]  # one list on screen
    return result
