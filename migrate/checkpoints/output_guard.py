"""What an output name may be, and what `--overwrite` may replace.

`--overwrite` replaces only a folder migrate wrote (its `.migrate` marker, or what
older versions left: a conversion.json whose `tool` is migrate, a training
checkpoint's trainer_state.json, a token folder's data.json) or an empty folder;
never a folder that is, holds or lies inside an input of the command (compared as
resolved real paths, so links and `..` cannot hide one), nor the current folder.
Every refusal is one MigrateError line, raised before anything is touched.

Every output of every command (folders and single files: a report, a YAML, a JSON or PNG)
goes through `check_apart` first: it may not be, contain or lie inside anything the command
reads. `check_declared` runs that, and the rest of the rule for each kind of output, on every
output a verb declares (`migrate.cli_verbs`), all of them before the command writes any.
A single-file output: never a folder or a link; an existing file is replaced only with the
verb's --overwrite where it has one (and, for a YAML, only one migrate wrote: its first
line), otherwise (reports, plots, comparison JSON, which migrate regenerates) it is replaced
when it is one of migrate's own (its `signature` in its first bytes): `report -o run.yaml`
replaced the run config with HTML.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from migrate import __version__
from migrate.errors import MigrateError

MARKER = ".migrate"
# (file, field, accepted prefix) left in folders written before the marker existed
_LEGACY = (("conversion.json", "tool", "migrate"),
           ("trainer_state.json", "format", "migrate-train-checkpoint"),
           ("data.json", "format", "migrate-tokens"))
_MARKER_LIMIT = 1 << 24  # never read a huge file just to recognise a folder
_SIGNATURE_SPAN = 4096   # a regenerated file's signature lies in its first bytes
# What each file migrate regenerates in place holds near its start
REPORT_SIGNATURE = b"<title>Training run report: "           # migrate report's HTML head
COMPARE_JSON_SIGNATURE = b'"tool": "migrate compare"'          # migrate compare --json
PNG_SIGNATURE = b"Software\x00migrate"                         # tEXt chunk of migrate's plots (judge.plot)


def write_marker(folder: Path, command: str) -> None:
    (Path(folder) / MARKER).write_text(json.dumps({"tool": f"migrate {__version__}", "command": command}) + "\n")


def written_by_migrate(folder: Path) -> bool:
    checks = ((MARKER, "tool", "migrate"), *_LEGACY)
    return any(_field_starts(Path(folder) / name, key, prefix) for name, key, prefix in checks)


def _field_starts(path: Path, key: str, prefix: str) -> bool:
    try:
        if not path.is_file() or path.stat().st_size > _MARKER_LIMIT:
            return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get(key), str) and data[key].startswith(prefix)


def check_output(out: str | Path, *, overwrite: bool, source: str | Path | None = None,
                 inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse, with one line, an output the command must not write or replace.

    source: the folder the command reads as a whole (the model folder): the output may
    not be it, hold it, or lie inside it. inputs: any other path the command reads
    (files, a tokenizer folder): the output may not be one or hold one."""
    out = Path(out)
    where = output_path(out)
    _check_name(out, where)
    if os.path.islink(where):
        target = os.readlink(where)
        state = "" if os.path.exists(where) else ", which does not exist"
        raise MigrateError(f"output {out} is a symbolic link (to {target}{state}); name a folder, not a link")
    _check_ancestors(out, where)
    real = Path(os.path.realpath(where))
    for given, whole in ((source, True), *((path, False) for path in inputs)):
        if given is not None and os.path.lexists(given):  # what does not exist cannot be lost
            _check_against_input(out, real, Path(given), whole)
    exists = os.path.lexists(where)
    if exists and not where.is_dir():
        raise MigrateError(f"output {out} exists and is not a folder; --overwrite replaces only folders "
                           "migrate wrote")
    if exists and not (written_by_migrate(where) or _is_empty(where)):
        raise MigrateError(f"output {out} already exists and was not written by migrate (no {MARKER} marker); "
                           "--overwrite replaces only migrate's own outputs: choose another folder")
    if exists and not overwrite:
        raise MigrateError(f"output {out} already exists (pass --overwrite to replace it)")
    if exists and Path(os.getcwd()).is_relative_to(real):
        raise MigrateError(f"output {out} holds the current folder; run from outside it to replace it")
    _check_writable(out, where.parent if exists else _nearest_existing(where))


def check_apart(out: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output (folder or file) that is, contains or lies inside a path the command reads."""
    out = Path(out)
    real = Path(os.path.realpath(output_path(out)))
    for given in inputs:
        if given is not None and os.path.lexists(given):  # what does not exist cannot be lost
            _check_against_input(out, real, Path(given), True)


def check_file_output(out: str | Path, *, overwrite: bool | None, inputs: Iterable[str | Path | None] = (),
                      first_line: str | None = None, signature: bytes | None = None) -> None:
    """Refuse, with one line, a single-file output the command must not write or replace.

    overwrite: the verb's --overwrite (None: it has none, and an existing file it wrote is replaced);
    first_line: what the first line of a file migrate wrote starts with (replace only those);
    signature: bytes the first KiBs of a file migrate wrote hold (replace only those)."""
    out = Path(out)
    where = output_path(out)
    _check_name(out, where)
    if os.path.islink(where):
        raise MigrateError(f"output {out} is a symbolic link; name a file, not a link")
    _check_ancestors(out, where)
    check_apart(out, inputs)
    if where.is_dir():
        raise MigrateError(f"output {out} is a folder; name the file to write")
    exists = os.path.lexists(where)
    if exists and not where.is_file():
        raise MigrateError(f"output {out} exists and is not a plain file")
    if exists and overwrite is False:
        raise MigrateError(f"output {out} already exists (pass --overwrite to replace it)")
    if exists and first_line is not None and not _starts_with(where, first_line):
        raise MigrateError(f"output {out} was not written by migrate; --overwrite replaces only its own files")
    if exists and signature is not None and not _holds(where, signature):
        raise MigrateError(f"output {out} exists and was not written by migrate (a report, plot or comparison "
                           f"JSON is regenerated in place only over its own); remove it or name another file")
    _check_writable(out, where.parent if exists else _nearest_existing(where))


def _starts_with(path: Path, prefix: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().startswith(prefix)
    except OSError:
        return False


def _holds(path: Path, signature: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return signature in fh.read(_SIGNATURE_SPAN)
    except OSError:
        return False


def output_path(out: str | Path) -> Path:
    """The absolute path the output will have: its parent resolved as the kernel resolves it
    (links, "..") and its own name kept, so that a link in its place is seen, not followed."""
    out = Path(out)
    if out.name in ("", ".", ".."):  # "." or "x/..": the folder's own name is needed to rename it
        return Path(os.path.realpath(out))
    return Path(os.path.realpath(out.parent)) / out.name


def _check_name(out: Path, where: Path) -> None:
    if where == where.parent:
        raise MigrateError(f"output {out} is the root folder")
    size = len(os.fsencode(where.name))
    try:
        limit = os.pathconf(_nearest_existing(where), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if size > limit:
        raise MigrateError(f"output name {where.name[:40]}... is {size} bytes long; this file system allows "
                           f"at most {limit}")


def _check_ancestors(out: Path, where: Path) -> None:
    for folder in where.parents:
        if not os.path.lexists(folder):
            continue
        if os.path.isdir(folder):
            return
        what = ("a symbolic link that points nowhere" if os.path.islink(folder) and not os.path.exists(folder)
                else "a file, not a folder")
        raise MigrateError(f"cannot create output {out}: {_shown(out, folder)} is {what}")


def _check_against_input(out: Path, real: Path, given: Path, whole: bool) -> None:
    other = Path(os.path.realpath(given))
    if other == real:
        raise MigrateError(f"output {out} is the input {given}; choose another output")
    if other.is_relative_to(real):
        raise MigrateError(f"output {out} contains the input {given}; choose another output "
                           "(--overwrite never replaces what the command reads)")
    if whole and real.is_relative_to(other):
        raise MigrateError(f"output {out} is inside the input {given}; write outside what the command reads")


def _check_writable(out: Path, folder: Path) -> None:
    if os.access(folder, os.W_OK | os.X_OK):
        return
    try:
        readonly = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    why = "read-only file system" if readonly else "permission denied"
    raise MigrateError(f"cannot create output {out}: {_shown(out, folder)} is not writable ({why})")


def _shown(out: Path, folder: Path) -> str:
    """`folder` as the user wrote the output: relative when they gave a relative name."""
    return str(folder) if out.is_absolute() else os.path.relpath(folder)


def _nearest_existing(where: Path) -> Path:
    for folder in (where, *where.parents):
        if os.path.isdir(folder):
            return folder
    return Path(where.anchor or "/")


def _is_empty(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return False
