"""The registry of training logs `migrate compare` reads: each format declared once, beside its reader.

A format is a `LogFormat` -- its metadata as data, its ``sniff`` (does this path hold it?) and its
``read`` (the path into a `Run`) -- registered with ``@log_format(LogFormat(...))`` on its reader
(`metrics_log`, `foreign_files`, `foreign_text`). `readers.detect_format`, `readers.read_run` and
the refusal's list of what compare reads (`readers.known`) are derived from `FORMATS`; adding a
format is one declaration (docs/DESIGN.md "Registration").

Every line format is copied from the producing project's own source, named in ``source``;
nothing is guessed. Each `LogFormat` says which of the log's fields fills which of compare's
columns (``fields``); whether the logged lr is the next step's (``lr_of_next_step``: Megatron-LM
steps its scheduler inside train_step, before training_log reads the lr); whether the logged
loss is a mean over the steps since the previous log line (``loss_averaged``: compare then
averages the other side's loss over the same steps); and whether the producer clips like
torch's ``clip_grad_norm_`` (``torch_clip``: then, with no post-clip norm in the log, compare
may derive the golden's from torch's formula).

Printed precision: a text log keeps only the digits it prints (MindSpore Transformers prints
the loss with 3 decimals), so every value carries its resolution -- half a unit in its last
printed digit (`printed_resolution`); TensorBoard stores float32 (half an fp32 ulp). Compare adds
that resolution to each bound a rounded value enters, and says so in its notes.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from migrate.checkpoints.input_folder import InputFolder
from migrate.errors import MigrateError

__all__ = ["LogFormat", "FORMATS", "Sample", "log_format", "printed_resolution", "FP32_HALF_ULP", "SNIFF_BYTES"]

FP32_HALF_ULP = 2.0 ** -24  # relative: TensorBoard scalars are float32 (simple_value)
SNIFF_BYTES = 4 << 20       # text formats are recognised within the first 4 MiB


class Sample:
    """What detection knows of a path: a folder's files, or a file's name and its first 4 MiB
    (read once, on first use, whichever format's sniff asks)."""

    def __init__(self, path: Path):
        self.path = path
        self.is_dir = path.is_dir()
        self.name = path.name

    def child(self, name: str) -> Path | None:
        """The folder's file ``name``, if it has one: under the reader rule (inside the folder, a regular
        file; a link out of the run folder or a FIFO there is refused, not read or skipped)."""
        return InputFolder(self.path, "run folder").optional(name) if self.is_dir else None

    @cached_property
    def head(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read(SNIFF_BYTES)
        except OSError as e:
            raise MigrateError(f"{self.path}: cannot read ({e.strerror or e})") from None

    @cached_property
    def text(self) -> str:
        return "" if self.is_dir else self.head.decode("utf-8", errors="replace")

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def first(self) -> str:
        """The first non-blank line, stripped ('' for none)."""
        return next((line.strip() for line in self.lines if line.strip()), "")

    def has_line(self, pattern) -> bool:
        """Whether a line of the sample matches the compiled regex ``pattern`` (anywhere in it)."""
        return any(pattern.search(line) for line in self.lines)

    @cached_property
    def utf8(self) -> bool:
        """The sample is UTF-8 text (a character cut by the sniffing limit does not count)."""
        try:
            self.head.decode("utf-8")
        except UnicodeDecodeError as e:
            return len(self.head) == SNIFF_BYTES and e.start >= len(self.head) - 3
        return True


# sniff(sample) -> what to read (a Path: a folder's file, or the path itself), True (the path), or
# None/False (not this format). read(path, role) -> Run.
Sniff = Callable[[Sample], "Path | bool | None"]


@dataclass(frozen=True)
class LogFormat:
    key: str
    title: str
    source: str                      # the project file (and function) the format is read from
    fields: dict[str, str]           # compare's column <- the log's field name
    loss_averaged: bool              # loss at step s = mean over the steps since the previous log line
    torch_clip: bool                 # the producer clips as torch: max_norm / (norm + 1e-6)
    note: str = ""
    lr_of_next_step: bool = False    # the logged lr is the next step's (the scheduler stepped before the log)
    printed: dict[str, str] = field(default_factory=dict)  # column -> how it is printed (`printed_resolution`)
    # -- detection (registered formats only; TensorBoard dialects have none) --
    sniff: Sniff | None = None       # tried on every path in `rank` order: a folder reads the first hit's,
                                     # a file two sniffs claim is refused as ambiguous
    rank: int = 50                   # a folder holding several formats' files reads the lowest rank's
    fallback: Sniff | None = None    # tried only when no format's sniff claimed the path
    known: str = ""                  # how compare's refusal names it ("" -> title)
    folder: str = ""                 # what a run folder of this format holds, for the refusal ("": none)
    read: Callable[[Path, str], Any] | None = None  # (path, role) -> Run; set by `log_format`


FORMATS: dict[str, LogFormat] = {}   # key -> format, filled by `log_format` as the readers load


def log_format(fmt: LogFormat):
    """Register ``fmt`` with the decorated function as its reader: ``@log_format(LogFormat(...))``."""
    def register(read: Callable[[Path, str], Any]):
        old = FORMATS.get(fmt.key)
        if old is not None and (old.read.__module__, old.read.__qualname__) != (read.__module__, read.__qualname__):
            raise ValueError(f"log format {fmt.key!r} registered twice")
        FORMATS[fmt.key] = replace(fmt, read=read)
        return read
    return register


def printed_resolution(text: str, style: str = "fixed") -> float:
    """The absolute resolution of a printed number, by how it was printed:

    ``fixed``   a format with a fixed number of digits ('%5.3f', '{:.6E}'): half a unit in the
                last digit -- '5.806' -> 5e-4, '5.806154E+00' -> 5e-7;
    ``numpy``   str() of a numpy float32 value: the shortest repr that reads back the same float32
                (within half an fp32 ulp of it, itself within half an ulp of the value: one ulp), except
                where numpy's 8 fixed decimals cut it ('0.00012346');
    ``float32`` a float32 value (TensorBoard): half an fp32 ulp;
    ``repr``    Python's repr of a float: exact (0).
    A non-number ('nan', 'inf') has resolution 0."""
    t = text.strip().strip("[]").strip().lower().lstrip("+-")
    mantissa, _, exp = t.partition("e")
    try:
        value = float(t)
        e = int(exp) if exp else 0
    except ValueError:
        return 0.0
    if not math.isfinite(value) or style == "repr":
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    digits = 0.5 * 10.0 ** (e - decimals)
    ulp = abs(value) * FP32_HALF_ULP
    if style == "fixed":
        return digits
    if style == "numpy":   # float32 rounding, then a decimal anywhere in that float32's rounding interval
        return max(2 * ulp, digits if not exp and decimals >= 8 else 0.0)
    return ulp
