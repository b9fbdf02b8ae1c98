"""The continued-pretraining run config: one YAML file that the golden PyTorch
script and the MindSpore trainer both read, so neither side can drift from it.

Defaults are HF TrainingArguments' where HF has the same knob (lr 5e-5, AdamW
betas (0.9, 0.999), eps 1e-8, weight decay 0, clip 1.0, linear schedule,
seed 42, micro batch 8) and torch.amp.GradScaler's for the fp16 loss scale,
so a field left out means what it means to HF. Relative paths resolve
against the YAML file's folder. Every mistake is one MigrateError line that
names the key.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migrate.dtype_names import SPELLINGS
from migrate.errors import MigrateError
from migrate.lora.spec import LoraSpec
from migrate.safeyaml import load_yaml
from migrate.train.decay import NO_DECAY_RULES

# Our schedule names, plus the HF names that mean the same thing.
SCHEDULES = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear",
             "cosine": "cosine", "cosine_with_min_lr": "cosine"}


class _Bad(Exception):
    """A bad value at a dotted key; RunConfig.from_dict turns it into one MigrateError line."""

    def __init__(self, key: str, msg: str):
        super().__init__(f"{key}: {msg}")


@dataclass(frozen=True)
class HFSchedule:
    """Exactly the arguments of `transformers.get_scheduler` for this run."""

    name: str
    num_warmup_steps: int
    num_training_steps: int
    kwargs: dict[str, float]


@dataclass
class OptimizerConfig:
    lr: float = 5e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay: list[str] = field(default_factory=lambda: ["bias", "norm"])  # HF Trainer's rule

    def _validate(self, at: str) -> None:
        _require(self.lr > 0, at + "lr", f"must be > 0, got {self.lr}")
        for i, beta in enumerate(self.betas):
            _require(0.0 <= beta < 1.0, f"{at}betas[{i}]", f"must be in [0, 1), got {beta}")
        _require(self.eps > 0, at + "eps", f"must be > 0, got {self.eps}")
        _require(self.weight_decay >= 0, at + "weight_decay", f"must be >= 0, got {self.weight_decay}")
        for i, rule in enumerate(self.no_decay):
            if rule not in NO_DECAY_RULES:
                raise _Bad(f"{at}no_decay[{i}]", f"unknown rule {rule!r}{_did_you_mean(rule, NO_DECAY_RULES)}; "
                                                 f"known: {', '.join(NO_DECAY_RULES)}")


@dataclass
class ScheduleConfig:
    name: str = "linear"
    warmup_steps: int | None = None
    warmup_ratio: float | None = None  # of total_steps, rounded up like HF TrainingArguments.get_warmup_steps
    min_lr: float | None = None
    min_lr_rate: float | None = None   # of optimizer.lr

    def _validate(self, at: str) -> None:
        if self.name not in SCHEDULES:
            raise _Bad(at + "name", f"unknown schedule {self.name!r}{_did_you_mean(self.name, SCHEDULES)}; "
                                    f"supported: constant, linear, cosine")
        if self.name == "cosine_with_min_lr":
            _require(self.min_lr is not None or self.min_lr_rate is not None, at + "name",
                     "cosine_with_min_lr needs min_lr or min_lr_rate")
        self.name = SCHEDULES[self.name]
        _require(self.warmup_steps is None or self.warmup_ratio is None, at + "warmup_ratio",
                 "set warmup_steps or warmup_ratio, not both")
        _require(self.warmup_steps is None or self.warmup_steps >= 0, at + "warmup_steps", "must be >= 0")
        _require(self.warmup_ratio is None or 0.0 <= self.warmup_ratio < 1.0, at + "warmup_ratio",
                 f"must be in [0, 1), got {self.warmup_ratio}")
        _require(self.min_lr is None or self.min_lr_rate is None, at + "min_lr_rate",
                 "set min_lr or min_lr_rate, not both")
        _require(self.min_lr_rate is None or 0.0 <= self.min_lr_rate < 1.0, at + "min_lr_rate",
                 f"must be in [0, 1), got {self.min_lr_rate}")
        _require(self.min_lr is None or self.min_lr >= 0, at + "min_lr", f"must be >= 0, got {self.min_lr}")
        if self.name == "constant":
            _require(not self.min_lr and not self.min_lr_rate, at + "min_lr", "a constant schedule has no min_lr")

    def num_warmup_steps(self, total_steps: int) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return math.ceil(total_steps * (self.warmup_ratio or 0.0))

    def hf(self, total_steps: int, lr: float) -> HFSchedule:
        """Map this schedule onto one HF scheduler name + kwargs (transformers 5 names).

        constant -> constant (no warmup) | constant_with_warmup; linear -> linear,
        or polynomial with power 1 and lr_end = min lr (HF's only linear decay to a
        floor); cosine -> cosine, or cosine_with_min_lr. A zero floor picks the
        plain variant, which computes the same numbers.
        """
        warmup = self.num_warmup_steps(total_steps)
        if self.name == "constant":
            return HFSchedule("constant_with_warmup" if warmup else "constant", warmup, total_steps, {})
        if self.name == "linear":
            floor = self.min_lr if self.min_lr is not None else lr * (self.min_lr_rate or 0.0)
            if not floor:
                return HFSchedule("linear", warmup, total_steps, {})
            return HFSchedule("polynomial", warmup, total_steps, {"lr_end": floor, "power": 1.0})
        if self.min_lr:
            return HFSchedule("cosine_with_min_lr", warmup, total_steps, {"min_lr": self.min_lr})
        if self.min_lr_rate:
            return HFSchedule("cosine_with_min_lr", warmup, total_steps, {"min_lr_rate": self.min_lr_rate})
        return HFSchedule("cosine", warmup, total_steps, {})


@dataclass
class LossScaleConfig:
    """fp16 dynamic loss scale; the defaults are torch.amp.GradScaler's."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def _validate(self, at: str) -> None:
        _require(self.init_scale > 0, at + "init_scale", "must be > 0")
        _require(self.growth_factor > 1.0, at + "growth_factor", "must be > 1")
        _require(0.0 < self.backoff_factor < 1.0, at + "backoff_factor", "must be in (0, 1)")
        _require(self.growth_interval >= 1, at + "growth_interval", "must be >= 1")


HEALTH_POLICIES = ("warn", "skip", "stop")
# The golden's float64 measure of its own first-step rounding (golden/train_torch.py `fp64_reference`):
# auto runs it where the float64 twin fits in memory, fp64 always, off never. `migrate train` ignores it.
REFERENCES = ("auto", "fp64", "off")


@dataclass
class HealthConfig:
    """The training health watch (`migrate.train.health.watch`): what makes an event, what to do about it."""

    policy: str = "warn"               # warn | skip (no optimizer or scheduler step) | stop (exit 3)
    verdict_step: int = 100            # the verdict line after this step (at the end of a shorter run)
    window: int = 20                   # running statistics over the last `window` healthy steps
    min_history: int = 5               # healthy steps before the spike and blow-up rules act
    loss_spike_sigma: float = 6.0      # a spike: loss above mean + sigma * std of the window...
    loss_spike_min_rel: float = 0.1    # ...and above mean * (1 + min_rel)
    grad_blowup_factor: float = 10.0   # pre-clip grad norm above factor * the window's median
    max_skipped_run: int = 3           # fp16: this many overflow-skipped steps in a row
    min_loss_scale: float = 1.0        # fp16: the scale backing off below this
    save_batches: bool = True          # write each event's micro-batches under health_batches/

    def _validate(self, at: str) -> None:
        if self.policy not in HEALTH_POLICIES:
            raise _Bad(at + "policy", f"unknown policy {self.policy!r}{_did_you_mean(self.policy, HEALTH_POLICIES)}; "
                                      f"use {', '.join(HEALTH_POLICIES)}")
        for key in ("verdict_step", "window", "min_history", "max_skipped_run"):
            _require(getattr(self, key) >= 1, at + key, f"must be >= 1, got {getattr(self, key)}")
        _require(self.min_history <= self.window, at + "min_history", f"must be <= window ({self.window})")
        for key in ("loss_spike_sigma", "loss_spike_min_rel", "min_loss_scale"):
            value = getattr(self, key)
            _require(math.isfinite(value) and value > 0, at + key, f"must be a number > 0, got {value}")
        _require(math.isfinite(self.grad_blowup_factor) and self.grad_blowup_factor > 1, at + "grad_blowup_factor",
                 f"must be a number > 1, got {self.grad_blowup_factor}")


@dataclass
class OutDirs:
    golden: Path = Path("runs/golden")
    ms: Path = Path("runs/ms")

    def _validate(self, at: str) -> None:
        pass


@dataclass
class RunConfig:
    data: Path                         # folder written by `migrate data tokenize`
    seq_length: int
    total_steps: int                   # optimizer steps
    hf_model: Path | None = None       # HF folder: the golden side trains this
    ms_model: Path | None = None       # converted folder: the MindSpore side trains this
    eval_data: Path | None = None      # optional held-out folder, same format as data
    micro_batch_size: int = 8
    grad_accum_steps: int = 1
    max_grad_norm: float | None = 1.0  # null or 0: no clipping (the norm is still logged)
    seed: int = 42
    shuffle: bool = True
    data_seed: int | None = None       # null: use seed (as HF TrainingArguments does)
    dtype: str = "fp32"
    dropout: float = 0.0               # set on every *dropout field of the model config
    recompute: bool = False
    peak_flops: float | None = None    # per-device peak flop/s for the MFU estimate; null: measured
    checkpoint_interval: int = 0       # 0: no checkpoints
    keep_checkpoints: int | None = None  # null: keep all
    eval_interval: int = 0             # 0: no evaluation
    eval_samples: int | None = None    # null: every eval row
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    out_dir: OutDirs = field(default_factory=OutDirs)
    lora: LoraSpec | None = None       # LoRA instead of full training (migrate.lora.spec)
    health: HealthConfig = field(default_factory=HealthConfig)  # the health watch (migrate.train.health.watch)
    tensorboard: bool = True           # TensorBoard event files in the run folder (migrate.train.tensorboard)
    reference: Any = "auto"            # golden only: auto | fp64 | off, its step-1 loss and grad norm in float64 too
    source: Path | None = field(default=None, compare=False)  # the YAML file, when loaded from one

    # ---------- loading ----------
    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        path = Path(path)
        if not path.is_file():
            raise MigrateError(f"no run config at {path}")
        data = load_yaml(path, "run config")  # bounded in size, depth and aliases; one line otherwise
        return cls.from_dict(data, base=path.resolve().parent, source=path)

    @classmethod
    def from_dict(cls, data: Any, base: str | Path = ".", source: str | Path | None = None) -> RunConfig:
        where = str(source) if source else "run config"
        if data is None:
            raise MigrateError(f"{where} is empty")
        try:
            cfg = _build(cls, data, "")
            cfg._resolve(Path(base))
            cfg._validate()
        except _Bad as exc:
            raise MigrateError(f"{where}: {exc}") from None
        cfg.source = Path(source) if source else None
        return cfg

    def _resolve(self, base: Path) -> None:
        def resolve(p: Path | None) -> Path | None:
            return None if p is None else (base / p.expanduser()).resolve()

        self.data, self.hf_model, self.ms_model, self.eval_data = map(
            resolve, (self.data, self.hf_model, self.ms_model, self.eval_data))
        self.out_dir.golden, self.out_dir.ms = resolve(self.out_dir.golden), resolve(self.out_dir.ms)

    def _validate(self) -> None:
        for key in ("seq_length", "total_steps", "micro_batch_size", "grad_accum_steps"):
            _require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("checkpoint_interval", "eval_interval"):
            _require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        _require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _require(self.data_seed is None or self.data_seed >= 0, "data_seed", f"must be >= 0, got {self.data_seed}")
        _require(self.keep_checkpoints is None or self.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1")
        _require(self.eval_samples is None or self.eval_samples >= 1, "eval_samples", "must be >= 1")
        _require(self.max_grad_norm is None or self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        _require(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        _require(self.peak_flops is None or (math.isfinite(self.peak_flops) and self.peak_flops > 0), "peak_flops",
                 f"must be a number > 0 (flop/s, e.g. 3.12e14), got {self.peak_flops}")
        if self.dtype not in SPELLINGS:
            raise _Bad("dtype", f"unknown dtype {self.dtype!r}{_did_you_mean(self.dtype, SPELLINGS)}; "
                                f"use fp32, bf16 or fp16")
        self.dtype = SPELLINGS[self.dtype]
        if self.reference is False:  # YAML 1.1 reads a bare `off` as false
            self.reference = "off"
        if not isinstance(self.reference, str) or self.reference not in REFERENCES:
            raise _Bad("reference", f"unknown reference {self.reference!r}"
                                    f"{_did_you_mean(str(self.reference), REFERENCES)}; use {', '.join(REFERENCES)}")
        _require(not self.eval_interval or self.eval_data is not None, "eval_data", "eval_interval needs eval_data")
        for name in ("optimizer", "schedule", "loss_scale", "out_dir", "health"):
            getattr(self, name)._validate(name + ".")
        if self.lora is not None:
            for key, msg in self.lora.problems():
                raise _Bad("lora." + key, msg)
            self.lora = self.lora.normalised()
        warmup = self.schedule.num_warmup_steps(self.total_steps)
        _require(warmup <= self.total_steps, "schedule.warmup_steps",
                 f"{warmup} warmup steps exceed total_steps {self.total_steps}")
        floor = self.schedule.min_lr
        _require(floor is None or floor < self.optimizer.lr, "schedule.min_lr",
                 f"must be below optimizer.lr ({self.optimizer.lr}), got {floor}")
        if self.hf_schedule().name == "polynomial":  # HF divides by total - warmup there
            _require(warmup < self.total_steps, "schedule.warmup_steps",
                     "a linear decay to min_lr needs warmup shorter than total_steps")

    def replace(self, **changes) -> RunConfig:
        """A copy with top-level fields changed (command-line overrides), validated again."""
        cfg = dataclasses.replace(self, **changes)
        try:
            cfg._validate()
        except _Bad as exc:
            raise MigrateError(f"{self.source or 'run config'}: {exc}") from None
        return cfg

    # ---------- derived ----------
    @property
    def samples_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps

    @property
    def shuffle_seed(self) -> int | None:
        """Seed of the sample order, None for file order."""
        if not self.shuffle:
            return None
        return self.seed if self.data_seed is None else self.data_seed

    def hf_schedule(self) -> HFSchedule:
        return self.schedule.hf(self.total_steps, self.optimizer.lr)

    def require(self, key: str) -> Path:
        """A path field one side needs, e.g. hf_model for the golden script."""
        value = getattr(self, key)
        if value is None:
            raise MigrateError(f"{self.source or 'run config'}: {key} is not set")
        return value

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        return _plain(data)


# ---------- generic, type-driven reading ----------
def _build(cls, data: Any, at: str):
    if not isinstance(data, dict):
        raise _Bad(at.rstrip(".") or "run config", "must be a mapping of keys")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise _Bad(f"{at}{key}", f"unknown key{_did_you_mean(str(key), fields)}")
        kwargs[key] = _coerce(value, hints[key], at + key)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _Bad(at + name, "is required")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), key)
    if value is None:
        raise _Bad(key, "must not be empty")
    if hint is Any:  # a field that checks its own values (lora.target_modules: a list or all-linear)
        return value
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key + ".")
    if hint is bool:
        if not isinstance(value, bool):
            raise _Bad(key, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(key, f"must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad(key, f"must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _Bad(key, f"must be a string, got {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise _Bad(key, f"must be a path, got {value!r}")
        return Path(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise _Bad(key, f"must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Bad(key, f"must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"no reader for {hint!r}")  # a bug in this module, not in the YAML


def _require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise _Bad(key, msg)


def _did_you_mean(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
