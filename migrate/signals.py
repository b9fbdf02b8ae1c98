"""SIGINT and SIGTERM end a command the same way, and never mid-rename.

`migrate.cli.main` turns both signals into `Interrupted` (a KeyboardInterrupt, so
every `except KeyboardInterrupt` / `except BaseException` cleanup already runs
for SIGTERM too: the temporary output folder is removed, msrun is stopped).
`deferred()` marks the few steps that must not be cut in half (swapping an output
folder into place, removing a temporary one): a signal arriving there is raised
when the step ends. Without `handled()` (library use) Python's defaults apply.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as shells report it
_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(_WORDS.get(signum, f"signal {signum}"))
        self.signum = signum
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)
        self.word = _WORDS.get(signum, f"stopped by signal {signum}")


_pending: list[int] = []    # signals received inside deferred(), raised at its end
_depth = [0]
_received = [False]         # a second signal while the first is being handled is ignored


def _handler(signum, _frame) -> None:
    if _received[0]:
        return
    if _depth[0]:
        _pending.append(signum)
        return
    _received[0] = True
    raise Interrupted(signum)


@contextmanager
def handled():
    """Install the handlers for the duration of one command (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    saved = (_received[0], list(_pending))
    _received[0] = False
    _pending.clear()
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _received[0] = saved[0]
        _pending[:] = saved[1]


@contextmanager
def deferred():
    """Hold SIGINT/SIGTERM (when `handled()` is active) until the block ends."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if not _depth[0] and _pending and not _received[0]:
            signum = _pending[0]
            _pending.clear()
            _received[0] = True
            raise Interrupted(signum)
