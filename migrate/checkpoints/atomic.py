"""Atomic outputs: build under a hidden temporary name, rename at the end.

A failed, refused or interrupted (SIGINT, SIGTERM) run leaves nothing under the
final name and no temporary folder, nor the parent folders it created. A run
killed outright (SIGKILL, power cut) leaves `.NAME.<host>-<pid>-<random>.partial`;
the next run for the same output removes it once that process is gone. The
temporary name is short whatever NAME is, so every name the file system allows
works. Folders get the permissions mkdir gives (0o777 minus the umask); files
0o666 minus the umask. An OSError while writing becomes one MigrateError line
naming the output and the reason (no space, file too large, permission...).
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from migrate import signals
from migrate.checkpoints.output_guard import check_output, output_path, write_marker
from migrate.errors import MigrateError

_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]
_SHORT = 200  # bytes of the output name kept in the temporary name: 200 + 33 stays under NAME_MAX (255)
_KINDS = ("partial", "old")


@contextmanager
def atomic_output_dir(final: str | Path, overwrite: bool = False, *, command: str | None = None,
                      source: str | Path | None = None, inputs: Iterable[str | Path | None] = ()):
    """Yield a temporary folder; on success it becomes `final`.

    command: the migrate command writing a user's output folder (convert, export,
    ckpt merge). Then `output_guard` rules what may be replaced (only migrate's
    own outputs, never `source` or one of `inputs`) and the folder gets migrate's
    marker. Without it (the trainer's own checkpoint folders) an existing folder
    is replaced whenever `overwrite` is set."""
    shown = Path(final)
    final = output_path(final)
    if command is not None:
        check_output(shown, overwrite=overwrite, source=source, inputs=inputs)
    else:
        _check_plain(shown, final, overwrite)
    created: list[Path] = []
    tmp = None
    try:
        created = _make_parents(final.parent)
        remove_stale(final.parent, final.name)
        tmp = _new_temp_dir(final.parent, final.name, "partial")
        if command is not None:  # first, so that a manifest written last lists it too
            write_marker(tmp, command)
        yield tmp
        _fsync_dir(tmp)
        with signals.deferred():  # a signal here would leave neither the old output nor the new one
            _put_in_place(tmp, final, shown, overwrite)
        _fsync_dir(final.parent)
    except BaseException as exc:
        with signals.deferred():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for folder in created:  # deepest first; a folder someone else filled meanwhile stays
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
        if isinstance(exc, OSError):
            raise _user_error(exc, shown, tmp) from None
        raise


def _check_plain(shown: Path, final: Path, overwrite: bool) -> None:
    if os.path.lexists(final) and not final.is_dir():
        raise MigrateError(f"output {shown} exists and is not a folder")
    if final.exists() and not overwrite:
        raise MigrateError(f"output {shown} already exists (pass --overwrite to replace it)")


def _put_in_place(tmp: Path, final: Path, shown: Path, overwrite: bool) -> None:
    old = None
    try:
        if os.path.lexists(final):
            if not overwrite:  # it appeared while this run worked
                raise MigrateError(f"output {shown} already exists (pass --overwrite to replace it)")
            old = _new_temp_dir(final.parent, final.name, "old")
            try:
                os.replace(final, old / "prev")
            except FileNotFoundError:  # another writer moved it away first
                pass
        try:
            os.replace(tmp, final)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise MigrateError(f"output {shown} was written by another process while this one ran; "
                                   "kept that one, discarded this run's") from None
            if old is not None and (old / "prev").exists() and not os.path.lexists(final):
                os.replace(old / "prev", final)  # put the previous output back
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _make_parents(folder: Path) -> list[Path]:
    """Create the missing folders above the output; return them deepest first."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    created = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        created.append(path)
    return created[::-1]


def _short(name: str) -> str:
    raw = os.fsencode(name)
    if len(raw) <= _SHORT:
        return name
    return os.fsdecode(raw[:_SHORT - 11]) + "~" + hashlib.sha1(raw).hexdigest()[:10]


def _temp_path(parent: Path, name: str, kind: str) -> Path:
    return parent / f".{_short(name)}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.{kind}"


def _new_temp_dir(parent: Path, name: str, kind: str) -> Path:
    while True:
        path = _temp_path(parent, name, kind)
        try:
            os.mkdir(path, 0o777)  # the umask applies, as for any folder (mkdtemp would force 0o700)
            return path
        except FileExistsError:
            continue


def remove_stale(parent: Path, name: str) -> list[Path]:
    """Remove the temporary siblings of `parent/name` left by dead migrate processes of
    this host (their pid is in the name); a live process's are left alone."""
    pattern = re.compile(rf"\.{re.escape(_short(name))}\.([0-9a-f]{{6}})-(\d+)-[0-9a-f]{{8}}\.(?:{'|'.join(_KINDS)})")
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match or match.group(1) != _HOST or _alive(int(match.group(2))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _user_error(exc: OSError, shown: Path, tmp: Path | None) -> MigrateError:
    """One line for an OSError met while writing `shown`: the output (never the
    temporary name) or the input path concerned, and the system's reason."""
    reason = exc.strerror or str(exc)
    path = exc.filename
    if path is None:
        return MigrateError(f"cannot write output {shown}: {reason}")
    path = os.fsdecode(path)
    if tmp is not None and Path(path).is_relative_to(tmp):
        inner = Path(path).relative_to(tmp)
        return MigrateError(f"cannot write output {shown}" + (f": {inner}" if str(inner) != "." else "")
                            + f": {reason}")
    final = output_path(shown)
    if Path(os.path.abspath(path)) in (final, *final.parents) or Path(path).parent == final.parent:
        return MigrateError(f"cannot write output {shown}: {path}: {reason}")
    return MigrateError(f"{path}: {reason}")


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Readers see the old file or the complete new one: temp file in the same
    folder, fsync, os.replace, folder fsync. An existing file's mode is kept."""
    path = Path(path)
    _ensure_folder(path.parent)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None  # a new file: 0o666 minus the umask, from os.open
    remove_stale(path.parent, path.name)
    while True:
        tmp = _temp_path(path.parent, path.name, "partial")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _ensure_folder(folder: Path) -> None:
    """mkdir -p, failing on the path that is not a folder (mkdir's own error names the leaf)."""
    for above in (folder, *folder.parents):
        if os.path.isdir(above):
            break
        if os.path.lexists(above):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(above))
    folder.mkdir(parents=True, exist_ok=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
