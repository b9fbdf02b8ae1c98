"""Longest files first: the order `make test` hands test files to its pytest-xdist workers.

`--dist loadfile` gives a worker a whole file; with xdist's default order (most tests first) the
few-test files that train for minutes came last, and one worker ran the last of them alone while
the other sat idle. Handing out the costliest files first (the longest-processing-time rule)
leaves only short files for the end. The costs are seconds per file from a recorded run
(tests/file_costs.json); a file not recorded yet is costed from its slow tests.

Refresh the table after adding a costly file: `make test-costs` (a whole run that records).
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_costs.json")
RECORD_ENV = "MIGRATE_RECORD_TEST_COSTS"  # set: the run writes what each file cost into TABLE
UNRECORDED_SLOW_S = 20.0   # a slow test of a file the table does not know yet
UNRECORDED_QUICK_S = 0.2


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_costs() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(TABLE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def estimated(items) -> dict[str, float]:
    """Seconds per file: the recorded ones, else from how many of its tests are marked slow."""
    recorded = load_costs()
    guess: dict[str, float] = defaultdict(float)
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        guess[file_of(item.nodeid)] += UNRECORDED_SLOW_S if slow else UNRECORDED_QUICK_S
    return {f: recorded.get(f, g) for f, g in guess.items()}


def longest_files_first(items) -> list:
    """`items` with whole files ordered by cost, descending; the order within a file kept."""
    cost = estimated(items)
    position = {}
    for index, item in enumerate(items):
        position.setdefault(file_of(item.nodeid), index)
    return sorted(items, key=lambda item: (-cost[file_of(item.nodeid)], position[file_of(item.nodeid)]))


class CostRecorder:
    """Adds up setup + call + teardown seconds per file (on the controller, which sees every report)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        if not self.seconds:
            return
        table = {**load_costs(), **{f: round(s, 1) for f, s in self.seconds.items()}}
        TABLE.write_text(json.dumps(dict(sorted(table.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


def recording_wanted(config) -> bool:
    return bool(os.environ.get(RECORD_ENV)) and not hasattr(config, "workerinput")
