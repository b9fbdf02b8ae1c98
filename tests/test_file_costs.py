"""The order `make test` hands files to its workers (tests/file_costs.py): costliest first."""
import json

import pytest

import file_costs


class Item:
    def __init__(self, nodeid, slow=False):
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name):
        return object() if name == "slow" and self.slow else None


def test_files_go_out_costliest_first_and_keep_their_inner_order(tmp_path, monkeypatch):
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"tests/test_b.py": 300.0, "tests/test_a.py": 2.0}))
    monkeypatch.setattr(file_costs, "TABLE", table)
    items = [Item("tests/test_a.py::x"), Item("tests/test_a.py::y"), Item("tests/test_b.py::z"),
             Item("tests/test_new.py::slow1", slow=True), Item("tests/test_new.py::quick"),
             Item("tests/test_b.py::w")]
    order = [i.nodeid for i in file_costs.longest_files_first(items)]
    # b recorded at 300 s; the unrecorded file costed from its one slow test (20.2 s); a at 2 s
    assert order == ["tests/test_b.py::z", "tests/test_b.py::w", "tests/test_new.py::slow1",
                     "tests/test_new.py::quick", "tests/test_a.py::x", "tests/test_a.py::y"]


@pytest.mark.parametrize("text", ["", "[1, 2]", "{not json"])
def test_a_missing_or_broken_table_falls_back_to_the_slow_marks(tmp_path, monkeypatch, text):
    table = tmp_path / "costs.json"
    table.write_text(text)
    monkeypatch.setattr(file_costs, "TABLE", table)
    items = [Item("tests/test_a.py::x"), Item("tests/test_b.py::y", slow=True)]
    assert [i.nodeid for i in file_costs.longest_files_first(items)] == ["tests/test_b.py::y", "tests/test_a.py::x"]


def test_the_recorder_adds_phases_per_file_and_keeps_other_files(tmp_path, monkeypatch):
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"tests/test_old.py": 5.0, "tests/test_a.py": 99.0}))
    monkeypatch.setattr(file_costs, "TABLE", table)
    recorder = file_costs.CostRecorder()
    for nodeid, seconds in [("tests/test_a.py::x", 1.25), ("tests/test_a.py::x", 0.5), ("tests/test_c.py::y", 3.0)]:
        recorder.pytest_runtest_logreport(type("Report", (), {"nodeid": nodeid, "duration": seconds}))
    recorder.pytest_sessionfinish(None)
    assert json.loads(table.read_text()) == {"tests/test_old.py": 5.0, "tests/test_c.py": 3.0, "tests/test_a.py": 1.8}
