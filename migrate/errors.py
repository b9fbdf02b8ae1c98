"""User-facing errors: the CLI prints their message on one line and exits 2."""


class MigrateError(Exception):
    """A user mistake or bad input. Never shown with a traceback."""

    exit_code = 2


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
