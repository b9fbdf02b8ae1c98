"""User-facing errors: the CLI prints their message on one line and exits 2."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """`text` with its control characters escaped (a newline in a file name is "\\n"), so that a
    message naming it stays one line."""
    return _CONTROL.sub(lambda m: {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(m[0], f"\\x{ord(m[0]):02x}"), text)


class MigrateError(Exception):
    """A user mistake or bad input. Never shown with a traceback."""

    exit_code = 2

    def lines(self) -> list[str]:
        """The message as the command line prints it: one line, whatever names it quotes."""
        return [one_line(str(self))]


class MigrateErrors(MigrateError):
    """Several broken rules at once: one printed line each."""

    def __init__(self, messages):
        self.messages = [str(m) for m in messages]
        super().__init__("\n".join(self.messages))

    def lines(self) -> list[str]:
        return [one_line(m) for m in self.messages]


class CoverageError(MigrateError):
    """Source tensors and target parameters do not pair up one to one."""

    def __init__(self, missing=(), unexpected=(), misshaped=()):
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.misshaped = list(misshaped)
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing: {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected: {', '.join(self.unexpected)}")
        if self.misshaped:
            parts.append(f"{len(self.misshaped)} mis-shaped: {', '.join(self.misshaped)}")
        super().__init__("coverage check failed: " + "; ".join(parts))
