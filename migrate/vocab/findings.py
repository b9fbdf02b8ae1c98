"""A finding of `migrate vocab check`: one line, its level, and the figures behind it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ERROR, WARNING, OK, INFO = "error", "warning", "ok", "info"
_RANK = {ERROR: 0, WARNING: 1, INFO: 2, OK: 3}


@dataclass
class Finding:
    key: str            # stable name, e.g. "special.eos", "data.ids_beyond_vocab"
    level: str          # error | warning | info | ok
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"key": self.key, "level": self.level, "message": self.message, "figures": self.figures}


@dataclass
class VocabReport:
    findings: list[Finding] = field(default_factory=list)

    def add(self, key: str, level: str, message: str, **figures) -> Finding:
        finding = Finding(key, level, message, figures)
        self.findings.append(finding)
        return finding

    def of_level(self, level: str) -> list[Finding]:
        return [f for f in self.findings if f.level == level]

    @property
    def exit_code(self) -> int:
        """1 on any error; warnings alone pass (0)."""
        return 1 if self.of_level(ERROR) else 0

    def verdict(self) -> str:
        errors, warnings = self.of_level(ERROR), self.of_level(WARNING)
        head = "FAIL" if errors else "PASS"
        parts = [f"{len(errors)} error{'s' * (len(errors) != 1)}",
                 f"{len(warnings)} warning{'s' * (len(warnings) != 1)}"]
        first = errors[0] if errors else (warnings[0] if warnings else None)
        return f"{head} · {', '.join(parts)}" + (f" · first: {first.message}" if first else "")

    def sorted(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: _RANK.get(f.level, 9))

    def to_dict(self) -> dict:
        return {"schema_version": 1, "passed": self.exit_code == 0, "verdict": self.verdict(),
                "errors": len(self.of_level(ERROR)), "warnings": len(self.of_level(WARNING)),
                "findings": [f.to_dict() for f in self.findings]}
