"""MindSpore-side model config, read from and written to `model.yaml`.

Field names follow MindFormers' LlamaConfig where one exists (num_layers,
num_heads, n_kv_heads, theta, qkv_has_bias, seq_length), so the file reads
naturally to MindFormers users.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from migrate.errors import MigrateError
from migrate.safeyaml import load_yaml, quote

# Sizes a model cannot have zero (or fewer) of, in any family's config that has them.
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "head_dim", "seq_length",
               "type_vocab_size")


def check_sizes(config) -> None:
    """One line for a size field below 1 (`num_layers: 0` is no model: the planner divided by it,
    the model built nothing); a field the config lacks, or leaves None (a default), is skipped."""
    for name in SIZE_FIELDS:
        value = getattr(type(config), "__dataclass_fields__", {}).get(name) and getattr(config, name)
        if isinstance(value, int) and value < 1:
            raise MigrateError(f"model config field {name} must be positive, got {value}")


def check_heads(hidden_size: int, num_heads: int) -> None:
    if num_heads <= 0 or hidden_size % num_heads:
        raise MigrateError(f"hidden_size ({hidden_size}) is not a multiple of num_heads ({num_heads})")


class HeadsFromHidden:
    """For a config whose heads split hidden_size evenly (GPT-2, BERT): checked when built."""

    def __post_init__(self):
        check_sizes(self)
        check_heads(self.hidden_size, self.num_heads)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class ConfigIO:
    """`model.yaml` round trip for a config dataclass with an `extra` dict field
    (unknown fields kept verbatim), the same contract as `LlamaConfig`."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        extra = data.pop("extra")
        data.update(extra)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        missing = [f.name for f in dataclasses.fields(cls) if f.name in known and f.name not in kwargs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise MigrateError(f"model config is incomplete: it lacks {', '.join(missing)}")
        hints = typing.get_type_hints(cls)
        for name, value in kwargs.items():
            if not _has_type(value, hints[name]):
                raise MigrateError(f"model config field {name} must be {_type_name(hints[name])}, "
                                   f"got {quote(value)}")
        return cls(**kwargs, extra=extra)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: str | Path):
        path = Path(path)
        if path.is_dir():
            path = path / "model.yaml"
        if not path.is_file():
            raise MigrateError(f"no model config at {path}")
        data = load_yaml(path, "model config")
        if not isinstance(data, dict):
            raise MigrateError(f"{path} is not a mapping of config fields")
        return cls.from_dict(data)


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a YAML value fits a config field's annotation (int for float is fine, bool for int is not)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_has_type(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_has_type(k, args[0]) and _has_type(v, args[1])
                                               for k, v in value.items())
    return True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if isinstance(hint, type):
        return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
                "dict": "a mapping", "list": "a list"}.get(hint.__name__, hint.__name__)
    return {list: "a list", dict: "a mapping"}.get(typing.get_origin(hint), str(hint))


@dataclass
class LlamaConfig(ConfigIO):
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    n_kv_heads: int | None = None          # None: same as num_heads (MHA)
    head_dim: int | None = None            # None: hidden_size // num_heads
    seq_length: int = 2048                 # max positions (HF max_position_embeddings)
    rms_norm_eps: float = 1e-6
    theta: float = 10000.0                 # RoPE base
    rope_scaling: dict[str, Any] | None = None  # HF rope_parameters minus rope_theta
    tie_word_embeddings: bool = False
    qkv_has_bias: bool = False
    out_proj_has_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None      # attention window (Mistral; Qwen2 windowed layers)
    layer_types: list[str] | None = None   # per layer: full_attention | sliding_attention
    hidden_act: str = "silu"
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    ignore_token_id: int = -100
    compute_dtype: str = "float32"         # float32 | float16 | bfloat16
    # MindFormers' fused layout: attention.w_qkv (rows per KV group: q heads | k | v)
    # and feed_forward.w_gate_hidden (gate/up rows interleaved); see migrate.transforms.
    qkv_concat: bool = False
    # Gemma's two forward features (keymaps/hf_gemma.yaml sets them): the embedding output
    # times √hidden_size rounded to the parameters' dtype, and RMSNorm scaling by (1 + weight)
    # in fp32 before its one cast back (the weight then starts at zeros).
    scale_embeddings: bool = False
    rms_norm_unit_offset: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # unknown fields, kept verbatim

    def __post_init__(self):
        check_sizes(self)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.num_heads
        if self.n_kv_heads <= 0:
            raise MigrateError(f"model config field n_kv_heads must be positive, got {self.n_kv_heads}")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_heads
        if self.num_heads % self.n_kv_heads:
            raise MigrateError(
                f"num_heads ({self.num_heads}) is not a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.extra.get("use_bidirectional_attention"):
            # HF Gemma's flag (kept verbatim for export): its sdpa path then attends both ways.
            raise MigrateError("use_bidirectional_attention is not supported: the bundled Llama attends causally")

    @property
    def rope_type(self) -> str:
        scaling = self.rope_scaling or {}
        return scaling.get("rope_type", scaling.get("type", "default"))
